"""A tiny dense 3->4 model for the tests of interruptions and refusals
(imported as MODULE:NAME by the CLI, and by child processes).

With ``EQUIVTOOL_TEST_READY`` set to a folder, each build of the model (on
either side, in whichever process) writes a file named by its pid there, then
sleeps ``EQUIVTOOL_TEST_SLEEP`` seconds (default 120): a test waits for those
files, with a deadline, to know that a run is under way in each process. With
``EQUIVTOOL_TEST_PAUSE_WITH_FOLDER`` set, only builds made while the check's
temporary folder exists pause.
"""

import os
import tempfile
import time

import tensorflow as tf


def _pause() -> None:
    ready = os.environ.get("EQUIVTOOL_TEST_READY")
    if os.environ.get("EQUIVTOOL_TEST_PAUSE_WITH_FOLDER") and not any(
            name.startswith("equivtool-") for name in os.listdir(tempfile.gettempdir())):
        return  # only once the check's temporary folder exists
    if ready:
        with open(os.path.join(ready, str(os.getpid())), "w"):
            pass
        time.sleep(float(os.environ.get("EQUIVTOOL_TEST_SLEEP", "120")))


def tf1_dense(inputs, training):
    _pause()
    with tf.compat.v1.variable_scope("dense"):
        kernel = tf.compat.v1.get_variable("kernel", [3, 4])
        bias = tf.compat.v1.get_variable("bias", [4], initializer=tf.compat.v1.zeros_initializer())
    return tf.matmul(inputs, kernel) + bias


class Dense(tf.keras.layers.Layer):
    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, inputs, training=None):
        return tf1_dense(inputs, training)


class NeedsUnits(Dense):
    """A layer class whose constructor needs an argument: not a zero-argument factory."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units


def dense_of(units, *, name="dense"):
    """A factory that needs an argument."""
    return Dense(name=name)
