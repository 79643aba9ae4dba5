"""The equivtool command line: exit codes and messages."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from equivtool import cli
from equivtool.cli import audit_main
from determinism_support import no_global_seed  # noqa: F401  (fixture)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(REPO, "tests")


def run_cli(*args, cwd=TESTS):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-m", "equivtool.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_check_passes_with_exit_code_zero_and_writes_reports(tmp_path):
    out_json = tmp_path / "r.json"
    result = run_cli("check", "small_models:slim_net", "small_models:SlimNetShim",
                     "--input-shape", "2,8,8,3", "--steps", "parity,fixed_weights",
                     "--json", str(out_json), "--html", str(tmp_path / "r.html"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "parity" in result.stdout and "PASSED" in result.stdout  # a progress line per step
    assert "Verdict: EQUIVALENT" in result.stdout
    data = json.loads(out_json.read_text())
    assert [s["name"] for s in data["steps"]] == ["parity", "fixed_weights"]
    assert (tmp_path / "r.html").stat().st_size > 1000


def test_check_reports_difference_with_exit_code_one():
    # the TF2 layer's batch norm uses another epsilon: fixed weights fail
    result = run_cli("check", "small_models:slim_net", "cli_models:broken_epsilon",
                     "--input-shape", "2,8,8,3", "--steps", "fixed_weights")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "NOT EQUIVALENT" in result.stdout


@pytest.mark.parametrize("args, fragment", [
    (["check", "no_such_module:f", "small_models:SlimNetShim", "--input-shape", "1,2"], "cannot import module"),
    (["check", "small_models:nope", "small_models:SlimNetShim", "--input-shape", "1,2"], "has no attribute 'nope'"),
    (["check", "small_models", "small_models:SlimNetShim", "--input-shape", "1,2"], "expected MODULE:NAME"),
    (["check", "small_models:slim_net", "small_models:SlimNetShim", "--input-shape", "1,x"], "--input-shape"),
    (["check", "small_models:slim_net", "small_models:SlimNetShim", "--input-shape", "1,0"], "--input-shape"),
    (["check", "small_models:slim_net", "small_models:SlimNetShim", "--input-shape", "2,8,8,3",
      "--steps", "bogus"], "--steps"),
    (["check", "small_models:NUM_CLASSES", "small_models:SlimNetShim", "--input-shape", "1,2"], "expected a callable"),
])
def test_bad_arguments_exit_two_with_one_line(args, fragment, capsys, monkeypatch):
    monkeypatch.chdir(TESTS)
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert fragment in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_unknown_command_exits_two(capsys):
    assert cli.main(["frobnicate"]) == 2


def test_doctor_reports_versions_and_fixes():
    result = run_cli("doctor", cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    for fragment in ("tensorflow      2.", "tf-slim         1.1.0", "legacy Keras    active",
                     "tf-slim fix     aliased", "xent op"):
        assert fragment in result.stdout


def test_audit_reproducible_step_exits_zero(tmp_path):
    out = tmp_path / "audit.json"
    result = run_cli("audit", "audit_targets:reproducible_step", "--runs", "3", "--json", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(out.read_text())["reproducible"] is True


def test_audit_unseeded_step_exits_one_and_names_the_culprit():
    result = run_cli("audit", "audit_targets:unseeded_step", "--runs", "3")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "audit_targets.py" in result.stdout  # the source line of the unseeded op


@pytest.mark.parametrize("args, fragment", [
    (["audit", "audit_targets:nope", "--runs", "3"], "nope"),
    (["audit", "audit_targets:reproducible_step", "--runs", "1"], "--runs"),
])
def test_audit_bad_arguments_exit_two(args, fragment, capsys, monkeypatch):
    monkeypatch.chdir(TESTS)
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err


def test_quiet_import_drops_tensorflow_notices_but_keeps_other_stderr(tmp_path):
    fake = tmp_path / "tensorflow"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "import os, types\n"
        "os.write(2, b'I0000 port.cc:153] oneDNN custom operations are on. You may see...\\n')\n"
        "os.write(2, b'E0000 something.cc:1] a real problem\\n')\n"
        "get_logger = lambda: types.SimpleNamespace(setLevel=lambda level: None)\n"
        "config = types.SimpleNamespace(list_physical_devices=lambda: [])\n")
    code = "from equivtool._quiet import import_tensorflow_quietly; import_tensorflow_quietly(); print('ok')"
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
    assert "a real problem" in result.stderr
    assert "oneDNN" not in result.stderr


# ---------------------------------------------------------------------------
# audit_main (the CLI's `equivtool audit MODULE:FN --runs N`)
# ---------------------------------------------------------------------------


_TARGET_MODULE = textwrap.dedent('''
    import equivtool
    import tensorflow as tf

    w = tf.Variable([1.0, 2.0])

    @tf.function
    def reproducible():
        w.assign_add(tf.random.uniform([2], seed=3))
        return {"w": w.read_value()}

    def noisy():
        w.assign_add(tf.random.uniform([2]))
        return w.read_value()

    not_callable = 3
''')


@pytest.fixture
def target_module(tmp_path, monkeypatch):
    name = "equivtool_audit_target"
    (tmp_path / f"{name}.py").write_text(_TARGET_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_audit_main_returns_0_for_a_reproducible_target_and_writes_reports(target_module, tmp_path, capsys):
    json_path, html_path = tmp_path / "audit.json", tmp_path / "audit.html"
    assert audit_main(f"{target_module}:reproducible", 2, json_path=json_path, html_path=html_path) == 0
    assert "REPRODUCIBLE" in capsys.readouterr().out
    assert json.loads(json_path.read_text())["passed"] is True
    assert "<html" in html_path.read_text()


def test_audit_main_returns_1_for_a_non_reproducible_target(target_module, no_global_seed, capsys):
    assert audit_main(f"{target_module}:noisy", 2) == 1
    assert "unseeded_random_op" in capsys.readouterr().out


@pytest.mark.parametrize("target, message", [
    ("no_such_module_xyz:fn", "cannot import module"),
    ("{mod}:missing", "has no attribute 'missing'"),
    ("{mod}:not_callable", "expected a callable"),
    ("{mod}", "expected MODULE:NAME"),
])
def test_audit_main_bad_target_raises_value_error(target_module, target, message):
    with pytest.raises(ValueError, match=message):
        audit_main(target.format(mod=target_module), 2)
