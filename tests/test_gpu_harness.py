"""The GPU harness's host side (benchmarks/gpu/xent_gpu.py), checked without a GPU.

The harness judges the CUDA kernels against its float64 reference; here that
reference is checked against TensorFlow's own ops on the CPU, and its case
list against the shapes the kernels must be run on.
"""

import equivtool  # noqa: F401  (must precede TensorFlow)

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from equivtool.ops import _build, _nvrtc

HARNESS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "benchmarks", "gpu", "xent_gpu.py")


@pytest.fixture(scope="module")
def harness():
    spec = importlib.util.spec_from_file_location("xent_gpu_harness", HARNESS)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve annotations there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def _tf_sparse(x, labels, g):
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=xt)
    return loss.numpy(), tape.gradient(loss, xt, output_gradients=tf.constant(g)).numpy()


def test_sparse_reference_matches_tensorflow(harness):
    case = harness.Case(37, 1000, "float64", "int64")
    data = harness.make_inputs(case, seed=3)
    loss, grad = harness.reference_sparse(data["logits"], data["labels"], data["grad_loss"])
    tf_loss, tf_grad = _tf_sparse(data["logits"], data["labels"], data["grad_loss"])
    np.testing.assert_allclose(loss, tf_loss, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grad, tf_grad, rtol=1e-10, atol=1e-14)


def test_sparse_reference_with_wrong_labels_does_not_match(harness):
    # the comparison above can fail: a reference that picks the wrong class
    case = harness.Case(37, 1000, "float64", "int64")
    data = harness.make_inputs(case, seed=3)
    wrong = (data["labels"] + 1) % case.classes
    loss, _ = harness.reference_sparse(data["logits"], wrong, data["grad_loss"])
    tf_loss, _ = _tf_sparse(data["logits"], data["labels"], data["grad_loss"])
    assert not np.allclose(loss, tf_loss, rtol=1e-12, atol=1e-12)


def test_dense_reference_matches_tensorflow(harness):
    case = harness.Case(9, 300, "float64", "dense")
    data = harness.make_inputs(case, seed=4)
    x, y, g = data["logits"], data["labels"], data["grad_loss"]
    loss, grad = harness.reference_dense(x, y, g)
    _, exact_grad = harness.reference_dense(x, y, g, exact=True)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        tf_loss = tf.nn.softmax_cross_entropy_with_logits(labels=y, logits=xt)
    tf_grad = tape.gradient(tf_loss, xt, output_gradients=tf.constant(g)).numpy()
    np.testing.assert_allclose(loss, tf_loss.numpy(), rtol=1e-12)
    # by default TensorFlow's gradient g * (p - y) on every row ...
    np.testing.assert_allclose(grad, tf_grad, rtol=1e-10, atol=1e-14)
    # ... the exact one g * (sum(y) p - y) agrees only where the labels sum to
    # one (make_inputs halves row 1)
    sums = y.sum(1)
    normalised = np.abs(sums - 1) < 1e-12
    assert normalised.sum() == len(sums) - 1
    np.testing.assert_allclose(exact_grad[normalised], tf_grad[normalised], rtol=1e-10, atol=1e-14)
    assert not np.allclose(exact_grad[~normalised], tf_grad[~normalised])


def test_reference_special_rows_follow_tensorflows_gpu_rules(harness):
    case = harness.Case(6, 10, "float64", "int64", "special")
    data = harness.make_inputs(case, seed=5)
    data["labels"][4] = 0  # row 4: all -inf but the last logit; label on a -inf logit
    loss, grad = harness.reference_sparse(data["logits"], data["labels"], data["grad_loss"])
    # +inf, NaN, all -inf: NaN rows; a -inf label logit: infinite loss
    assert np.isnan(loss[:3]).all() and np.isnan(grad[:3]).all()
    assert loss[3] == np.inf and np.isfinite(grad[3]).all() and grad[3, -1] < 0
    assert loss[4] == np.inf and np.isfinite(loss[5])
    np.testing.assert_allclose(grad[5].sum(), 0.0, atol=1e-12)


def test_reference_out_of_range_labels_give_nan_rows(harness):
    case = harness.Case(8, 10, "float64", "int32", "bad_labels")
    data = harness.make_inputs(case, seed=6)
    loss, grad = harness.reference_sparse(data["logits"], data["labels"].astype(np.int64),
                                          data["grad_loss"])
    bad = (data["labels"] < 0) | (data["labels"] >= case.classes)
    assert bad.sum() == 6
    assert np.isnan(loss[bad]).all() and np.isnan(grad[bad]).all()
    assert np.isfinite(loss[~bad]).all() and np.isfinite(grad[~bad]).all()


def test_case_list_covers_the_required_shapes_and_kinds(harness):
    cases = harness.check_cases(full=True)
    seen = {(c.rows, c.classes, c.dtype) for c in cases}
    for rows, classes in harness.ISSUE_SHAPES:
        for dtype in harness.DTYPES:
            assert (rows, classes, dtype) in seen, (rows, classes, dtype)
    assert {c.labels for c in cases} == {"int32", "int64", "dense"}
    assert {c.kind for c in cases} == {"normal", "offset", "huge", "special", "bad_labels"}
    assert any(c.rows > 2**20 for c in cases) and any(c.offset_bytes for c in cases)


def test_harness_builds_with_the_op_builds_nvcc_flags(harness):
    cmd = harness.build_command("nvcc", "/tmp/libx.so")
    assert cmd[1:1 + len(_build.NVCC_FLAGS)] == _build.NVCC_FLAGS
    assert harness.CAPI in cmd and any(a.endswith("xent_kernels.cu.cc") for a in cmd)
    assert "arch=compute_90,code=sm_90" in cmd and not any(a.startswith("-DEQUIVTOOL_XENT_GPU") for a in cmd)
    variant = harness.build_command("nvcc", "/tmp/libx.so", defines=["EQUIVTOOL_XENT_GPU_HOST_EXP"])
    assert variant == cmd[:1 + len(_build.NVCC_FLAGS)] + ["-DEQUIVTOOL_XENT_GPU_HOST_EXP"] + cmd[1 + len(_build.NVCC_FLAGS):]


def test_driver_harness_builds_without_cuda_and_says_why_it_cannot_run(harness, tmp_path):
    # the op's run-time path: a C++ compiler alone, libcuda opened at run time
    lib = harness.build_driver_library(str(tmp_path / "libdrv.so"))
    cmd = harness.driver_build_command("g++", "x.so")
    assert "nvcc" not in " ".join(cmd) and harness.CAPI_DRIVER in cmd
    nowhere = str(tmp_path / "no-libcuda.so.1")
    script = ("import sys; sys.path.insert(0, %r); import xent_gpu as h\n"
              "try:\n    h.DriverKernels(%r, [])\nexcept RuntimeError as e:\n    print(e)\n"
              % (os.path.dirname(HARNESS), lib))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ, "EQUIVTOOL_LIBCUDA": nowhere}, timeout=120)
    assert out.stdout.strip().startswith(
        f"driver launcher: no NVIDIA driver: cannot open {nowhere}"), out


def test_cubins_exported_for_the_driver_harness_read_back_whole(harness, tmp_path):
    # two of the four types (each compile takes seconds; the others are the same code path)
    dtypes = ("float32", "bfloat16")
    written = harness.export_cubins(str(tmp_path / "cubins"), 90, cache=str(tmp_path / "cache"),
                                    dtypes=dtypes)
    assert len(written) == len(dtypes)
    back = {c.dtype: c for c in harness.read_cubins(str(tmp_path / "cubins"))}
    assert set(back) == set(dtypes)
    nvrtc = _nvrtc.find_nvrtc()
    for dtype in dtypes:
        c = back[dtype]
        image = _nvrtc.kernel_image(dtype, 90, nvrtc, str(tmp_path / "cache"))
        assert c.cubin == image.cubin and c.names == dict(image.names) and c.arch == 90
        assert set(c.names) == set(_nvrtc.kernel_names(dtype))
        assert c.origin == f"NVRTC {nvrtc.version[0]}.{nvrtc.version[1]}"
        lines = c.names_text().decode().splitlines()
        assert len(lines) == len(c.names) and all("=" in line for line in lines)
    (tmp_path / "empty").mkdir()
    with pytest.raises(RuntimeError, match="no xent-\\*.json/.cubin pairs"):
        harness.read_cubins(str(tmp_path / "empty"))


def test_agreement_cases_cover_every_partition_path(harness):
    cases = harness.agree_cases()
    ext = {}
    for c in cases:
        p = _plan_kind(c)
        ext.setdefault(c.dtype, set()).add((p, c.labels, c.exact))
    for dtype in harness.DTYPES:
        kinds = {(p, labels) for p, labels, _ in ext[dtype]}
        for p in ("warp", "block", "chunks", "chunks+merge kernel"):
            assert {(p, "int64"), (p, "dense")} <= kinds, (dtype, p)
        assert ("chunks", "dense", True) in ext[dtype]  # the label sums' own launch
        assert ("chunks+merge kernel", "dense", True) in ext[dtype]
    assert any(c.offset_bytes for c in cases) and any(c.classes >= 1 << 20 for c in cases)


def _plan_kind(case):
    per_thread = {"float16": 64, "bfloat16": 64, "float32": 32, "float64": 16}[case.dtype]
    if case.classes <= 32 * per_thread:
        return "warp"
    if case.classes <= 256 * per_thread:
        return "block"
    chunks = -(-case.classes // (256 * per_thread))
    return "chunks" if case.rows * chunks < 2048 else "chunks+merge kernel"  # xent_launch.h


def test_harness_refuses_malformed_options_before_any_gpu_work(harness, capsys):
    with pytest.raises(SystemExit) as exc:
        harness.main(["speed", "--other", "nolib"])
    assert exc.value.code == 2 and "--other must be NAME=LIB" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        harness.main(["dump"])
    assert exc.value.code == 2 and "dump needs --inputs" in capsys.readouterr().err


def test_cpu_vs_gpu_counts_equal_bits_and_finds_a_one_ulp_change(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "cpu_vs_gpu", os.path.join(os.path.dirname(HARNESS), "cpu_vs_gpu.py"))
    cvg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cvg)
    inputs = str(tmp_path / "cases.npz")
    cvg.make_inputs(inputs)
    cpu = cvg._cpu_outputs(np.load(inputs))
    same = str(tmp_path / "same.npz")
    np.savez(same, **cpu)
    planted = dict(cpu)
    grad = planted["bf16_1000/dlogits"].copy()
    grad.flat[7] += 1  # the next bfloat16 value, one element
    planted["bf16_1000/dlogits"] = grad
    moved = str(tmp_path / "moved.npz")
    np.savez(moved, **planted)
    rows = {line.split(" | ")[0].strip("| ") + " " + line.split(" | ")[1] + " " + line.split(" | ")[2]:
            line for line in cvg.compare(inputs, [same, moved]).splitlines()[2:]}
    assert all(line.endswith("| 100.0% | 0 |") for key, line in rows.items() if "same.npz" in key)
    assert rows["bf16_1000 dlogits moved.npz"].endswith(f"| {1 - 1 / 64000:.1%} | 1 |")
    assert rows["bf16_1000 loss moved.npz"].endswith("| 100.0% | 0 |")
    # the inputs are bfloat16 bits as TensorFlow rounds them
    data = np.load(inputs)
    x = np.random.default_rng(0).standard_normal(1000) * 3
    ours = cvg._to_bits(x, "bfloat16")
    theirs = tf.bitcast(tf.cast(tf.constant(x.astype(np.float32)), tf.bfloat16), tf.int16).numpy()
    np.testing.assert_array_equal(ours, theirs)
    assert data["bf16_1000/logits"].dtype == np.int16
