"""The parameters of each CUDA kernel, as the cubins declare them: one table
for the tests that read the cubins (test_ops_nvrtc.py) and those that run the
launch recipe on the host (test_ops_launch_recipe.py).

Sizes for float32 logits: 8-byte pointers and integers, Plan 24 bytes, bool 1,
in the order custom_ops/xent_launch.h passes them (the driver backend passes
their addresses as they are).
"""

PARAM_SIZES = {
    "SparseForward": (8, 8, 8, 8, 24, 1, 8, 8, 8, 8, 8),
    "SparseMerge": (8, 8, 8, 8, 8, 8, 8, 8, 8),
    "SparseGrad": (8, 8, 8, 8, 24, 1, 8, 8, 8, 8),
    "DenseForward": (8, 8, 8, 8, 24, 1, 8, 8, 8, 8, 8),
    "DenseMerge": (8, 8, 8, 8, 8, 8),
    "LabelSum": (8, 8, 8, 24, 1, 8, 8, 8),
    "LabelSumMerge": (8, 8, 8, 8),
    "DenseGrad": (8, 8, 8, 8, 24, 1, 1, 8, 8, 8, 8, 8),
}
