"""Tests for equivtool.seeding (DeterministicRandomTestTool, traces).

The reference is the original tool, tf.compat.v1.keras.utils.DeterministicRandomTestTool,
run side by side on the same program.
"""

import json
import os
import subprocess
import sys
import threading

import equivtool  # noqa: F401  (before TensorFlow)
import numpy as np
import pytest
import tensorflow as tf
import tf_slim as slim
import tf_keras
from tensorflow.python.framework import random_seed
from tf_keras.src import backend as keras_backend

from equivtool import (
    DeterministicRandomTestTool,
    RandomOpRecord,
    TraceDivergence,
    compare_random_traces,
)

OriginalTool = tf.compat.v1.keras.utils.DeterministicRandomTestTool
TF_GET_SEED = random_seed.get_seed
MODES = ("constant", "num_random_ops")
HERE = os.path.dirname(os.path.abspath(__file__))


def three_uniforms_graph():
    """The original's documented program (a: 3x1, b and c: 3x3) in a TF1 graph."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        a = tf.compat.v1.random.uniform(shape=(3, 1)) * 3
        b = tf.compat.v1.random.uniform(shape=(3, 3)) * 3
        c = tf.compat.v1.random.uniform(shape=(3, 3)) * 3
        return sess.run([a, b, c])


def three_uniforms_eager():
    a = tf.random.uniform(shape=(3, 1)) * 3
    b = tf.random.uniform(shape=(3, 3)) * 3
    c = tf.random.uniform(shape=(3, 3)) * 3
    return [a.numpy(), b.numpy(), c.numpy()]


def run_in(tool, program):
    with tool.scope():
        return program()


def assert_bitwise_equal(xs, ys):
    assert len(xs) == len(ys)
    for i, (x, y) in enumerate(zip(xs, ys)):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape, i
        assert x.tobytes() == y.tobytes(), f"value {i} differs"


# ---------------------------------------------------------------- the clone


def test_invalid_mode_raises_naming_allowed_values():
    with pytest.raises(ValueError, match=r"constant.*num_random_ops.*'sometimes'"):
        DeterministicRandomTestTool(mode="sometimes")


def test_negative_operation_seed_is_rejected():
    tool = DeterministicRandomTestTool(mode="num_random_ops")
    with pytest.raises(ValueError, match="non-negative"):
        tool.operation_seed = -1
    assert tool.operation_seed == 0


@pytest.mark.parametrize("world", [three_uniforms_graph, three_uniforms_eager], ids=["graph", "eager"])
def test_constant_mode_gives_equal_values_for_equal_shapes(world):
    _, b, c = run_in(DeterministicRandomTestTool(), world)
    assert_bitwise_equal([b], [c])


@pytest.mark.parametrize("world", [three_uniforms_graph, three_uniforms_eager], ids=["graph", "eager"])
def test_num_random_ops_gives_different_values_for_equal_shapes(world):
    _, b, c = run_in(DeterministicRandomTestTool(mode="num_random_ops"), world)
    assert not np.array_equal(b, c)


@pytest.mark.parametrize("mode", MODES)
def test_graph_and_eager_agree(mode):
    graph = run_in(DeterministicRandomTestTool(mode=mode), three_uniforms_graph)
    eager = run_in(DeterministicRandomTestTool(mode=mode), three_uniforms_eager)
    assert_bitwise_equal(graph, eager)


def test_graph_and_eager_agree_in_one_constant_scope():
    # The original's own example: one tool, the graph part first, then eager.
    tool = DeterministicRandomTestTool()
    with tool.scope():
        graph = three_uniforms_graph()
        eager = three_uniforms_eager()
    assert_bitwise_equal(graph, eager)


def test_num_random_ops_reversed_program_order_changes_values():
    with DeterministicRandomTestTool(mode="num_random_ops").scope():
        a = tf.random.uniform((3, 1)).numpy()
        b = tf.random.uniform((3, 3)).numpy()
    with DeterministicRandomTestTool(mode="num_random_ops").scope():
        b2 = tf.random.uniform((3, 3)).numpy()
        a2 = tf.random.uniform((3, 1)).numpy()
    assert not np.array_equal(a, a2)
    assert not np.array_equal(b, b2)


def test_num_random_ops_explicit_operation_seed_restores_values():
    with DeterministicRandomTestTool(mode="num_random_ops").scope():
        a = tf.random.uniform((3, 1)).numpy()
        b = tf.random.uniform((3, 3)).numpy()
    tool = DeterministicRandomTestTool(mode="num_random_ops")
    with tool.scope():
        tool.operation_seed = 1
        b2 = tf.random.uniform((3, 3)).numpy()
        tool.operation_seed = 0
        a2 = tf.random.uniform((3, 1)).numpy()
    assert_bitwise_equal([a, b], [a2, b2])


def test_num_random_ops_reused_operation_seed_raises():
    tool = DeterministicRandomTestTool(mode="num_random_ops")
    with tool.scope():
        tool.operation_seed = 1
        tf.random.uniform((3, 3))
        tool.operation_seed = 0
        tf.random.uniform((3, 1))  # seed 0; the counter now points at the used 1
        with pytest.raises(ValueError, match=r"operation seed 1 a second time.*set explicitly"):
            tf.random.uniform((3, 1))


def test_tool_counter_continues_across_its_scopes():
    tool = DeterministicRandomTestTool(mode="num_random_ops")
    with tool.scope():
        tf.random.uniform((2,))
    with tool.scope():
        tf.random.uniform((2,))
    assert tool.operation_seed == 2
    assert [r.operation_seed for r in tool.trace] == [0, 1]


# ------------------------------------------------- bit identity with the original


def mixed_random_ops():
    """Every kind of stateful op from the issue, graph part then eager part."""
    def ops():
        x = tf.ones((4, 6))
        return [
            tf.random.uniform((3, 2)),
            tf.random.normal((3, 3)),
            tf.random.truncated_normal((2, 5)),
            tf.compat.v1.random.uniform((3, 2), seed=7),  # explicit seed: overridden in the scope
            tf.nn.dropout(x, rate=0.5),
            tf.nn.dropout(x, rate=0.0),  # no op, but a seed is consumed
            tf.random.normal((2,), dtype=tf.float64),
        ]
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        graph = sess.run(ops())
    return graph + [t.numpy() for t in ops()]


@pytest.mark.parametrize("mode", MODES)
def test_random_ops_bitwise_identical_to_original(mode):
    ours = run_in(DeterministicRandomTestTool(mode=mode), mixed_random_ops)
    theirs = run_in(OriginalTool(mode=mode), mixed_random_ops)
    assert_bitwise_equal(ours, theirs)


@pytest.mark.parametrize("mode", MODES)
def test_tf_function_bitwise_identical_to_original(mode):
    def program():
        fn = tf.function(lambda: [tf.random.uniform((3,)), tf.nn.dropout(tf.ones((2, 3)), 0.5)])
        return [t.numpy() for t in fn()]
    assert_bitwise_equal(run_in(DeterministicRandomTestTool(mode=mode), program),
                         run_in(OriginalTool(mode=mode), program))


def test_stateless_ops_with_explicit_seeds_are_unchanged_in_scope():
    outside = tf.random.stateless_uniform((3, 3), seed=[1, 2]).numpy()
    with DeterministicRandomTestTool(mode="num_random_ops").scope() as tool:
        inside = tf.random.stateless_uniform((3, 3), seed=[1, 2]).numpy()
    assert_bitwise_equal([outside], [inside])
    assert tool.trace == ()


def slim_net(x, training=True):
    """A small tf-slim model touching each initializer kind from the issue."""
    net = slim.conv2d(x, 4, [3, 3], scope="conv1")  # xavier (glorot) uniform
    net = slim.batch_norm(net, is_training=False, scope="bn1")  # no moving-stat updates to sync
    net = slim.conv2d(
        net, 4, [3, 3], scope="conv2",
        weights_initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.1))
    net = slim.flatten(net)
    net = slim.dropout(net, 0.5, is_training=training, scope="drop")
    net = slim.fully_connected(
        net, 3, scope="fc",
        weights_initializer=tf.compat.v1.variance_scaling_initializer())
    extra = tf.compat.v1.get_variable(
        "extra", [3], initializer=tf.compat.v1.glorot_normal_initializer())
    return net + extra


INPUT = np.linspace(-1.0, 1.0, 2 * 6 * 6 * 2, dtype=np.float32).reshape(2, 6, 6, 2)


def slim_graph():
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        out = slim_net(tf.constant(INPUT))
        sess.run(tf.compat.v1.global_variables_initializer())
        names = [v.name for v in tf.compat.v1.global_variables()]
        values = sess.run(tf.compat.v1.global_variables())
        return sess.run(out), dict(zip(names, values))


class SlimShim(tf_keras.layers.Layer):
    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, x, training=True):
        return slim_net(x, training)


def slim_eager():
    layer = SlimShim()
    out = layer(tf.constant(INPUT)).numpy()
    return out, {v.name: v.numpy() for v in layer.weights}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("world", [slim_graph, slim_eager], ids=["graph", "eager_shim"])
def test_slim_model_bitwise_identical_to_original(mode, world):
    out, weights = run_in(DeterministicRandomTestTool(mode=mode), world)
    ref_out, ref_weights = run_in(OriginalTool(mode=mode), world)
    assert sorted(weights) == sorted(ref_weights)
    assert_bitwise_equal([out] + [weights[k] for k in sorted(weights)],
                         [ref_out] + [ref_weights[k] for k in sorted(weights)])


@pytest.mark.parametrize("mode", MODES)
def test_slim_model_graph_and_shim_agree(mode):
    g_out, g_weights = run_in(DeterministicRandomTestTool(mode=mode), slim_graph)
    e_out, e_weights = run_in(DeterministicRandomTestTool(mode=mode), slim_eager)
    key = lambda name: name.split("/", 1)[1] if name.startswith("slim_shim") else name  # noqa: E731
    e_weights = {key(k): v for k, v in e_weights.items()}
    assert sorted(g_weights) == sorted(e_weights)
    for name in g_weights:
        np.testing.assert_array_equal(g_weights[name], e_weights[name], err_msg=name)
    np.testing.assert_allclose(g_out, e_out, rtol=1e-6, atol=1e-6)  # same dropout mask, same math


# ------------------------------------------------------------- safe scopes


def test_scope_restores_get_seed_after_exception():
    tool = DeterministicRandomTestTool()
    with pytest.raises(KeyError):
        with tool.scope():
            assert random_seed.get_seed is not TF_GET_SEED
            raise KeyError("boom")
    assert random_seed.get_seed is TF_GET_SEED
    assert not tool.active


def test_scope_restores_eager_global_seed_after_exception():
    tf.random.set_seed(1234)
    try:
        with pytest.raises(KeyError):
            with DeterministicRandomTestTool(seed=5).scope():
                tf.random.uniform((2,))  # constant mode sets the global seed to 0
                raise KeyError("boom")
        assert random_seed.get_seed(None)[0] == 1234
    finally:
        tf.random.set_seed(None)


def test_scope_restores_graph_seed_after_exception():
    with tf.Graph().as_default() as graph:
        graph.seed = 99
        with pytest.raises(KeyError):
            with DeterministicRandomTestTool(seed=5).scope():
                tf.random.uniform((2,))
                assert graph.seed == 0  # what the original's constant mode leaves
                raise KeyError("boom")
        assert graph.seed == 99


def test_scope_restores_keras_seed_generator_after_exception():
    holder = keras_backend._SEED_GENERATOR
    sentinel = object()
    holder.generator = sentinel  # as tf.keras.utils.set_random_seed would
    try:
        with pytest.raises(KeyError):
            with DeterministicRandomTestTool().scope():
                assert holder.generator is not sentinel
                raise KeyError("boom")
        assert holder.generator is sentinel
    finally:
        del holder.generator
    with DeterministicRandomTestTool().scope():
        pass
    assert not hasattr(holder, "generator")


def test_entering_an_active_scope_again_raises():
    tool = DeterministicRandomTestTool()
    with tool.scope():
        with pytest.raises(RuntimeError, match="already active"):
            with tool.scope():
                pass
        assert tool.active  # the failed entry left the outer scope intact
    assert random_seed.get_seed is TF_GET_SEED


def test_overlapping_scopes_of_two_tools_raise():
    first, second = DeterministicRandomTestTool(), DeterministicRandomTestTool(mode="num_random_ops")
    with first.scope():
        with pytest.raises(RuntimeError, match="another tool"):
            with second.scope():
                pass
        tf.random.uniform((2,))
    assert len(first.trace) == 1 and second.trace == ()


def test_scope_inside_original_tools_scope_raises():
    with OriginalTool().scope():
        with pytest.raises(RuntimeError, match="already replaced"):
            with DeterministicRandomTestTool().scope():
                pass
    assert random_seed.get_seed is TF_GET_SEED


def test_other_threads_get_tensorflow_seeds_and_are_not_traced():
    tool = DeterministicRandomTestTool(seed=1234, mode="num_random_ops")
    seen = {}

    def worker():
        seen["seeds"] = random_seed.get_seed(7)
        seen["value"] = tf.random.uniform((2,)).numpy()

    with tool.scope():
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join(timeout=60)
        mine = random_seed.get_seed(7)
    assert seen["seeds"] == (1234, 7)  # TensorFlow's rule: global seed, explicit op seed
    assert mine == (1234, 0)  # the tool's rule: explicit seed ignored, counter used
    assert tool.operation_seed == 1 and len(tool.trace) == 1


# ------------------------------------------------------- Keras initializers


def test_keras_initializer_is_deterministic_across_fresh_processes():
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE), TF_CPP_MIN_LOG_LEVEL="3")
    cmd = [sys.executable, os.path.join(HERE, "_keras_seed_child.py")]
    children = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(2)]
    results = []
    for child in children:
        out, err = child.communicate(timeout=180)
        assert child.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    first, second = results
    assert first["equivtool_constant"] == second["equivtool_constant"]
    assert first["equivtool_num_random_ops"] == second["equivtool_num_random_ops"]
    assert first["no_scope"] != second["no_scope"]  # proves the check can fail
    assert first["original"] != second["original"]  # the gap equivtool closes


def test_keras_initializers_constant_mode_same_shape_same_values():
    with DeterministicRandomTestTool().scope():
        a = tf_keras.initializers.GlorotUniform()((3, 4)).numpy()
        b = tf_keras.initializers.GlorotUniform()((3, 4)).numpy()
    assert_bitwise_equal([a], [b])


def test_keras_initializers_num_random_ops_follow_order():
    def two():
        return (tf_keras.initializers.HeNormal()((3, 4)).numpy(),
                tf_keras.initializers.HeNormal()((3, 4)).numpy())
    a, b = run_in(DeterministicRandomTestTool(mode="num_random_ops"), two)
    a2, b2 = run_in(DeterministicRandomTestTool(mode="num_random_ops"), two)
    assert not np.array_equal(a, b)
    assert_bitwise_equal([a, b], [a2, b2])


@pytest.mark.parametrize("mode", MODES)
def test_keras_layers_do_not_shift_original_compatible_seeds(mode):
    def program():
        u1 = tf.random.uniform((3,))
        tf_keras.layers.Dense(4).build((None, 3))  # draws a Keras seed, not a get_seed seed
        u2 = tf.random.normal((3,))
        return [u1.numpy(), u2.numpy()]
    assert_bitwise_equal(run_in(DeterministicRandomTestTool(mode=mode), program),
                         run_in(OriginalTool(mode=mode), program))


# ------------------------------------------------------------------ the trace


def test_trace_records_op_type_shape_dtype_and_source_line():
    tool = DeterministicRandomTestTool(mode="num_random_ops")
    with tool.scope():
        tf.random.truncated_normal((2, 3), dtype=tf.float64); line = sys._getframe().f_lineno  # noqa: E702
        tf.nn.dropout(tf.ones((4, 5)), rate=0.25)
        tf_keras.initializers.GlorotUniform()((5, 6))
    first, drop, keras = tool.trace
    assert (first.index, first.operation_seed, first.op_type, first.shape, first.dtype, first.kind) == \
        (0, 0, "truncated_normal", (2, 3), "float64", "tf")
    assert first.source.startswith(f"{__file__}:{line} in test_trace_records")
    assert (drop.op_type, drop.shape, drop.operation_seed) == ("dropout", (4, 5), 1)
    assert (keras.kind, keras.op_type, keras.shape, keras.operation_seed) == ("keras", "random_uniform", (5, 6), 0)
    assert "truncated_normal shape=(2, 3) dtype=float64 operation_seed=0 at " in str(first)


def test_record_trace_false_keeps_trace_empty():
    tool = DeterministicRandomTestTool(record_trace=False)
    with tool.scope():
        tf.random.uniform((2,))
    assert tool.trace == ()


def test_compare_identical_traces_returns_none():
    a, b = DeterministicRandomTestTool(mode="num_random_ops"), DeterministicRandomTestTool(mode="num_random_ops")
    run_in(a, three_uniforms_graph)
    run_in(b, three_uniforms_eager)
    assert len(a.trace) == 3
    assert compare_random_traces(a, b) is None


def test_compare_traces_reports_a_shorter_trace_as_length():
    a, b = DeterministicRandomTestTool(mode="num_random_ops"), DeterministicRandomTestTool(mode="num_random_ops")
    run_in(a, three_uniforms_eager)
    with b.scope():
        tf.random.uniform((3, 1))
    divergence = compare_random_traces(a.trace, b.trace)
    assert (divergence.index, divergence.reason, divergence.right) == (1, "length", None)
    assert "<trace ended>" in str(divergence)


def tf1_mlp(x):
    net = slim.fully_connected(x, 8, scope="fc1")
    net = slim.dropout(net, 0.5, is_training=True, scope="drop")  # TF1_DROPOUT
    return slim.fully_connected(net, 2, scope="fc2")  # TF1_FC2


class MovedDropout(tf_keras.layers.Layer):
    """The TF2 port, where the dropout was moved behind the second layer."""

    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, x):
        net = slim.fully_connected(x, 8, scope="fc1")
        net = slim.fully_connected(net, 2, scope="fc2")  # TF2_FC2
        return slim.dropout(net, 0.5, is_training=True, scope="drop")


def _line_of(marker):
    with open(__file__) as f:
        return next(i for i, text in enumerate(f, 1) if text.rstrip().endswith(marker))


def test_trace_divergence_pinpoints_a_reordered_program():
    x = np.ones((2, 4), np.float32)
    tf1 = DeterministicRandomTestTool(mode="num_random_ops")
    with tf1.scope(), tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        out = tf1_mlp(tf.constant(x))
        sess.run(tf.compat.v1.global_variables_initializer())
        graph_out = sess.run(out)
    tf2 = DeterministicRandomTestTool(mode="num_random_ops")
    with tf2.scope():
        eager_out = MovedDropout()(tf.constant(x)).numpy()
    assert not np.allclose(graph_out, eager_out)  # the symptom the user sees

    divergence = compare_random_traces(tf1, tf2)
    assert isinstance(divergence, TraceDivergence)
    assert (divergence.index, divergence.reason) == (1, "op type")
    assert divergence.left.op_type == "dropout" and divergence.right.op_type == "random_uniform"
    assert divergence.left.source.startswith(f"{__file__}:{_line_of('# TF1_DROPOUT')} ")
    assert divergence.right.source.startswith(f"{__file__}:{_line_of('# TF2_FC2')} ")
    text = str(divergence)
    assert text.startswith("random-op traces diverge at position 1 (different op type)")
    assert isinstance(divergence.left, RandomOpRecord)


@pytest.mark.parametrize("mode", MODES)
def test_keras_seed_source_takes_a_float_bound_as_python_random_does(mode):
    # tf-keras 2.16-2.18 ask their seed source for randint(1, 1e9): a float
    # bound. Python's random.randint returns an int for it; a float seed makes
    # TensorFlow raise "Value for attr 'Tseed' of float is not in the list".
    import random
    assert isinstance(random.Random(0).randint(1, 1e9), int)  # the contract copied
    tool = DeterministicRandomTestTool(mode=mode)
    with tool.scope():
        source = keras_backend._SEED_GENERATOR.generator
        as_float = source.randint(1, 1e9)
        assert type(as_float) is int
        # the same seed as the int bound gives (the tool's next draw, same key in constant mode)
        as_int = source.randint(1, 10**9)
        if mode == "constant":
            assert as_int == as_float
        # what tf-keras 2.16 does with the seed: an initializer runs
        values = tf_keras.initializers.GlorotUniform(seed=source.randint(1, 1e9))((3, 4)).numpy()
    assert values.shape == (3, 4)
    with tool.scope():
        with pytest.raises(TypeError, match="randint bound b must be an integer"):
            keras_backend._SEED_GENERATOR.generator.randint(1, 1.5)


# ------------------------------------------- scopes that end somewhere else


def _glorot_pair():
    """Two unseeded tf-keras initializers' values; equal only if their seeds are pinned."""
    first = tf_keras.initializers.GlorotUniform()((4, 4)).numpy()
    second = tf_keras.initializers.GlorotUniform()((4, 4)).numpy()
    return first, second


def _run_on_another_thread(fn):
    errors = []

    def target():
        try:
            fn()
        except BaseException as exc:  # reported to the test thread below
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    assert not errors, errors


def _assert_entering_thread_restored(holder):
    assert "generator" not in holder.__dict__  # the entering thread's own slot
    assert random_seed.get_seed is TF_GET_SEED
    first, second = _glorot_pair()
    assert not np.array_equal(first, second)  # Python's random again, not the tool's seed


def test_scope_exited_on_another_thread_restores_the_entering_threads_keras_seed():
    holder = keras_backend._SEED_GENERATOR
    assert "generator" not in holder.__dict__
    tool = DeterministicRandomTestTool()
    scope = tool.scope()
    scope.__enter__()
    try:
        first, second = _glorot_pair()
        assert np.array_equal(first, second)  # inside: the tool pins Keras seeds
        _run_on_another_thread(lambda: scope.__exit__(None, None, None))
        assert not tool.active
        _assert_entering_thread_restored(holder)
    finally:
        holder.__dict__.pop("generator", None)
        random_seed.get_seed = TF_GET_SEED


def test_scope_held_by_a_generator_closed_on_another_thread_is_restored():
    holder = keras_backend._SEED_GENERATOR
    tool = DeterministicRandomTestTool(mode="num_random_ops")

    def held():
        with tool.scope():
            yield

    gen = held()
    next(gen)
    try:
        assert tool.active and "generator" in holder.__dict__
        _run_on_another_thread(gen.close)
        assert not tool.active
        _assert_entering_thread_restored(holder)
    finally:
        holder.__dict__.pop("generator", None)
        random_seed.get_seed = TF_GET_SEED


def test_scope_exited_on_another_thread_puts_back_a_users_keras_generator():
    holder = keras_backend._SEED_GENERATOR
    sentinel = object()
    holder.generator = sentinel  # as tf.keras.utils.set_random_seed would
    try:
        scope = DeterministicRandomTestTool().scope()
        scope.__enter__()
        _run_on_another_thread(lambda: scope.__exit__(None, None, None))
        assert holder.generator is sentinel
    finally:
        holder.__dict__.pop("generator", None)
        random_seed.get_seed = TF_GET_SEED


# ---------------------------------------------------------------- arguments


@pytest.mark.parametrize("seed", [2 ** 63, -(2 ** 63) - 1, 10 ** 30])
def test_seed_outside_int64_is_refused_at_construction(seed):
    with pytest.raises(ValueError, match=r"seed must be an integer in \[-9223372036854775808, 9223372036854775807\]"):
        DeterministicRandomTestTool(seed=seed)
    assert random_seed.get_seed is TF_GET_SEED


@pytest.mark.parametrize("seed", [2 ** 63 - 1, -(2 ** 63)])
def test_seeds_at_the_int64_bounds_work_in_graph_and_eager(seed):
    assert_bitwise_equal(
        run_in(DeterministicRandomTestTool(seed=seed, mode="num_random_ops"), three_uniforms_graph),
        run_in(DeterministicRandomTestTool(seed=seed, mode="num_random_ops"), three_uniforms_eager))


def test_operation_seed_beyond_int64_is_refused():
    tool = DeterministicRandomTestTool()
    with pytest.raises(ValueError, match=r"operation_seed must be a non-negative integer in \[0, 9223372036854775807\]"):
        tool.operation_seed = 2 ** 63


@pytest.mark.parametrize("mode", MODES)
def test_seed_zero_is_deterministic(mode):
    # TensorFlow reads the seed pair (0, 0) as "pick a random seed".
    runs = [run_in(DeterministicRandomTestTool(seed=0, mode=mode), program)
            for program in (three_uniforms_eager, three_uniforms_eager, three_uniforms_graph)]
    assert_bitwise_equal(runs[0], runs[1])
    assert_bitwise_equal(runs[0], runs[2])


@pytest.mark.parametrize("bad, message", [
    ("trace", r"a must be a DeterministicRandomTestTool or its `trace`.*got str"),
    (None, r"a must be a DeterministicRandomTestTool or its `trace`.*got NoneType"),
    ({"index": 0}, r"a must be a DeterministicRandomTestTool .*got dict"),
    ([1, 2], r"a\[0\] is a int, not a RandomOpRecord"),
])
def test_compare_random_traces_refuses_what_is_not_a_trace(bad, message):
    with pytest.raises(TypeError, match=message):
        compare_random_traces(bad, ())
    with pytest.raises(TypeError, match=message.replace("a", "b", 1)):
        compare_random_traces((), bad)
