"""``check_equivalence(..., tf1_python=PATH)``: the TF1 side in a real TensorFlow 1.15 interpreter.

The tests that run the old side need ``$EQUIVTOOL_TF1_PYTHON`` (``./dev test``
sets it; see tests/test_tf1_interpreter.py) and skip with the reason without
it. The model is the example's (examples/contrib_tf1/contrib_tf1_model.py):
``tf.contrib.layers``' fully_connected, layer_norm and dropout there, the same
code on tf-slim in a TF2 shim here; tests/tf1_python_model.py adds a model
that raises and random draws. The argument checks need no TensorFlow 1.15.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import types

import numpy as np
import pytest

from equivtool import check_equivalence
from equivtool.engine.options import Options
from equivtool.engine.registry import MODES
from equivtool.engine.sides import old_python

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "contrib_tf1")
sys.path[:0] = [HERE, EXAMPLE]
import contrib_tf1_model as model  # noqa: E402
import tf1_python_model as helpers  # noqa: E402
from options_support import equivalence_arguments  # noqa: E402
from test_tf1_interpreter import temp_root  # noqa: E402,F401 (a fixture: TMPDIR for one test alone)

INPUTS = np.random.RandomState(3).standard_normal((4, model.FEATURES)).astype(np.float32)
DEFAULT = ["variables_once", "parity", "fixed_weights", "random/constant/inference", "random/constant/training",
           "random/num_random_ops/inference", "random/num_random_ops/training", "gradients"]


@pytest.fixture(scope="module")
def tf1_python():
    path = os.environ.get("EQUIVTOOL_TF1_PYTHON")
    if not path:
        pytest.skip(os.environ.get("EQUIVTOOL_TF1_SKIP")
                    or "no TensorFlow 1.15 interpreter: set EQUIVTOOL_TF1_PYTHON (equivtool tf1-env DIR makes one)")
    return path


def _check(tf1_python, fn="contrib_tf1_model:model", layer=lambda: model.Shim(), **kwargs):
    return check_equivalence(fn, layer, INPUTS, tf1_python=tf1_python, tf1_path=[HERE, EXAMPLE], **kwargs)


def _statuses(report) -> dict:
    return {step.name: step.status for step in report.steps}


# --------------------------------------------------------------------------
# verdicts
# --------------------------------------------------------------------------

@pytest.mark.parametrize("tf_function", [False, True])
def test_the_contrib_model_is_equivalent_on_every_step_run_there(tf1_python, temp_root, tf_function):
    import tensorflow as tf
    report = _check(tf1_python, tf_function=tf_function, checkpoint=True,
                    optimizers=("contrib_tf1_model:sgd", lambda: tf.keras.optimizers.SGD(0.1)))
    assert _statuses(report) == {name: "passed" for name in DEFAULT + ["optimizer", "checkpoint"]}, str(report)
    assert report.passed
    ran_under = report.meta["old_ran_under"]
    assert ran_under.startswith("TensorFlow 1.15.0, Python 3.") and ran_under.endswith(os.path.abspath(tf1_python))
    assert "old_ran_under" in str(report)
    assert report.meta["old_interpreter"]["tensorflow"] == "1.15.0"
    assert report.meta["old_interpreter"]["cpu_build"] is True and report.meta["old_interpreter"]["contrib_imported"]
    steps = {step.name: step for step in report.steps}
    assert steps["gradients"].data["variables"] == 9  # every trainable variable's gradient compared
    assert list(temp_root.glob("equivtool-*")) == []  # the program's folder is gone (autograph leaves its own)


def test_a_planted_layer_norm_epsilon_is_not_equivalent(tf1_python):
    report = _check(tf1_python, layer=lambda: model.Shim(epsilon=1e-3), steps=["parity", "fixed_weights"])
    assert _statuses(report) == {"parity": "passed", "fixed_weights": "failed"}, str(report)
    assert not report.passed and "NOT EQUIVALENT" in str(report)


def test_a_loss_named_module_function_is_imported_on_both_sides(tf1_python):
    import tensorflow as tf
    there = _check(tf1_python, steps=["gradients", "optimizer"], loss_fn="contrib_tf1_model:loss",
                   optimizers=("contrib_tf1_model:sgd", lambda: tf.keras.optimizers.SGD(0.1)))
    here = check_equivalence(model.model, lambda: model.Shim(), INPUTS, steps=["gradients"], loss_fn=model.loss)
    assert _statuses(there) == {"gradients": "passed", "optimizer": "passed"}, str(there)
    assert there.step("gradients").data["loss_target"] is None  # the user's loss, not the default
    # the loss there is the named one: the value in-process (TF 1.15's LSTM and batch-norm
    # kernels round the last digits otherwise), and not the default's
    def tf1_loss(report):
        return float(report.step("gradients").notes[0].split("TF1 ", 1)[1].split(",")[0])
    np.testing.assert_allclose(tf1_loss(there), tf1_loss(here), rtol=1e-6)
    default = _check(tf1_python, steps=["gradients"])
    assert not np.isclose(tf1_loss(default), tf1_loss(there), rtol=1e-3)


@pytest.mark.parametrize("learning_rate, status", [(0.1, "passed"), (0.11, "failed")])
def test_optimizer_steps_run_there(tf1_python, learning_rate, status):
    import tensorflow as tf
    report = _check(tf1_python, steps=["optimizer"],
                    optimizers=("contrib_tf1_model:sgd", lambda: tf.keras.optimizers.SGD(learning_rate)))
    [step] = report.steps
    assert step.status == status, str(report)
    assert "3 steps of GradientDescentOptimizer (TF1) vs SGD (TF2)" in step.notes[0]
    assert len(step.data["losses"]) == 3 and "noise_floor" in step.data


def _tf1_checkpoint(folder) -> str:
    """A TF1 checkpoint of the model's variables, written here (through tf.compat.v1)."""
    import tensorflow as tf
    graph = tf.Graph()
    with graph.as_default():
        model.model(tf.compat.v1.placeholder(tf.float32, INPUTS.shape), False)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return tf.compat.v1.train.Saver().save(session, os.path.join(str(folder), "model.ckpt"))


@pytest.mark.parametrize("epsilon, status", [(None, "passed"), (1e-3, "failed")])
def test_a_checkpoint_written_there_loads_into_both_sides(tf1_python, epsilon, status):
    report = _check(tf1_python, layer=lambda: model.Shim(epsilon=epsilon), steps=["checkpoint"], checkpoint=True)
    [step] = report.steps
    assert step.status == status, str(report)
    assert step.data["loaded_variables"] == 11 and step.data["missing"] == 0
    assert "checkpoint written by the TF1 side" in step.notes[0]


def test_steps_not_run_there_are_refused_with_the_reason_never_passed(tf1_python, tmp_path, monkeypatch):
    """A step without a TF1 function there is skipped with the reason (planted: resume's entry
    taken away; tests/test_tf1_python_resume.py runs it there)."""
    import tensorflow as tf
    from equivtool.engine.registry import get_step
    from equivtool.engine.sides import refusal
    monkeypatch.delitem(old_python.STEP_SIDES, "resume")
    report = _check(tf1_python, steps=["parity", "checkpoint", "resume"], checkpoint=_tf1_checkpoint(tmp_path),
                    optimizers=("contrib_tf1_model:sgd", lambda: tf.keras.optimizers.SGD(0.1)))
    assert _statuses(report) == {"parity": "passed", "checkpoint": "passed", "resume": "skipped"}, str(report)
    assert report.step("resume").message == "resume: not yet run in the TF1 interpreter (tf1_python)"
    assert refusal(old_python.OldTF1Side, get_step("resume").needs) is None  # refused by the side's step list
    assert refusal(old_python.OldTF1Side, ["intermediates"]) is None  # localization runs there too
    # the verdict counts it as skipped
    assert "1 skipped" in str(report.verdict)
    only_refused = _check(tf1_python, steps=["resume"], checkpoint=_tf1_checkpoint(tmp_path / "again"),
                          optimizers=("contrib_tf1_model:sgd", lambda: tf.keras.optimizers.SGD(0.1)))
    assert [s.status for s in only_refused.steps] == ["skipped"] and not only_refused.passed
    assert str(only_refused.verdict).startswith("Verdict: INCONCLUSIVE, no step passed")


def test_an_error_there_is_one_line_with_the_users_frame_and_the_traceback(tf1_python, temp_root):
    report = _check(tf1_python, fn="tf1_python_model:failing_model", steps=["parity", "fixed_weights"])
    first = report.steps[0]
    assert first.status == "error"
    assert first.message.startswith("OldSideError: ValueError in the TF1 interpreter: a planted error in the "
                                    "model (at "), first.message
    assert "tf1_python_model.py:" in first.message and "in failing_model" in first.message
    assert "\n" not in first.message
    traceback = first.data["traceback"]
    assert "Traceback (most recent call last)" in traceback and 'raise ValueError("a planted error' in traceback
    assert report.steps[1].status in ("error", "skipped")
    assert list(temp_root.iterdir()) == []
    as_json = json.loads(report.to_json())  # the JSON report keeps the traceback there
    assert 'raise ValueError("a planted error' in as_json["steps"][0]["data"]["traceback"]
    assert as_json["meta"]["old_ran_under"].startswith("TensorFlow 1.15.0")


def test_the_cli_check_runs_the_tf1_side_there(tf1_python, capsys, monkeypatch):
    from equivtool import cli
    monkeypatch.chdir(EXAMPLE)
    code = cli.main(["check", "contrib_tf1_model:model", "contrib_tf1_model:Shim", "--input-shape", "4,6",
                     "--tf1-python", tf1_python, "--steps", "parity,fixed_weights"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "old_ran_under: TensorFlow 1.15.0" in out and "Verdict: EQUIVALENT" in out


def test_an_interpreter_with_tensorflow_2_is_refused_with_the_reason(tmp_path):
    # this interpreter (TensorFlow 2.x) as the "old" one: the program starts, says its version, is refused
    report = check_equivalence("contrib_tf1_model:model", lambda: model.Shim(), INPUTS, tf1_python=sys.executable,
                               tf1_path=[EXAMPLE], steps=["parity", "fixed_weights"])
    assert [s.status for s in report.steps] == ["error", "skipped"], str(report)
    assert "needs TensorFlow 1.x" in report.steps[0].message
    assert "needs TensorFlow 1.x" in report.steps[1].message  # said again, not retried


def test_the_old_interpreter_runs_tf1_as_it_ran_though_tensorflow_2_set_tf2_behavior_here(tf1_python):
    """TensorFlow 2's import sets TF2_BEHAVIOR=1 in this process's environment; the old
    interpreter must not inherit it, or TensorFlow 1.15 starts eager, with resource
    variables and control flow v2 (every TF 1.15 run before this fix did)."""
    from equivtool._platform import tf1_python as _tf1
    assert os.environ.get("TF2_BEHAVIOR") == "1"  # what TensorFlow 2.21's import did to this process
    script = ("import tensorflow as tf\n"
              "v = tf.Variable(1.0)\n"
              "print(tf.executing_eagerly(), type(v).__name__)\n")
    done = subprocess.run([tf1_python, "-c", script], capture_output=True, text=True, env=_tf1.clean_env(),
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "RefVariable"]  # graph mode, a reference variable
    inherited = subprocess.run([tf1_python, "-c", script], capture_output=True, text=True, timeout=300,
                               env=dict(_tf1.clean_env(), TF2_BEHAVIOR="1"))
    assert inherited.stdout.split() == ["True", "ResourceVariable"]  # the planted fault: what the old side ran


def test_an_old_interpreter_started_with_v2_behaviour_is_refused_with_the_reason(tf1_python, monkeypatch):
    from equivtool._platform import tf1_python as _tf1
    clean = _tf1.clean_env
    monkeypatch.setattr(_tf1, "clean_env", lambda: dict(clean(), TF2_BEHAVIOR="1"))
    report = _check(tf1_python, steps=["parity", "fixed_weights"])
    assert [s.status for s in report.steps] == ["error", "skipped"], str(report)
    assert "starts with v2 behaviour (eager execution, resource variables)" in report.steps[0].message


# --------------------------------------------------------------------------
# the same numbers as the in-process TF1 side
# --------------------------------------------------------------------------

def _old_side_values(tf1_python, fn: str, mode: str, seed: int = 42) -> dict:
    options = Options.build(fn, lambda: None, INPUTS, **equivalence_arguments(
        train_steps=1, seed=seed, tf1_python=tf1_python, tf1_path=[HERE, EXAMPLE]))
    engine = types.SimpleNamespace(options=options, old_program=None)
    try:
        side = old_python.OldTF1Side(engine, mode)
        forward = side.forward(training=True)
        return side.run(forward)["outputs"]
    finally:
        if engine.old_program is not None:
            engine.old_program.close()


def _in_process_values(fn, mode: str) -> dict:
    from equivtool.engine.sides.tf1_side import TF1Side
    from equivtool.seeding import DeterministicRandomTestTool
    side = TF1Side(fn, INPUTS, renamer=lambda name: name, loss_fn=None,
                   random_tool=DeterministicRandomTestTool(seed=42, mode=mode))
    try:
        forward = side.forward(training=True)
        return side.run(forward.outputs)
    finally:
        side.close()


@pytest.mark.parametrize("mode", MODES)
def test_the_random_tools_tf1_half_draws_what_the_in_process_side_draws(tf1_python, mode):
    there = _old_side_values(tf1_python, "tf1_python_model:draws", mode)
    here = _in_process_values(helpers.draws, mode)
    assert list(there) == ["w", "t", "uniform", "normal", "dropout"]
    for key in here:
        np.testing.assert_array_equal(there[key], here[key], err_msg=key)
    assert 0 < np.count_nonzero(there["dropout"]) < there["dropout"].size  # a real mask
    # the check can fail: another seed there draws other numbers
    other = _old_side_values(tf1_python, "tf1_python_model:draws", mode, seed=43)
    assert not np.array_equal(other["uniform"], here["uniform"])


def test_in_process_and_old_interpreter_give_the_same_verdict_and_numbers(tf1_python):
    there = _check(tf1_python, steps=["fixed_weights", "random", "gradients"])
    here = check_equivalence(model.model, lambda: model.Shim(), INPUTS, steps=["fixed_weights", "random",
                                                                               "gradients"])
    assert _statuses(there) == _statuses(here) and there.passed and here.passed
    values = _old_side_values(tf1_python, "contrib_tf1_model:model", "num_random_ops")
    np.testing.assert_allclose(values, _in_process_values(model.model, "num_random_ops"), rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------
# the program stopped and its folder removed on every exit
# --------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_stops_the_program_and_removes_its_folder(tf1_python, temp_root, monkeypatch, workers):
    started = []
    real_init = old_python.OldProgram.__init__

    def init(self, *args):
        real_init(self, *args)
        started.append((self.folder, self.process.pid, self.process))

    monkeypatch.setattr(old_python.OldProgram, "__init__", init)

    def interrupt(result):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _check(tf1_python, steps=["parity", "fixed_weights"], progress=interrupt, workers=workers)
    [(folder, pid, process)] = started
    assert process.returncode is not None  # stopped and reaped
    assert not os.path.exists(folder) and list(temp_root.iterdir()) == []


def test_ctrl_c_while_the_tf1_thread_starts_the_program_leaves_nothing(tf1_python, temp_root, monkeypatch):
    """With workers=2, Ctrl-C in the TF2 side while the TF1 thread is starting the
    TF1 interpreter: the program it starts after the check ended is stopped too."""
    import threading

    from equivtool.engine.sides import tf2_side as tf2_layer
    started, threads, starting = [], [], threading.Event()
    real_init = old_python.OldProgram.__init__

    def init(self, *args):
        threads.append(threading.current_thread())
        starting.set()
        real_init(self, *args)
        started.append(self)

    def interrupted(*args, **kwargs):
        starting.wait(60)
        raise KeyboardInterrupt

    monkeypatch.setattr(old_python.OldProgram, "__init__", init)
    monkeypatch.setattr(tf2_layer.TF2Side, "forward", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _check(tf1_python, steps=["fixed_weights"], workers=2)
    [thread] = threads
    thread.join(120)  # the TF1 thread finishes its start, sees the check ended, stops the program
    assert not thread.is_alive()
    [program] = started
    assert program.process is None and list(temp_root.iterdir()) == []


def test_sigterm_stops_the_program_and_removes_its_folder(tf1_python, tmp_path):
    script = (
        "import os, signal, sys, numpy as np\n"
        f"sys.path.insert(0, {EXAMPLE!r})\n"
        "import contrib_tf1_model as model\n"
        "from equivtool import check_equivalence\n"
        "from equivtool.engine.sides import old_python\n"
        "real = old_python.OldProgram.request\n"
        "def request(self, op, **fields):\n"
        "    if op == 'forward':\n"
        "        print('PID', self.process.pid, flush=True)\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return real(self, op, **fields)\n"
        "old_python.OldProgram.request = request\n"
        f"check_equivalence('contrib_tf1_model:model', lambda: model.Shim(), np.ones((2, 6), np.float32),\n"
        f"                  tf1_python={tf1_python!r}, tf1_path=[{EXAMPLE!r}], steps=['parity'])\n")
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": os.path.dirname(HERE)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == -signal.SIGTERM, done.stderr[-2000:]
    pid = int(done.stdout.split("PID", 1)[1].split()[0])
    from equivtool._base.scratch import process_gone
    assert process_gone(pid)
    assert glob.glob(str(temp / "equivtool-tf1-side-*")) == []


# --------------------------------------------------------------------------
# arguments (no TensorFlow 1.15 needed)
# --------------------------------------------------------------------------

def _build(tf1_fn="m:f", **kwargs):
    return Options.build(tf1_fn, lambda: None, INPUTS, **equivalence_arguments(train_steps=1, **kwargs))


def test_arguments_are_checked_before_any_work(monkeypatch):
    monkeypatch.delenv("EQUIVTOOL_TF1_PYTHON", raising=False)
    python = sys.executable
    with pytest.raises(TypeError, match='tf1_fn: with tf1_python, expected "module:function"'):
        _build(model.model, tf1_python=python)
    with pytest.raises(ValueError, match="tf1_python: '/no/such/python' is not an executable file"):
        _build(tf1_python="/no/such/python")
    with pytest.raises(TypeError, match='optimizers: with tf1_python, expected \\("module:make_tf1_optimizer"'):
        _build(tf1_python=python, optimizers=(lambda: None, lambda: None))
    with pytest.raises(TypeError, match='loss_fn: with tf1_python, expected "module:function"'):
        _build(tf1_python=python, loss_fn=lambda outputs, regularization: outputs)
    with pytest.raises(ValueError, match="loss_fn: cannot import 'no_such_module:loss' here"):
        _build(tf1_python=python, loss_fn="no_such_module:loss")
    with_loss = _build(tf1_python=python, loss_fn="contrib_tf1_model:loss")
    assert with_loss.loss_fn is model.loss and with_loss.tf1_loss == "contrib_tf1_model:loss"
    assert _build(tf1_python=python, localize=True).localize  # localized there (tests/test_tf1_python_localize.py)
    assert _build(tf1_python=python, workers=2).in_process is None  # nothing to send: the TF2 side stays here
    with pytest.raises(TypeError, match="tf1_path: expected a list of folders"):
        _build(tf1_python=python, tf1_path="folder")
    with pytest.raises(TypeError, match='a "module:function" name needs tf1_python'):
        _build("m:f")
    built = _build(tf1_python=python, tf1_path=["a"])
    assert built.tf1_python == os.path.abspath(python)
    assert built.tf1_path == (os.path.abspath("a"), os.getcwd())


def test_the_environment_names_the_interpreter_for_names_only(monkeypatch):
    monkeypatch.setenv("EQUIVTOOL_TF1_PYTHON", sys.executable)
    assert _build("m:f").tf1_python == os.path.abspath(sys.executable)
    assert _build(model.model).tf1_python is None  # a callable runs here, as before
    monkeypatch.delenv("EQUIVTOOL_TF1_PYTHON")
    with pytest.raises(TypeError):
        _build("m:f")


def test_the_random_tool_there_puts_get_seed_and_the_graph_seed_back_on_an_error(tf1_python):
    snippet = (
        "import sys\n"
        f"sys.path.insert(0, {os.path.dirname(old_python.PROGRAM)!r})\n"
        "import _old_side_program as program\n"
        "import tensorflow as tf\n"
        "from tensorflow.python.framework import random_seed\n"
        "original = random_seed.get_seed\n"
        "graph = tf.Graph()\n"
        "with graph.as_default():\n"
        "    tool = program.RandomTool(42, 'num_random_ops')\n"
        "    def fail():\n"
        "        seen.append(random_seed.get_seed(None))\n"
        "        raise RuntimeError('planted')\n"
        "    seen = []\n"
        "    try:\n"
        "        tool.run(fail)\n"
        "    except RuntimeError:\n"
        "        pass\n"
        "    assert seen == [(42, 0)], seen\n"
        "    assert random_seed.get_seed is original and graph.seed is None, graph.seed\n"
        "print('restored')\n")
    done = subprocess.run([tf1_python, "-c", snippet], capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0 and done.stdout.strip() == "restored", done.stderr[-2000:]


# --------------------------------------------------------------------------
# workers: the TF1 interpreter is the TF1 worker
# --------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [2, 3])
def test_with_workers_the_sides_run_at_once_with_the_same_results(tf1_python, monkeypatch, temp_root, workers):
    import threading
    import time

    from equivtool.engine.sides import tf2_side as tf2_layer
    spans = {"tf1": [], "tf2": []}
    real_request, real_forward = old_python.OldProgram.request, tf2_layer.TF2Side.forward

    def timed(side, call):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                what = args[1] if side == "tf1" else "forward"
                pid = args[0].process.pid if side == "tf1" and args[0].process is not None else None
                spans[side].append((start, time.perf_counter(), threading.current_thread().name, what, pid))
        return wrapper

    monkeypatch.setattr(old_python.OldProgram, "request", timed("tf1", real_request))
    monkeypatch.setattr(tf2_layer.TF2Side, "forward", timed("tf2", real_forward))
    steps = ["fixed_weights", "random", "gradients", "checkpoint"]
    parallel = _check(tf1_python, steps=steps, checkpoint=True, workers=workers)
    overlapped = [(a, b) for a in spans["tf1"] for b in spans["tf2"] if a[0] < b[1] and b[0] < a[1]]
    assert overlapped, "no TF1 request overlapped a TF2 forward pass"
    # every request but closing a graph (between steps) is a TF1 thread's: with workers=3 the pair's steps'
    # on one, the steps with models of their own (num_random_ops) on another, in a second interpreter
    pids = {}
    for _, _, name, op, pid in spans["tf1"]:
        if op != "close":
            pids.setdefault(name, set()).add(pid)
    threads = {"equivtool-tf1-interpreter_0"} | ({"equivtool-tf1-interpreter-own_0"} if workers == 3 else set())
    assert set(pids) == threads, pids
    assert all(len(found) == 1 for found in pids.values()) and len(set.union(*pids.values())) == len(threads)
    [job] = parallel.meta["worker_jobs"]
    assert job["side"] == "tf1 (TF1 interpreter)" and len(job["steps"]) == 7 and job["worker"] > 0
    spans["tf1"].clear(), spans["tf2"].clear()
    one = _check(tf1_python, steps=steps, checkpoint=True)
    assert not [(a, b) for a in spans["tf1"] for b in spans["tf2"] if a[0] < b[1] and b[0] < a[1]]
    assert [(s.name, s.status) for s in parallel.steps] == [(s.name, s.status) for s in one.steps]
    assert parallel.passed and one.passed
    for mine, theirs in zip(parallel.steps, one.steps):
        np.testing.assert_array_equal([leaf.max_abs for c in mine.comparisons for leaf in c.leaves],
                                      [leaf.max_abs for c in theirs.comparisons for leaf in c.leaves])
    assert list(temp_root.iterdir()) == []


def test_the_demo_asks_for_the_interpreter(monkeypatch, capsys):
    from examples.contrib_tf1 import parity
    monkeypatch.delenv("EQUIVTOOL_TF1_PYTHON", raising=False)
    with pytest.raises(SystemExit) as exited:
        parity.main([])
    assert exited.value.code == 2
    assert "--tf1-python: expected the path of a TensorFlow 1.15 interpreter" in capsys.readouterr().err


@pytest.mark.parametrize("script, message, start_seconds", [
    ("while read line; do :; done\n", "OldSideError: the TF1 interpreter did not answer 'hello' within 0.5 s", 0.5),
    ("exec cat > /dev/null\n", "OldSideError: the TF1 interpreter exited (status -9) during 'hello'", 0.5),
    # an interpreter that dies at once is waited for as long as a real start may take (a loaded
    # machine may need more than half a second to start even this script)
    ("echo 'ImportError: no tensorflow here' >&2\nexit 3\n",
     "OldSideError: the TF1 interpreter exited (status 3) during 'hello': ImportError: no tensorflow here", 60),
])
def test_an_interpreter_that_hangs_or_dies_at_start_is_one_line_and_leaves_nothing(
        tmp_path, temp_root, monkeypatch, script, message, start_seconds):
    import stat
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\n" + script)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(old_python, "START_SECONDS", start_seconds)
    monkeypatch.setattr(old_python, "QUIT_SECONDS", 0.5)
    report = _check(str(fake), steps=["parity"])
    [step] = report.steps
    assert step.status == "error" and step.message.startswith(message), step.message
    assert list(temp_root.iterdir()) == []


def test_every_registered_step_runs_there_or_is_skipped_with_the_reason():
    from equivtool.engine.registry import REGISTRY
    from equivtool.engine.steps.forward import random_constant, random_fresh
    for step in REGISTRY:
        assert step.name in old_python.STEP_SIDES, step.name  # a new step is decided on, not run in-process
    unlisted = types.SimpleNamespace(name="a_new_step")
    with pytest.raises(old_python.SkipStep, match="a_new_step: not yet run in the TF1 interpreter"):
        old_python.OldTF1Side.step_side(unlisted)(None)
    # the random steps' TF1 functions here match the in-process runners they stand for
    assert {step.runner() for step in REGISTRY if step.name.startswith("random/constant/")} == {random_constant}
    assert {step.runner() for step in REGISTRY if step.name.startswith("random/num_random_ops/")} == {random_fresh}



def test_an_interpreter_that_ended_before_a_request_is_named_as_ended_whenever_it_is_seen(tmp_path):
    """Whether its end is seen before the request is written or after, the message is the same."""
    import stat
    import subprocess as _subprocess
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'ImportError: no tensorflow here' >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    program = old_python.OldProgram.__new__(old_python.OldProgram)  # the process alone, no program folder
    with open(tmp_path / "stderr.txt", "w+") as stderr:
        program._stderr = stderr
        program.process = _subprocess.Popen([str(fake)], stdin=_subprocess.PIPE, stdout=_subprocess.PIPE,
                                            stderr=stderr, text=True)
        program.process.wait()  # the planted order: it ended before the request
        try:
            with pytest.raises(old_python.OldSideError,
                               match=r"exited \(status 3\) during 'hello': ImportError: no tensorflow here"):
                program._request("hello", {}, None)
        finally:
            program.process.stdin.close()
            program.process.stdout.close()
