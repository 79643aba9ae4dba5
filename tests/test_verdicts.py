"""End to end through check_equivalence: a verdict of EQUIVALENT is never given for nothing (issue 11).

The model pair from the issue: the TF1 side computes ``dense(x) * 5 + 1``, the
TF2 side ``dense(x)``. They are plainly different, yet on inputs that make
every output non-finite nothing that could differ is compared.
"""

from __future__ import annotations

import equivtool  # noqa: F401  (must come before tensorflow)

import numpy as np
import pytest
import tensorflow as tf

from equivtool import check_equivalence
from equivtool.testing import assert_equivalent

STEPS = ["fixed_weights", "gradients"]


def f1_bad(x, training):
    return tf.compat.v1.layers.dense(x, 3, name="d") * 5.0 + 1.0


def f1_good(x, training):
    return tf.compat.v1.layers.dense(x, 3, name="d")


class Dense(tf.keras.layers.Layer):
    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, x, training=None):
        return tf.compat.v1.layers.dense(x, 3, name="d")


def _one_nan_per_row():
    x = np.ones([2, 4], np.float32)
    x[0, 1] = x[1, 2] = np.nan
    return x


@pytest.mark.parametrize("inputs", [
    np.full([2, 4], np.nan, np.float32),
    np.full([2, 4], np.inf, np.float32),
    _one_nan_per_row(),
], ids=["all-nan", "all-inf", "one-nan-per-row"])
def test_different_models_on_non_finite_inputs_are_not_equivalent(inputs):
    report = check_equivalence(f1_bad, Dense, inputs, steps=STEPS)
    assert not report.passed
    assert report.step("fixed_weights").status == "inconclusive"
    assert report.step("gradients").status == "inconclusive"
    assert "non-finite" in report.step("gradients").message
    assert report.verdict().startswith("Verdict: INCONCLUSIVE")
    with pytest.raises(AssertionError, match="INCONCLUSIVE"):
        report.raise_for_failure()


def test_one_nan_in_the_batch_leaves_gradients_inconclusive_not_passed_with_max_abs_err_0():
    x = np.ones([2, 4], np.float32)
    x[0, 1] = np.nan
    report = check_equivalence(f1_bad, Dense, x, steps=STEPS)
    assert report.step("fixed_weights").status == "failed"
    gradients = report.step("gradients")
    assert gradients.status == "inconclusive" and gradients.error_cell() == "-"
    assert not report.passed


def test_assert_equivalent_treats_inconclusive_as_not_passing():
    with pytest.raises(AssertionError, match="INCONCLUSIVE"):
        assert_equivalent(f1_good, Dense, np.full([2, 4], np.nan, np.float32), steps=STEPS)
    # the same pair on finite inputs passes: the refusal above is about the inputs
    assert assert_equivalent(f1_good, Dense, np.ones([2, 4], np.float32), steps=STEPS).passed


def test_a_legitimately_non_finite_output_opts_out_per_leaf():
    def tf1_mask(x, training):
        return {"logits": tf.compat.v1.layers.dense(x, 3, name="d"), "mask": tf.fill([2, 3], -np.inf)}

    class Mask(tf.keras.layers.Layer):
        @tf.compat.v1.keras.utils.track_tf1_style_variables
        def call(self, x, training=None):
            return {"logits": tf.compat.v1.layers.dense(x, 3, name="d"), "mask": tf.fill([2, 3], -np.inf)}

    x = np.ones([2, 4], np.float32)
    strict = check_equivalence(tf1_mask, Mask, x, steps=["fixed_weights"])
    assert strict.step("fixed_weights").status == "inconclusive"
    tol = {"fixed_weights": {"mask": equivtool.Tolerance(allow_nonfinite=True)}}
    allowed = check_equivalence(tf1_mask, Mask, x, steps=["fixed_weights"], step_tolerances=tol)
    assert allowed.passed, str(allowed)
