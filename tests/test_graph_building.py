"""equivtool._platform.graph_building: the shortcut gives TensorFlow's own answer
in every nesting of contexts, and TensorFlow's function is put back on every exit."""

import equivtool  # noqa: F401  (must precede TensorFlow)

import contextlib
import threading

import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorflow.python.eager import context
from tensorflow.python.framework import func_graph, ops

from equivtool._platform import graph_building

ORIGINAL = ops.executing_eagerly_outside_functions

CONTEXTS = {
    "graph": lambda: tf.Graph().as_default(),
    "function": lambda: func_graph.FuncGraph("f").as_default(),
    "eager_mode": context.eager_mode,
    "graph_mode": context.graph_mode,
    "init_scope": tf.init_scope,
    "name_scope": lambda: tf.name_scope("s"),
}


def _answers(nesting):
    """At every depth of ``nesting``: (TensorFlow's answer, the shortcut's)."""
    out = []
    with contextlib.ExitStack() as stack:
        for name in nesting:
            stack.enter_context(CONTEXTS[name]())
            with graph_building.fast_graph_building():
                fast = graph_building.shortcut()
            out.append((name, ORIGINAL(), fast))
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(sorted(CONTEXTS)), max_size=6))
def test_the_shortcut_answers_as_tensorflow_in_every_nesting(nesting):
    for name, expected, fast in _answers(nesting):
        assert fast == expected, (nesting, name)


def test_the_nestings_reach_both_answers_and_the_shortcut_itself():
    # not vacuous: both answers occur, and the plain-graph case is the shortcut's own
    answers = _answers(["graph", "function", "init_scope"]) + _answers(["eager_mode"])
    assert {expected for _, expected, _ in answers} == {True, False}
    calls = []
    with tf.Graph().as_default(), graph_building.fast_graph_building():
        graph_building._original, saved = (lambda: calls.append(1) or True), graph_building._original
        try:
            assert graph_building.shortcut() is False and calls == []  # answered without TensorFlow
        finally:
            graph_building._original = saved


def test_a_planted_wrong_shortcut_is_caught(monkeypatch):
    # a first draft's shortcut (answer False whenever the default graph builds no function),
    # which the property above rejected: graph mode entered inside eager mode inside a graph
    monkeypatch.setattr(graph_building, "shortcut", lambda: False if (
        not context.executing_eagerly() and not ops.get_default_graph().building_function) else ORIGINAL())
    assert _answers(["graph", "eager_mode", "graph_mode"])[-1][1:] == (True, False)
    assert all(expected == fast for _, expected, fast in _answers(["graph", "function", "init_scope"]))


@pytest.mark.parametrize("fail", [False, True])
def test_the_function_is_put_back_on_every_exit_and_nests(fail):
    with pytest.raises(RuntimeError) if fail else contextlib.nullcontext():
        with graph_building.fast_graph_building():
            with graph_building.fast_graph_building():
                assert ops.executing_eagerly_outside_functions is graph_building.shortcut
            assert ops.executing_eagerly_outside_functions is graph_building.shortcut  # the outer one holds
            if fail:
                raise RuntimeError("planted")
    assert ops.executing_eagerly_outside_functions is ORIGINAL


def test_other_threads_get_tensorflows_answers_meanwhile():
    seen = []
    with graph_building.fast_graph_building():
        thread = threading.Thread(target=lambda: seen.append(ops.executing_eagerly_outside_functions()))
        thread.start()
        thread.join()
    assert seen == [True]  # a thread's default is eager


def test_a_variable_in_a_graph_hashes_and_an_eager_one_still_refuses():
    with graph_building.fast_graph_building():
        with tf.Graph().as_default():
            v = tf.compat.v1.get_variable("v", [2], use_resource=True)
            assert v in {v}
        with pytest.raises(TypeError, match="unhashable"):
            hash(tf.Variable([1.0]))


def test_a_slim_graph_is_built_the_same_with_the_shortcut():
    import tf_slim as slim

    def build(fast: bool):
        graph = tf.Graph()
        with graph.as_default(), (graph_building.fast_graph_building() if fast else contextlib.nullcontext()):
            x = tf.compat.v1.placeholder(tf.float32, [2, 16, 16, 3])
            with slim.arg_scope([slim.conv2d], normalizer_fn=slim.batch_norm):
                for i in range(4):
                    x = slim.conv2d(x, 8, 3, scope=f"conv{i}")
            loss = tf.reduce_mean(slim.fully_connected(slim.flatten(x), 5))
            tf.gradients(loss, tf.compat.v1.trainable_variables())
        return graph.as_graph_def().SerializeToString(deterministic=True), len(graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES))

    fast, plain = build(True), build(False)
    assert plain[1] > 10 and fast == plain
