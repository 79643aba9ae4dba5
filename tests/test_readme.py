"""The README's one-call example runs as written and passes."""

import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python_blocks():
    with open(os.path.join(REPO, "README.md")) as handle:
        return re.findall(r"```python\n(.*?)```", handle.read(), re.S)


def test_readme_one_call_example_runs_and_reports_equivalent(tmp_path):
    example = next(block for block in python_blocks() if "check_equivalence(tf1_forward, Net" in block)
    result = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Verdict: EQUIVALENT (8 passed)" in result.stdout
    assert (tmp_path / "report.html").stat().st_size > 1000
