"""``workers=N``: the sides of the steps spread over N processes, this one included.

The TF1 side and the TF2 side of a step are independent until their captures
are judged (see :mod:`equivtool.engine.steps`), and so are the step groups: the
constant-mode pair (its TF1 half, its TF2 half) and every ``num_random_ops``
comparison (its TF1 graph, its TF2 layer). Each of those *jobs* runs either
in this process, on its main thread as with ``workers=1`` (it starts the
first and longest job, the pair's TF1 half, at once), or in one of N-1 worker
processes; this process also judges. With 2 cores the two sides overlap; with
more, independent steps run at the same time. Running jobs here too saves one
interpreter holding TensorFlow (about 600 MB). A worker is given a job only
once it has started (imported TensorFlow and read the check's arguments, a few
seconds); until then this process takes the next job itself, so a worker's
start is never waited for: a small model's check may end before it is up.

What crosses a process: the check's options, once per worker (pickled with
cloudpickle, so lambdas and functions defined in ``__main__`` travel by value;
importable ones by reference, with the parent's ``sys.path``), and each side's
capture coming back (NumPy arrays, names, flags). A worker sends a capture's
large arrays as digests and keeps them; once the other side of the step is in,
each is matched to an array of that side with the same bytes (most are: the same
initial values, read back) and only the others are asked for (see
:mod:`equivtool.engine._kept`): a model's values cross once at most, and
usually not at all. A side that raises comes
back as the same one-line message and full traceback an in-process run
reports. A worker that dies is reported on every side it had not finished;
nothing waits on it.

Workers are plain ``python -m equivtool.engine.workers`` processes (not
``multiprocessing``'s spawn, which re-imports the user's ``__main__`` and so
re-runs a script without an ``if __name__ == "__main__"`` guard), connected by
a socket pair.
"""

from __future__ import annotations

import atexit
import dataclasses
import gc
import importlib
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Callable

from equivtool.engine import _kept
from equivtool.engine import send as _send
from equivtool.engine import signals as _signals

if TYPE_CHECKING:  # pragma: no cover
    from equivtool.engine.run import Engine

_FD_ENV = "EQUIVTOOL_WORKER_FD"
_PARENT_ENV = "EQUIVTOOL_WORKER_PARENT"  # the parent's pid: the worker ends when it is gone
_WORKDIR_ENV = "EQUIVTOOL_WORKER_WORKDIR"  # the parent's temporary folder: an orphan removes it


# --------------------------------------------------------------------------
# The parent: jobs, workers, judging
# --------------------------------------------------------------------------

@dataclasses.dataclass
class _Job:
    side: str                 # "tf1" or "tf2"
    steps: list               # [Step], run in this order
    release_after: bool = True  # drop the pair afterwards (fresh steps build their own models)
    on_pair_worker: bool = False  # must run where the pair's TF2 half lives (it needs that state)
    inputs: dict = dataclasses.field(default_factory=dict)  # step name -> the TF1 capture it needs


class _Slot:
    """Somewhere a job runs: this process (:class:`_Here`) or a worker process (:class:`_Worker`)."""

    pid: int
    job: "_Job | None" = None
    dead: str | None = None
    reserved = False          # holds the pair's TF2 half for a step still to come

    def __init__(self):
        self.pending: set = set()   # (step name, side) this slot still owes

    def take(self, job: _Job) -> None:
        self.job = job
        self.taken = time.monotonic()
        self.pending = {(step.name, job.side) for step in job.steps}


class _Here(_Slot):
    """The parent itself: it runs jobs on its main thread, as ``workers=1`` does, so
    that ``workers=N`` means N processes in all (one interpreter fewer)."""

    def __init__(self):
        super().__init__()
        self.pid = os.getpid()


class _Worker(_Slot):
    def __init__(self, workdir: str | None = None):
        super().__init__()
        self.started_in = _environment()  # a spare is taken only by a check run where it was started
        parent, child = socket.socketpair()
        env = dict(os.environ, **{_FD_ENV: str(child.fileno()), _PARENT_ENV: str(os.getpid()),
                                  _WORKDIR_ENV: workdir or ""})
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # this process has already said what TensorFlow says at start
        # The worker imports this very equivtool (a checkout can shadow an installed one).
        home = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join([home] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        self.process = subprocess.Popen([sys.executable, "-m", "equivtool.engine.workers"], env=env,
                                        pass_fds=(child.fileno(),))
        child.close()
        self.pid = self.process.pid
        self.conn = Connection(parent.detach())
        self.fetching: set = set()  # (step name, side) whose kept arrays were asked for, not yet come
        self.ready = False  # it has read the options (its imports done): it may be given jobs

    @property
    def starting(self) -> bool:
        """Alive and not up yet: it will say "ready" (or its connection will end)."""
        return not (self.ready or self.dead)

    def setup(self, payload: bytes, workdir: str | None) -> None:
        """The options; sent once every worker is starting, so that their imports overlap
        (a large payload waits until the worker reads it)."""
        self.conn.send(("setup", list(sys.path), payload, workdir))

    def start(self, job: _Job, keep: tuple, final: bool = False, spill: tuple = ((), 0)) -> None:
        """Run ``job``; ``keep``: ``(step names, bytes)``, the arrays of that size or
        larger in those steps' captures are kept there (see :mod:`equivtool.engine._kept`);
        ``final``: no job is left after it (see :func:`_run_job`); ``spill``:
        ``((step name, side) ..., bytes)``, captures whose kept arrays are moved to
        disk first when they come to that many bytes or more (see :meth:`_Outbox.spill`)."""
        self.take(job)
        self.conn.send(("run", job.side, [step.name for step in job.steps], job.inputs, job.release_after, keep,
                        final, spill))

    def died(self) -> str:
        try:
            code = self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        try:
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        except ValueError:
            how = f"killed by signal {-code}"
        self.dead = f"the worker process (pid {self.process.pid}) died ({how})"
        self.job, self.reserved = None, False
        return self.dead

    def stop(self, force: bool) -> None:
        if self.process.poll() is None and not force:
            try:
                self.conn.send(("exit",))
                self.process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.conn.close()


# A side's outcome: ("ok", capture, seconds) | ("skip", reason, seconds) | ("error", message, traceback, seconds).

#: What a side's capture is replaced by once its step is judged (its arrays freed).
_JUDGED = ("judged",)
_OTHER = {"tf1": "tf2", "tf2": "tf1"}


def _died(message: str) -> tuple:
    """The outcome of a side a dead worker owed."""
    return ("error", f"WorkerDied: {message}", "", 0.0)


def _seconds(*outcomes) -> float:
    return max([o[-1] for o in outcomes if o is not None] or [0.0])


class _Parallel:
    """Schedules the jobs on this process and the workers and judges each step once
    both sides are in.

    The main thread runs jobs here (the first one, the longest, at once, while
    the workers start) and judges; a second thread, which runs no TensorFlow,
    hands jobs to the workers that have started and collects what they send.
    Both take jobs from one queue under one lock, so whichever is free first
    takes the next.
    """

    def __init__(self, engine: "Engine", workers: int):
        from equivtool.engine import registry as _steps
        self.engine = engine
        self.order = _steps.run_order(engine.options.steps, engine.options.modes)
        shared = [step for step in self.order if step.shared]
        # Their TF2 side needs the TF1 capture (a checkpoint file), on the pair's TF2 worker.
        self.later = {step.name: step for step in shared if step.runner().tf2_needs_tf1}
        self.queue: list[_Job] = []
        if shared:
            self.queue += [_Job("tf1", shared),
                           _Job("tf2", [s for s in shared if s.name not in self.later],
                                release_after=not self.later)]
        # The longest jobs first (a TF1 side builds a graph, which takes several
        # times a TF2 call): whichever process is free last then has a short job
        # left, not a graph build. Steps are still judged in run order.
        fresh = [step for step in self.order if not step.shared]
        self.queue += [_Job("tf1", [step]) for step in fresh] + [_Job("tf2", [step]) for step in fresh]
        self.captures: dict = {}      # (step name, side) -> its outcome
        self.layer_names: set = set()  # the TF2 layers' names the workers saw
        self.count = min(workers, len(self.queue))  # processes in all, this one included
        self.pair_worker: _Slot | None = None
        self.emitted = 0              # the steps judged and recorded so far, in run order (see _emit)
        self.unresolved: dict = {}    # (step name, side) -> the worker keeping some of its capture's arrays
        self.tf1_on: dict = {}        # step name -> the slot its TF1 side was given to
        self.jobs: list = []          # what each finished job ran, where, when it was handed over, how long
        self.began = time.monotonic()
        self.lock = threading.Condition()  # guards the queue, the captures and the slots
        self.stopping = False
        self.failure: BaseException | None = None  # what stopped the thread serving the workers

    # -- the main thread ---------------------------------------------------

    def run(self) -> None:
        engine = self.engine
        from equivtool.engine.options import check_sendable
        payload = check_sendable(engine.options)
        here = _Here()
        workdir = engine.workdir() if self.later else None  # where the TF1 side writes what the TF2 side loads
        workers = _take_workers(self.count - 1, workdir)
        wake_out, self._wake_in = socket.socketpair()
        self._wake_in.setblocking(False)  # a full buffer already means "look again"
        server = threading.Thread(target=self._serve_workers, args=(workers, wake_out),
                                  name="equivtool-workers", daemon=True)
        failed = True
        try:
            for worker in workers:
                try:
                    worker.setup(payload, workdir)
                except OSError:  # it did not even start
                    worker.died()
            with self.lock:
                first = self._claim(here)  # the longest job, started before the workers have
            server.start()
            if first is not None:
                self._run_here(here, first)
            while True:
                self._emit()
                if self.emitted >= len(self.order):
                    break
                with self.lock:
                    if self.failure is not None:
                        raise self.failure
                    self._dispatch(workers)
                    job = self._claim(here)
                    if job is None:
                        starting = self.queue and any(w.starting for w in workers)
                        if starting or any(w.job is not None or w.fetching for w in workers):
                            self._wake()
                            self.lock.wait()
                        else:
                            # no job runs or waits for a worker to start, and no kept array is on its
                            # way: what is left was owed by dead workers (judging it may still ask a
                            # live one for arrays)
                            self._fail_unowned(workers)
                        continue
                self._wake()  # the server waits on the workers it gave jobs to
                self._run_here(here, job)
            self._drain(workers)
            if self.failure is not None:
                raise self.failure
            failed = False
        finally:
            with _signals.shielded():  # a SIGTERM now waits until the workers are stopped
                with self.lock:
                    self.stopping = True
                self._wake()
                if server.is_alive():
                    server.join(timeout=30)
                for worker in workers:
                    worker.stop(force=failed)
                wake_out.close()
                self._wake_in.close()

    def _wake(self) -> None:
        """Have the server look at the queue and its workers again."""
        try:
            self._wake_in.send(b"x")
        except OSError:
            pass

    def _claim(self, here: _Here) -> "_Job | None":
        """The next job this process may run (under the lock), taken off the queue."""
        for job in self._in_turn(here):
            if (self.pair_worker is here) if job.on_pair_worker else not here.reserved:
                self.queue.remove(job)
                self._placed(here, job)
                if job.on_pair_worker:
                    here.reserved = False
                here.take(job)
                return job
        return None

    def _run_here(self, here: _Here, job: _Job) -> None:
        def captured(step, outcome):
            with self.lock:
                self._captured(here, step.name, job.side, outcome)
            self._emit()  # this step, and any before it, if the other side is in

        with self.lock:
            final = self._none_left()
        seconds = _run_job(self.engine, job.side, job.steps, job.inputs, job.release_after, captured, final)
        with self.lock:
            self._done(here, seconds)

    def _none_left(self) -> bool:
        """No job is left to hand out, and none can be added (a step whose TF2 side
        needs its TF1 capture adds one): the job just taken is its process's last."""
        return not self.queue and not self.later

    def _drain(self, workers, timeout: float = 30.0) -> None:
        """Every step is judged: wait for the workers' last "done" (their job times)."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while any(w.job is not None for w in workers) and self.failure is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self.lock.wait(left)

    def _fail_unowned(self, workers) -> None:
        reason = "; ".join(w.dead for w in workers if w.dead) or "no worker process was left"
        for step in self.order:
            for side in ("tf1", "tf2"):
                self.captures.setdefault((step.name, side), _died(f"not run: {reason}"))

    def _emit(self) -> None:
        """Judge and record the steps, in run order, whose sides are both in (or
        whose TF1 side did not succeed: an in-process run would stop there). On
        the main thread only: between jobs, and between the steps of a job it runs
        (as ``workers=1`` judges each step before the next), so that a step's
        captures (a model's values per training step and side) are dropped as soon
        as both are in, not held to the end of the job."""
        while self.emitted < len(self.order):
            step = self.order[self.emitted]
            with self.lock:
                self.engine.layer_names.update(self.layer_names)
                tf1 = self.captures.get((step.name, "tf1"))
                tf2 = self.captures.get((step.name, "tf2"))
                if tf1 is None or (tf1[0] == "ok" and tf2 is None):
                    break
                if tf1[0] == "ok" and tf2[0] == "ok" and not self._resolve(step.name):
                    break  # a worker's kept arrays asked for
                tf1 = self.captures.get((step.name, "tf1"))
                tf2 = self.captures.get((step.name, "tf2"))
            self.engine.record(self._judge(step, tf1, tf2))
            del tf1, tf2
            self._forget(step)
            self.emitted += 1

    def _forget(self, step) -> None:
        """Drop ``step``'s captures once it is judged: their outputs and variable
        values (a model's worth per training step and side) are not needed again,
        and kept they would add up over the check (in a worker too)."""
        with self.lock:
            for key in ((step.name, "tf1"), (step.name, "tf2")):
                self.captures[key] = _JUDGED
                worker = self.unresolved.pop(key, None)
                if worker is not None and key not in worker.fetching:
                    self._tell(worker, ("drop", *key))

    def _resolve(self, name: str) -> bool:
        """Whether both sides of step ``name`` hold all their arrays (under the lock).
        A side whose worker kept some gets the other side's arrays with the same
        bytes in their place; the rest are asked for (``False`` until they come).
        When both sides were kept by workers, the TF1 side's are asked for first."""
        keys = ((name, "tf1"), (name, "tf2"))
        for key, other in (keys, keys[::-1]):
            worker = self.unresolved.get(key)
            if worker is None or key in worker.fetching or (key[1] == "tf2" and other in self.unresolved):
                continue
            outcome = self.captures[key]
            if other in self.unresolved:  # kept elsewhere too: nothing here to match yet
                capture, missing = outcome[1], [leaf.index for leaf in _kept.kept(outcome[1])]
            else:
                capture, missing = _kept.match(outcome[1], self.captures[other][1])
            self.captures[key] = ("ok", capture, outcome[2])
            if missing:
                worker.fetching.add(key)
                self._tell(worker, ("fetch", *key, missing))
            else:
                del self.unresolved[key]
                self._tell(worker, ("drop", *key))
        return not any(key in self.unresolved for key in keys)

    @staticmethod
    def _tell(worker: _Worker, message) -> None:
        try:
            worker.conn.send(message)
        except OSError:  # gone: the end of its connection says so (see _receive)
            pass

    def _judge(self, step, tf1, tf2):
        from equivtool.engine.run import judge
        return judge(self.engine, step, tf1, tf2, _seconds(tf1, tf2))

    # -- both threads, under the lock ---------------------------------------

    def _dispatch(self, workers) -> None:
        """Give free workers the jobs they may run (a job for the pair's TF2 half
        waits for the slot holding it; see :meth:`_in_turn` for the others' order)."""
        for job in [job for job in self.queue if job.on_pair_worker]:
            target = self.pair_worker
            if not isinstance(target, _Worker) or target.job is not None:
                continue
            if target.dead:
                self.queue.remove(job)
                for step in job.steps:
                    self.captures[(step.name, job.side)] = _died(target.dead)
                self.lock.notify_all()
                continue
            target.reserved = False
            self._start(target, job)
        for worker in workers:
            if worker.ready and worker.job is None and not worker.dead and not worker.reserved:
                job = next((job for job in self._in_turn(worker) if not job.on_pair_worker), None)
                if job is None:
                    break
                self._start(worker, job)

    def _start(self, worker: _Worker, job: _Job) -> None:
        self.queue.remove(job)
        self._placed(worker, job)
        try:
            # Kept arrays whose other side is not in yet would be held through this job.
            waiting = [key for key, keeper in self.unresolved.items()
                       if keeper is worker and (key[0], _OTHER[key[1]]) not in self.captures]
            worker.start(job, ([step.name for step in job.steps  # (a later step's TF1 side travels on)
                                if not (job.side == "tf1" and step.name in self.later)], _kept.KEEP_BYTES),
                         final=self._none_left(), spill=(waiting, _kept.SPILL_BYTES))
        except OSError:
            dead = worker.died()
            for step in job.steps:
                self.captures[(step.name, job.side)] = _died(dead)
            self.lock.notify_all()

    def _placed(self, slot: _Slot, job: _Job) -> None:
        if job.side == "tf1":
            self.tf1_on.update((step.name, slot) for step in job.steps)

    def _in_turn(self, slot: _Slot) -> list:
        """The queue in the order ``slot`` takes from it: as queued, but a fresh
        step's TF2 side after those whose TF1 side ran on another process. Two
        sides on two processes, the worker's arrays are matched by digest to the
        other side's and stay where they are; both on one worker, every array
        of one side crosses (IRv2's or alexnet_v2's training step: hundreds of
        MB, half a second at the end of a check)."""
        return sorted(self.queue, key=lambda job: job.side == "tf2" and not job.on_pair_worker
                      and any(self.tf1_on.get(step.name) is slot for step in job.steps))

    def _captured(self, slot: _Slot, name: str, side: str, outcome: tuple) -> None:
        self.captures[(name, side)] = outcome
        slot.pending.discard((name, side))
        if side == "tf1" and name in self.later:
            # On success the pair's TF2 half loads what the TF1 side wrote; otherwise it is released.
            ok = outcome[0] == "ok"
            self.queue.append(_Job("tf2", [self.later[name]] if ok else [], on_pair_worker=True,
                                   inputs={name: outcome[1]} if ok else {}))
        self.lock.notify_all()

    def _done(self, slot: _Slot, seconds: float) -> None:
        job, slot.job = slot.job, None
        if job is not None and job.steps:
            self.jobs.append({"side": job.side, "steps": [step.name for step in job.steps],
                              "worker": slot.pid, "started": round(slot.taken - self.began, 2),
                              "seconds": round(seconds, 2)})
        if job is not None and job.side == "tf2" and not job.release_after:
            self.pair_worker, slot.reserved = slot, True
        self.lock.notify_all()

    # -- the thread serving the workers --------------------------------------

    def _serve_workers(self, workers, wake) -> None:
        try:
            while True:
                with self.lock:
                    if self.stopping:
                        return
                    self._dispatch(workers)
                    keeping = set(self.unresolved.values())
                    busy = [w for w in workers if w.job is not None or w in keeping or w.starting]
                for ready in wait([w.conn for w in busy] + [wake]):
                    if ready is wake:
                        wake.recv(4096)
                        continue
                    worker = next(w for w in busy if w.conn is ready)
                    try:
                        message = _send.receive(worker.conn)
                    except (EOFError, OSError):
                        message = None
                    with self.lock:
                        self._receive(worker, message)
        except BaseException as exc:  # a defect here must not hang the check
            with self.lock:
                self.failure = exc
                self.lock.notify_all()

    def _receive(self, worker: _Worker, message) -> None:
        if message is None:  # the worker is gone
            dead = worker.died()
            for name, side in worker.pending:
                self.captures[(name, side)] = _died(f"{dead} while running the {side.upper()} side of this step")
            for key in [key for key, keeper in self.unresolved.items() if keeper is worker]:
                del self.unresolved[key]
                self.captures[key] = _died(f"{dead} while keeping the {key[1].upper()} side of this step")
            worker.pending, worker.fetching = set(), set()
            self.lock.notify_all()
        elif message[0] == "capture":
            _, name, side, outcome, layer_names = message
            self.layer_names.update(layer_names)  # the engine's, on the main thread (see _emit)
            if outcome[0] == "ok" and _kept.kept(outcome[1]):
                self.unresolved[(name, side)] = worker
            self._captured(worker, name, side, outcome)
        elif message[0] == "arrays":  # kept arrays asked for (see _resolve)
            _, name, side, arrays = message
            key = (name, side)
            worker.fetching.discard(key)
            if self.unresolved.pop(key, None) is not None:  # (else judged meanwhile: dropped)
                outcome = self.captures[key]
                self.captures[key] = ("ok", _kept.fill(outcome[1], arrays), outcome[2])
            del arrays
            self.lock.notify_all()
        elif message[0] == "done":
            self._done(worker, message[1])
        elif message[0] == "ready":  # started: the next free job is its (see _dispatch)
            worker.ready = True


def run_parallel(engine: "Engine", workers: int) -> list:
    """Run every selected step with its sides in up to ``workers`` processes, this
    one included; results are recorded on ``engine`` (in run order, as soon as
    both sides are in). Returns the jobs run: ``[{"side", "steps", "worker" (pid),
    "started" (seconds after the check began, when the job was handed over), "seconds"}]``,
    in the order they ended."""
    parallel = _Parallel(engine, workers)
    parallel.run()
    return parallel.jobs


# --------------------------------------------------------------------------
# Workers started ahead of a check
# --------------------------------------------------------------------------

_spares: list = []  # started by start_workers, not yet taken by a check


def _environment() -> tuple:
    """What a worker inherits from this process when it starts."""
    return sys.executable, os.getcwd(), dict(os.environ)


# Variables that configure what a worker runs: one set after a worker started is
# a reason to start a fresh one. (Importing TensorFlow sets others, e.g.
# TF2_BEHAVIOR and TPU_ML_PLATFORM, in this process and in the worker alike.)
_CONFIGURING = ("TF_", "XLA_", "CUDA_", "OMP_", "KMP_", "KERAS_", "PYTHON", "EQUIVTOOL_", "LD_", "MALLOC_")


def _started_alike(started: tuple, now: tuple) -> bool:
    """A worker started in ``started`` (see :func:`_environment`) runs as one started ``now`` would:
    the same interpreter and folder, every variable it inherited unchanged, and
    none that configures TensorFlow, Python or equivtool set since."""
    (python, cwd, env), (python_now, cwd_now, env_now) = started, now
    return (python == python_now and cwd == cwd_now and all(env_now.get(k) == v for k, v in env.items())
            and not any(k.startswith(_CONFIGURING) for k in env_now.keys() - env.keys()))


def start_workers(count: int) -> None:
    """Have ``count`` worker processes starting now, for the next check run with ``workers >= 2``.

    A worker's start (an interpreter importing TensorFlow: 2 to 3 CPU seconds)
    is otherwise paid inside the check, on cores its first steps need; started
    before the caller's own imports and model building, it overlaps them. The
    ``equivtool check`` and ``equivtool demo`` commands call this first thing
    with their ``--workers`` less one. A check takes these workers (as many as
    it needs) only when this process's interpreter, working folder and
    environment variables are still those they were started with (a variable
    set since is fine unless it configures TensorFlow, Python or equivtool:
    ``TF_*``, ``OMP_*``, ``PYTHON*``, ...), and starts fresh ones otherwise; a
    worker taken runs one check and ends with it, as any worker. Those never
    taken are stopped when this interpreter exits (and end by themselves if it
    is killed). Calling it again tops the count up."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"count: expected a whole number >= 0, got {count!r}")
    _spares[:] = [worker for worker in _spares if worker.process.poll() is None]
    while len(_spares) < count:
        _spares.append(_Worker())


@atexit.register
def _stop_spares() -> None:
    while _spares:
        _spares.pop().stop(force=True)


def _take_workers(count: int, workdir: str | None) -> list:
    """``count`` workers for a check: started-ahead ones first (those started in
    another environment, or dead, are stopped), fresh ones for the rest."""
    taken, here = [], _environment()
    for worker in list(_spares):
        if len(taken) == count:
            break
        _spares.remove(worker)
        if worker.process.poll() is None and _started_alike(worker.started_in, here):
            taken.append(worker)
        else:
            worker.stop(force=True)
    return taken + [_Worker(workdir) for _ in range(count - len(taken))]


# --------------------------------------------------------------------------
# The worker
# --------------------------------------------------------------------------

def _run_side(engine: "Engine", step, side: str, tf1_capture) -> tuple:
    """One side's outcome, as it crosses a process: without the capture's in-process keys."""
    from equivtool.engine.run import run_side
    outcome = run_side(engine, step, side, tf1_capture)
    if outcome[0] == "ok":
        outcome = ("ok", {k: v for k, v in outcome[1].items() if not k.startswith("_")}, outcome[2])
    return outcome


def _run_job(engine: "Engine", side: str, steps: list, inputs: dict, release_after: bool,
             captured: Callable, final: bool = False) -> float:
    """One job's steps, one side each, in this process (a worker's, or the parent's
    own); ``captured(step, outcome)`` after each. Returns the job's seconds. With
    ``final`` (no job is left for this process to run) memory is not given back
    after the last step: no step of this process would reuse it (a collection of a
    large model's cycles takes most of a second)."""
    started = time.perf_counter()
    for index, step in enumerate(steps):
        captured(step, _run_side(engine, step, side, inputs.get(step.name)))
        if not step.shared and not (final and index == len(steps) - 1):
            engine.give_back_memory()  # it built its own graph or layer: their memory back before the next job
    if release_after:
        engine.release_pair(give_back=not final)
    return time.perf_counter() - started


class _Outbox:
    """What a worker sends its parent, from its main thread (what each job
    yields) and from the thread reading the parent's messages (kept arrays
    asked for), one message at a time; and the arrays it keeps until the
    parent asks for them or lets them go (see :mod:`equivtool.engine._kept`)."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.lock = threading.Lock()
        self.kept: dict = {}  # (step name, side) -> {index: array}

    def send(self, message) -> None:
        with self.lock:
            _send.send_with_buffers(self.conn, message)

    def capture(self, name: str, side: str, outcome: tuple, layer_names: list, keep: int | None) -> None:
        """Send a side's outcome; with ``keep`` (bytes), its arrays that large or larger are kept here."""
        if keep is not None and outcome[0] == "ok":
            capture, arrays = _kept.keep(outcome[1], keep)
            if arrays:
                with self.lock:
                    self.kept[(name, side)] = arrays
                outcome = ("ok", capture, outcome[2])
        self.send(("capture", name, side, outcome, layer_names))

    def answer(self, message) -> None:
        """The parent's ``("fetch", name, side, indices)`` or ``("drop", name, side)``."""
        with self.lock:
            arrays = self.kept.pop((message[1], message[2]), {})
        if isinstance(arrays, _kept.OnDisk):
            on_disk, arrays = arrays, {}
            with on_disk:
                if message[0] == "fetch":
                    arrays = on_disk.read(message[3])
        if message[0] == "fetch":
            self.send(("arrays", message[1], message[2], {index: arrays[index] for index in message[3]}))

    def spill(self, keys, min_bytes: int) -> None:
        """Move the arrays kept for ``keys`` (``(step name, side)``: captures whose
        other side is not in yet) to a temporary file, when they come to
        ``min_bytes`` or more: this process would otherwise hold them through its
        next job (a training step's variables and gradients, with outputs: 387 MB for
        Inception-ResNet-v2 at 299 px, while the next job builds a graph). A kept
        array is mostly matched by digest and never read again; one asked for is
        read back. The file has no name (see :class:`equivtool.engine._kept.OnDisk`):
        nothing is left on disk however this process ends. Where the disk
        refuses (full, read-only), the arrays stay in memory."""
        with self.lock:
            held = [(key, self.kept[key]) for key in keys if isinstance(self.kept.get(key), dict)]
        if not held or sum(array.nbytes for _, arrays in held for array in arrays.values()) < min_bytes:
            return
        for key, arrays in held:
            try:
                on_disk = _kept.OnDisk(arrays)
            except OSError:  # a full or read-only disk: they stay in memory, as before
                return
            with self.lock:
                if self.kept.get(key) is arrays:  # (else asked for or let go meanwhile)
                    self.kept[key], on_disk = on_disk, None
            if on_disk is not None:
                on_disk.close()


def _read(conn: Connection, outbox: _Outbox, inbox: queue.Queue) -> None:
    """The parent's messages: kept arrays asked for are sent (or let go) from
    here at once, while the main thread may be running a job; the rest go to the
    main thread, then None when the parent is gone."""
    try:
        while True:
            message = conn.recv()
            if message[0] in ("fetch", "drop"):
                outbox.answer(message)
            else:
                if message[0] == "setup" and message[3]:  # a started-ahead worker learns its check's folder
                    _signals.own_workdir(message[3])
                inbox.put(message)
    except (EOFError, OSError):
        pass
    finally:
        inbox.put(None)


def _serve(conn: Connection) -> "Engine | None":
    """Run what the parent sends until it says "exit" or is gone; the engine built, if any."""
    engine, broken = None, None   # broken: the outcome of every side when the options could not be read
    outbox, inbox = _Outbox(conn), queue.Queue()
    threading.Thread(target=_read, args=(conn, outbox, inbox), name="equivtool-parent", daemon=True).start()
    # TensorFlow and the engine at once, with this process's own path (equivtool's
    # folder first): a worker started ahead of its check is then up when the check
    # comes; the parent's path, for the user's modules, comes with the options.
    importlib.import_module("equivtool")  # the environment fix, before TensorFlow
    from equivtool._base.errors import full_traceback, one_line
    from equivtool.engine.run import Engine
    while True:
        message = inbox.get()
        if message is None:  # the parent is gone
            return engine
        kind = message[0]
        if kind == "setup":
            _, path, payload, workdir = message
            sys.path[:0] = [entry for entry in path if entry not in sys.path]
            try:
                engine = Engine(_send.loads(payload), workdir=workdir)
            except Exception as exc:  # e.g. a function whose module this process cannot import
                broken = ("error", f"{one_line(exc)} (unpickling the check's arguments in a worker process)",
                          full_traceback(exc), 0.0)
            gc.freeze()  # what there is now is never garbage: collections walk only what the jobs make
            outbox.send(("ready",))  # (broken, its jobs come back as that error, as they would have)
        elif kind == "run":
            from equivtool.engine import registry as _steps
            _, side, names, inputs, release_after, keep, final, spill = message
            outbox.spill(*spill)
            steps = [_steps.get_step(name) for name in names]

            def send(step, outcome):
                names_seen = engine.layer_names if engine is not None else ()
                outbox.capture(step.name, side, outcome, sorted(n for n in names_seen if isinstance(n, str)),
                               keep[1] if step.name in keep[0] else None)

            if broken:
                for step in steps:
                    send(step, broken)
                seconds = 0.0
            else:
                seconds = _run_job(engine, side, steps, inputs, release_after, send, final)
            outbox.send(("done", seconds))
        elif kind == "exit":
            return engine


def _main() -> None:
    fd = int(os.environ.pop(_FD_ENV))
    _signals.watch_parent(fd, int(os.environ.pop(_PARENT_ENV)), os.environ.pop(_WORKDIR_ENV, "") or None)
    conn = Connection(fd)
    if os.environ.get("EQUIVTOOL_QUIET"):  # a worker of an equivtool command: as quiet as the command
        from equivtool._platform.quiet import quiet_command
        quiet_command()
    try:
        engine = _serve(conn)
    finally:
        conn.close()
    # Everything this process owns is released here (its models, its temporary
    # folder); the interpreter's own teardown is skipped: after a large model,
    # TensorFlow's destructors took seconds that the parent spent waiting.
    if engine is not None:
        engine.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    _main()
