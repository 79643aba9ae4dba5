"""Issue 23, items 3 and 8: each distinct error once in the text report (the
tracebacks stay in JSON and HTML), and ``report.verdict`` as an attribute."""

import json

from equivtool.report import EquivalenceReport, StepResult

TB = 'Traceback (most recent call last):\n  File "/x/model.py", line 3, in call\nAttributeError: boom\n'


def _error(name, message="AttributeError: boom (at /x/model.py:3 in call)", tb=TB):
    return StepResult(name, name, "error", 0.1, message=message, data={"traceback": tb})


def _report():
    steps = [_error(f"s{i}") for i in range(8)] + [_error("other", "ValueError: else (at /x/m.py:9 in f)")]
    steps.insert(2, StepResult("ok", "ok", "passed", 0.0))
    return EquivalenceReport(tuple(steps), {"tensorflow": "x"})


def test_one_root_cause_is_printed_once_with_the_steps_it_broke():
    text = str(_report())
    # once in the table (the first step it broke) and once in its section, not once per step
    assert text.count("AttributeError: boom (at /x/model.py:3 in call)") == 2, text
    assert text.count("the same error as s0") == 7
    assert "== error in 8 steps: s0, s1, s2, s3, s4, s5, s6, s7 ==" in text
    assert "== error in 1 step: other ==" in text
    assert "Traceback (most recent call last)" not in text  # the tracebacks are not in the text ...
    assert text.count("full traceback: in the JSON report") == 2


def test_tracebacks_stay_in_json_and_html(tmp_path):
    report = _report()
    data = json.loads(report.to_json())
    assert sum(s["data"].get("traceback") == TB for s in data["steps"]) == 9  # ... but in JSON, every one
    html = (tmp_path / "r.html")
    report.to_html(html)
    assert "Traceback (most recent call last)" in html.read_text()


def test_a_single_steps_own_text_keeps_its_traceback():
    assert "Traceback (most recent call last)" in str(_error("s0"))


def test_verdict_is_an_attribute_and_still_callable():
    report = _report()
    assert isinstance(report.verdict, str)
    assert report.verdict.startswith("Verdict: NOT EQUIVALENT")
    assert report.verdict() == report.verdict  # the former method form
    assert f"{report.verdict}" == report.verdict() and "bound method" not in f"{report.verdict}"
    assert json.loads(report.to_json())["verdict"] == report.verdict
