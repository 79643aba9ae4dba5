"""Memory a check gives back (issue 38): a step's captures are dropped once it is
judged, freed memory is handed back between steps, and neither changes a number."""

from __future__ import annotations

import numpy as np
import pytest

import equivtool
from equivtool._base import memory
from equivtool.engine import workers as _workers
from small_models import INPUT_SHAPE, SlimNetShim, slim_net

X = np.random.RandomState(0).rand(*INPUT_SHAPE).astype(np.float32)
STEPS = ["fixed_weights", "random"]


def _arrays(value) -> int:
    """How many NumPy arrays ``value`` (a side's outcome) holds, at any depth."""
    if isinstance(value, np.ndarray):
        return 1
    if isinstance(value, dict):
        return sum(_arrays(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_arrays(v) for v in value)
    return 0


def _watch(monkeypatch) -> dict:
    """Per judged step, the arrays its sides brought in, and the arrays the
    scheduler's captures still held when the next step was judged and at the end."""
    seen = {"judged": {}, "held_later": [], "parallel": []}
    init, judge = _workers._Parallel.__init__, _workers._Parallel._judge

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        seen["parallel"].append(self)

    def recording_judge(self, step, tf1, tf2):
        with self.lock:
            seen["held_later"] += [(key, _arrays(v)) for key, v in self.captures.items()
                                   if key[0] in seen["judged"] and _arrays(v)]
        seen["judged"][step.name] = _arrays(tf1) + _arrays(tf2)
        return judge(self, step, tf1, tf2)

    monkeypatch.setattr(_workers._Parallel, "__init__", recording_init)
    monkeypatch.setattr(_workers._Parallel, "_judge", recording_judge)
    return seen


def assert_captures_dropped(seen: dict) -> None:
    """Every judged step brought arrays in (so something was there to drop), and
    none of them was still held by a later judgement or at the end."""
    assert seen["judged"] and all(seen["judged"].values()), seen["judged"]
    assert seen["held_later"] == [], seen["held_later"][:3]
    (parallel,) = seen["parallel"]
    left = [(key, _arrays(v)) for key, v in parallel.captures.items() if _arrays(v)]
    assert left == [], left[:3]


def test_a_steps_captures_are_gone_once_it_is_judged(monkeypatch):
    seen = _watch(monkeypatch)
    report = equivtool.check_equivalence(slim_net, SlimNetShim, X, workers=2, steps=STEPS)
    assert report.passed, str(report)
    assert set(seen["judged"]) == {s.name for s in report.steps}
    assert_captures_dropped(seen)


def test_the_check_of_dropped_captures_fails_when_they_are_kept(monkeypatch):
    """Planted fault: captures kept after judging (the scheduler before issue 38)."""
    seen = _watch(monkeypatch)
    monkeypatch.setattr(_workers._Parallel, "_forget", lambda self, step: None)
    report = equivtool.check_equivalence(slim_net, SlimNetShim, X, workers=2, steps=STEPS)
    assert report.passed, str(report)
    with pytest.raises(AssertionError):
        assert_captures_dropped(seen)


def test_the_check_of_dropped_captures_fails_when_nothing_was_captured():
    """No step judged, or a step whose sides brought no arrays: nothing was shown dropped."""
    with pytest.raises(AssertionError):
        assert_captures_dropped({"judged": {}, "held_later": [], "parallel": []})
    with pytest.raises(AssertionError):
        assert_captures_dropped({"judged": {"fixed_weights": 0}, "held_later": [], "parallel": []})


def test_return_freed_memory_collects_cycles():
    import gc
    import weakref

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # a reference cycle: only the collector frees it
    gone = weakref.ref(a)
    gc.disable()
    try:
        del a, b
        assert gone() is not None
        assert memory.return_freed_memory() in (True, False)
        assert gone() is None
    finally:
        gc.enable()


def _numbers(report) -> list:
    """Everything a verdict rests on, without timings."""
    return [(step.name, step.status, step.message,
             [(leaf.name, leaf.ok, leaf.mismatched, leaf.max_abs) for leaf in step.leaves])
            for step in report.steps]


@pytest.mark.parametrize("workers", [1, 2])
def test_giving_memory_back_between_steps_changes_no_number(monkeypatch, workers):
    monkeypatch.setattr(memory, "STEP_GROWTH", 0)  # a tiny model: give back after every step all the same
    given = equivtool.check_equivalence(slim_net, SlimNetShim, X, workers=workers, steps=STEPS)
    calls = []
    monkeypatch.setattr(memory, "return_freed_memory", lambda: calls.append(1))
    kept = equivtool.check_equivalence(slim_net, SlimNetShim, X, workers=workers, steps=STEPS)
    assert given.passed and kept.passed, str(kept)
    assert calls  # the engine did call it between steps (here: this process's share of the steps)
    assert _numbers(given) == _numbers(kept)


def _step_memory(monkeypatch, sizes: list) -> tuple:
    """A StepMemory reading ``sizes`` (MiB, or None) as the resident size, one per read;
    and the list its collections are recorded in."""
    reads = iter(sizes)
    monkeypatch.setattr(memory, "resident_bytes", lambda: (lambda v: None if v is None else v << 20)(next(reads)))
    collected = []
    monkeypatch.setattr(memory, "return_freed_memory", lambda: collected.append(1))
    return memory.StepMemory(), collected


def test_memory_is_given_back_only_after_the_process_grew(monkeypatch):
    """0.1 s a collection with TensorFlow loaded: skipped after a small step, made after a large one."""
    growth = memory.STEP_GROWTH >> 20
    # made at 1000 MiB; a step leaves it at 1000 + growth - 1: no collection
    give_back, collected = _step_memory(monkeypatch, [1000, 1000 + growth - 1])
    assert give_back() is False and collected == []
    # grown by the threshold: collected, and the mark moves to the size after it
    give_back, collected = _step_memory(monkeypatch, [1000, 1000 + growth, 1010, 1010 + growth - 1])
    assert give_back() is True and collected == [1]
    assert give_back() is False and collected == [1]  # measured from 1010 MiB, not from 1000


def test_memory_is_always_given_back_where_the_size_cannot_be_read(monkeypatch):
    give_back, collected = _step_memory(monkeypatch, [None] * 5)
    assert give_back() and give_back()
    assert collected == [1, 1]


def test_the_resident_size_is_read_here():
    """On Linux the size is this process's, and grows with what it holds."""
    if memory.resident_bytes() is None:
        pytest.skip("no /proc/self/statm on this system")
    before = memory.resident_bytes()
    block = np.ones(64 << 20, np.uint8)  # 64 MiB, touched
    assert memory.resident_bytes() - before >= 48 << 20
    del block


# -- collections leave out the objects there were before the check ------------

class _Node:
    pass


def _naive_skip():
    """Planted fault: freeze and unfreeze whatever was frozen before."""
    import contextlib
    import gc

    @contextlib.contextmanager
    def skip():
        gc.freeze()
        try:
            yield
        finally:
            gc.unfreeze()
    return skip()


@pytest.mark.parametrize("planted", [False, True])
def test_objects_frozen_by_the_user_stay_frozen(planted):
    import gc
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        with (_naive_skip() if planted else memory.collections_skip_older_objects()):
            inside = gc.get_freeze_count()
        assert (inside == before == gc.get_freeze_count()) != planted
    finally:
        gc.unfreeze()


def test_within_older_objects_are_frozen_and_cycles_made_inside_are_collected():
    import gc
    import weakref
    assert gc.get_freeze_count() == 0
    with memory.collections_skip_older_objects():
        assert gc.get_freeze_count() > 0
        node = _Node()
        node.self = node
        gone = weakref.ref(node)
        del node
        gc.collect()
        assert gone() is None
    assert gc.get_freeze_count() == 0


def test_a_check_leaves_the_collector_as_it_found_it_whatever_the_exit():
    import gc
    assert gc.get_freeze_count() == 0
    seen = []

    def tf1_fn(x, training):
        seen.append(gc.get_freeze_count())
        return slim_net(x, training)
    report = equivtool.check_equivalence(tf1_fn, SlimNetShim, np.ones(INPUT_SHAPE, np.float32),
                                         steps=["fixed_weights"])
    assert report.passed and seen and all(count > 0 for count in seen)
    assert gc.get_freeze_count() == 0

    def raises(x, training):
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        equivtool.check_equivalence(raises, SlimNetShim, np.ones(INPUT_SHAPE, np.float32), steps=["fixed_weights"])
    assert gc.get_freeze_count() == 0
