"""``equivtool <command> --help`` and usage errors answer without importing TensorFlow
(it takes seconds to import; a command imports it only once it runs)."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = """
import sys
from equivtool.cli import main
code = main(sys.argv[1:])
print("exit", code, "tensorflow imported:", "tensorflow" in sys.modules)
"""


def _run(*argv):
    result = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, PYTHONPATH=REPO))
    return result.stdout.strip().splitlines()[-1], result.stderr


@pytest.mark.parametrize("argv", [["--help"], ["convert-checkpoint", "--help"], ["compare", "--help"],
                                  ["check", "--help"]])
def test_help_does_not_import_tensorflow(argv):
    last, _ = _run(*argv)
    assert last == "exit 0 tensorflow imported: False"


def test_a_usage_error_does_not_import_tensorflow():
    last, err = _run("convert-checkpoint", "--no-such-option")
    assert last == "exit 2 tensorflow imported: False"
    assert "convert-checkpoint: error:" in err


def test_a_command_that_runs_imports_tensorflow():
    """The probe can see TensorFlow imported: a command that runs does import it."""
    last, _ = _run("doctor")
    assert last.endswith("tensorflow imported: True")
