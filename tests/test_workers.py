"""``workers=2``: each side of each step in a process of its own, with the same
numbers, verdicts and error messages as ``workers=1``."""

from __future__ import annotations

import collections
import functools
import os
import signal
import subprocess
import sys
import threading
import time
import types

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import equivtool
import processes
import sparse_models
from small_models import INPUT_SHAPE, SlimNetShim, slim_net

X = np.random.RandomState(0).rand(*INPUT_SHAPE).astype(np.float32)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SGD = (lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1), lambda: tf.keras.optimizers.SGD(0.1))


def _timing_free(note: str) -> str:
    return note.split(" (")[0] if note.startswith("includes building") else note


def summary(report) -> list:
    """Everything a verdict rests on, without timings."""
    rows = []
    for step in report.steps:
        leaves = [(leaf.name, leaf.ok, leaf.mismatched, leaf.max_abs, leaf.expected_shape)
                  for leaf in step.leaves]
        rows.append((step.name, step.status, step.message, tuple(_timing_free(n) for n in step.notes), leaves))
    return rows


def both(tf1_fn, tf2_layer, inputs, **kwargs):
    """The check in one process, and with ``workers=2`` where this process builds
    its TF1 half only once the worker is up (so that the worker runs the pair's
    TF2 half; a small model's check could otherwise end before it starts)."""
    one = equivtool.check_equivalence(tf1_fn, tf2_layer, inputs, workers=1, **kwargs)
    two = equivtool.check_equivalence(once_workers_up(tf1_fn), tf2_layer, inputs, workers=2, **kwargs)
    return one, two


_HEARD = threading.Condition()  # notified when a worker's message has been handled
_COUNTS = collections.Counter()  # the workers' messages handled, by kind ("ready": up; "done": a job ended)


@pytest.fixture(autouse=True)
def _count_workers_messages(monkeypatch):
    """Count the workers' messages by kind, once this process has handled each."""
    from equivtool.engine import workers as _workers
    receive = _workers._Parallel._receive
    _COUNTS.clear()

    def counted(self, worker, message):
        try:
            return receive(self, worker, message)
        finally:
            if message is not None:
                _heard(message[0])
    monkeypatch.setattr(_workers._Parallel, "_receive", counted)


def _heard(kind: str) -> None:
    with _HEARD:
        _COUNTS[kind] += 1
        _HEARD.notify_all()


def _wait_to_hear(kind: str, count: int, what: str) -> None:
    with _HEARD:
        assert _HEARD.wait_for(lambda: _COUNTS[kind] >= count, 120), what


def _in_a_worker() -> bool:
    return getattr(getattr(sys.modules["__main__"], "__spec__", None), "name", None) == "equivtool.engine.workers"


def once_workers_up(tf1_fn, count: int = 1):
    """``tf1_fn``, which here (not in a worker) first waits until ``count`` workers
    of the next check are up, so that they are given the jobs this process would
    otherwise have taken itself."""
    _COUNTS.clear()
    return functools.partial(_tf1_once_up, tf1_fn, count)


def _tf1_once_up(tf1_fn, count, x, training):
    if not _in_a_worker():
        _wait_to_hear("ready", count, "the workers did not start")
    return tf1_fn(x, training)


def test_every_step_gives_the_same_numbers_and_verdicts_as_one_process():
    one, two = both(slim_net, SlimNetShim, X, optimizers=SGD, checkpoint=True)
    assert one.passed and two.passed, str(two)
    # (resume needs a TF1 checkpoint path: tests/test_checkpoints_resume.py runs it with workers=2)
    assert {s.name for s in two.steps} == set(equivtool.STEPS) - {"random", "resume"} | {
        f"random/{m}/{p}" for m in equivtool.MODES for p in ("inference", "training")}
    assert summary(one) == summary(two)
    assert two.meta["workers"] == 2 and "workers" not in one.meta
    # Every side of every step ran once, in two processes in all (this one and a worker);
    # the pair's two halves in different ones, its TF1 half (the longest job) here.
    jobs = two.meta["worker_jobs"]
    ran = sorted((job["side"], name) for job in jobs for name in job["steps"])
    assert ran == sorted((side, step.name) for step in two.steps for side in ("tf1", "tf2"))
    assert len({job["worker"] for job in jobs}) == 2
    pair = {job["side"]: job["worker"] for job in jobs if "variables_once" in job["steps"]}
    assert len(pair) == 2 and pair["tf1"] == os.getpid() != pair["tf2"]
    # when each job was handed over: the pair's TF1 half first, at once; none before the check
    first = min(jobs, key=lambda job: job["started"])
    assert first["side"] == "tf1" and "variables_once" in first["steps"] and first["started"] < 1.0
    assert all(job["started"] >= 0 for job in jobs)
    assert _worker_children() == [] and not _serving_threads()


def _at_the_barrier(folder: str, count: int = 2) -> None:
    """In a worker: say so in ``folder`` (a file named by its pid), then wait until
    ``count`` workers have."""
    if not _in_a_worker():
        return
    open(os.path.join(folder, str(os.getpid())), "w").close()
    end = time.monotonic() + 120
    while len(os.listdir(folder)) < count:
        assert time.monotonic() < end, "the other worker never took a job"
        time.sleep(0.01)  # polling, with a deadline: not a synchronisation by sleep


def _tf1_at_the_barrier(folder, x, training):
    _at_the_barrier(folder)
    return slim_net(x, training)


class _ShimAtTheBarrier(SlimNetShim):
    def __init__(self, folder, **kwargs):
        super().__init__(**kwargs)
        self.folder = folder

    def call(self, inputs, training=None):
        _at_the_barrier(self.folder)
        return super().call(inputs, training)


def _worker_children() -> list:
    """This process's children that are equivtool worker processes."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and b"equivtool.engine.workers" in cmdline:
            found.append(int(pid))
    return found


def _serving_threads() -> list:
    return [t for t in threading.enumerate() if t.name == "equivtool-workers"]


def test_more_workers_spread_the_jobs_over_more_processes(tmp_path):
    """With workers=3 the jobs spread over three processes. This process builds its
    TF1 half once both workers are up; a worker's first job waits until the other
    worker has one too (a small model's jobs are quick enough for one worker to take
    them all before the other is up)."""
    report = equivtool.check_equivalence(once_workers_up(functools.partial(_tf1_at_the_barrier, str(tmp_path)), 2),
                                         functools.partial(_ShimAtTheBarrier, str(tmp_path)), X, workers=3,
                                         steps=["fixed_weights", "random"])
    assert report.passed, str(report)
    processes = {job["worker"] for job in report.meta["worker_jobs"]}
    assert len(processes) == 3 and os.getpid() in processes
    assert _worker_children() == [] and not _serving_threads()


@pytest.mark.parametrize("planted", [False, True])
def test_no_job_waits_for_a_worker_to_start(monkeypatch, planted):
    """A worker is given a job only once it is up: until then this process takes
    the jobs itself, so a worker that never starts (it is never sent the check's
    arguments here) delays nothing, and the report is the one-process report.
    Planted fault: workers taken as up at once (the scheduler before this), whose
    jobs then wait on a worker that cannot run them."""
    from equivtool.engine import workers as _workers
    monkeypatch.setattr(_workers._Worker, "setup", lambda self, payload, workdir: None)
    if planted:
        init = _workers._Worker.__init__

        def up_at_once(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self.ready = True
        monkeypatch.setattr(_workers._Worker, "__init__", up_at_once)
    steps = ["variables_once", "parity", "fixed_weights", "random"]
    one = equivtool.check_equivalence(slim_net, SlimNetShim, X, workers=1, steps=steps)
    two = equivtool.check_equivalence(slim_net, SlimNetShim, X, workers=2, steps=steps)
    assert one.passed
    assert (summary(one) == summary(two)) != planted, str(two)
    if not planted:
        assert {job["worker"] for job in two.meta["worker_jobs"]} == {os.getpid()}
    assert _worker_children() == [] and not _serving_threads()


def test_a_defect_in_the_thread_serving_the_workers_ends_the_check(monkeypatch):
    """A defect in the thread that hands out jobs and collects captures must
    reach the caller; the check neither hangs nor leaves a process behind."""
    from equivtool.engine import workers as _workers

    def planted(self, worker, message):
        _heard("ready")  # (this process's TF1 side waits for the worker's first message)
        raise RuntimeError("planted: the serving thread broke")

    tf1_fn = once_workers_up(slim_net)
    monkeypatch.setattr(_workers._Parallel, "_receive", planted)
    with pytest.raises(RuntimeError, match="planted: the serving thread broke"):
        equivtool.check_equivalence(tf1_fn, SlimNetShim, X, workers=2, steps=["fixed_weights"])
    assert _worker_children() == [] and not _serving_threads()


def test_a_planted_fault_fails_the_same_way():
    broken = functools.partial(SlimNetShim, bn_epsilon=1.1e-3)
    one, two = both(slim_net, broken, X)
    assert not two.passed
    assert two.step("fixed_weights").status == "failed"
    assert two.step("fixed_weights").first_failure.name == "end_points/bn1"
    assert summary(one) == summary(two)


def test_sparse_gradients_and_optimizer_steps_match_one_process():
    ids = sparse_models.token_ids()
    one, two = both(sparse_models.lstm_lm, lambda: sparse_models.Shim(sparse_models.lstm_lm), ids,
                    steps=["gradients", "optimizer"], optimizers=SGD, train_steps=1)
    assert two.passed, str(two)
    assert summary(one) == summary(two)
    for step in ("gradients", "optimizer"):
        assert any("sparse gradients" in note and "lstm_lm/embedding" in note for note in two.step(step).notes)


def test_an_error_in_a_worker_reaches_the_report_as_in_one_process():
    def tf1_fn(x, training):
        return slim_net(x, training)

    class Raising(SlimNetShim):
        def call(self, inputs, training=None):
            raise ValueError("planted: the TF2 side cannot run")

    one, two = both(tf1_fn, Raising, X, steps=["variables_once", "parity", "fixed_weights"])
    assert summary(one) == summary(two)
    first = two.step("variables_once")
    assert first.status == "error" and "planted: the TF2 side cannot run" in first.message
    trace = first.data["traceback"]
    assert "test_workers.py" in trace and "in call" in trace  # the user's frame, from the worker
    assert two.step("parity").status == "error"  # each call of the layer raises


def test_a_worker_that_dies_is_reported_and_nothing_hangs(tmp_path):
    script = tmp_path / "dies.py"
    script.write_text(
        "import os, sys\n"
        f"sys.path[:0] = [{os.path.join(ROOT, 'tests')!r}, {ROOT!r}]\n"
        "import numpy as np\n"
        "import equivtool\n"
        "from small_models import INPUT_SHAPE, SlimNetShim, slim_net\n"
        "import threading\n"
        "from equivtool.engine import workers\n"
        "PARENT, UP = os.getpid(), threading.Event()\n"
        "receive = workers._Parallel._receive\n"
        "def watched(self, worker, message):\n"
        "    if message is not None and message[0] == 'ready':\n"
        "        UP.set()\n"
        "    return receive(self, worker, message)\n"
        "workers._Parallel._receive = watched\n"
        "def tf1_fn(x, training):  # here, once the worker is up (it is given the TF2 half)\n"
        "    assert os.getpid() != PARENT or sys.modules['__main__'].UP.wait(120)  # (UP does not travel)\n"
        "    return slim_net(x, training)\n"
        "class Dies(SlimNetShim):\n"
        "    def call(self, inputs, training=None):\n"
        "        if os.getpid() != PARENT:\n"
        "            os._exit(7)\n"
        "        return super().call(inputs, training)\n"
        "x = np.ones(INPUT_SHAPE, np.float32)\n"
        "report = equivtool.check_equivalence(tf1_fn, Dies, x, workers=2)\n"
        "print(report)\n"
        "for step in report.steps:\n"
        "    print('STEP', step.name, step.status, step.message)\n"
        "sys.exit(0 if report.passed else 1)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                          cwd=str(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("STEP ")]
    assert lines, done.stdout + done.stderr
    died = [line for line in lines if "WorkerDied" in line and "exit code 7" in line]
    assert died, "\n".join(lines)
    assert "EQUIVALENT (" not in done.stdout.replace("NOT EQUIVALENT", "")


def _old_run_here(self, here, job):
    """The planted fault: the job's steps judged only once the whole job has run."""
    from equivtool.engine import workers as _workers

    def captured(step, outcome):
        with self.lock:
            self._captured(here, step.name, job.side, outcome)
    seconds = _workers._run_job(self.engine, job.side, job.steps, job.inputs, job.release_after, captured)
    with self.lock:
        self._done(here, seconds)


@pytest.mark.parametrize("planted", [False, True])
def test_a_step_is_judged_here_as_soon_as_both_sides_are_in(monkeypatch, planted):
    """While this process runs the pair's TF1 half, a step whose TF2 side is in
    is judged before the half's next step runs (as with workers=1), so both
    captures are dropped then rather than held to the end of the job. The TF1
    side of ``parity`` waits here until the worker's is in."""
    from equivtool.engine import workers as _workers
    events, arrived = [], threading.Event()
    captured, run_side = _workers._Parallel._captured, _workers._run_side

    def watched_captured(self, slot, name, side, outcome):
        captured(self, slot, name, side, outcome)
        if (name, side) == ("parity", "tf2"):
            arrived.set()

    def watched_run_side(engine, step, side, tf1_capture):
        if (step.name, side) == ("parity", "tf1"):
            assert arrived.wait(120), "the worker's parity side never came"
        events.append(("ran", step.name, side))
        return run_side(engine, step, side, tf1_capture)

    monkeypatch.setattr(_workers._Parallel, "_captured", watched_captured)
    monkeypatch.setattr(_workers, "_run_side", watched_run_side)
    if planted:
        monkeypatch.setattr(_workers._Parallel, "_run_here", _old_run_here)
    report = equivtool.check_equivalence(slim_net, SlimNetShim, X, workers=2,
                                         steps=["variables_once", "parity", "fixed_weights", "gradients"],
                                         progress=lambda result: events.append(("judged", result.name)))
    assert report.passed, str(report)
    assert ("ran", "fixed_weights", "tf1") in events and ("judged", "parity") in events, events
    early = events.index(("judged", "parity")) < events.index(("ran", "fixed_weights", "tf1"))
    assert early != planted, events


def _count_matches(monkeypatch) -> list:
    """Keep every array in the workers, and record what each match found: ``[(matched, missing)]``."""
    from equivtool.engine import _kept
    monkeypatch.setattr(_kept, "KEEP_BYTES", 1)
    found, match = [], _kept.match

    def counted(capture, other):
        matched, missing = match(capture, other)
        found.append((len(_kept.kept(capture)) - len(missing), len(missing)))
        return matched, missing
    monkeypatch.setattr(_kept, "match", counted)
    return found


def test_kept_arrays_give_the_numbers_and_verdicts_of_one_process(monkeypatch):
    """Every array a worker sends is kept there and matched to this side's by its
    digest; those that differ are asked for: more of them with a planted fault
    (its outputs differ) than without (a few values of the training steps differ in
    their last bits). Either way the report is the one-process report, leaf for leaf."""
    found = _count_matches(monkeypatch)
    missing = {}
    for planted in (False, True):
        layer = functools.partial(SlimNetShim, bn_epsilon=1.1e-3) if planted else SlimNetShim
        one, two = both(slim_net, layer, X, steps=["fixed_weights", "random", "gradients"])
        assert two.passed != planted and summary(one) == summary(two), str(two)
        assert sum(matched for matched, _ in found) > 0, found
        missing[planted] = sum(count for _, count in found)
        found.clear()
    assert missing[True] > missing[False], missing
    assert _worker_children() == [] and not _serving_threads()


def test_kept_arrays_on_both_sides_give_the_numbers_of_one_process(monkeypatch):
    """With three processes a step's two sides can both be kept by workers: the TF1
    side's arrays are asked for whole, then the TF2 side's matched to them. This
    process builds its TF1 half only once the workers have run every other job."""
    from equivtool.engine import workers as _workers
    _count_matches(monkeypatch)
    both_kept, resolve = [], _workers._Parallel._resolve

    def watched(self, name):
        if all((name, side) in self.unresolved for side in ("tf1", "tf2")):
            both_kept.append(name)
        return resolve(self, name)
    monkeypatch.setattr(_workers._Parallel, "_resolve", watched)
    steps = ["fixed_weights", "random"]
    one = equivtool.check_equivalence(slim_net, SlimNetShim, X, workers=1, steps=steps)
    three = equivtool.check_equivalence(_tf1_last_here, SlimNetShim, X, workers=3, steps=steps)
    assert three.passed and summary(one) == summary(three), str(three)
    assert both_kept, "no step had both sides kept by workers"
    assert _worker_children() == [] and not _serving_threads()


def test_kept_arrays_moved_to_disk_give_the_numbers_of_one_process(monkeypatch):
    """A worker that runs on while this process's TF1 half is not in moves what it
    keeps to disk first; matched or read back (a few training values differ in
    their last bits; with a planted fault, the TF2 outputs differ: more), the
    report is the one-process report, leaf for leaf. Which worker runs what is
    the scheduler's choice: the pair's TF2 half must be moved to disk whenever
    its worker starts another job, and the check is run again (at most three
    times) until its worker has (under load the other worker once took every
    job after the pair, and nothing was left for the pair's worker)."""
    from equivtool.engine import _kept
    from equivtool.engine import workers as _workers
    found = _count_matches(monkeypatch)
    monkeypatch.setattr(_kept, "SPILL_BYTES", 0)
    starts, start = [], _workers._Worker.start

    def watched(self, job, keep, final=False, spill=((), 0)):
        pair = job.side == "tf2" and "fixed_weights" in [step.name for step in job.steps]
        starts.append((self, pair, list(spill[0])))
        return start(self, job, keep, final, spill)
    monkeypatch.setattr(_workers._Worker, "start", watched)
    missing = {}
    for planted in (False, True):
        layer = functools.partial(SlimNetShim, bn_epsilon=1.1e-3) if planted else SlimNetShim
        steps = ["fixed_weights", "random"]
        one = equivtool.check_equivalence(slim_net, layer, X, workers=1, steps=steps)
        for _ in range(3):
            starts.clear()
            found.clear()
            with _HEARD:
                _COUNTS.clear()  # (_tf1_last_here counts this check's jobs)
            three = equivtool.check_equivalence(_tf1_last_here, layer, X, workers=3, steps=steps)
            assert three.passed != planted and summary(one) == summary(three), str(three)
            pair = next((i for i, (_, is_pair, _) in enumerate(starts) if is_pair), None)
            after = [] if pair is None else [spill for worker, _, spill in starts[pair + 1:]
                                             if worker is starts[pair][0]]
            if after:  # the pair's TF2 half, kept while its worker ran on
                assert ("fixed_weights", "tf2") in after[0], starts
                break
        else:
            raise AssertionError(f"in three checks the pair's worker ran no job after the pair: {starts}")
        missing[planted] = sum(count for _, count in found)
    assert 0 < missing[False] < missing[True], missing
    assert _worker_children() == [] and not _serving_threads()


def _tf1_last_here(x, training):
    """slim_net; here (not in a worker) it first waits until the workers have ended five jobs."""
    if not _in_a_worker():
        _wait_to_hear("done", 5, "the workers did not end five jobs")
    return slim_net(x, training)


def test_no_step_is_lost_when_kept_arrays_come_back_at_once(monkeypatch):
    """Kept arrays asked for may come back before this process looks again: the
    check must still ask for the rest and judge every step (on TensorFlow 2.16 a
    step whose two sides both needed fetching went missing from the report).
    Here every judging pass waits until what it asked for is in; with a planted
    fault the TF2 arrays match nothing, so each such step needs two fetches."""
    from equivtool.engine import workers as _workers
    _count_matches(monkeypatch)
    emit = _workers._Parallel._emit

    def slow_emit(self):
        emit(self)
        with self.lock:  # as if this thread were slow: the arrays asked for are in before it looks
            while any(key in worker.fetching for key, worker in self.unresolved.items()):
                self.lock.wait(1.0)
    monkeypatch.setattr(_workers._Parallel, "_emit", slow_emit)
    layer = functools.partial(SlimNetShim, bn_epsilon=1.1e-3)
    steps = ["fixed_weights", "random"]
    one = equivtool.check_equivalence(slim_net, layer, X, workers=1, steps=steps)
    three = equivtool.check_equivalence(_tf1_last_here, layer, X, workers=3, steps=steps)
    assert [s.name for s in three.steps] == [s.name for s in one.steps]
    assert summary(one) == summary(three), str(three)
    assert _worker_children() == [] and not _serving_threads()


def test_a_worker_that_dies_keeping_arrays_is_reported_on_their_steps(monkeypatch):
    """The worker runs the pair's TF2 half and keeps its arrays, then dies in its
    next job (a TF1 side) before this process's TF1 half is in: the steps whose
    arrays it kept are reported as its death, the check ends."""
    from equivtool.engine import workers as _workers
    _count_matches(monkeypatch)
    gone, receive = _GONE, _workers._Parallel._receive
    gone.clear()

    def watched(self, worker, message):
        try:
            return receive(self, worker, message)
        finally:
            if message is None:
                gone.set()

    monkeypatch.setattr(_workers._Parallel, "_receive", watched)
    report = equivtool.check_equivalence(_dies_in_a_worker, SlimNetShim, X, workers=2,
                                         steps=["fixed_weights", "random"])
    assert not report.passed
    kept = [step.name for step in report.steps if "while keeping the TF2 side of this step" in (step.message or "")]
    assert "fixed_weights" in kept and "random/constant/training" in kept, str(report)
    for name in kept:
        assert report.step(name).status == "error" and "exit code 7" in report.step(name).message
    assert any("while running the TF1 side" in (step.message or "") for step in report.steps), str(report)
    assert _worker_children() == [] and not _serving_threads()


_GONE = threading.Event()  # set here when a worker has ended (the test wraps _Parallel._receive)


def _dies_in_a_worker(x, training):
    """slim_net; in a worker process it ends that process, here it first waits until a worker has."""
    if _in_a_worker():
        os._exit(7)
    assert _GONE.wait(120), "no worker ended"
    return slim_net(x, training)


def test_one_worker_process_is_the_in_process_run():
    report = equivtool.check_equivalence(slim_net, SlimNetShim, X, steps=["fixed_weights"], workers=1)
    assert report.passed and "workers" not in report.meta


def test_checks_that_need_one_process_say_so():
    report = equivtool.check_equivalence(slim_net, SlimNetShim, X, steps=["fixed_weights"], workers=2,
                                         localize=True)
    assert report.meta["workers"].startswith("1 (asked for 2: localize=True")
    layer = SlimNetShim()
    report = equivtool.check_equivalence(slim_net, layer, X, steps=["fixed_weights"], workers=2)
    assert report.passed and "layer instance" in report.meta["workers"]


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2", None])
def test_bad_workers_is_refused_before_any_work(bad):
    calls = []

    def tf1_fn(x, training):
        calls.append(1)
        return slim_net(x, training)

    with pytest.raises(ValueError, match=r"workers: expected an int >= 1"):
        equivtool.check_equivalence(tf1_fn, SlimNetShim, X, workers=bad)
    assert calls == []


def test_an_argument_that_cannot_be_sent_is_named_before_any_work():
    lock = threading.Lock()
    calls = []

    def tf1_fn(x, training, _lock=lock):
        calls.append(1)
        return slim_net(x, training)

    with pytest.raises(TypeError, match=r"^tf1_fn: cannot be sent to a worker process with workers>1"):
        equivtool.check_equivalence(tf1_fn, SlimNetShim, X, workers=2)
    assert calls == []


def test_progress_is_called_in_run_order_with_workers():
    seen = []
    report = equivtool.check_equivalence(slim_net, SlimNetShim, X, workers=2, progress=seen.append,
                                         steps=["variables_once", "parity", "random"])
    from equivtool.engine import registry as _steps
    expected = [step.name for step in _steps.run_order(report.meta["steps"], report.meta["modes"])]
    assert [result.name for result in seen] == expected


def test_the_checkpoint_folder_is_removed(tmp_path, monkeypatch):
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    report = equivtool.check_equivalence(slim_net, SlimNetShim, X, workers=2, steps=["checkpoint"],
                                         checkpoint=True)
    assert report.step("checkpoint").status == "passed", str(report)
    assert any("written by the TF1 side" in note for note in report.step("checkpoint").notes)
    assert list(tmp_path.iterdir()) == []


def test_cli_check_runs_with_workers(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "equivtool.cli", "check", "small_models:slim_net", "small_models:SlimNetShim",
         "--input-shape", ",".join(map(str, INPUT_SHAPE)), "--steps", "fixed_weights,random",
         "--workers", "2"],
        capture_output=True, text=True, timeout=600, cwd=os.path.join(ROOT, "tests"),
        env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "workers: 2" in done.stdout and "Verdict: EQUIVALENT" in done.stdout


def tiny_slim_net(inputs, num_classes=3, is_training=True, scope="tiny"):
    import tf_slim as slim
    end_points = {}
    with tf.compat.v1.variable_scope(scope):
        net = slim.conv2d(inputs, 4, [3, 3], scope="conv1")
        end_points["conv1"] = net
        net = slim.dropout(slim.flatten(net), 0.5, is_training=is_training, scope="dropout")
        net = slim.fully_connected(net, num_classes, activation_fn=None, scope="logits")
        end_points["logits"] = net
    return net, end_points


def tiny_arg_scope():
    import tf_slim as slim
    # tf.nn.relu is TensorFlow's dispatch wrapper, which names itself gen_nn_ops.relu
    with slim.arg_scope([slim.conv2d, slim.fully_connected], activation_fn=tf.nn.relu,
                        weights_regularizer=slim.l2_regularizer(0.01)):
        with slim.arg_scope([slim.conv2d], normalizer_fn=slim.batch_norm) as scope:
            return scope


def test_slim_shim_leaves_the_users_arg_scope_as_it_was():
    scope = tiny_arg_scope()
    before = {key: dict(defaults) for key, defaults in scope.items()}
    layer = equivtool.slim_shim(tiny_slim_net, scope, num_classes=3)
    layer(np.zeros([1, 6, 6, 3], np.float32), training=False)
    assert all(type(defaults) is dict for defaults in scope.values())  # not Keras-tracked wrappers
    assert scope == before and layer.arg_scope is scope


def test_library_functions_that_misname_themselves_travel_by_reference():
    from equivtool.engine import send as _send
    assert tf.nn.relu.__module__ == "tensorflow.python.ops.gen_nn_ops"  # what made plain cloudpickle fail
    assert _send.loads(_send.dumps(tf.nn.relu)) is tf.nn.relu
    assert _send.loads(_send.dumps({"act": tf.nn.relu}))["act"] is tf.nn.relu


def test_a_slim_shim_with_an_arg_scope_runs_in_workers():
    make = functools.partial(equivtool.slim_shim, tiny_slim_net, tiny_arg_scope(), num_classes=3)
    x = np.random.RandomState(1).rand(2, 6, 6, 3).astype(np.float32)
    one, two = both(make().tf1_fn, make, x, steps=["parity", "fixed_weights", "random"])
    assert two.passed, str(two)
    assert summary(one) == summary(two)
    # The arg scope reached both sides in the workers: conv1 has batch norm instead of
    # biases (weights, beta, moving mean and variance; 2 without the scope), and the logits
    # weights and biases.
    assert dict(two.step("parity").data) == dict(one.step("parity").data)
    assert two.step("parity").data["tf1_variables"] == 4 + 2
    regularization = [leaf for leaf in two.step("fixed_weights").leaves if leaf.name == "regularization_loss"]
    assert regularization and regularization[0].max_abs == 0


_ARG_SCOPE_PROBE = """
import sys, equivtool, tensorflow as tf, tf_slim as slim
from equivtool.engine import send as _send
import cloudpickle
scope = (_send.loads if sys.argv[1] == "send" else cloudpickle.loads)(open(sys.argv[2], "rb").read())
with tf.Graph().as_default():
    with slim.arg_scope(scope):
        slim.conv2d(tf.zeros([1, 4, 4, 3]), 2, [3, 3], scope="conv")
    print("VARIABLES", len(tf.compat.v1.global_variables()))
"""


@pytest.mark.parametrize("how", ["send", "plain cloudpickle"])
def test_an_arg_scope_still_applies_in_another_process(how, tmp_path):
    import cloudpickle
    from equivtool.engine import send as _send
    scope = tiny_arg_scope()
    path = tmp_path / "scope.pickle"
    path.write_bytes(_send.dumps(scope) if how == "send" else cloudpickle.dumps(scope))
    done = subprocess.run([sys.executable, "-c", _ARG_SCOPE_PROBE, how.split()[0], str(path)],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.returncode == 0, done.stderr[-2000:]
    count = int(done.stdout.split("VARIABLES")[1])
    # With the scope: weights + batch norm (beta, moving mean, moving variance); without: weights + biases.
    assert count == (4 if how == "send" else 2)


def test_an_arg_scope_whose_op_cannot_be_found_is_refused():
    import tf_slim as slim

    @slim.add_arg_scope
    def local_op(x, units=1):  # lives in no module: another process cannot find it
        return x

    with slim.arg_scope([local_op], units=2) as scope:
        pass

    def tf1_fn(x, training):
        with slim.arg_scope(scope):
            return slim_net(x, training)

    with pytest.raises(TypeError, match=r"^tf1_fn: cannot be sent .*tf-slim arg scope for <function"):
        equivtool.check_equivalence(tf1_fn, SlimNetShim, X, workers=2)


def test_functions_sent_by_value_keep_their_file():
    """cloudpickle 3.1.3 sends copied code as "<dynamic-code>"; equivtool keeps the
    file, so an error in a worker names the user's file as in one process."""
    import pickle

    from equivtool.engine import send

    def local(x):
        return lambda: x  # nested code objects travel too

    copied = pickle.loads(send.dumps(local))
    assert copied.__code__.co_filename == __file__
    assert copied(1).__code__.co_filename == __file__


def test_memory_is_not_given_back_after_a_process_s_last_job(monkeypatch):
    """A job after which no job is left for its process (the queue empty when it
    was handed over) gives no memory back after its last step: nothing there would
    reuse it, and a large model's collection takes most of a second at the check's
    end. Every other job still gives it back after each step of its own model."""
    from types import SimpleNamespace

    from equivtool.engine import workers as _workers
    given, released = [], []
    engine = SimpleNamespace(give_back_memory=lambda: given.append(1),
                             release_pair=lambda give_back=True: released.append(give_back))
    with monkeypatch.context() as patched:
        patched.setattr(_workers, "_run_side", lambda engine, step, side, capture: ("ok", {}, 0.0))
        fresh = [SimpleNamespace(name=f"step{i}", shared=False) for i in range(3)]
        for final, expected in ((False, 3), (True, 2)):
            given.clear()
            _workers._run_job(engine, "tf1", fresh, {}, True, lambda step, outcome: None, final)
            assert len(given) == expected and released[-1] is not final

    # In a check: the flags each job was run with, here and in the worker.
    here, sent = [], []
    run_job, start = _workers._run_job, _workers._Worker.start

    def recorded_run_job(engine, side, steps, inputs, release_after, captured, final=False):
        here.append(([s.name for s in steps], final))
        return run_job(engine, side, steps, inputs, release_after, captured, final)

    def recorded_start(self, job, keep, final=False, **kwargs):
        sent.append(([s.name for s in job.steps], final))
        return start(self, job, keep, final, **kwargs)
    monkeypatch.setattr(_workers, "_run_job", recorded_run_job)
    monkeypatch.setattr(_workers._Worker, "start", recorded_start)
    report = equivtool.check_equivalence(once_workers_up(slim_net), SlimNetShim, X, workers=2,
                                         steps=["fixed_weights", "random"])
    assert report.passed, str(report)
    flags = [final for _, final in here + sent]
    assert len(flags) == 6 and 1 <= sum(flags) <= 2, (here, sent)  # the last job of each process at most
    assert not any(final for _, final in here[:-1]) and not any(final for _, final in sent[:-1]), (here, sent)


# -- workers started ahead of a check (equivtool.start_workers) ---------------

def test_a_check_takes_the_workers_started_ahead_and_gives_the_same_numbers():
    """A worker started ahead is the one the check gives its jobs to, and the
    report is the one-process report; the check starts no other worker."""
    from equivtool.engine import workers as _workers
    equivtool.start_workers(1)
    ahead = [worker.pid for worker in _workers._spares]
    one, two = both(slim_net, SlimNetShim, X, steps=["variables_once", "fixed_weights", "random"])
    assert one.passed and summary(one) == summary(two), str(two)
    assert {job["worker"] for job in two.meta["worker_jobs"]} == {os.getpid(), *ahead}
    assert _workers._spares == [] and _worker_children() == []


@pytest.mark.parametrize("planted", [False, True])
def test_a_worker_started_in_another_environment_is_not_taken(monkeypatch, planted):
    """A variable that configures equivtool, TensorFlow or Python set after the
    worker started: the check starts a fresh worker and stops the one started
    ahead. Planted fault: every worker started ahead taken."""
    from equivtool.engine import workers as _workers
    if planted:
        monkeypatch.setattr(_workers, "_started_alike", lambda started, now: True)
    equivtool.start_workers(1)
    ahead = _workers._spares[0].pid
    monkeypatch.setenv("EQUIVTOOL_SOMETHING_NEW", "1")
    _, two = both(slim_net, SlimNetShim, X, steps=["fixed_weights"])
    assert two.passed, str(two)
    assert (ahead in {job["worker"] for job in two.meta["worker_jobs"]}) == planted
    assert processes.gone_within(ahead, 30) and _workers._spares == []


_ENV = st.dictionaries(st.sampled_from(["HOME", "LANG", "TF_X", "OMP_NUM_THREADS", "PYTHONPATH", "TERM", "SHLVL"]),
                       st.sampled_from(["0", "1", "a"]), max_size=5)


@settings(max_examples=200, deadline=None)
@given(_ENV, _ENV)
def test_a_worker_counts_as_started_alike_exactly_when_nothing_it_runs_with_changed(started, now):
    """Started alike: every inherited variable unchanged and no configuring one
    (TF_*, OMP_*, PYTHON*, ...) added; interpreter and folder the same."""
    from equivtool.engine.workers import _CONFIGURING, _started_alike
    changed = any(now.get(key) != value for key, value in started.items())
    configured = any(key.startswith(_CONFIGURING) for key in now.keys() - started.keys())
    assert _started_alike(("py", "/d", started), ("py", "/d", now)) == (not changed and not configured)
    assert not _started_alike(("py", "/d", started), ("py", "/e", dict(started)))
    assert not _started_alike(("py", "/d", started), ("py3", "/d", dict(started)))


@pytest.mark.parametrize("how", ["exit", "SIGTERM", "SIGKILL"])
def test_workers_started_ahead_end_with_this_interpreter(how):
    """Never taken by a check, they are stopped at exit, and end by themselves
    when this interpreter is killed."""
    script = ("import os, sys, time, equivtool\n"
              "from equivtool.engine import workers\n"
              "equivtool.start_workers(2)\n"
              "equivtool.start_workers(2)  # topped up: still two\n"
              "print(' '.join(str(w.pid) for w in workers._spares), flush=True)\n"
              "sys.stdin.readline()\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        pids = [int(pid) for pid in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(processes.alive(pid) for pid in pids)
        if how == "exit":
            proc.stdin.close()
        else:
            proc.send_signal(getattr(signal, how))
        proc.wait(timeout=60)
        assert all(processes.gone_within(pid, 30) for pid in pids)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("bad", [-1, True, 1.5, "2", None])
def test_a_bad_count_of_workers_to_start_is_refused(bad):
    from equivtool.engine import workers as _workers
    with pytest.raises(ValueError, match=r"^count: expected a whole number >= 0, got "):
        equivtool.start_workers(bad)
    assert _workers._spares == []


def _queue_order(slot, queue, tf1_on):
    from equivtool.engine import workers as _workers
    parallel = types.SimpleNamespace(queue=queue, tf1_on=tf1_on)
    return _workers._Parallel._in_turn(parallel, slot)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["tf1", "tf2"]), st.integers(0, 5), st.booleans()), max_size=8),
       st.dictionaries(st.integers(0, 5), st.sampled_from(["here", "worker"])))
def test_a_process_takes_last_the_tf2_sides_whose_tf1_side_it_ran(jobs, ran):
    """The queue as a process takes from it: a fresh step's TF2 side whose TF1
    side that process ran comes after the rest; otherwise the queue's order.
    (Both sides on one worker, one side's arrays all cross to be judged.)"""
    from equivtool.engine import workers as _workers
    slots = {"here": object(), "worker": object()}
    queue = [_workers._Job(side, [types.SimpleNamespace(name=f"s{n}")], on_pair_worker=pair)
             for side, n, pair in jobs]
    tf1_on = {f"s{n}": slots[where] for n, where in ran.items()}
    for where, slot in slots.items():
        mine = [job for job in queue if job.side == "tf2" and not job.on_pair_worker
                and ran.get(int(job.steps[0].name[1:])) == where]
        assert _queue_order(slot, list(queue), tf1_on) == [job for job in queue if job not in mine] + mine


@pytest.mark.parametrize("planted", [False, True])
def test_the_worker_that_ran_a_steps_tf1_side_leaves_its_tf2_side_to_another(planted):
    from equivtool.engine import workers as _workers
    here, worker = object(), object()
    step = lambda name: [types.SimpleNamespace(name=name)]  # noqa: E731
    inference, training = _workers._Job("tf2", step("inference")), _workers._Job("tf2", step("training"))
    tf1_on = {"inference": here, "training": worker}
    order = (lambda slot, queue, on: list(queue)) if planted else _queue_order
    assert (order(here, [inference, training], tf1_on)[0] is training) != planted
    assert order(worker, [inference, training], tf1_on)[0] is inference
