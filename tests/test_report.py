"""equivtool.report: StepResult and EquivalenceReport, and their three renderers."""

from __future__ import annotations

import base64
import json
import math
import re

import numpy as np
import pytest

from equivtool.comparison import Tolerance, compare
from equivtool.report import EquivalenceReport, StepResult


def _endpoints(perturb: dict[str, float]) -> tuple[dict, dict]:
    names = ["Conv2d_1a_3x3", "Conv2d_2a_3x3", "Mixed_5b", "Mixed_6a", "Logits"]
    rng = np.random.default_rng(0)
    expected = {n: rng.normal(size=(1, 4, 4, 3)).astype(np.float32) for n in names}
    actual = {n: v + np.float32(perturb.get(n, 0.0)) for n, v in expected.items()}
    return expected, actual


def _failing_step() -> StepResult:
    expected, actual = _endpoints({"Mixed_5b": 3e-4, "Logits": 1e-2})
    return StepResult.from_comparisons(
        "fixed_weights", "Fixed weights, forward pass", [compare(expected, actual, name="end_points")], seconds=3.1
    )


def _passing_step(name: str = "parity") -> StepResult:
    expected, actual = _endpoints({})
    return StepResult.from_comparisons(name, "Variable parity", compare(expected, actual, name="variables"), seconds=0.4)


def _report(*steps: StepResult) -> EquivalenceReport:
    return EquivalenceReport(steps, meta={"model": "tiny", "tensorflow": "2.21.0", "input_shape": (1, 4, 4, 3)})


def _strict_loads(text: str):
    def reject(token):
        raise ValueError(f"non-strict JSON token {token}")

    return json.loads(text, parse_constant=reject)


# -- StepResult ------------------------------------------------------------------


def test_step_from_comparisons_passes_iff_all_comparisons_ok():
    assert _passing_step().status == "passed"
    assert _failing_step().status == "failed"


def test_step_first_divergence_is_first_failing_leaf_in_forward_order():
    assert _failing_step().first_divergence == "end_points/Mixed_5b"
    assert _passing_step().first_divergence is None


def test_step_first_divergence_spans_comparisons_in_order():
    ok = compare({"a": 1.0}, {"a": 1.0}, name="first")
    bad1 = compare({"b": 1.0}, {"b": 2.0}, name="second")
    bad2 = compare({"c": 1.0}, {"c": 2.0}, name="third")
    step = StepResult.from_comparisons("grads", "Gradients", [ok, bad1, bad2])
    assert step.first_divergence == "second/b"


def test_step_failed_message_names_failing_leaves():
    assert _failing_step().message == "2 of 5 leaves differ; first divergence: end_points/Mixed_5b"


def test_step_with_nothing_compared_is_inconclusive_not_passed():
    for comparisons in ([], [compare({}, {}, name="gradients")]):
        step = StepResult.from_comparisons("grads", "Gradients", comparisons)
        assert step.status == "inconclusive" and not step.passed and "nothing" in step.message
        assert not _report(_passing_step(), step).passed


# -- three outcomes --------------------------------------------------------------------


def _inconclusive_step() -> StepResult:
    """A constant regularization loss compares equal; the gradients are all NaN on both sides."""
    nan = np.full([2, 3], np.nan, np.float32)
    return StepResult.from_comparisons("gradients", "Gradients", [
        compare([np.float32(0.0)], [np.float32(0.0)], name="regularization_losses"),
        compare({"w": nan}, {"w": nan.copy()}, name="gradients")], seconds=0.2)


def test_a_step_with_an_inconclusive_leaf_is_inconclusive_even_when_other_leaves_passed():
    step = _inconclusive_step()
    assert step.status == "inconclusive" and not step.passed and not step.failed
    assert "gradients/w" in step.message and "non-finite" in step.message
    assert "6 NaN" in step.message


def test_zero_size_outputs_make_the_step_and_the_report_inconclusive():
    # the dense*5+1 against dense on a [0, 4] batch: both sides produce [0, 3]
    empty = np.zeros([0, 3], np.float32)
    step = StepResult.from_comparisons("fixed_weights", "Fixed weights", compare(empty, empty * 5 + 1, name="outputs"))
    assert step.status == "inconclusive" and "zero-size" in step.message
    report = _report(_passing_step(), step)
    assert not report.passed and report.inconclusive_steps == (step,)
    assert report.verdict().startswith("Verdict: INCONCLUSIVE") and "fixed_weights" in report.verdict()
    with pytest.raises(AssertionError, match="INCONCLUSIVE"):
        report.raise_for_failure()


def test_failure_wins_over_inconclusive_in_the_verdict():
    report = _report(_inconclusive_step(), _failing_step())
    assert "NOT EQUIVALENT" in report.verdict() and not report.passed


def test_text_json_and_html_show_compared_counts_and_why_inconclusive(tmp_path):
    report = _report(_passing_step(), _inconclusive_step())
    text = str(report)
    assert re.search(r"gradients\s+INCONCLUSIVE\s+0\.20s\s+0\s+gradients/w: all 6 elements non-finite", text)
    assert "Nothing compared: all 6 elements non-finite on both sides (6 NaN, 0 inf)" in text
    assert "Tolerance(allow_nonfinite=True)" in text
    assert "48 / 48 compared" in str(_passing_step().comparisons[0].leaves[0])
    data = _strict_loads(report.to_json())
    leaves = data["steps"][1]["comparisons"][1]["leaves"]
    assert data["steps"][1]["status"] == "inconclusive" and data["passed"] is False
    assert leaves[0]["compared"] == 0 and leaves[0]["status"] == "inconclusive" and leaves[0]["inconclusive_reason"]
    assert data["steps"][0]["comparisons"][0]["leaves"][0]["compared"] == 48
    assert EquivalenceReport.from_json(report.to_json()).step("gradients").status == "inconclusive"
    page = open(report.to_html(tmp_path / "r.html"), encoding="utf-8").read()
    assert "INCONCLUSIVE" in page and "Inconclusive leaves" in page and "<th>compared</th>" in page
    assert "0 / 6" in page and "48 / 48" in page


# -- structural failures name what differs -------------------------------------------------


def test_a_structural_failure_names_missing_and_extra_keys_and_never_shows_max_abs_err_0():
    expected = {"end_points": {"conv1": np.ones([2, 3], np.float32), "pool1": np.ones([2, 3], np.float32)}}
    actual = {"end_points": {"conv1": np.ones([2, 3], np.float32), "pool_1": np.ones([2, 3], np.float32)}}
    step = StepResult.from_comparisons("fixed_weights", "Fixed weights", compare(expected, actual, name="outputs"))
    assert step.status == "failed"
    assert "missing: outputs/end_points/pool1" in step.message
    assert "extra: outputs/end_points/pool_1" in step.message
    row = next(line for line in _report(step).table().splitlines() if line.startswith("fixed_weights"))
    assert re.search(r"FAILED\s+0\.00s\s+-\s+missing: outputs/end_points/pool1", row), row


@pytest.mark.parametrize("expected, actual, fragment", [
    (np.ones([2, 1], np.float32), np.ones([1, 2], np.float32), "shape: y (2, 1) vs (1, 2)"),
    (np.ones([2], np.float32), np.ones([2], np.float64), "dtype: y float32 vs float64"),
    ([np.ones(2)], (np.ones(2), np.ones(2)), "extra: y/1"),
    ({"a": np.ones(2)}, [np.ones(2)], "structure: y"),
])
def test_shape_dtype_and_structure_failures_are_named_in_the_table(expected, actual, fragment):
    step = StepResult.from_comparisons("s", "S", compare(expected, actual, name="y"))
    row = _report(step).table().splitlines()[2]
    assert step.status == "failed" and fragment in row, row
    assert not re.search(r"FAILED\s+\S+\s+0\s", row), row


def test_a_value_failure_keeps_its_max_abs_err():
    row = _report(_failing_step()).table().splitlines()[2]
    assert re.search(r"FAILED\s+3\.10s\s+0\.01\s+end_points/Mixed_5b", row)


# -- files: atomic, never through a symlink --------------------------------------------------


def test_json_and_html_are_written_atomically_through_a_temporary_file_in_the_same_folder(tmp_path, monkeypatch):
    import os as _os
    renames = []
    real_replace = _os.replace

    def spy(src, dst):
        renames.append((str(src), str(dst)))
        assert _os.path.dirname(str(src)) == _os.path.dirname(str(dst))
        assert not _os.path.exists(dst) or open(dst).read() == "old"  # destination untouched until the rename
        return real_replace(src, dst)

    monkeypatch.setattr("equivtool._base.render.os.replace", spy)
    report = _report(_passing_step(), _failing_step())
    for name, write in (("r.json", report.to_json), ("r.html", report.to_html)):
        target = tmp_path / name
        target.write_text("old")
        write(target)
        assert renames[-1][1] == str(target) and target.read_text() != "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "r.json"]  # no temporary file left


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "r.json"
    target.write_text("old")

    def boom(*args):
        raise OSError("disk full")

    monkeypatch.setattr("equivtool._base.render.os.replace", boom)
    with pytest.raises(OSError, match="disk full"):
        _report(_passing_step()).to_json(target)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_reports_never_write_through_a_symlink_at_the_destination(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    report = _report(_passing_step())
    for name, write in (("r.json", report.to_json), ("r.html", report.to_html)):
        link = tmp_path / name
        link.symlink_to(victim)
        write(link)
        assert victim.read_text() == "precious"
        assert not link.is_symlink() and link.read_text().startswith(("{", "<!DOCTYPE"))


def test_step_rejects_unknown_status():
    with pytest.raises(ValueError, match="status"):
        StepResult("x", "X", "ok", 0.0)


def test_step_rejects_negative_seconds():
    with pytest.raises(ValueError, match="seconds"):
        StepResult("x", "X", "passed", -1.0)


def test_step_from_exception_keeps_message_and_traceback():
    try:
        raise RuntimeError("graph blew up")
    except RuntimeError as exc:
        step = StepResult.from_exception("training", "Training", exc, seconds=1.0)
    assert step.status == "error" and step.message == "RuntimeError: graph blew up"
    assert "raise RuntimeError" in step.data["traceback"]


def test_step_data_is_read_only():
    step = StepResult("x", "X", "passed", 0.0, data={"k": 1})
    with pytest.raises(TypeError):
        step.data["k"] = 2


# -- EquivalenceReport: verdict -------------------------------------------------------


def test_report_passes_with_a_passed_step_and_no_failures():
    report = _report(_passing_step(), StepResult.skipped("gpu", "GPU run", "no GPU"))
    assert report.passed and report.failed_steps == ()


def test_report_fails_with_a_failed_or_error_step():
    error = StepResult("training", "Training", "error", 1.0, message="boom")
    report = _report(_passing_step(), _failing_step(), error)
    assert not report.passed
    assert [s.name for s in report.failed_steps] == ["fixed_weights", "training"]


def test_report_with_only_skipped_steps_does_not_pass():
    report = _report(StepResult.skipped("gpu", "GPU run", "no GPU"))
    assert not report.passed and "INCONCLUSIVE" in str(report)


# -- text ------------------------------------------------------------------------------


def test_report_table_lists_step_names_status_time_error_and_divergence():
    skipped = StepResult.skipped("random_constant/inference", "Random weights", "needs a GPU")
    text = str(_report(_passing_step("variables_once"), _failing_step(), skipped))
    rows = {line.split()[0]: line for line in text.splitlines() if line.split()}
    assert re.search(r"passed\s+0\.40s\s+0\b", rows["variables_once"])
    assert re.search(r"FAILED\s+3\.10s\s+0\.01\s+end_points/Mixed_5b$", rows["fixed_weights"])
    assert re.search(r"skipped\s+0\.00s\s+-\s+needs a GPU$", rows["random_constant/inference"])


def test_report_table_columns_are_aligned():
    table = _report(_passing_step("a"), _failing_step()).table().splitlines()
    status_columns = {line.index(word) for line, word in zip(table[2:], ["passed", "FAILED"])}
    assert len(status_columns) == 1
    assert table[0].index("status") == status_columns.pop()


def test_report_text_has_verdict_and_failing_step_details_only():
    text = str(_report(_passing_step(), _failing_step()))
    assert "Verdict: NOT EQUIVALENT" in text and "failing: fixed_weights" in text
    assert "== fixed_weights: Fixed weights, forward pass (FAILED, 3.10s) ==" in text
    assert "'end_points/Mixed_5b': NOT close" in text
    assert "== parity" not in text


def test_report_text_shows_meta():
    assert "model: tiny" in str(_report(_passing_step()))


def test_raise_for_failure_raises_with_the_table():
    with pytest.raises(AssertionError, match=r"(?s)step\s+status.*fixed_weights\s+FAILED"):
        _report(_failing_step()).raise_for_failure()


def test_raise_for_failure_returns_the_report_on_pass():
    report = _report(_passing_step())
    assert report.raise_for_failure() is report


# -- JSON --------------------------------------------------------------------------


def test_json_is_strict_with_non_finite_values_as_strings():
    comparison = compare({"a": np.array([np.nan, 1.0]), "z": 0.0}, {"a": np.array([1.0, 1.0]), "z": 1.0})
    step = StepResult.from_comparisons("s", "S", comparison, data={"ratio": math.inf, "arr": np.arange(2)})
    report = EquivalenceReport((step,), meta={"x": math.nan})
    parsed = _strict_loads(report.to_json())
    assert parsed["meta"]["x"] == "nan"
    assert parsed["steps"][0]["data"] == {"ratio": "inf", "arr": [0, 1]}
    assert parsed["steps"][0]["comparisons"][0]["leaves"][1]["max_rel"] == "inf"
    assert parsed["passed"] is False


def test_json_keys_are_stable_and_leaves_keep_forward_order():
    parsed = _strict_loads(_report(_failing_step()).to_json())
    assert list(parsed) == ["passed", "verdict", "meta", "steps"]
    names = [leaf["name"] for leaf in parsed["steps"][0]["comparisons"][0]["leaves"]]
    assert names == [f"end_points/{n}" for n in ["Conv2d_1a_3x3", "Conv2d_2a_3x3", "Mixed_5b", "Mixed_6a", "Logits"]]


def test_json_round_trip_rebuilds_the_report(tmp_path):
    report = _report(_passing_step(), _failing_step(), StepResult.skipped("gpu", "GPU", "no GPU"))
    path = tmp_path / "report.json"
    text = report.to_json(path)
    assert _strict_loads(path.read_text()) == _strict_loads(text)
    rebuilt = EquivalenceReport.from_json(path)
    assert str(rebuilt) == str(report)
    assert rebuilt.steps[1].comparisons[0].leaves[2] == report.steps[1].comparisons[0].leaves[2]


# -- HTML --------------------------------------------------------------------------


def test_html_is_written_self_contained_with_a_png_plot(tmp_path):
    path = _report(_passing_step(), _failing_step()).to_html(tmp_path / "report.html")
    document = open(path, encoding="utf-8").read()
    assert document.startswith("<!DOCTYPE html>")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", document)
    assert "<link" not in document and "<script" not in document
    images = re.findall(r'<img [^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"', document)
    assert len(images) == 2  # one per step that compared several leaves
    assert base64.b64decode(images[0]).startswith(b"\x89PNG")


def test_html_escapes_step_text(tmp_path):
    step = StepResult("training", "Training <b>", "error", 0.1, message="ValueError: <script>alert(1)</script>")
    document = open(_report(step).to_html(tmp_path / "r.html"), encoding="utf-8").read()
    assert "<script>" not in document and "<b>" not in document
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in document


def test_html_shows_summary_verdict_and_failing_leaf(tmp_path):
    document = open(_report(_failing_step()).to_html(tmp_path / "r.html"), encoding="utf-8").read()
    assert "Verdict: NOT EQUIVALENT" in document
    assert "end_points/Mixed_5b" in document and "FAILED" in document


def test_html_plot_handles_exact_zero_errors_and_per_leaf_atol(tmp_path):
    expected = {"a": np.zeros(2), "b": np.zeros(2), "c": np.zeros(2)}
    actual = {"a": np.zeros(2), "b": np.full(2, 1e-3), "c": np.full(2, np.nan)}
    comparison = compare(expected, actual, {"b": Tolerance(atol=1e-2), "*": Tolerance.exact()})
    path = _report(StepResult.from_comparisons("s", "S", comparison)).to_html(tmp_path / "r.html")
    assert "data:image/png;base64," in open(path, encoding="utf-8").read()


def test_report_header_wraps_metadata_into_short_lines():
    meta = {f"key_{i}": "v" * 30 for i in range(8)}
    report = EquivalenceReport((StepResult("parity", "Parity", "passed", 0.1),), meta)
    lines = str(report).splitlines()
    assert lines[0] == "Equivalence report"
    header = lines[1:lines.index(next(l for l in lines if l.startswith("step")))]
    assert len(header) >= 3 and all(len(line) <= 100 and line.startswith("  ") for line in header)
    assert all(f"key_{i}: " in "\n".join(header) for i in range(8))
