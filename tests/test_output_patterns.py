"""Issue 23, item 4: ``outputs=`` include/exclude patterns on both sides, and the
note on keys one side collects by scanning its graph."""

import numpy as np
import pytest
import tensorflow as tf

import equivtool
from published_models import shim_of
from equivtool.engine.output_filter import select

X = np.random.default_rng(0).normal(size=(2, 4)).astype(np.float32)
FORWARD = dict(steps=["random"], modes=["constant"])


def scan_net(x, training, fault=False):
    end_points = {}
    with tf.compat.v1.variable_scope("net"):
        y = tf.compat.v1.layers.dense(x, 3, activation=tf.nn.relu if fault else None, name="d")
        end_points["d"] = tf.identity(y, name="d_output")
        if not tf.executing_eagerly():  # end points found by scanning the graph exist in graph mode only
            for op in end_points["d"].graph.get_operations():
                if op.name.endswith("d_output"):
                    end_points["scanned/" + op.name.rsplit("/", 1)[-1]] = op.outputs[0]
        end_points["e"] = tf.compat.v1.layers.dense(y, 2, name="e")
    return end_points


ScanShim = shim_of(scan_net)


def test_select_applies_include_and_exclude_to_both_sides():
    exp = {"a": 1, "b": {"c": 2, "d_output": 3}}
    act = {"a": 1, "b": {"c": 2}}
    assert select(exp, act, "end_points", ["!*d_output"]) == ({"a": 1, "b": {"c": 2}}, {"a": 1, "b": {"c": 2}})
    assert select(exp, act, "end_points", ["end_points/b/*"]) == ({"b": {"c": 2, "d_output": 3}}, {"b": {"c": 2}})
    assert select(exp, act, "end_points", ["nothing"]) is None
    assert select(exp, act, "end_points", ()) == (exp, act)


def test_graph_scanned_keys_fail_eagerly_and_the_message_says_why():
    report = equivtool.check_equivalence(scan_net, ScanShim, X, **FORWARD)
    step = report.step("random/constant/inference")
    assert step.status == "failed" and "missing: end_points/scanned/d_output" in step.message
    note = " ".join(step.notes)
    assert "scanning its graph" in note and "tf_function=True" in note and "outputs=['!*/d_output']" in note


def test_excluding_them_passes_and_a_fault_is_still_caught():
    report = equivtool.check_equivalence(scan_net, ScanShim, X, outputs=["!*/scanned/*"], **FORWARD)
    assert report.passed, str(report)
    assert report.meta["outputs"] == ["!*/scanned/*"]
    names = [leaf.name for leaf in report.step("random/constant/inference").leaves]
    assert "end_points/d" in names and not any("scanned" in n for n in names)
    faulty = equivtool.check_equivalence(scan_net, lambda: ScanShim(fault=True), X, outputs="!*/scanned/*",
                                         **FORWARD)
    assert faulty.step("random/constant/inference").status == "failed"


def test_an_include_pattern_that_matches_nothing_compares_nothing_and_is_not_a_pass():
    report = equivtool.check_equivalence(scan_net, ScanShim, X, outputs=["end_points/none*"], **FORWARD)
    step = report.step("random/constant/inference")
    names = [leaf.name for leaf in step.leaves]
    assert not any(n.startswith("end_points") for n in names)
    # only the regularization loss (0 on both sides, below atol) is left: inconclusive
    assert step.status == "inconclusive" and not report.passed
    # and the report names the pattern that selected nothing (issue 34), in the text too
    assert any("outputs: pattern 'end_points/none*' matches no output leaf" in n for n in step.notes)
    assert "pattern 'end_points/none*' matches no output leaf" in str(report)
    matched = equivtool.check_equivalence(scan_net, ScanShim, X, outputs=["end_points/*"], **FORWARD)
    assert not any("matches no output leaf" in n for s in matched.steps for n in s.notes)


@pytest.mark.parametrize("bad, error, words", [
    (3, TypeError, "outputs: expected a pattern or a sequence of patterns"),
    ([""], ValueError, "outputs: empty pattern"),
    (["!"], ValueError, "outputs: empty pattern"),
])
def test_bad_patterns_are_refused_before_any_work(bad, error, words):
    def never(*_):
        raise AssertionError("ran")
    with pytest.raises(error, match=words):
        equivtool.check_equivalence(never, ScanShim, X, outputs=bad)
