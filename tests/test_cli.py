"""The equivtool command line: exit codes and messages."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from equivtool import cli
import equivtool.cli.common  # noqa: F401  (patched below)
import equivtool.cli.doctor  # noqa: F401  (patched below)
from equivtool.cli.audit import audit_main
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
    code = "from equivtool._platform.quiet import import_tensorflow_quietly; import_tensorflow_quietly(); print('ok')"
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


# ---------------------------------------------------------------------------
# The promise: 0 equivalent, 1 not, 2 usage, one line, never a traceback
# ---------------------------------------------------------------------------


def _assert_one_line_usage_error(code, capsys, *fragments):
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    return err


@pytest.fixture
def target_dir(tmp_path, monkeypatch):
    """A current directory to hold target modules; they are forgotten afterwards."""
    before = set(sys.modules)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith("cli_target_"):
            del sys.modules[name]


BAD_MODULES = {
    "cli_target_raises": "import tensorflow\nraise RuntimeError('model file is broken')\n",
    "cli_target_syntax": "def f(:\n    pass\n",
    "cli_target_exits": "import sys\nsys.exit(0)\n",
    "cli_target_missing_dep": "import no_such_dependency_xyz\n",
}


@pytest.mark.parametrize("module, fragment", [
    ("cli_target_raises", "RuntimeError: model file is broken (at "),
    ("cli_target_syntax", "SyntaxError"),
    ("cli_target_exits", "called sys.exit(0) while being imported"),
    ("cli_target_missing_dep", "No module named 'no_such_dependency_xyz'"),
])
@pytest.mark.parametrize("command", ["check", "audit"])
def test_a_target_module_that_fails_at_import_exits_two_with_one_line(command, module, fragment, target_dir,
                                                                      capsys):
    (target_dir / f"{module}.py").write_text(BAD_MODULES[module])
    args = (["check", f"{module}:f", "small_models:SlimNetShim", "--input-shape", "1,2"] if command == "check"
            else ["audit", f"{module}:f"])
    code = cli.main(args)
    _assert_one_line_usage_error(code, capsys, f"cannot import module {module!r}", fragment)


@pytest.mark.parametrize("args, fragment", [
    (["check", ".models:f", "small_models:SlimNetShim", "--input-shape", "1,2"], "relative module names"),
    (["audit", ".steps:f"], "relative module names"),
    (["check", "small_models:slim_net", "small_models:SlimNetShim", "--input-shape", "100000,100000,100"],
     "allocates at most"),
    (["check", "small_models:slim_net", "small_models:SlimNetShim",
      "--input-shape", "99999999999999999999999,2"], "--input-shape"),
    (["check", "small_models:slim_net", "small_models:SlimNetShim", "--input-shape", "2,8,8,3", "--seed", "-1"],
     "--seed: expected an integer from 0 to 4294967295"),
    (["check", "small_models:slim_net", "small_models:SlimNetShim", "--input-shape", "2,8,8,3",
      "--seed", str(2 ** 32)], "--seed"),
    (["check", "small_models:slim_net", "small_models:SlimNetShim", "--input-shape", "2,8,8,3",
      "--json", "/no/such/folder/r.json"], "--json: cannot write"),
    (["check", "small_models:slim_net", "small_models:SlimNetShim", "--input-shape", "2,8,8,3",
      "--html", "."], "--html: '.' is a directory"),
    (["audit", "audit_targets:reproducible_step", "--json", "/no/such/folder/a.json"], "--json: cannot write"),
    (["audit", "audit_targets:reproducible_step", "--html", "."], "--html: '.' is a directory"),
])
def test_bad_usage_exits_two_with_one_line_before_any_run(args, fragment, capsys, monkeypatch):
    monkeypatch.chdir(TESTS)
    code = cli.main(args)
    _assert_one_line_usage_error(code, capsys, fragment)
    assert "equivtool check" not in capsys.readouterr().out  # the run never started


def test_unwritable_report_folder_is_refused_before_the_run(tmp_path, capsys, monkeypatch):
    # A folder that refuses new files (simulated: the tests may run as root, who may write anywhere).
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cli.common.tempfile, "mkstemp", refuse)
    monkeypatch.chdir(TESTS)
    code = cli.main(["check", "small_models:slim_net", "small_models:SlimNetShim", "--input-shape", "2,8,8,3",
                     "--json", str(tmp_path / "r.json")])
    out_err = capsys.readouterr()
    assert code == 2 and "--json: cannot write" in out_err.err and "Permission denied" in out_err.err
    assert "equivtool check" not in out_err.out


AUDIT_TARGETS = textwrap.dedent('''
    import tensorflow as tf

    def raises():
        raise ValueError("step blew up")

    def needs_batch(batch):
        return batch

    def fine():
        return {"x": tf.constant([1.0, 2.0])}
''')


@pytest.mark.parametrize("target, fragments", [
    ("raises", ("auditing cli_target_audit:raises failed: ValueError: step blew up", "cli_target_audit.py:")),
    ("needs_batch", ("takes arguments (batch)", "zero-argument")),
])
def test_an_audit_target_that_raises_or_needs_arguments_exits_two(target, fragments, target_dir, capsys):
    (target_dir / "cli_target_audit.py").write_text(AUDIT_TARGETS)
    code = cli.main(["audit", f"cli_target_audit:{target}", "--runs", "2"])
    _assert_one_line_usage_error(code, capsys, *fragments)


def test_audit_imports_the_target_from_the_current_directory(tmp_path):
    (tmp_path / "my_steps.py").write_text("import equivtool\n" + AUDIT_TARGETS)
    result = run_cli("audit", "my_steps:fine", "--runs", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "REPRODUCIBLE" in result.stdout


def test_check_leaves_sys_path_as_it_found_it(target_dir, capsys):
    (target_dir / "cli_target_models.py").write_text("from small_models import SlimNetShim, slim_net\n")
    before = list(sys.path)
    code = cli.main(["check", "cli_target_models:slim_net", "cli_target_models:SlimNetShim",
                     "--input-shape", "2,8,8,3", "--steps", "parity"])
    assert code == 0, capsys.readouterr()
    assert sys.path == before and str(target_dir) not in sys.path


def test_a_file_named_like_a_dependency_in_the_current_directory_is_not_imported(tmp_path):
    # The installed console script does not put the current directory on sys.path;
    # `python -P -m` runs the CLI the same way.
    (tmp_path / "matplotlib.py").write_text("raise RuntimeError('the shadowing matplotlib.py was imported')\n")
    (tmp_path / "numpy.py").write_text("raise RuntimeError('the shadowing numpy.py was imported')\n")
    (tmp_path / "models.py").write_text(f"import sys\nsys.path.append({TESTS!r})\n"
                                        "from small_models import SlimNetShim, slim_net\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
    result = subprocess.run([sys.executable, "-P", "-m", "equivtool.cli", "check", "models:slim_net",
                             "models:SlimNetShim", "--input-shape", "2,8,8,3", "--steps", "parity",
                             "--html", "r.html"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "shadowing" not in result.stderr and (tmp_path / "r.html").stat().st_size > 1000


def test_build_ops_exits_two_with_one_line_when_the_compiler_fails(tmp_path):
    library = os.path.join(REPO, "equivtool", "ops")
    before = {name: os.path.getmtime(os.path.join(library, name)) for name in os.listdir(library)
              if name.endswith(".so")}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO, CXX="false")
    result = subprocess.run([sys.executable, "-m", "equivtool.cli", "build-ops"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stdout + result.stderr
    err = result.stderr.strip()
    assert "building the op failed" in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if "equivtool build-ops: error" in line]) == 1
    after = {name: os.path.getmtime(os.path.join(library, name)) for name in before}
    assert after == before  # a failed build leaves the installed library alone


@pytest.mark.parametrize("library", ["missing", "stale", "unusable"])
def test_doctor_exits_one_when_the_op_library_is_missing_stale_or_unusable(library, tmp_path):
    import tensorflow as tf
    path = tmp_path / "_xent_ops.so"
    if library == "stale":
        path.write_bytes(b"\0EQUIVTOOL_XENT_BUILD{tensorflow=1.15.0;cuda=0}\0")
    elif library == "unusable":
        path.write_bytes(b"not an ELF file EQUIVTOOL_XENT_BUILD{tensorflow=" + tf.__version__.encode() + b";cuda=0}")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO, EQUIVTOOL_OPS_LIBRARY=str(path))
    result = subprocess.run([sys.executable, "-m", "equivtool.cli", "doctor"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "xent op         NOT usable" in result.stdout and "Problems:" in result.stdout
    assert "The environment can run equivtool." not in result.stdout


def test_doctor_checks_are_a_list_that_one_line_extends(monkeypatch, capsys):
    monkeypatch.setattr(cli.doctor, "DOCTOR_CHECKS", [("planted", lambda: (False, "planted problem")),
                                               ("fine", lambda: (True, "ok"))])
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "  planted         planted problem" in out and "  - planted: planted problem" in out
    monkeypatch.setattr(cli.doctor, "DOCTOR_CHECKS", [("fine", lambda: (True, "ok"))])
    assert cli.main(["doctor"]) == 0


def test_importing_the_cli_has_no_side_effects():
    code = ("import os, sys; before = dict(os.environ); path = list(sys.path); import equivtool.cli; "
            "assert dict(os.environ) == before, 'environment changed'; assert sys.path == path, 'sys.path changed'; "
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = REPO
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_inconclusive_check_exits_one(tmp_path):
    (tmp_path / "nan_models.py").write_text(textwrap.dedent('''
        import equivtool
        import tensorflow as tf

        def tf1(x, training):
            return tf.compat.v1.layers.dense(x * float("nan"), 3, name="d")

        class Shim(tf.keras.layers.Layer):
            @tf.compat.v1.keras.utils.track_tf1_style_variables
            def call(self, x, training=None):
                return tf.compat.v1.layers.dense(x * float("nan"), 3, name="d")
    '''))
    result = run_cli("check", "nan_models:tf1", "nan_models:Shim", "--input-shape", "2,4",
                     "--steps", "fixed_weights", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Verdict: INCONCLUSIVE" in result.stdout


def test_cli_reports_replace_a_symlink_at_the_destination_and_never_write_through_it(tmp_path, capsys,
                                                                                     monkeypatch):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    for name in ("a.json", "a.html"):
        (tmp_path / name).symlink_to(victim)
    monkeypatch.chdir(TESTS)
    code = cli.main(["audit", "audit_targets:reproducible_step", "--runs", "2",
                     "--json", str(tmp_path / "a.json"), "--html", str(tmp_path / "a.html")])
    assert code == 0, capsys.readouterr()
    assert victim.read_text() == "precious"
    assert json.loads((tmp_path / "a.json").read_text())["passed"] is True
    assert not (tmp_path / "a.html").is_symlink() and "<html" in (tmp_path / "a.html").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.html", "a.json", "victim.txt"]  # no temporaries


def test_check_with_workers_prints_the_report_not_tensorflows_start_up():
    """The command and its worker process start quietly (no oneDNN/CUDA-stub notices,
    no cuInit error, no TF1 deprecation warnings); what the verdict depends on stays
    in the report's header."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "EQUIVTOOL_QUIET")}
    env["PYTHONPATH"] = REPO
    result = subprocess.run(
        [sys.executable, "-m", "equivtool.cli", "check", "small_models:slim_net", "small_models:SlimNetShim",
         "--input-shape", "2,8,8,3", "--steps", "parity,fixed_weights", "--workers", "2"],
        cwd=TESTS, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    for noise in ("oneDNN custom operations", "cuda drivers", "cuInit", "is deprecated", "cpu_feature_guard"):
        assert noise not in result.stderr, result.stderr
        assert noise not in result.stdout
    assert "machine: " in result.stdout and "oneDNN o" in result.stdout
    assert "graph rewrites: as_written" in result.stdout


def test_a_users_program_keeps_tensorflows_warnings():
    code = ("import os, warnings, equivtool, tensorflow as tf\n"
            "assert 'EQUIVTOOL_QUIET' not in os.environ\n"
            "with warnings.catch_warnings(record=True) as seen:\n"
            "    warnings.simplefilter('default')\n"
            "    warnings.warn('`layer.apply` is deprecated and will be removed in a future version.', UserWarning)\n"
            "print(len(seen))\n")
    env = {k: v for k, v in os.environ.items() if k != "EQUIVTOOL_QUIET"}
    env.update(PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"


def _leaves(path):
    data = json.loads(path.read_text())
    return {leaf["name"]: leaf["ok"] for step in data["steps"] for c in step["comparisons"]
            for leaf in c["leaves"]}


def test_check_takes_tolerances_per_output(tmp_path, capsys, monkeypatch):
    """--rtol/--atol reach the comparison (the planted epsilon's logits differ by rtol 0.246):
    the named output passes, the others still fail, and the re-run hint keeps them."""
    monkeypatch.chdir(TESTS)
    base = ["check", "small_models:slim_net", "cli_models:broken_epsilon", "--input-shape", "2,8,8,3",
            "--steps", "fixed_weights"]
    assert cli.main([*base, "--json", str(tmp_path / "a.json")]) == 1
    assert _leaves(tmp_path / "a.json")["end_points/logits"] is False
    assert cli.main([*base, "--rtol", "end_points/logits:0.3", "--json", str(tmp_path / "b.json")]) == 1
    leaves = _leaves(tmp_path / "b.json")
    assert leaves["end_points/logits"] is True and leaves["end_points/pool1"] is False
    assert "--rtol end_points/logits:0.3 --localize" in capsys.readouterr().out


@pytest.mark.parametrize("extra, fragment", [
    (["--atol", "end_points/logits:-1"], "--atol: expected [OUTPUT:]VALUE"),
    (["--rtol", "nan"], "--rtol: expected [OUTPUT:]VALUE"),
    (["--atol", "end_points/logitz:1", "--strict-tolerances"], "end_points/logitz"),
])
def test_bad_or_unmatched_check_tolerances_exit_two(extra, fragment, capsys, monkeypatch):
    monkeypatch.chdir(TESTS)
    code = cli.main(["check", "small_models:slim_net", "small_models:SlimNetShim", "--input-shape", "2,8,8,3",
                     "--steps", "fixed_weights", *extra])
    _assert_one_line_usage_error(code, capsys, fragment)
