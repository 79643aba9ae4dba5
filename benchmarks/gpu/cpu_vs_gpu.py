"""How far the op's CPU and GPU kernels are from giving the same bits (issue 39, part 4).

Two halves, on two machines::

    python benchmarks/gpu/cpu_vs_gpu.py inputs cases.npz            # anywhere
    python benchmarks/gpu/xent_gpu.py dump --inputs cases.npz ...  # on the GPU
    python benchmarks/gpu/cpu_vs_gpu.py compare cases.npz gpu_outputs.npz [more.npz]

``inputs`` draws the cases (seeded NumPy: the same file everywhere); the GPU
half writes the kernels' outputs as raw bits; ``compare`` runs the op's CPU
kernels (``equivtool.ops``, through TensorFlow) on the same inputs and says,
per case and output, which share of the values is bitwise equal and the
largest distance in units in the last place. Nothing here is a pass/fail
check: the two devices reduce a row in different orders today (the CPU in 16
lanes, the GPU in its thread tree) and with different exponentials.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

CASES = (  # name, rows, classes, dtype
    ("f32_1000", 64, 1000, "float32"),
    ("f32_32000", 16, 32000, "float32"),
    ("f32_100000", 4, 100000, "float32"),
    ("bf16_1000", 64, 1000, "bfloat16"),
    ("bf16_32000", 16, 32000, "bfloat16"),
    ("f64_1000", 16, 1000, "float64"),
)

_BITS = {"float32": np.int32, "float64": np.int64, "bfloat16": np.int16, "float16": np.int16}


def _to_bits(values: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values rounded to `dtype`, as that type's raw bits (bfloat16 by
    round-to-nearest-even from float32)."""
    if dtype == "bfloat16":
        f = values.astype(np.float32).view(np.uint32).astype(np.uint64)
        rounded = (f + 0x7FFF + ((f >> 16) & 1)) >> 16
        return rounded.astype(np.uint16).view(np.int16)
    if dtype == "float16":
        return values.astype(np.float16).view(np.int16)
    return values.astype(dtype).view(_BITS[dtype])


def make_inputs(path: str, seed: int = 39) -> None:
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, rows, classes, dtype in CASES:
        arrays[f"{name}/dtype"] = np.array(dtype)
        x = rng.standard_normal((rows, classes)) * 3.0
        g = rng.random(rows) + 0.5
        if dtype in ("float32", "float64"):
            arrays[f"{name}/logits"] = x.astype(dtype)
            arrays[f"{name}/grad_loss"] = g.astype(dtype)
        else:
            arrays[f"{name}/logits"] = _to_bits(x, dtype)
            arrays[f"{name}/grad_loss"] = _to_bits(g, dtype)
        arrays[f"{name}/labels"] = rng.integers(0, classes, rows).astype(np.int64)
    np.savez_compressed(path, **arrays)


def _cpu_outputs(inputs) -> dict:
    import equivtool  # noqa: F401  (before TensorFlow)
    import tensorflow as tf

    from equivtool import ops

    out = {}
    for name, _rows, _classes, dtype in CASES:
        tf_dtype = getattr(tf, dtype)
        raw = inputs[f"{name}/logits"]
        g_raw = inputs[f"{name}/grad_loss"]
        if dtype in ("float16", "bfloat16"):
            x = tf.bitcast(tf.constant(raw), tf_dtype)
            g = tf.bitcast(tf.constant(g_raw), tf_dtype)
        else:
            x, g = tf.constant(raw), tf.constant(g_raw)
        labels = tf.constant(inputs[f"{name}/labels"])
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = ops.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=x)
        dx = tape.gradient(loss, x, output_gradients=g)
        bits = {2: tf.int16, 4: tf.int32, 8: tf.int64}[tf_dtype.size]
        out[f"{name}/loss"] = tf.bitcast(loss, bits).numpy()
        out[f"{name}/dlogits"] = tf.bitcast(dx, bits).numpy()
    return out


def _ordered(bits: np.ndarray) -> np.ndarray:
    """Raw float bits as integers whose order is the floats' (for ulp distances)."""
    b = bits.astype(np.int64)
    width = bits.dtype.itemsize * 8
    magnitude = np.int64((1 << (width - 1)) - 1)
    return np.where(b < 0, -(b & magnitude), b)


def compare(inputs_path: str, gpu_paths: list[str]) -> str:
    inputs = np.load(inputs_path)
    cpu = _cpu_outputs(inputs)
    lines = ["| case | output | GPU file | bitwise equal | largest distance (ulp) |",
             "|---|---|---|---:|---:|"]
    for path in gpu_paths:
        gpu = np.load(path)
        for name, *_ in CASES:
            for what in ("loss", "dlogits"):
                a, b = cpu[f"{name}/{what}"], gpu[f"{name}/{what}"]
                if a.shape != b.shape:
                    raise SystemExit(f"{path}: {name}/{what} has shape {b.shape}, the CPU's {a.shape}")
                equal = float(np.mean(a == b))
                ulps = int(np.max(np.abs(_ordered(a) - _ordered(b)))) if a.size else 0
                lines.append(f"| {name} | {what} | {path.rsplit('/', 1)[-1]} | {equal:.1%} | {ulps} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_in = sub.add_parser("inputs", help="write the cases' inputs")
    p_in.add_argument("path")
    p_cmp = sub.add_parser("compare", help="the CPU op's bits against GPU outputs")
    p_cmp.add_argument("inputs")
    p_cmp.add_argument("gpu", nargs="+")
    args = parser.parse_args(argv)
    if args.cmd == "inputs":
        make_inputs(args.path)
        print(f"wrote {args.path}")
    else:
        print(compare(args.inputs, args.gpu))
    return 0


if __name__ == "__main__":
    sys.exit(main())
