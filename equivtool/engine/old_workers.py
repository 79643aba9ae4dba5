"""``check_equivalence(tf1_python=PATH, workers=2)``: the TF1 interpreter is the TF1 worker.

Each step's TF1 side is the TF1 interpreter's work (:mod:`equivtool.engine.sides.old_python`),
so it is sent from a thread of this process while the TF2 sides run here:
both sides compute at once, as with ``workers=2`` in-process, and nothing of
the check crosses a process but the old side's requests. The thread runs
every step's TF1 side in run order without waiting for the TF2 side of each
step (the in-process workers take jobs from one queue, and a per-step wait
only adds idle time to the slower side; benchmarks/old_side_timing.py).
With ``workers=3`` or more the steps that build models of their own
(``num_random_ops``, ``resume``) run on a second thread, in a second TF1
interpreter, so they no longer wait behind the pair's steps, as in-process
workers take each as a job of its own (``workers=N`` is N processes, this one
included). Not with ``workers=2``: on 2 cores a third busy process slowed the
pair's interpreter more than it took off it (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import dataclasses
import gc
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from equivtool.engine import registry as _steps
from equivtool.engine.run import after_wanted, judge, run_after, run_side
from equivtool.engine.sides.old_python import OldProgram, own_models_lane

if TYPE_CHECKING:  # pragma: no cover
    from equivtool.engine.run import Engine


def run_parallel(engine: "Engine", workers: int) -> list:
    """Every selected step with its TF1 side on a thread of this process, whose work
    is the TF1 interpreter's, while its TF2 side runs here (the TF2 side of a step
    that needs the TF1 capture waits for it): both sides run at once, as with
    ``workers=2``, and the results are those of ``workers=1``. Returns the job
    (``{"side", "steps", "worker", "seconds"}``) for the report's header.

    The TF1 thread runs ahead: every step's TF1 side is queued at once and runs in
    run order, so neither side waits for the other at each step (only a TF2 side
    that needs the TF1 capture, and the judgement, wait). Each thread drops its own
    half of the shared pair before a step that builds its own models
    (:func:`_release`), as ``Engine.release_pair`` drops both between steps. A layer
    instance built before the check gives the TF2 half the TF1 half's values, so
    with one the steps run one at a time, as before."""
    if engine.user_layer is not None:
        return _run_step_by_step(engine)
    started, names = time.perf_counter(), []
    order = list(_steps.run_order(engine.options.steps, engine.options.modes))
    pool = ThreadPoolExecutor(1, thread_name_prefix="equivtool-tf1-interpreter")
    own = _own_models_pool(order, workers)
    last_shared = [step for step in order if step.shared][-1:]
    # A step whose TF1 side has a second half (SplitStep.tf1_after) that needs the TF2
    # capture: its TF1 thread waits for it there, before the next step's TF1 side.
    waits = {step.name: Future() for step in order if after_wanted(engine, step)}

    def tf1_side(step):
        if not step.shared and own is None:
            _release(engine, "tf1")
        found = run_side(engine, step, "tf1")
        if step.name in waits:
            found = run_after(engine, step, found, waits[step.name].result())
        if own is not None and [step] == last_shared:
            _release(engine, "tf1")  # the pair's last step there: its graphs closed
        return found
    try:
        futures = [(step, (pool if step.shared or own is None else own).submit(tf1_side, step)) for step in order]
        for step, tf1_future in futures:
            start = time.perf_counter()
            if not step.shared:
                _release(engine, "tf2")
            _finish(engine, step, tf1_future, start, names, waits)
    finally:
        for wait in waits.values():  # (the TF1 thread never waits on a step that will not come)
            if not wait.done():
                wait.set_result(None)
        # Not waiting: on Ctrl-C or SIGTERM the engine's close stops the TF1
        # interpreter next, which ends a request the thread still waits on;
        # the TF1 sides not started yet never start.
        pool.shutdown(wait=False, cancel_futures=True)
        if own is not None:
            own.shutdown(wait=False, cancel_futures=True)
    return [_job(engine, names, started)]


def _own_models_pool(order: list, workers: int) -> ThreadPoolExecutor | None:
    """With ``workers >= 3`` (this process and two interpreters), a thread for the TF1 sides
    of the steps that build models of their own, in a second TF1 interpreter
    (:func:`equivtool.engine.sides.old_python.own_models_lane`), where the check has both
    kinds of step: they no longer wait behind the pair's steps, whose graphs the first
    interpreter builds one after the other (TensorFlow 1.15's graph building was most of
    its time, benchmarks/RESULTS.md), as in-process workers take the pair and each fresh
    comparison as jobs of their own. None otherwise."""
    if workers < 3 or not (any(step.shared for step in order) and any(not step.shared for step in order)):
        return None
    return ThreadPoolExecutor(1, thread_name_prefix="equivtool-tf1-interpreter-own", initializer=own_models_lane)


def _finish(engine: "Engine", step, tf1_future, start: float, names: list, waits: dict | None = None) -> None:
    """``step``'s TF2 side here (after the TF1 capture when it needs it), then its
    judgement, recorded with the seconds since ``start``. ``waits``: the steps whose TF1
    thread waits for the TF2 outcome to run the TF1 side's second half there (None:
    step by step, where it runs here once both sides are in)."""
    if step.runner().tf2_needs_tf1:
        tf1 = tf1_future.result()
        tf2 = run_side(engine, step, "tf2", tf1[1]) if tf1[0] == "ok" else None
    else:
        tf2 = run_side(engine, step, "tf2")
        if waits is not None and step.name in waits:
            waits[step.name].set_result(tf2)
        tf1 = tf1_future.result()
        if waits is None:
            tf1 = run_after(engine, step, tf1, tf2)
    names.append(step.name)
    result = judge(engine, step, tf1, tf2 if tf1[0] == "ok" else None, 0.0)
    engine.record(dataclasses.replace(result, seconds=time.perf_counter() - start))


def _release(engine: "Engine", side: str) -> None:
    """Drop ``side``'s half of the shared pair (the TF1 one's graphs closed there), as
    ``Engine.release_pair`` does for both; each thread drops its own."""
    half = engine._halves.pop(side, None)
    if half is not None and not isinstance(half, str):
        if side == "tf1":
            half.close()
        gc.collect()  # layers and graphs hold reference cycles


def _job(engine: "Engine", names: list, started: float) -> dict:
    found = engine.old_program
    pid = found.process.pid if isinstance(found, OldProgram) and found.process is not None else None
    return {"side": "tf1 (TF1 interpreter)", "steps": names, "worker": pid,
            "seconds": round(time.perf_counter() - started, 3)}


def _run_step_by_step(engine: "Engine") -> list:
    """Each step's two sides at once, the next step once both are in (a layer instance)."""
    started, names = time.perf_counter(), []
    pool = ThreadPoolExecutor(1, thread_name_prefix="equivtool-tf1-interpreter")
    try:
        for step in _steps.run_order(engine.options.steps, engine.options.modes):
            if not step.shared:
                engine.release_pair()  # (the TF1 thread is idle between steps)
            start = time.perf_counter()
            tf1_future = pool.submit(run_side, engine, step, "tf1")
            _finish(engine, step, tf1_future, start, names)
    finally:
        pool.shutdown(wait=False)
    return [_job(engine, names, started)]
