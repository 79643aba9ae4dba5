"""Cost of equivtool's DeterministicRandomTestTool next to tf-keras' original.

Builds the same tf-slim model (9 conv + batch-norm, 4 fully-connected, 6
dropouts: 19 seeded random ops) in a fresh tf.Graph under each tool's scope,
rotating which tool goes first in every round so drift on a shared machine
hits both alike, and prints time(equivtool) / time(original) per mode,
measured as CPU time of this process (robust to other users' load) with the
paired wall-clock ratio beside it. The equivtool trace is on (the default).
Usage:

    .venv/bin/python benchmarks/bench_seeding.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import equivtool  # noqa: E402,F401  (before TensorFlow)
import tensorflow as tf  # noqa: E402
import tf_slim as slim  # noqa: E402
import warnings  # noqa: E402

tf.get_logger().setLevel("ERROR")
warnings.filterwarnings("ignore", category=UserWarning)

from equivtool import DeterministicRandomTestTool  # noqa: E402

OriginalTool = tf.compat.v1.keras.utils.DeterministicRandomTestTool


def slim_model(images):
    with slim.arg_scope([slim.conv2d], normalizer_fn=slim.batch_norm,
                        normalizer_params={"is_training": True}):
        net = images
        for block, depth in enumerate((16, 32, 64)):
            for layer in range(3):
                net = slim.conv2d(net, depth, [3, 3], scope=f"b{block}/conv{layer}")
            net = slim.max_pool2d(net, [2, 2], scope=f"b{block}/pool")
            net = slim.dropout(net, 0.8, is_training=True, scope=f"b{block}/drop")
        net = slim.flatten(net)
        for i in range(3):
            net = slim.fully_connected(
                net, 64, scope=f"fc{i}",
                weights_initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.05))
            net = slim.dropout(net, 0.5, is_training=True, scope=f"fc{i}/drop")
        logits = slim.fully_connected(
            net, 10, activation_fn=None, scope="logits",
            weights_initializer=tf.compat.v1.variance_scaling_initializer())
    return logits


def build_once(make_tool, mode: str) -> tuple[float, float]:
    """(CPU seconds, wall seconds) to build the model in a fresh graph under a scope."""
    gc.collect()
    cpu, wall = time.process_time(), time.perf_counter()
    with tf.Graph().as_default():
        with make_tool(mode=mode).scope():
            slim_model(tf.compat.v1.placeholder(tf.float32, [8, 32, 32, 3]))
    return time.process_time() - cpu, time.perf_counter() - wall


def untraced_tool(seed: int = 42, mode: str = "constant") -> DeterministicRandomTestTool:
    return DeterministicRandomTestTool(seed=seed, mode=mode, record_trace=False)


def measure(mode: str, rounds: int) -> dict:
    """Rotate the tools; CPU time is the headline (other users' load barely moves it)."""
    tools = [DeterministicRandomTestTool, OriginalTool, untraced_tool]
    samples = {make_tool: [] for make_tool in tools}
    for make_tool in tools:  # warm-up
        build_once(make_tool, mode)
    for i in range(rounds):
        for make_tool in tools[i % 3:] + tools[:i % 3]:
            samples[make_tool].append(build_once(make_tool, mode))
    ours, theirs = samples[DeterministicRandomTestTool], samples[OriginalTool]
    tool = DeterministicRandomTestTool(mode=mode)
    with tf.Graph().as_default(), tool.scope():
        slim_model(tf.compat.v1.placeholder(tf.float32, [8, 32, 32, 3]))

    def cpu(values):
        return statistics.median(v[0] for v in values)

    return {
        "traced": len(tool.trace),
        "cpu_ours": cpu(ours),
        "cpu_theirs": cpu(theirs),
        "cpu_ratio": cpu(ours) / cpu(theirs),
        "min_cpu_ratio": min(v[0] for v in ours) / min(v[0] for v in theirs),
        "wall_ratio": statistics.median(a[1] / b[1] for a, b in zip(ours, theirs)),
        "untraced_ratio": cpu(samples[untraced_tool]) / cpu(theirs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    print(f"machine: {platform.platform()}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs visible; Python {platform.python_version()}, "
          f"TensorFlow {tf.__version__}, tf-slim model in tf.Graph, {args.rounds} rotating rounds")
    print(f"{'mode':<16}{'traced ops':>11}{'equivtool cpu s':>16}{'original cpu s':>15}"
          f"{'ratio':>7}{'ratio of mins':>14}{'wall ratio':>11}{'no-trace ratio':>15}")
    worst = 0.0
    for mode in ("constant", "num_random_ops"):
        r = measure(mode, args.rounds)
        worst = max(worst, r["cpu_ratio"])
        print(f"{mode:<16}{r['traced']:>11}{r['cpu_ours']:>16.4f}{r['cpu_theirs']:>15.4f}"
              f"{r['cpu_ratio']:>7.3f}{r['min_cpu_ratio']:>14.3f}{r['wall_ratio']:>11.3f}"
              f"{r['untraced_ratio']:>15.3f}")
    print(f"ratio = median CPU time equivtool / original (trace on); wall ratio = median of "
          f"paired wall-clock ratios, noisy on a shared machine; no-trace = record_trace=False.\nworst ratio: {worst:.3f} "
          f"({'within' if worst <= 1.05 else 'OVER'} the 1.05 budget)")

if __name__ == "__main__":
    main()
