"""``./dev matrix`` (tools/matrix.py): arguments, test counts and the compatibility table.

The matrix itself installs TensorFlow versions (minutes each); these tests
cover what it computes from their results, with planted results.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("matrix_tool", os.path.join(REPO, "tools", "matrix.py"))
matrix = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(matrix)

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" failures="2"
skipped="3" tests="20"><testcase classname="tests.test_a" name="test_ok"/>
<testcase classname="tests.test_a" name="test_bad"><failure message="x"/></testcase>
<testcase classname="tests.test_b" name="test_err"><error message="y"/></testcase>
</testsuite></testsuites>"""


def _result(version, **extra):
    base = {"version": version, "date": "2026-11-23", "cpu": "AMD EPYC (AVX-512)", "suite_scope": "full",
            "install": "ok", "install_s": 55,
            "versions": {"tensorflow": f"{version}.1", "tf-keras": f"{version}.0", "numpy": "1.26.4"},
            "doctor": "ok", "suite": {"tests": 20, "passed": 14, "failures": 2, "errors": 1, "skipped": 3,
                                      "rc": 1, "seconds": 600},
            "demo": {"verdict": "EQUIVALENT", "seconds": 81}}
    base.update(extra)
    return base


@pytest.mark.parametrize("bad", ["2", "2.x", "3.16.1", "latest", ""])
def test_versions_must_be_tensorflow_minors(bad, capsys):
    with pytest.raises(SystemExit) as exit_info:
        matrix._parse([bad])
    assert exit_info.value.code == 2
    assert "VERSIONS: expected TensorFlow minors such as 2.16" in capsys.readouterr().err


def test_default_is_every_declared_minor():
    assert matrix._parse([]).versions == []
    assert matrix.DECLARED == ("2.16", "2.17", "2.18", "2.19", "2.20", "2.21")


def test_junit_counts_and_failed_tests(tmp_path):
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    counts = matrix._junit_counts(str(path))
    assert counts["passed"] == 14 and counts["failures"] == 2 and counts["errors"] == 1 and counts["skipped"] == 3
    assert counts["failed_tests"] == ["tests.test_a::test_bad", "tests.test_b::test_err"]
    assert matrix._junit_counts(str(tmp_path / "missing.xml")) is None  # no report: no counts, not zero


def test_row_names_the_cpu_it_ran_on():
    assert matrix._cpu()  # this machine's model name (with AVX-512/AMX where it has them)
    assert "| Intel(R) Xeon(R) (AVX-512, AMX) |" in matrix._row(_result("2.16", cpu="Intel(R) Xeon(R) (AVX-512, AMX)"))


def test_row_says_what_failed():
    row = matrix._row(_result("2.16"))
    assert row.startswith("| 2.16.1 | 2.16.0 | 1.26.4 | AMD EPYC (AVX-512) | ok, 55 s | ok |")
    assert "full suite: 14 passed, 2 failed, 1 errors, 3 skipped (600 s)" in row
    assert row.endswith("| EQUIVALENT, 81 s | 2026-11-23 |")
    failed_install = matrix._row({"version": "2.16", "install": "FAILS: 'Adaptive' is not a member",
                                  "date": "d"})
    assert "| ? | FAILS: 'Adaptive' is not a member | not run | not run | not run |" in failed_install
    compat = matrix._row(_result("2.18", suite_scope="compat"))
    assert "op + seeding + equivalence tests: 14 passed" in compat


def test_table_keeps_rows_of_versions_not_run_and_orders_them(tmp_path, monkeypatch):
    table = tmp_path / "COMPATIBILITY.md"
    table.write_text(f"# intro\n\n{matrix.BEGIN}\n| 2.20.0 | old row |\n{matrix.END}\n\nafter\n")
    monkeypatch.setattr(matrix, "TABLE_FILE", str(table))
    matrix.write_table([_result("2.16"), _result("2.18")])
    text = table.read_text()
    assert text.startswith("# intro\n\n") and text.endswith("\n\nafter\n")
    rows = [line for line in text.splitlines() if line.startswith("| 2.")]
    assert [r.split(" | ")[0] for r in rows] == ["| 2.16.1", "| 2.18.1", "| 2.20.0"]
    assert "| 2.20.0 | old row |" in rows  # kept as it was
    matrix.write_table([_result("2.20")])
    assert "old row" not in table.read_text()  # replaced by the new result


def test_table_needs_its_markers(tmp_path, monkeypatch):
    table = tmp_path / "COMPATIBILITY.md"
    table.write_text("no markers\n")
    monkeypatch.setattr(matrix, "TABLE_FILE", str(table))
    with pytest.raises(SystemExit, match="expected the markers"):
        matrix.write_table([_result("2.16")])
    assert table.read_text() == "no markers\n"


def test_table_write_replaces_a_symlink_instead_of_writing_through_it(tmp_path, monkeypatch):
    target = tmp_path / "elsewhere.md"
    target.write_text(f"{matrix.BEGIN}\n{matrix.END}\n")
    link = tmp_path / "COMPATIBILITY.md"
    link.symlink_to(target)
    monkeypatch.setattr(matrix, "TABLE_FILE", str(link))
    matrix.write_table([_result("2.16")])
    assert not link.is_symlink() and "2.16.1" in link.read_text()
    assert target.read_text() == f"{matrix.BEGIN}\n{matrix.END}\n"


def test_compat_suite_selects_existing_test_files_only():
    files = matrix._suite_files(REPO, "compat")
    assert "tests/test_ops_xent.py" in files and "tests/test_seeding.py" in files
    assert "tests/test_equivalence.py" in files and "tests/test_selfcheck.py" in files
    assert "tests/test_compat_tensorflow.py" in files  # the repairs of TensorFlow itself
    assert all(os.path.isfile(os.path.join(REPO, f)) for f in files)
    assert "tests/test_ops_packaging.py" not in files  # TF-independent, and two more op builds
    assert matrix._suite_files(REPO, "full") == []  # pytest's own testpaths: everything


def test_log_keeps_each_command_and_returns_its_output(tmp_path):
    log = matrix._Log(str(tmp_path / "log.txt"), "2.16")
    try:
        rc, out, seconds = log.run([os.sys.executable, "-c", "print('first'); raise SystemExit(3)"], str(tmp_path))
        rc2, out2, _ = log.run([os.sys.executable, "-c", "print('second')"], str(tmp_path))
    finally:
        log.close()
    assert (rc, out) == (3, "first\n") and (rc2, out2) == (0, "second\n") and seconds >= 0
    text = (tmp_path / "log.txt").read_text()
    assert "first\n[exit 3 after" in text and "second\n[exit 0 after" in text


def test_tree_copy_is_a_checkout_that_lists_the_same_files(tmp_path):
    dest = tmp_path / "src"
    matrix._copy_tree(str(dest))
    assert (dest / "tools" / "matrix.py").read_bytes() == open(os.path.join(REPO, "tools", "matrix.py"), "rb").read()
    assert not list(dest.glob("equivtool/ops/*.so"))  # build outputs are ignored: not copied
    listed = subprocess.run(["git", "ls-files", "--others", "--exclude-standard"], cwd=dest,
                            stdout=subprocess.PIPE, text=True, check=True).stdout.split()
    assert "tools/matrix.py" in listed and "setup.cfg" in listed


@pytest.fixture
def dev_copy(tmp_path):
    """./dev in a scratch tree whose .venv is a stub recording the pytest call (no install)."""
    import hashlib
    import shutil
    shutil.copy2(os.path.join(REPO, "dev"), tmp_path / "dev")
    for name in ("requirements.lock", "setup.py", "setup.cfg", "equivtool/ops/_build.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    venv_bin = tmp_path / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (tmp_path / ".venv" / ".equivtool-stamp").write_text(hashlib.sha256(b"").hexdigest() + "\n")
    (venv_bin / "python").write_text('#!/bin/sh\necho "suite $*" >> calls\nexit ${SUITE_RC:-0}\n')
    (venv_bin / "python").chmod(0o755)
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "matrix.py").write_text(
        "import os, sys\nopen('calls', 'a').write('compat ' + ' '.join(sys.argv[1:]) + '\\n')\n"
        "sys.exit(int(os.environ.get('COMPAT_RC', '0')))\n")

    def run(*args, **env):
        full = {k: v for k, v in os.environ.items() if k not in ("CI", "EQUIVTOOL_CI_COMPAT")}
        full.update(env)
        proc = subprocess.run([str(tmp_path / "dev"), *args], cwd=tmp_path, env=full, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
        (tmp_path / "calls").unlink(missing_ok=True)
        return proc.returncode, calls, proc.stdout
    return run


def test_dev_test_runs_only_the_suite_outside_ci(dev_copy):
    rc, calls, _ = dev_copy("test", "-x", EQUIVTOOL_TEST_WORKERS="1")
    assert (rc, calls) == (0, ["suite -m pytest -x"])


def test_dev_test_runs_test_files_in_parallel_unless_told_otherwise(dev_copy):
    assert dev_copy("test", "-x", EQUIVTOOL_TEST_WORKERS="2")[:2] == (
        0, ["suite -m pytest -n 2 --dist loadfile -x"])
    assert dev_copy("test", "-n", "0", EQUIVTOOL_TEST_WORKERS="2")[:2] == (0, ["suite -m pytest -n 0"])
    assert dev_copy("test", EQUIVTOOL_TEST_WORKERS="0")[:2] == (0, ["suite -m pytest"])


def test_dev_test_under_ci_also_proves_tensorflow_2_16_first(dev_copy):
    rc, calls, _ = dev_copy("test", CI="true", EQUIVTOOL_TEST_WORKERS="1")
    assert (rc, calls) == (0, ["compat --suite compat --no-demo --no-table 2.16", "suite -m pytest"])
    assert dev_copy("test", CI="true", EQUIVTOOL_CI_COMPAT="0", EQUIVTOOL_TEST_WORKERS="1")[:2] == (
        0, ["suite -m pytest"])


@pytest.mark.parametrize("compat_rc, suite_rc, expected", [("1", "0", 1), ("0", "1", 1), ("1", "2", 2), ("0", "5", 5)])
def test_dev_test_under_ci_fails_when_either_leg_fails(dev_copy, compat_rc, suite_rc, expected):
    rc, calls, out = dev_copy("test", CI="true", COMPAT_RC=compat_rc, SUITE_RC=suite_rc)
    assert rc == expected and len(calls) == 2  # the suite runs even after a failed 2.16 leg
    assert ("the TensorFlow 2.16 leg failed" in out) == (compat_rc != "0")
