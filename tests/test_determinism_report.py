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




@pytest.mark.parametrize("fn", [lambda: None, lambda: {}, lambda: np.zeros([0, 3], np.float32)])
def test_a_step_that_returns_nothing_to_compare_is_inconclusive_not_reproducible(fn):
    report = audit_determinism(fn, runs=2, variables=[])
    assert report.reproducible and not report.passed
    assert report.verdict().startswith("Verdict: INCONCLUSIVE")
    with pytest.raises(AssertionError, match="INCONCLUSIVE"):
        report.raise_for_failure()


def test_matching_nan_and_inf_outputs_are_reproducible_but_nan_payloads_are_checked():
    values = np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)
    report = audit_determinism(lambda: values, runs=2, variables=[])
    assert report.passed, str(report)
    payloads = iter([np.array([np.nan], np.float32), np.array([0x7FC00001], np.uint32).view(np.float32)])
    report = audit_determinism(lambda: next(payloads), runs=2, variables=[])
    assert not report.reproducible and "different bits" in report.differing[0].worst.note


def test_json_and_html_are_written_atomically_and_never_through_a_symlink(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    report = audit_determinism(lambda: tf.constant([1.0]), runs=2, variables=[])
    for name, write in (("a.json", report.to_json), ("a.html", report.to_html)):
        link = tmp_path / name
        link.symlink_to(victim)
        write(link)
        assert victim.read_text() == "precious" and not link.is_symlink()
        assert link.read_text().startswith(("{", "<!DOCTYPE"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.html", "a.json", "victim.txt"]


def test_sparse_gradients_are_named_in_text_json_and_html(tmp_path):
    table = tf.Variable(tf.ones([5, 2]), name="table")
    optimizer = tf.keras.optimizers.Adam(0.1)
    ids = tf.constant([1, 3, 1])

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(table, ids))
        grad = tape.gradient(loss, table)
        optimizer.apply_gradients([(grad, table)])
        return [loss, grad]

    report = audit_determinism(tf.function(step), runs=2)
    assert report.passed, str(report)
    assert report.sparse_outputs == ("outputs/1",)
    # Adam scatters the sparse gradient into its slots m and v; the table itself gets a dense update
    assert report.sparse_updates == ("variables/Adam/m/table by ResourceScatterAdd",
                                     "variables/Adam/v/table by ResourceScatterAdd"), report.sparse_updates
    note = report.sparse_note
    assert note.startswith("sparse gradients returned as tf.IndexedSlices and compared densely: outputs/1;")
    assert f"note: {note}" in str(report)
    data = json.loads(report.to_json())
    assert data["sparse_outputs"] == ["outputs/1"] and data["sparse_note"] == note
    assert data["sparse_updates"] == list(report.sparse_updates)
    report.to_html(tmp_path / "r.html")
    html = (tmp_path / "r.html").read_text()
    assert "outputs/1; applied sparsely to: variables/Adam/m/table by ResourceScatterAdd" in html


def test_a_sparse_update_of_a_variable_outside_the_audit_says_so():
    table = tf.Variable(tf.ones([4, 2]))

    def step():
        table.scatter_sub(tf.IndexedSlices(tf.ones([1, 2]), tf.constant([2]), tf.constant([4, 2])))
        return tf.constant(1.0)

    try:
        report = audit_determinism(step, runs=2, variables=[])
        assert report.sparse_updates == ("a variable not among the audited ones by ResourceScatterSub",)
    finally:
        table.assign(tf.ones([4, 2]))
    dense = audit_determinism(lambda: tf.constant(1.0), runs=2, variables=[])
    assert dense.sparse_updates == () and dense.sparse_note is None and "sparse_note" in dense.to_dict()
