"""equivtool.determinism's report: bitwise differences, text, JSON and HTML."""

from __future__ import annotations

import json

import equivtool  # noqa: F401  (must come before tensorflow)

import numpy as np
import pytest
import tensorflow as tf

from equivtool import audit_determinism
from determinism_support import _noisy_step, no_global_seed  # noqa: F401  (fixtures)


def test_signed_zero_is_a_bitwise_difference():
    values = iter([0.0, -0.0])
    report = audit_determinism(lambda: np.float32(next(values)), runs=2)
    assert not report.reproducible
    (diff,) = report.differing
    assert diff.mismatched == 1 and diff.max_abs == 0.0
    assert "different bits" in diff.worst.note


def test_report_text_and_json_name_differences_and_causes(no_global_seed):
    w = tf.Variable(tf.ones([4]))
    report = audit_determinism(_noisy_step(w), runs=2)
    text = str(report)
    assert "NOT REPRODUCIBLE" in text and "unseeded_random_op" in text and "variables/Variable" in text
    data = json.loads(report.to_json())
    assert data["reproducible"] is False and data["passed"] is False
    assert data["causes"][0]["kind"] == "unseeded_random_op"
    assert [d["name"] for d in data["differing"]] == ["outputs/loss", "variables/Variable"]
    with pytest.raises(AssertionError, match="NOT REPRODUCIBLE"):
        report.raise_for_failure()


