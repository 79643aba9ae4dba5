"""Fresh-process helper for tests/test_seeding.py (not a test module).

Builds a native tf-keras ``Dense`` layer three times in eager mode (inside an
equivtool scope, inside no scope, inside the original tool's scope) and prints
a SHA-256 of each kernel as JSON. Python's ``random`` is seeded from the OS in
every new process, so only a scope that fixes tf-keras' seed source gives the
same kernel in two processes.
"""

import hashlib
import json

import equivtool  # noqa: F401  (before TensorFlow: selects legacy Keras)
import tensorflow as tf
import tf_keras

from equivtool import DeterministicRandomTestTool


def kernel_digest(mode: str) -> str:
    layer = tf_keras.layers.Dense(4)
    layer.build((None, 3))
    return hashlib.sha256(layer.kernel.numpy().tobytes()).hexdigest()


def main() -> None:
    results = {}
    for mode in ("constant", "num_random_ops"):
        with DeterministicRandomTestTool(mode=mode).scope():
            results[f"equivtool_{mode}"] = kernel_digest(mode)
    results["no_scope"] = kernel_digest("none")
    with tf.compat.v1.keras.utils.DeterministicRandomTestTool(mode="num_random_ops").scope():
        results["original"] = kernel_digest("original")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
