"""The old side in a real TensorFlow 1.15 interpreter: ``equivtool tf1-env``, ``doctor --tf1-python``
and ``compare --old-python``.

The tests marked by the ``tf1`` fixture need a TensorFlow 1.15 interpreter:
``$EQUIVTOOL_TF1_PYTHON`` (``./dev test`` creates or reuses one with
``equivtool tf1-env`` and sets it), else the complete environment at
:func:`equivtool._platform.tf1_python.default_env`. Without one they skip with
the reason ``./dev test`` recorded (``$EQUIVTOOL_TF1_SKIP``: no Python 3.6/3.7,
no download). A set ``$EQUIVTOOL_TF1_PYTHON`` that does not work fails.

The rest needs no TensorFlow 1.15: interpreter discovery runs on planted
fake interpreters, and the temporary-folder and error paths of
``--old-python`` use this interpreter (its TensorFlow runs the recorder
through ``tf.compat.v1``) on a TF1 SavedModel built here.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import numpy as np
import pytest

import equivtool
from equivtool import cli
from processes import alive, gone_within
import equivtool.cli.doctor  # noqa: F401  (patched below)
from equivtool._platform import tf1_python
from equivtool.exported import _old_python, _record

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL_SCRIPT = os.path.join(HERE, "tf1_contrib_model.py")
FAULT_NODE = "small/LayerNorm/batchnorm/add"  # where variance + epsilon is computed


# --------------------------------------------------------------------------
# the interpreter
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tf1():
    """The TensorFlow 1.15 interpreter, as probed; skips (with the reason) where there is none."""
    path = os.environ.get("EQUIVTOOL_TF1_PYTHON")
    if not path:
        found = tf1_python.complete_env(tf1_python.default_env())
        if found is None:
            pytest.skip(os.environ.get("EQUIVTOOL_TF1_SKIP")
                        or "no TensorFlow 1.15 interpreter: set EQUIVTOOL_TF1_PYTHON (./dev test makes one "
                           f"with `equivtool tf1-env {tf1_python.default_env()}`)")
        return found
    found = tf1_python.probe(path, "EQUIVTOOL_TF1_PYTHON")
    assert found.is_tf1 and found.contrib, f"EQUIVTOOL_TF1_PYTHON={path}: {found} ({found.error})"
    return found


def _run_there(python, *args):
    done = subprocess.run([python, *args], capture_output=True, text=True, env=tf1_python.clean_env(),
                          cwd=HERE)
    assert done.returncode == 0, done.stderr[-3000:]


def _fake_python(path, version: str):
    """An executable that answers the version question as a Python ``version`` would."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\necho {version}\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return str(path)


@pytest.fixture
def no_pythons(tmp_path, monkeypatch):
    """A pyenv root and a PATH holding only what a test plants."""
    root, bin_dir = tmp_path / "pyenv", tmp_path / "bin"
    root.mkdir()
    bin_dir.mkdir()
    monkeypatch.setenv("PYENV_ROOT", str(root))
    monkeypatch.setenv("PATH", str(bin_dir))
    return root, bin_dir


def test_pyenv_3_7_is_preferred_to_3_6_and_to_path(no_pythons):
    root, bin_dir = no_pythons
    _fake_python(bin_dir / "python3.7", "3.7")
    _fake_python(root / "versions" / "3.6.15" / "bin" / "python", "3.6")
    newest = _fake_python(root / "versions" / "3.7.16" / "bin" / "python", "3.7")
    _fake_python(root / "versions" / "3.7.9" / "bin" / "python", "3.7")
    assert tf1_python.find_base_python() == newest


def test_a_pyenv_version_whose_python_is_not_3_6_or_3_7_is_not_taken(no_pythons):
    root, bin_dir = no_pythons
    _fake_python(root / "versions" / "3.7.16" / "bin" / "python", "3.11")  # a broken pyenv shim, say
    on_path = _fake_python(bin_dir / "python3.6", "3.6")
    assert tf1_python.find_base_python() == on_path


def test_without_python_3_6_or_3_7_tf1_env_says_what_to_install_in_one_line(no_pythons, tmp_path, capsys):
    root, bin_dir = no_pythons
    _fake_python(bin_dir / "python3.7", "3.11")
    target = tmp_path / "env"
    assert cli.main(["tf1-env", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no Python 3.6 or 3.7 found" in err and "pyenv install 3.7.16" in err
    assert not target.exists()  # refused before anything was made


def test_tf1_env_refuses_a_python_of_another_version_before_any_work(tmp_path, capsys):
    target = tmp_path / "env"
    assert cli.main(["tf1-env", str(target), "--python", sys.executable]) == 2
    err = capsys.readouterr().err
    assert "--python" in err and "needs Python 3.6 or 3.7" in err and err.count("\n") == 1
    assert not target.exists()


def test_tf1_env_refuses_a_folder_that_is_not_its_own(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert cli.main(["tf1-env", str(tmp_path), "--python", sys.executable]) == 2
    assert "is not an equivtool TF 1.15 environment" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["notes.txt"]


def test_an_interrupted_creation_is_not_taken_for_a_complete_environment(tf1, tmp_path):
    folder = tmp_path / "env"
    _wrapper(folder, tf1.path)
    assert tf1_python.complete_env(str(folder)) is not None  # what the marker test below needs
    (folder / tf1_python.CREATING).write_text("")
    assert tf1_python.complete_env(str(folder)) is None


def _wrapper(folder, python):
    path = folder / "bin" / "python"
    path.parent.mkdir(parents=True)
    path.write_text(f'#!/bin/sh\nexec "{python}" "$@"\n')
    path.chmod(0o755)


def test_tf1_env_reuses_a_complete_environment_without_installing(tf1, tmp_path, monkeypatch, capsys):
    folder = tmp_path / "env"
    _wrapper(folder, tf1.path)

    def no_install(*args, **kwargs):
        raise AssertionError("a complete environment was installed again")

    monkeypatch.setattr(tf1_python, "_run", no_install)
    assert cli.main(["tf1-env", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "reused" in out and "TensorFlow 1.15.0" in out and f"--old-python {folder}/bin/python" in out


def test_doctor_checks_a_tf1_interpreter(tf1, monkeypatch, capsys):
    monkeypatch.setattr(cli.doctor, "DOCTOR_CHECKS", [])
    assert cli.main(["doctor", "--tf1-python", tf1.path]) == 0
    out = capsys.readouterr().out
    assert f"Python {tf1.python}" in out and "1.15.0 (CPU build)" in out and "tf1 contrib     importable" in out


def test_doctor_fails_an_interpreter_without_tensorflow_1(monkeypatch, capsys):
    monkeypatch.setattr(cli.doctor, "DOCTOR_CHECKS", [])
    assert cli.main(["doctor", "--tf1-python", sys.executable]) == 1  # TensorFlow 2.x here
    out = capsys.readouterr().out
    assert "is not TensorFlow 1.x" in out and "Problems:" in out
    assert cli.main(["doctor", "--tf1-python", "/nonexistent/python"]) == 1
    assert "is not an executable file" in capsys.readouterr().out


# --------------------------------------------------------------------------
# compare --old-python: the contrib model as it ran in TensorFlow 1.15
# --------------------------------------------------------------------------

def _load_model_script():
    import importlib.util
    spec = importlib.util.spec_from_file_location("tf1_contrib_model", MODEL_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def export_tf2_rewrite(folder: str, epsilon: float) -> None:
    """The TF2 rewrite of tf1_contrib_model.py's network: the same weights, layer
    norm written out with ``tf.nn.moments`` and ``tf.nn.batch_normalization``."""
    import tensorflow as tf
    model = _load_model_script()

    class Small(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = {k: tf.Variable(v, name=k.replace("/", "_")) for k, v in model.weights().items()}

        @tf.function(input_signature=[tf.TensorSpec([None, model.FEATURES], tf.float32, name="x")])
        def serve(self, x):
            w = self.w
            with tf.name_scope("small"):
                with tf.name_scope("fc1"):
                    net = tf.nn.relu(tf.nn.bias_add(tf.matmul(x, w["fc1/weights"]), w["fc1/biases"]))
                with tf.name_scope("LayerNorm"):
                    mean, variance = tf.nn.moments(net, [1], keepdims=True)
                    net = tf.nn.batch_normalization(net, mean, variance, w["LayerNorm/beta"], w["LayerNorm/gamma"],
                                                    epsilon)
                with tf.name_scope("logits"):
                    y = tf.nn.bias_add(tf.matmul(net, w["logits/weights"]), w["logits/biases"])
            return {"y": y}

    module = Small()
    tf.saved_model.save(module, folder, signatures={"serving_default": module.serve})


@pytest.fixture(scope="module")
def contrib_models(tf1, tmp_path_factory):
    root = tmp_path_factory.mktemp("tf1_contrib")
    paths = {name: str(root / name) for name in ("tf1", "tf2", "tf2_bad_eps")}
    _run_there(tf1.path, MODEL_SCRIPT, paths["tf1"])
    export_tf2_rewrite(paths["tf2"], _load_model_script().LAYER_NORM_EPSILON)
    export_tf2_rewrite(paths["tf2_bad_eps"], 1e-3)  # the planted rewrite slip
    return paths


def _compared_values(report) -> int:
    """How many values were compared, and not just present (finite on both sides, some above atol)."""
    leaves = [leaf for step in report.steps for comparison in step.comparisons for leaf in comparison.leaves]
    assert leaves and not any(leaf.below_atol for leaf in leaves)
    return sum(leaf.compared for leaf in leaves)


def test_a_contrib_savedmodel_run_in_tf_1_15_is_equivalent_to_its_tf2_rewrite(tf1, contrib_models):
    report = equivtool.compare_models(contrib_models["tf1"], contrib_models["tf2"], old_python=tf1.path,
                                      batches=2, input_shapes={"x": (4, 6)})
    assert report.passed, str(report)
    assert [s.name for s in report.steps] == ["outputs/batch0", "outputs/batch1"]
    assert _compared_values(report) == 2 * 4 * 3  # y of both batches, every value compared
    old = report.meta["old"]
    assert old["interpreter"]["tensorflow"] == "1.15.0" and old["interpreter"]["contrib_imported"] is True
    assert report.meta["old_ran_under"].startswith(f"TensorFlow 1.15.0, Python {tf1.python}")
    assert "TensorFlow 1.15.0" in str(report)


def test_a_planted_layer_norm_epsilon_is_not_equivalent_and_localized(tf1, contrib_models, tmp_path, capsys):
    code = cli.main(["compare", "--old-python", tf1.path, contrib_models["tf1"], contrib_models["tf2_bad_eps"],
                     "--localize", "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert code == 1 and "NOT EQUIVALENT" in out
    assert f"first divergent op: {FAULT_NODE} [AddV2]" in out
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["meta"]["old"]["interpreter"]["tensorflow"] == "1.15.0"


def test_contrib_ops_registered_lazily_load_in_the_old_interpreter(tf1, tmp_path):
    """A SavedModel with contrib's Resampler op records there; the same recorder with the
    registration planted away fails with TensorFlow's "Op type not registered"."""
    model = str(tmp_path / "resampler")
    _run_there(tf1.path, MODEL_SCRIPT, model, "--resampler")
    source = _record.recorder_source()
    planted = source.replace("    version = tf.__version__\n", "    version = 'planted'\n")
    assert planted != source
    for name, text, code in (("real", source, 0), ("planted", planted, 2)):
        script = tmp_path / f"{name}.py"
        script.write_text(text)
        done = subprocess.run([tf1.path, str(script), model, str(tmp_path / f"{name}.npz")], capture_output=True,
                              text=True, env=tf1_python.clean_env())
        assert done.returncode == code, done.stderr[-2000:]
    assert "Op type not registered 'Resampler'" in done.stderr


# --------------------------------------------------------------------------
# compare --old-python: errors and the temporary folder (this interpreter as the "old" one)
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_tf1(tmp_path_factory):
    """A TF1 SavedModel built here: y = 2 x + 1."""
    import tensorflow as tf
    folder = str(tmp_path_factory.mktemp("small_tf1") / "sm")
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        y = tf.identity(2.0 * x + 1.0, name="y")
        with tf.compat.v1.Session(graph=graph) as session:
            builder = tf.compat.v1.saved_model.Builder(folder)
            signature = tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"y": y})
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={"serving_default": signature})
            builder.save()
    return folder


@pytest.fixture
def temp_root(tmp_path, monkeypatch):
    import tempfile
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def test_the_record_folder_is_removed_after_a_comparison(small_tf1, temp_root):
    report = equivtool.compare_models(small_tf1, small_tf1, old_python=sys.executable,
                                      inputs={"x": np.ones((2, 3), np.float32)})
    assert report.passed and report.meta["inputs"].startswith("inputs from ")
    assert report.meta["old_ran_under"].startswith("TensorFlow " + __import__("tensorflow").__version__)
    assert os.listdir(temp_root) == []


def test_an_old_side_error_is_one_line_with_its_stderr_in_the_json(small_tf1, temp_root, tmp_path, capsys):
    report = tmp_path / "r.json"
    code = cli.main(["compare", "--old-python", sys.executable, small_tf1, small_tf1, "--signature", "nope",
                     "--json", str(report)])
    err = capsys.readouterr().err
    assert code == 2
    first = err.splitlines()[0]
    assert first.startswith("equivtool compare: error: --old-python: ") and "'nope' is not in the SavedModel" in first
    saved = json.loads(report.read_text())
    assert saved["steps"][0]["status"] == "error"
    assert "record.py: error: --signature: 'nope'" in saved["steps"][0]["data"]["old_interpreter_stderr"]
    assert os.listdir(temp_root) == []


def test_ctrl_c_while_the_old_side_runs_stops_it_and_removes_the_folder(small_tf1, temp_root, monkeypatch):
    started = []
    real_popen = subprocess.Popen

    class Interrupted(real_popen):
        def communicate(self, *args, **kwargs):
            started.append(self)
            raise KeyboardInterrupt

    monkeypatch.setattr(_old_python.subprocess, "Popen", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        equivtool.compare_models(small_tf1, small_tf1, old_python=sys.executable)
    assert len(started) == 1 and started[0].returncode is not None  # killed and reaped, not left running
    assert os.listdir(temp_root) == []


_SIGTERM_CHILD = """
import sys
import equivtool
equivtool.compare_models(sys.argv[1], sys.argv[1], old_python=sys.argv[2])
"""


def test_sigterm_while_the_old_side_runs_stops_it_and_removes_the_folder(small_tf1, tmp_path):
    """A real SIGTERM to a compare whose old interpreter is busy: the compare ends by
    SIGTERM, its folder is gone, and the old interpreter is killed."""
    import signal
    root, fifo = tmp_path / "tmp", tmp_path / "started"
    root.mkdir()
    os.mkfifo(fifo)
    # probes as this Python; as the recorder, says it started (its pid) and waits for a signal
    old = _fake_python(tmp_path / "old" / "python", "unused")
    with open(old, "w") as f:
        f.write(f'#!/bin/sh\nif [ "$1" = "-c" ]; then exec "{sys.executable}" "$@"; fi\n'
                f'echo $$ > "{fifo}"\nexec sleep 600\n')
    env = dict(os.environ, TMPDIR=str(root), PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen([sys.executable, "-c", _SIGTERM_CHILD, small_tf1, old], env=env,
                             stderr=subprocess.PIPE)
    recorder_pid = None
    try:
        recorder_pid, stderr = _wait_for_recorder(str(fifo), child)
        child.send_signal(signal.SIGTERM)
        code = child.wait(timeout=120)
        assert code == -signal.SIGTERM, (stderr + child.stderr.read().decode(errors="replace"))[-2000:]
        assert os.listdir(root) == []
        assert gone_within(recorder_pid, 30)  # (killed: it ends a moment later)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        child.stderr.close()
        if recorder_pid is not None and alive(recorder_pid):  # the fault this test is for: end it
            os.kill(recorder_pid, signal.SIGKILL)


def _wait_for_recorder(fifo: str, child) -> tuple:
    """(the recorder's pid, read from ``fifo`` when it starts, and the child's stderr so far);
    fails if the child ends first or nothing comes in 180 s."""
    import select
    fd, stderr = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK), b""
    try:
        while True:
            ready, _, _ = select.select([fd, child.stderr], [], [], 180)
            assert ready, "neither the recorder nor the compare said anything in 180 s"
            if fd in ready:
                return int(os.read(fd, 64)), stderr.decode(errors="replace")
            chunk = os.read(child.stderr.fileno(), 65536)
            assert chunk, f"the compare ended before its recorder ran: {stderr.decode(errors='replace')[-2000:]}"
            stderr += chunk
    finally:
        os.close(fd)




def test_old_python_refusals_come_before_any_work(small_tf1, tmp_path, temp_root):
    with pytest.raises(ValueError, match="--old-python: .* is not an executable file"):
        equivtool.compare_models(small_tf1, small_tf1, old_python=str(tmp_path / "none"))
    with pytest.raises(ValueError, match="--data-loader: not with --old-python"):
        equivtool.compare_models(small_tf1, small_tf1, old_python=sys.executable, data_loader="x.py:f")
    record = tmp_path / "r.npz"
    assert equivtool.compare_models(small_tf1, small_tf1, save_outputs=str(record)).passed
    with pytest.raises(ValueError, match="--old-python: OLD .* is a record; the old interpreter records"):
        equivtool.compare_models(str(record), small_tf1, old_python=sys.executable)
    assert os.listdir(temp_root) == []
