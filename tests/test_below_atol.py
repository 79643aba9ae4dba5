"""Issue 23, item 5: never a pass when nothing compared could differ at the tolerance.

A leaf whose every value on both sides is below ``atol`` in magnitude cannot
show a difference: it is counted (``below_atol``), and a step made only of
such leaves is inconclusive, with a message saying how to make it meaningful.
"""

import numpy as np
import pytest

import equivtool
from equivtool.comparison import Tolerance, compare
from equivtool.report import StepResult

import tensorflow as tf

TOL = Tolerance(rtol=1e-6, atol=1e-5)


def test_leaf_below_atol_is_counted_and_one_above_is_not():
    tiny = np.full((3,), 1.5e-7, np.float32)
    c = compare({"a": tiny, "b": tiny * 100}, {"a": tiny * -1, "b": tiny * 100}, TOL)
    assert c.leaf("a").ok and c.leaf("a").below_atol
    assert c.leaf("b").ok and not c.leaf("b").below_atol  # 1.5e-5 is above atol=1e-5
    big = compare(np.array([2e-5, 0.0], np.float32), np.array([2e-5, 0.0], np.float32), TOL)
    assert big.leaves[0].ok and not big.leaves[0].below_atol  # one value above atol: it counts


def test_integers_and_zero_atol_are_never_below_atol():
    assert not compare(np.zeros(3, np.int32), np.zeros(3, np.int32), TOL).leaves[0].below_atol
    rtol_only = compare(np.full(3, 1e-7), np.full(3, 1e-7), Tolerance(rtol=1e-6, atol=0.0))
    assert rtol_only.leaves[0].ok and not rtol_only.leaves[0].below_atol


def test_step_of_only_below_atol_leaves_is_inconclusive_with_what_to_do():
    tiny = np.full((4,), 1.5e-7, np.float32)
    step = StepResult.from_comparisons("s", "s", [compare(tiny, -tiny, TOL), compare(np.float32(0), np.float32(0),
                                                                                     TOL)])
    assert step.status == "inconclusive"
    assert "below atol=1e-05" in step.message
    for remedy in ("rtol-only", "larger inputs", "fixed weights"):
        assert remedy in step.message
    assert step.data["below_atol_leaves"] == 2


def test_step_with_one_meaningful_leaf_still_passes_and_counts_the_rest():
    tiny = np.full((4,), 1.5e-7, np.float32)
    step = StepResult.from_comparisons("s", "s", [compare(tiny, tiny, TOL), compare(np.ones(3), np.ones(3), TOL)])
    assert step.status == "passed"
    assert step.data["below_atol_leaves"] == 1


def test_json_round_trip_keeps_the_flag():
    tiny = np.full((2,), 1e-8)
    leaf = compare(tiny, tiny, TOL).leaves[0]
    assert type(leaf).from_dict(leaf.to_dict()).below_atol


# -- end to end: the planted fault of the issue ----------------------------------

SCALE = 1e-6  # inputs this small keep every activation far below atol=1e-5


def _tf1_fn(inputs, training):
    x = tf.compat.v1.layers.dense(inputs, 4, activation=tf.nn.relu, name="d")
    return {"out": x}


class _Faulty(tf.keras.layers.Layer):
    """The same layer with the activation changed (the planted fault)."""

    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, inputs, training=None):
        return {"out": tf.compat.v1.layers.dense(inputs, 4, activation=tf.nn.tanh, name="d")}


def test_planted_activation_fault_below_atol_is_not_a_pass():
    inputs = np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32) * SCALE
    report = equivtool.check_equivalence(_tf1_fn, _Faulty, inputs, steps=["random"], modes=["num_random_ops"],
                                         tolerance=TOL)
    step = report.step("random/num_random_ops/inference")
    assert step.status == "inconclusive", str(report)  # today's code: "passed"
    assert not report.passed
    # the same fault is caught with an rtol-only tolerance
    strict = equivtool.check_equivalence(_tf1_fn, _Faulty, inputs, steps=["random"], modes=["num_random_ops"],
                                         tolerance=Tolerance(rtol=1e-4, atol=0.0))
    assert strict.step("random/num_random_ops/inference").status == "failed"
