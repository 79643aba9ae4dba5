"""A check stopped by a signal leaves nothing behind: no worker process alive
(checked by pid), no temporary folder; Ctrl-C on the CLI is one line and 130.

Each run is a child process running a tiny dense 3->4 model that sleeps in
both processes (see ``interrupt_models``); the tests wait for its ready files,
with a deadline, before they send the signal.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import equivtool
from interrupt_models import Dense, tf1_dense
from processes import alive

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
X = np.random.RandomState(0).rand(2, 3).astype(np.float32)

START_DEADLINE = 300   # both processes import TensorFlow and reach the model (a loaded 2-core machine)
STOP_DEADLINE = 30     # everything is gone after the signal (the model sleeps 120 s)

PARENT = f"""
import sys
sys.path[:0] = [{TESTS!r}, {ROOT!r}]
import os
import numpy as np
import equivtool
if os.environ.get("EQUIVTOOL_TEST_AHEAD"):  # the worker started ahead: it learns the folder with the options
    from equivtool.engine import workers
    equivtool.start_workers(int(sys.argv[1]) - 1)
    with open(os.environ["EQUIVTOOL_TEST_AHEAD"], "w") as f:
        f.write(" ".join(str(worker.pid) for worker in workers._spares))
from interrupt_models import Dense, tf1_dense
equivtool.check_equivalence(tf1_dense, Dense, np.ones([2, 3], np.float32), workers=int(sys.argv[1]),
                            steps=sys.argv[2].split(","), checkpoint=True)
"""


def _children(pid: int) -> list:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _wait_for(condition, deadline: float, what: str, process=None):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        if process is not None and process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"the run ended ({process.returncode}) before {what}:\n{out[-3000:]}\n{err[-3000:]}")
        time.sleep(0.1)  # polling, with a deadline: not a synchronisation by sleep
    pytest.fail(f"timed out after {deadline} s waiting for {what}")


def _communicate(process, what: str):
    """The run's output once it has ended, within STOP_DEADLINE; past it, the
    run is made to print every thread's Python stack (``PYTHONFAULTHANDLER``,
    set by :func:`_start`, dumps them on SIGABRT) and the test fails with it."""
    try:
        return process.communicate(timeout=STOP_DEADLINE)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGABRT)
        out, err = process.communicate()
        pytest.fail(f"the run did not end within {STOP_DEADLINE} s of {what}; its threads:\n{err[-6000:]}")


# A process started from a terminal has SIGINT at its default action and unblocked. One
# started from a test inherits the test process's: where an earlier test in the same pytest
# worker left SIGINT ignored or blocked, Python keeps it so (it installs KeyboardInterrupt
# only over a default action), and the child never sees the test's Ctrl-C (the flake of
# sessions 6 and 8). The launcher puts the terminal's state back, says on stderr what it
# inherited when that differed, and execs the command.
LAUNCH = """
import os, signal, sys
inherited = (signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, []))
if inherited[0] is not signal.SIG_DFL or signal.SIGINT in inherited[1] or signal.SIGTERM in inherited[1]:
    sys.stderr.write("launcher: inherited SIGINT %r, blocked %r\\n" % (inherited[0], sorted(inherited[1])))
signal.signal(signal.SIGINT, signal.SIG_DFL)
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT, signal.SIGTERM])
os.execv(sys.argv[1], sys.argv[1:])
"""


def _start(command, tmp_path, workers: int = 2, **env):
    ready, temp = tmp_path / "ready", tmp_path / "tmp"
    ready.mkdir()
    temp.mkdir()
    env = dict(os.environ, EQUIVTOOL_TEST_READY=str(ready), TMPDIR=str(temp), TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join([ROOT, TESTS]), PYTHONFAULTHANDLER="1", **env)
    process = subprocess.Popen([sys.executable, "-c", LAUNCH, *command], env=env, cwd=TESTS, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)

    def started():
        pids = {int(name) for name in os.listdir(ready)}
        others = pids - {process.pid}
        return (others or True) if process.pid in pids and len(others) >= workers - 1 else None

    try:
        found = _wait_for(started, START_DEADLINE, "the model running in the parent and its workers", process)
    except BaseException:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
        raise
    workers = (found if found is not True else set()) | set(_children(process.pid))
    return process, workers, temp


def _folders(temp) -> list:
    return sorted(p.name for p in temp.iterdir() if p.name.startswith("equivtool-"))


@pytest.mark.parametrize("how", ["SIGINT to the parent", "SIGTERM to the parent", "SIGKILL to the parent",
                                 "SIGKILL to the parent, its worker started ahead", "SIGTERM to the group",
                                 "SIGTERM to a one-process check"])
def test_a_signal_leaves_no_worker_and_no_temporary_folder(how, tmp_path):
    if how.endswith("one-process check"):  # it pauses in a num_random_ops build, after the checkpoint step
        count, steps, env = 1, "fixed_weights,checkpoint,random", {"EQUIVTOOL_TEST_PAUSE_WITH_FOLDER": "1"}
    else:  # the parent pauses in the pair's TF1 half, the worker in its TF2 half
        count, steps, env = 2, "fixed_weights,checkpoint", {}
        if how.endswith("ahead"):
            env["EQUIVTOOL_TEST_AHEAD"] = str(tmp_path / "ahead")
    process, workers, temp = _start([sys.executable, "-c", PARENT, str(count), steps], tmp_path, count, **env)
    assert len(workers) == count - 1
    try:
        assert _folders(temp), "the checkpoint folder should exist while the run is under way"
        signum = getattr(signal, how.split()[0])
        if how.endswith("ahead"):  # the check's worker is the one started ahead
            assert workers == {int(pid) for pid in (tmp_path / "ahead").read_text().split()}
        if how.endswith("group"):
            os.killpg(process.pid, signum)
        else:
            os.kill(process.pid, signum)
        out, err = _communicate(process, how)
        gone = _wait_for(lambda: not any(alive(pid) for pid in workers), STOP_DEADLINE,
                         f"the workers {sorted(workers)} to end")
        assert gone
        _wait_for(lambda: not _folders(temp), STOP_DEADLINE, f"the temporary folder to go: {_folders(temp)}")
        if signum == signal.SIGTERM:  # an orderly stop, then the death SIGTERM means
            assert process.returncode == -signal.SIGTERM, err[-3000:]
            assert "Traceback" not in err, err[-3000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_ctrl_c_on_the_cli_prints_one_line_and_exits_130(tmp_path):
    """Ctrl-C at a terminal reaches the whole process group: the CLI and its worker."""
    command = [sys.executable, "-m", "equivtool.cli", "check", "interrupt_models:tf1_dense",
               "interrupt_models:Dense", "--input-shape", "2,3", "--steps", "fixed_weights", "--workers", "2"]
    process, workers, temp = _start(command, tmp_path)
    assert workers
    try:
        os.killpg(process.pid, signal.SIGINT)
        out, err = _communicate(process, "SIGINT to the group")
        assert process.returncode == 130, out[-2000:] + err[-3000:]
        told = "\n".join(line for line in err.splitlines() if not line.startswith("launcher: "))
        assert told.strip() == "interrupted", err[-3000:]  # nothing from the worker, no traceback
        assert "Traceback" not in out
        _wait_for(lambda: not any(alive(pid) for pid in workers), STOP_DEADLINE, "the workers to end")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


# --------------------------------------------------------------------------
# The SIGTERM handler: installed on the main thread only, always put back
# --------------------------------------------------------------------------

def _handler_during_a_check() -> list:
    seen = []
    report = equivtool.check_equivalence(tf1_dense, Dense, X, steps=["parity"],
                                         progress=lambda result: seen.append(signal.getsignal(signal.SIGTERM)))
    assert report.passed, str(report)
    return seen


@pytest.fixture
def default_sigterm():
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_sigterm_handler_is_installed_during_a_check_and_put_back(default_sigterm):
    seen = _handler_during_a_check()
    assert seen and all(callable(handler) for handler in seen)  # ours, while the check ran
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_the_sigterm_handler_is_put_back_when_the_check_raises(default_sigterm):
    def progress(result):
        raise RuntimeError("planted: progress failed")

    with pytest.raises(RuntimeError, match="planted"):
        equivtool.check_equivalence(tf1_dense, Dense, X, steps=["parity"], progress=progress)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_check_on_another_thread_leaves_sigterm_alone(default_sigterm):
    seen, failures = [], []

    def run():
        try:
            seen.extend(_handler_during_a_check())
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=300)
    assert not thread.is_alive() and not failures, failures
    assert seen and all(handler is signal.SIG_DFL for handler in seen)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_handler_of_the_users_is_left_in_place(default_sigterm):
    def users(signum, frame):
        pass

    signal.signal(signal.SIGTERM, users)
    seen = _handler_during_a_check()
    assert seen and all(handler is users for handler in seen)
    assert signal.getsignal(signal.SIGTERM) is users
