"""Runs check_equivalence with the TF2 side under a tf.distribute strategy.

Run as a separate process (a strategy's devices and cluster must be set up
before TensorFlow initialises its runtime):

    python distributed_worker.py mirrored OUT.json
    TF_CONFIG=... python distributed_worker.py multiworker OUT.json
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import equivtool  # noqa: E402  (before tensorflow)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from small_models import INPUT_SHAPE, SlimNetShim, slim_net  # noqa: E402


def make_strategy(kind: str):
    if kind == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
        return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    if kind == "multiworker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    raise SystemExit(f"unknown strategy kind {kind!r}")


def main(kind: str, out_path: str) -> int:
    strategy = make_strategy(kind)
    inputs = np.random.RandomState(0).rand(*INPUT_SHAPE).astype(np.float32)
    report = equivtool.check_equivalence(
        slim_net, SlimNetShim, inputs, strategy=strategy,
        steps=["variables_once", "parity", "fixed_weights", "random", "gradients", "optimizer"],
        optimizers=(lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
                    lambda: tf.keras.optimizers.SGD(0.1)),
        train_steps=1)
    report.to_json(out_path)
    print(report)
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
