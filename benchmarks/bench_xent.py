"""Benchmark: equivtool's cross-entropy op against TensorFlow's fused op.

One run, same machine, side by side (the machines are shared and noisy):
TensorFlow's ``tf.nn.sparse_softmax_cross_entropy_with_logits`` and
equivtool's, loss only and loss + gradient, at [8192, 1000] and
[1024, 32000] float32 plus one float16 and one bfloat16 shape, and a plain
copy of the logits (NumPy, one thread) as the memory-bandwidth reference.
Each timing is the median of several repeats of a ``tf.function``. Peak
resident memory of one loss-only evaluation at [1024, 32000] is measured in
fresh subprocesses (growth of the process's high-water mark).

    .venv/bin/python benchmarks/bench_xent.py            # print the table
    .venv/bin/python benchmarks/bench_xent.py --write    # and update RESULTS.md

Targets (issue 5): loss + gradient >= 3x faster than TF's op, loss only >= 5x,
loss + gradient within 3x of the copy, loss-only peak memory at least one
B x C buffer below TF's.
"""

from __future__ import annotations

import equivtool  # noqa: F401  (must precede TensorFlow)

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time

import numpy as np
import tensorflow as tf

from equivtool import ops

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "RESULTS.md")
HEADING = "## Cross-entropy op"
SHAPES = [((8192, 1000), "float32"), ((1024, 32000), "float32"),
          ((8192, 1000), "float16"), ((8192, 1000), "bfloat16")]
MEMORY_SHAPE = (1024, 32000)


def _median_ms(fn, repeats: int, inner: int = 3) -> float:
    fn()  # trace and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - start) / inner)
    return 1e3 * float(np.median(times))


def _functions(xent, x, y):
    @tf.function
    def loss_only():
        return tf.reduce_sum(xent(labels=y, logits=x))

    @tf.function
    def loss_and_grad():
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = xent(labels=y, logits=x)
        return loss, tape.gradient(loss, x)

    return loss_only, loss_and_grad


def _time_shape(shape, dtype_name, repeats):
    rng = np.random.default_rng(0)
    dtype = tf.as_dtype(dtype_name)
    x = tf.cast(rng.standard_normal(shape, np.float32) * 3, dtype)
    y = tf.constant(rng.integers(0, shape[1], shape[0]), tf.int32)
    row = {"shape": f"[{shape[0]}, {shape[1]}]", "dtype": dtype_name}
    for who, fn in (("tf", tf.nn.sparse_softmax_cross_entropy_with_logits),
                    ("ours", ops.sparse_softmax_cross_entropy_with_logits)):
        loss_only, loss_and_grad = _functions(fn, x, y)
        row[f"{who}_fwd"] = _median_ms(lambda: loss_only().numpy(), repeats)
        # CPU functions run synchronously; converting the B x C gradient to
        # NumPy would add a copy to both sides, so only the loss is fetched
        row[f"{who}_fwdbwd"] = _median_ms(lambda: loss_and_grad()[0].numpy(), repeats)
    src = x.numpy()
    dst = np.empty_like(src)
    row["copy"] = _median_ms(lambda: np.copyto(dst, src), repeats)
    row["copy_alloc"] = _median_ms(lambda: src.copy(), repeats)  # writes fresh pages, as ops do
    return row


_MEMORY_CHILD = r"""
import equivtool, sys, threading, numpy as np, psutil, tensorflow as tf
from equivtool import ops
B, C = {B}, {C}
# inputs built without large temporaries, so no freed B x C block sits in an
# allocator cache for the op to reuse unseen
rng = np.random.default_rng(0)
host = np.empty((B, C), np.float32)
for i in range(0, B, 64):
    host[i:i + 64] = rng.standard_normal((64, C), np.float32)
x = tf.constant(host)
y = tf.constant(rng.integers(0, C, B, dtype=np.int32))
fn = ops.sparse_softmax_cross_entropy_with_logits if sys.argv[1] == "ours" \
    else tf.nn.sparse_softmax_cross_entropy_with_logits
fn(labels=y[:2], logits=x[:2]).numpy()          # load kernels, warm the allocator
proc = psutil.Process()
before = proc.memory_info().rss
peak, done = [before], threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], proc.memory_info().rss)
sampler = threading.Thread(target=sample)
sampler.start()
for _ in range(3):
    fn(labels=y, logits=x).numpy()
done.set()
sampler.join()
print(peak[0] - before)
"""


def _peak_growth_bytes(who: str) -> int:
    code = _MEMORY_CHILD.format(B=MEMORY_SHAPE[0], C=MEMORY_SHAPE[1])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", code, who], capture_output=True, text=True,
                         env=env, check=True).stdout
    return int(out.strip().splitlines()[-1])


def _machine() -> dict:
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            match = re.search(r"model name\s*:\s*(.+)", f.read())
            cpu = match.group(1).strip() if match else cpu
    except OSError:
        pass
    return {
        "cpu": cpu, "cores": os.cpu_count(), "load": os.getloadavg(),
        "python": platform.python_version(), "tensorflow": tf.__version__,
        "numpy": np.__version__, "op": ops.op_status(),
        "gpu": bool(tf.config.list_physical_devices("GPU")),
    }


def _ratio(a, b):
    return a / b if b else float("nan")


def render(rows, memory, machine) -> str:
    bxc_mib = MEMORY_SHAPE[0] * MEMORY_SHAPE[1] * 4 / 2**20
    lines = [
        HEADING, "",
        f"Measured by `benchmarks/bench_xent.py` on {machine['cpu']} ({machine['cores']} cores, "
        f"shared; load average {machine['load'][0]:.2f} / {machine['load'][1]:.2f} / "
        f"{machine['load'][2]:.2f} at the start), {'with' if machine['gpu'] else 'no'} GPU; "
        f"Python {machine['python']}, TensorFlow {machine['tensorflow']}, NumPy {machine['numpy']}; "
        f"op library built for TF {machine['op']['built_for_tf']} "
        f"(CUDA kernels compiled: {'yes' if machine['op']['cuda'] else 'no'}). CPU timings, "
        "median ms of a `tf.function`; `copy` is a NumPy copy of the logits into a preallocated "
        "array, `copy+alloc` into a new one (fresh pages, like any op's output); one thread.", "",
        "| shape | dtype | TF fwd | ours fwd | fwd speed-up (>= 5x) | TF fwd+bwd | ours fwd+bwd "
        "| fwd+bwd speed-up (>= 3x) | copy | copy+alloc | ours fwd+bwd / copy (<= 3x) "
        "| ours fwd+bwd / copy+alloc |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['dtype']} | {r['tf_fwd']:.2f} | {r['ours_fwd']:.2f} "
            f"| {_ratio(r['tf_fwd'], r['ours_fwd']):.1f}x | {r['tf_fwdbwd']:.2f} "
            f"| {r['ours_fwdbwd']:.2f} | {_ratio(r['tf_fwdbwd'], r['ours_fwdbwd']):.1f}x "
            f"| {r['copy']:.2f} | {r['copy_alloc']:.2f} | {_ratio(r['ours_fwdbwd'], r['copy']):.1f}x "
            f"| {_ratio(r['ours_fwdbwd'], r['copy_alloc']):.1f}x |")
    saved = (memory["tf"] - memory["ours"]) / 2**20
    verdicts = []
    for r in rows:
        if r["dtype"] != "float32":
            continue
        checks = [("loss only >= 5x", _ratio(r["tf_fwd"], r["ours_fwd"]) >= 5),
                  ("fwd+bwd >= 3x", _ratio(r["tf_fwdbwd"], r["ours_fwdbwd"]) >= 3),
                  ("fwd+bwd <= 3x copy", _ratio(r["ours_fwdbwd"], r["copy"]) <= 3)]
        missed = [name for name, ok in checks if not ok]
        verdicts.append(f"{r['shape']}: " + ("all met" if not missed else "missed " + ", ".join(missed)))
    verdicts.append("memory: " + ("met" if saved >= bxc_mib * 0.95 else "missed"))
    lines += ["", "Targets (float32): " + "; ".join(verdicts) + "."]
    lines += [
        "",
        f"Peak resident memory growth (RSS sampled continuously, above the RSS "
        f"with the inputs in place) of a loss-only evaluation at "
        f"[{MEMORY_SHAPE[0]}, {MEMORY_SHAPE[1]}] float32 (fresh process each): TF "
        f"{memory['tf'] / 2**20:.1f} MiB, ours {memory['ours'] / 2**20:.1f} MiB: "
        f"{saved:.1f} MiB less (one B x C buffer is {bxc_mib:.1f} MiB).", "",
    ]
    return "\n".join(lines)


def write_section(text: str, path: str = RESULTS) -> None:
    """Replace (or append) the cross-entropy section; other sections stay."""
    old = open(path).read() if os.path.exists(path) else "# Benchmark results\n"
    pattern = re.compile(rf"^{re.escape(HEADING)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(old):
        new = pattern.sub(lambda _: text + "\n", old)
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    with open(path, "w") as f:
        f.write(new)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="also print the raw numbers")
    args = parser.parse_args(argv)
    machine = _machine()
    rows = [_time_shape(shape, dtype, args.repeats) for shape, dtype in SHAPES]
    memory = {who: _peak_growth_bytes(who) for who in ("tf", "ours")}
    text = render(rows, memory, machine)
    print(text)
    if args.json:
        print(json.dumps({"rows": rows, "memory": memory}, indent=1))
    if args.write:
        write_section(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
