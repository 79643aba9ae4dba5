"""The README's one example runs as written, passes, and prints the report the README shows.

The README shows the example's real output; the timings and the machine line
vary from run to run, so the shown report is compared with a fresh one by
what does not: the header's fields, every step's name and status, and the
verdict. (``tests/test_docs.py`` runs the README's blocks with the rest of the
documentation.)
"""

import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme() -> str:
    with open(os.path.join(REPO, "README.md")) as handle:
        return handle.read()


def python_blocks():
    return re.findall(r"```python\n(.*?)```", readme(), re.S)


def shown_report() -> str:
    """The ```text block after the example: the report as the README shows it."""
    return re.search(r"It prints[^\n]*\n\n```text\n(.*?)```", readme(), re.S).group(1)


def report_shape(text: str) -> dict:
    """What a report's text says that does not vary between runs."""
    lines = text.splitlines()
    start = lines.index("Equivalence report")
    rule = next(i for i, line in enumerate(lines) if line.startswith("-----"))
    # the header's fields: its lines up to the table (a wrapped line goes on indented deeper)
    header = [re.findall(r"(?:^|\s)([a-z_ ]+?): ", line)[0].strip() for line in lines[start + 1:rule - 1]
              if line.startswith("  ") and not line.startswith("   ")]
    end = next(i for i, line in enumerate(lines) if line.startswith("Verdict:"))
    steps = [tuple(line.split()[:2]) for line in lines[rule + 1:end] if line]
    verdict = [line for line in lines if line.startswith("Verdict:")]
    coverage = [line for line in lines if line.startswith("coverage:")]  # the ledger's summary
    return {"header": header, "steps": steps, "verdict": verdict, "coverage": coverage}


def test_readme_one_call_example_runs_and_prints_the_report_shown(tmp_path):
    example = next(block for block in python_blocks() if "check_equivalence(tf1_forward, Net" in block)
    result = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Verdict: EQUIVALENT (8 passed)" in result.stdout
    assert (tmp_path / "report.html").stat().st_size > 1000
    shown, printed = report_shape(shown_report()), report_shape(result.stdout)
    assert len(shown["steps"]) == 8 and len(shown["header"]) >= 5 and len(shown["coverage"]) == 1
    assert shown == printed


def test_the_report_comparison_sees_a_changed_step():
    shown = shown_report()
    assert report_shape(shown.replace("gradients                        passed",
                                      "gradients                        failed")) != report_shape(shown)
    assert report_shape(shown.replace("  seed: 42", "")) == report_shape(shown)  # a value, not a field
    assert report_shape(shown.replace("3/3 output leaves", "2/3 output leaves")) != report_shape(shown)
    with pytest.raises(ValueError):
        report_shape("no report here")


def test_readme_is_short_and_opens_with_the_two_set_up_commands():
    text = readme()
    assert len(text.splitlines()) <= 200
    first_block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    assert [line.split("#")[0].strip() for line in first_block.splitlines()] == ["./dev demo", "./dev test"]
    assert text.index("```bash") < text.index("## ")  # before any section


def test_readme_keras3_example_prints_the_verdict_it_says(capsys):
    """The Keras 3 section's example runs as written and prints what the text after it says."""
    block = next(b for b in python_blocks() if "keras3_head" in b)
    exec(compile(block, "README.md (Keras 3 or tf-keras)", "exec"), {"__name__": "readme_keras3"})
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert printed == "Verdict: EQUIVALENT (9 passed)" and f"It prints `{printed}`" in readme()
