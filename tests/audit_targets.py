"""Targets for `equivtool audit` tests (imported as MODULE:FN)."""

import equivtool  # noqa: F401
import tensorflow as tf

counter = tf.Variable(tf.zeros([3]), name="counter")


def reproducible_step():
    """Updates a variable; the audit restores it between runs, so runs agree."""
    counter.assign_add(tf.ones([3]))
    return {"counter": counter.read_value() * 2.0}


def unseeded_step():
    """Draws from an unseeded random op: differs from run to run."""
    return {"noise": tf.random.uniform([4])}
