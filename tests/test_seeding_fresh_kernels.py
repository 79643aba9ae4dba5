"""Constant mode's eager draws served by stateless twins (equivtool.seeding._fresh_kernels).

The served draws must give the bits the tool gave before, with the kernel
cache cleared before every op, and the bits a TF1 graph draws under the same
tool; only the four kernels behind tf.random.uniform/normal/truncated_normal
are served, only eagerly, only on the scope's thread, and the module's
functions are put back on every exit."""

import equivtool  # noqa: F401  (must precede TensorFlow)

import threading

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from equivtool.seeding import DeterministicRandomTestTool
from equivtool.seeding import _fresh_kernels
from tensorflow.python.ops import gen_random_ops

ORIGINALS = {name: getattr(gen_random_ops, name) for name in _fresh_kernels.TWINS}

DRAWS = {
    "uniform": lambda shape, dtype: tf.random.uniform(shape, dtype=dtype),
    "uniform_range": lambda shape, dtype: tf.random.uniform(shape, -3, 5, dtype=dtype),
    "normal": lambda shape, dtype: tf.random.normal(shape, 0.5, 2.0, dtype=dtype),
    "truncated_normal": lambda shape, dtype: tf.random.truncated_normal(shape, dtype=dtype),
    "dropout": lambda shape, dtype: tf.nn.dropout(tf.ones(shape, dtype), rate=0.4),
    "glorot": lambda shape, dtype: tf.compat.v1.glorot_uniform_initializer()(shape, dtype),
}
INT_DRAWS = {"uniform_int": lambda shape, dtype: tf.random.uniform(shape, -7, 1000, dtype=dtype)}


def _eager(draw, shape, dtype, seed, served: bool, count: int = 3):
    saved = _fresh_kernels.FreshKernels.can_serve
    if not served:  # the tool as it was: a kernel-cache clear before every draw
        _fresh_kernels.FreshKernels.can_serve = lambda self, caller: False
    try:
        with DeterministicRandomTestTool(seed=seed, mode="constant").scope():
            return [draw(shape, dtype).numpy() for _ in range(count)]
    finally:
        _fresh_kernels.FreshKernels.can_serve = saved


def _graph(draw, shape, dtype, seed, count: int = 3):
    graph = tf.Graph()
    with graph.as_default(), DeterministicRandomTestTool(seed=seed, mode="constant").scope():
        tensors = [draw(shape, dtype) for _ in range(count)]
    with tf.compat.v1.Session(graph=graph) as session:
        return session.run(tensors)


def _bits(values):
    return [v.tobytes() for v in values]


class _Spy:
    """Counts the twins' calls (the served draws)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        from equivtool._platform import tf_internals
        twins = tf_internals.gen_stateless_random_ops_v2
        for twin, _ in _fresh_kernels.TWINS.values():
            original = getattr(twins, twin)

            def counted(*args, _original=original, **kwargs):
                self.calls += 1
                return _original(*args, **kwargs)
            monkeypatch.setattr(twins, twin, counted)


@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(sorted(DRAWS)), dtype=st.sampled_from([tf.float32, tf.float64, tf.float16, tf.bfloat16]),
       shape=st.lists(st.integers(1, 70), min_size=1, max_size=3), seed=st.integers(0, 2**63 - 1))
def test_served_draws_have_the_bits_of_a_fresh_kernel_and_of_the_graph(kind, dtype, shape, seed):
    if kind == "glorot" and len(shape) < 2:
        shape = shape + [3]
    draw = DRAWS[kind]
    served = _eager(draw, shape, dtype, seed, served=True)
    assert _bits(served) == _bits(_eager(draw, shape, dtype, seed, served=False))
    assert _bits(served) == _bits(_graph(draw, shape, dtype, seed))
    assert _bits(served[1:]) == _bits(served[:-1])  # constant mode: every draw the same


@settings(max_examples=10, deadline=None)
@given(dtype=st.sampled_from([tf.int32, tf.int64]), shape=st.lists(st.integers(1, 90), min_size=1, max_size=2),
       seed=st.integers(1, 2**40))
def test_served_integer_draws_have_the_graphs_bits(dtype, shape, seed):
    draw = INT_DRAWS["uniform_int"]
    served = _eager(draw, shape, dtype, seed, served=True)
    assert _bits(served) == _bits(_eager(draw, shape, dtype, seed, served=False))
    assert _bits(served) == _bits(_graph(draw, shape, dtype, seed))


def test_draws_are_served_and_the_cache_is_not_cleared(monkeypatch):
    spy = _Spy(monkeypatch)
    clears = []
    from equivtool._platform import tf_internals
    context = tf_internals.context
    original = context.Context._set_global_seed
    monkeypatch.setattr(context.Context, "_set_global_seed",
                        lambda self, seed: (clears.append(seed), original(self, seed))[1])
    with DeterministicRandomTestTool(seed=3, mode="constant").scope():
        for draw in (*DRAWS.values(), *INT_DRAWS.values()):
            draw([4, 5], tf.int32 if draw is INT_DRAWS["uniform_int"] else tf.float32)
    assert spy.calls == len(DRAWS) + len(INT_DRAWS)
    assert len(clears) == 2 and clears[0] == 3  # the scope's entry and exit only


def test_a_planted_wrong_counter_is_caught(monkeypatch):
    # the fault a wrong key/counter mapping would be: the comparison with the graph fails
    monkeypatch.setattr(_fresh_kernels, "philox_state",
                        lambda seed, seed2: (tf.constant([seed], tf.uint64), tf.constant([1, seed2], tf.uint64)))
    draw = DRAWS["normal"]
    assert _bits(_eager(draw, [8], tf.float32, 5, served=True)) != _bits(_graph(draw, [8], tf.float32, 5))


def test_not_served_in_a_trace_or_on_another_thread(monkeypatch):
    spy = _Spy(monkeypatch)
    with DeterministicRandomTestTool(seed=4, mode="constant").scope():
        traced = tf.function(lambda: tf.random.uniform([6]))().numpy()
        other = []
        thread = threading.Thread(target=lambda: other.append(tf.random.uniform([6], seed=1).numpy()))
        thread.start()
        thread.join()
        shuffled = [tf.random.shuffle(tf.range(20)).numpy() for _ in range(2)]  # not served: cleared each time
    assert spy.calls == 0
    assert _bits([traced]) == _bits(_graph(DRAWS["uniform"], [6], tf.float32, 4, count=1))
    assert np.array_equal(shuffled[0], shuffled[1]) and len(other) == 1


def test_a_direct_kernel_call_with_the_same_seeds_is_not_served(monkeypatch):
    spy = _Spy(monkeypatch)
    with DeterministicRandomTestTool(seed=9, mode="constant").scope():
        tf.random.uniform([3])  # armed and served
        gen_random_ops.random_uniform([3], tf.float32, seed=9, seed2=0)  # nobody armed it
    assert spy.calls == 1


@pytest.mark.parametrize("fail", [False, True])
def test_the_kernel_functions_are_put_back_on_every_exit(fail):
    with pytest.raises(RuntimeError) if fail else _nothing():
        with DeterministicRandomTestTool(seed=1, mode="constant").scope():
            assert gen_random_ops.random_uniform is not ORIGINALS["random_uniform"]
            if fail:
                raise RuntimeError("planted")
    assert {name: getattr(gen_random_ops, name) for name in ORIGINALS} == ORIGINALS


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_not_served_under_an_op_callback_which_sees_the_stateful_op(monkeypatch):
    # localization's taps align the TF2 ops with the TF1 graph's RandomUniform by name and type
    spy = _Spy(monkeypatch)
    from tensorflow.python.framework import op_callbacks
    seen = []

    def callback(op_type, inputs, attrs, outputs, op_name=None, graph=None):
        seen.append(op_type)
    op_callbacks.add_op_callback(callback)
    try:
        with DeterministicRandomTestTool(seed=2, mode="constant").scope():
            tapped = [tf.random.uniform([5]).numpy() for _ in range(2)]
    finally:
        op_callbacks.remove_op_callback(callback)
    assert spy.calls == 0 and "RandomUniform" in seen and "StatelessRandomUniformV2" not in seen
    assert _bits(tapped) == _bits(_eager(DRAWS["uniform"], [5], tf.float32, 2, served=True, count=2))


# -- num_random_ops mode: the scope entry's clear owed until a draw is not served --

def _nro_eager(draws, seed, served: bool):
    """Each of ``draws`` (functions of no argument) once in one num_random_ops scope,
    eagerly; ``served=False``: the tool as it was (no twin, the clear at entry)."""
    saved = _fresh_kernels.FreshKernels.can_serve
    if not served:
        _fresh_kernels.FreshKernels.can_serve = lambda self, caller: False
    try:
        with DeterministicRandomTestTool(seed=seed, mode="num_random_ops").scope():
            return [draw().numpy() for draw in draws]
    finally:
        _fresh_kernels.FreshKernels.can_serve = saved


def _nro_graph(draws, seed):
    graph = tf.Graph()
    with graph.as_default(), DeterministicRandomTestTool(seed=seed, mode="num_random_ops").scope():
        tensors = [draw() for draw in draws]
    with tf.compat.v1.Session(graph=graph) as session:
        return session.run(tensors)


def _cache_outside(kinds, shape, dtype, seed):
    """Draw, outside any tool, with the seeds a num_random_ops scope of ``seed``
    hands out ((seed, 0), (seed, 1), ...), so stateful kernels with those very
    attributes stay cached when the scope opens."""
    ops = {"normal": tf.random.normal, "truncated_normal": tf.random.truncated_normal}
    tf.random.set_seed(seed)
    for i, kind in enumerate(kinds):
        if kind == "shuffle":
            tf.random.shuffle(tf.range(30), seed=i)
        else:
            ops.get(kind, tf.random.uniform)(shape, dtype=dtype, seed=i)


@pytest.fixture
def global_seed_back():
    yield
    tf.random.set_seed(None)


@settings(max_examples=20, deadline=None)
@given(kinds=st.lists(st.sampled_from(sorted(DRAWS) + ["shuffle"]), min_size=1, max_size=5),
       dtype=st.sampled_from([tf.float32, tf.float64, tf.float16]),
       shape=st.lists(st.integers(1, 40), min_size=2, max_size=3), seed=st.integers(1, 2**62),
       before=st.booleans())
def test_num_random_ops_draws_have_the_bits_of_the_graph_whatever_was_cached(kinds, dtype, shape, seed, before):
    """Served draws and draws that are not (shuffle, the first of which clears the
    cache) in any order give a TF1 graph's bits and the old path's, also when
    kernels with the scope's very seeds were left cached before it (``before``)."""
    draws = [(lambda: tf.random.shuffle(tf.range(30))) if kind == "shuffle"
             else (lambda kind=kind: DRAWS[kind](shape, dtype)) for kind in kinds]
    try:
        expected = _nro_graph(draws, seed)
        if before:
            _cache_outside(kinds, shape, dtype, seed)
        assert _bits(_nro_eager(draws, seed, served=True)) == _bits(expected)
        if before:
            _cache_outside(kinds, shape, dtype, seed)
        assert _bits(_nro_eager(draws, seed, served=False)) == _bits(expected)
    finally:
        tf.random.set_seed(None)


def test_num_random_ops_clears_the_cache_at_the_first_draw_not_served(monkeypatch):
    spy = _Spy(monkeypatch)
    clears = []
    from equivtool._platform import tf_internals
    original = tf_internals.clear_eager_kernel_cache
    monkeypatch.setattr(tf_internals, "clear_eager_kernel_cache", lambda: (clears.append(1), original())[1])
    with DeterministicRandomTestTool(seed=4, mode="num_random_ops").scope():
        tf.random.uniform([6])
        tf.random.normal([6])
        assert spy.calls == 2 and clears == []  # served: nothing owed yet
        tf.random.shuffle(tf.range(5))
        assert clears == [1]
        tf.random.shuffle(tf.range(5))
        tf.random.uniform([6])
    assert spy.calls == 3 and clears == [1]  # owed once, made once


def test_a_planted_skipped_clear_is_caught(monkeypatch, global_seed_back):
    """Without the owed clear a stateful kernel cached before the scope with the
    same seeds continues its stream: the comparison with the graph fails."""
    draws = [lambda: tf.random.shuffle(tf.range(30))] * 2
    expected = _nro_graph(draws, 11)
    _cache_outside(["shuffle", "shuffle"], None, None, 11)
    assert _bits(_nro_eager(draws, 11, served=True)) == _bits(expected)
    from equivtool._platform import tf_internals
    monkeypatch.setattr(tf_internals, "clear_eager_kernel_cache", lambda: None)
    _cache_outside(["shuffle", "shuffle"], None, None, 11)
    assert _bits(_nro_eager(draws, 11, served=True)) != _bits(expected)
