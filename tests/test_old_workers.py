"""equivtool.engine.old_workers: with ``tf1_python`` and ``workers=2``, the TF1 thread runs ahead.

No TensorFlow 1.15 needed: the sides are stand-ins (``run_side`` and ``judge``
replaced), so the test sees only the scheduling: every step's TF1 side is
queued at once and runs in order on one thread (a step that builds its own
models on a second one, for a second interpreter, with workers=3), each thread drops its own
half of the shared pair, and the results are recorded in run order. tests/test_tf1_python_side.py runs the real thing
(the same results as ``workers=1``).
"""

from __future__ import annotations

import dataclasses
import threading
import types

import pytest

from equivtool.engine import old_workers


@dataclasses.dataclass(frozen=True)
class _Result:
    name: str
    tf1: object
    tf2: object
    seconds: float = 0.0


class _Step:
    def __init__(self, name: str, shared: bool = True):
        self.name, self.shared = name, shared

    def runner(self):
        return types.SimpleNamespace(tf2_needs_tf1=False)


class _Half:
    def __init__(self):
        self.closed_on = None

    def close(self):
        self.closed_on = threading.current_thread().name


def _engine(steps, halves=None):
    recorded = []
    engine = types.SimpleNamespace(options=types.SimpleNamespace(steps=None, modes=None), user_layer=None,
                                   _halves=halves if halves is not None else {}, old_program=None,
                                   record=recorded.append, release_pair=lambda: None)
    return engine, recorded


@pytest.fixture
def steps(monkeypatch):
    found = [_Step("a"), _Step("b"), _Step("c", shared=False)]
    monkeypatch.setattr(old_workers._steps, "run_order", lambda names, modes: list(found))
    monkeypatch.setattr(old_workers, "judge", lambda engine, step, tf1, tf2, s: _Result(step.name, tf1[1], tf2[1]))
    return found


def _sides(monkeypatch, wait_seconds: float, seen: dict):
    """Step a's TF2 side waits (up to wait_seconds) for step b's TF1 side to start."""
    b_started = threading.Event()

    def run_side(engine, step, side, capture=None):
        seen.setdefault(side, []).append((step.name, threading.current_thread().name, dict(engine._halves)))
        if side == "tf1" and step.name == "b":
            b_started.set()
        if side == "tf2" and step.name == "a":
            return ("ok", b_started.wait(timeout=wait_seconds), 0.0)
        return ("ok", step.name, 0.0)
    monkeypatch.setattr(old_workers, "run_side", run_side)


def _ran_ahead(monkeypatch, steps, workers: int) -> tuple:
    """``run_parallel`` with ``workers`` on the stand-ins: ``(engine, seen, the pair's TF1 half)``,
    checked to have run ahead and recorded the results in run order."""
    seen = {}
    _sides(monkeypatch, 30.0, seen)
    half = _Half()
    engine, recorded = _engine(steps, {"tf1": half, "tf2": object()})
    [job] = old_workers.run_parallel(engine, workers)
    assert [r.name for r in recorded] == ["a", "b", "c"] and job["steps"] == ["a", "b", "c"]
    assert recorded[0].tf2 is True  # b's TF1 side started while a's TF2 side ran
    return engine, seen, half


def test_the_tf1_thread_runs_ahead_of_the_tf2_side(monkeypatch, steps):
    engine, seen, half = _ran_ahead(monkeypatch, steps, 2)
    assert {thread for _, thread, _ in seen["tf1"]} == {"equivtool-tf1-interpreter_0"}  # workers=2: one interpreter
    assert [name for name, _, _ in seen["tf1"]] == ["a", "b", "c"]
    # before c (its own models) each thread dropped its own half: the TF1 one closed on the TF1 thread
    assert half.closed_on == "equivtool-tf1-interpreter_0"
    assert "tf1" not in seen["tf1"][2][2] and "tf2" not in seen["tf2"][2][2]
    assert engine._halves == {}


def test_with_workers_3_the_steps_with_models_of_their_own_run_on_a_second_thread(monkeypatch, steps):
    engine, seen, half = _ran_ahead(monkeypatch, steps, 3)
    threads = {name: thread for name, thread, _ in seen["tf1"]}
    assert threads == {"a": "equivtool-tf1-interpreter_0", "b": "equivtool-tf1-interpreter_0",
                       "c": "equivtool-tf1-interpreter-own_0"}  # c (its own models): the second interpreter's
    assert [name for name, _, _ in seen["tf1"] if name != "c"] == ["a", "b"]
    # the TF1 half closed on the TF1 thread after the pair's last step; the TF2 one dropped before c
    assert half.closed_on == "equivtool-tf1-interpreter_0"
    assert "tf2" not in seen["tf2"][2][2]
    assert engine._halves == {}


def test_without_steps_of_both_kinds_no_second_interpreter_is_used(monkeypatch, steps):
    steps[2].shared = True
    seen = {}
    _sides(monkeypatch, 30.0, seen)
    engine, recorded = _engine(steps)
    old_workers.run_parallel(engine, 3)
    assert {thread for _, thread, _ in seen["tf1"]} == {"equivtool-tf1-interpreter_0"}
    assert [r.name for r in recorded] == ["a", "b", "c"]


def test_one_step_at_a_time_is_caught_by_the_run_ahead_check(monkeypatch, steps):
    """The planted fault: the step-by-step schedule (kept for a layer instance) does not run ahead."""
    seen = {}
    _sides(monkeypatch, 0.5, seen)
    engine, recorded = _engine(steps)
    engine.user_layer = object()  # a layer instance: one step at a time
    old_workers.run_parallel(engine, 2)
    assert [r.name for r in recorded] == ["a", "b", "c"]
    assert recorded[0].tf2 is False
