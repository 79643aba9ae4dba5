"""deterministic_xent(): every route reaches equivtool's op (seen in the graph),
and TensorFlow's originals come back on every exit path."""

import equivtool  # noqa: F401  (must precede TensorFlow)

import threading
import warnings

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from equivtool import ops
from equivtool.ops import swap, xent

B, C = 4, 5


def _sparse_routes():
    return {
        "tf.nn": lambda y, x: tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=x),
        "tf.compat.v1.nn": lambda y, x: tf.compat.v1.nn.sparse_softmax_cross_entropy_with_logits(
            labels=y, logits=x),
        "tf.compat.v1.losses": lambda y, x: tf.compat.v1.losses.sparse_softmax_cross_entropy(y, x),
        "tf_keras.losses": lambda y, x: tf_keras.losses.SparseCategoricalCrossentropy(
            from_logits=True)(y, x),
        "tf_keras.backend": lambda y, x: tf_keras.backend.sparse_categorical_crossentropy(
            y, x, from_logits=True),
    }


def _dense_routes():
    return {
        "tf.nn": lambda y, x: tf.nn.softmax_cross_entropy_with_logits(labels=y, logits=x),
        "tf.compat.v1.nn": lambda y, x: tf.compat.v1.nn.softmax_cross_entropy_with_logits(
            labels=y, logits=x),
        "tf.compat.v1.nn_v2": lambda y, x: tf.compat.v1.nn.softmax_cross_entropy_with_logits_v2(
            labels=y, logits=x),
        "tf.compat.v1.losses": lambda y, x: tf.compat.v1.losses.softmax_cross_entropy(y, x),
        "tf_keras.losses": lambda y, x: tf_keras.losses.CategoricalCrossentropy(
            from_logits=True)(y, x),
        "tf_keras.backend": lambda y, x: tf_keras.backend.categorical_crossentropy(
            y, x, from_logits=True),
    }


def _op_types(route, dense):
    """Op types in a TF1 graph holding the route's loss and its gradient."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [B, C])
        y = tf.compat.v1.placeholder(tf.float32, [B, C]) if dense \
            else tf.compat.v1.placeholder(tf.int32, [B])
        loss = route(y, x)
        tf.compat.v1.gradients(loss, [x])
    return {op.type for op in graph.get_operations()}


@pytest.mark.parametrize("name", sorted(_sparse_routes()))
def test_sparse_route_reaches_the_op(name):
    route = _sparse_routes()[name]
    assert xent.SPARSE_OP not in _op_types(route, dense=False)
    with ops.deterministic_xent():
        types = _op_types(route, dense=False)
    assert {xent.SPARSE_OP, xent.SPARSE_GRAD_OP} <= types
    assert "SparseSoftmaxCrossEntropyWithLogits" not in types


@pytest.mark.parametrize("name", sorted(_dense_routes()))
def test_dense_route_reaches_the_op(name):
    route = _dense_routes()[name]
    assert xent.DENSE_OP not in _op_types(route, dense=True)
    with ops.deterministic_xent():
        types = _op_types(route, dense=True)
    assert {xent.DENSE_OP, xent.DENSE_GRAD_OP} <= types
    assert "SoftmaxCrossEntropyWithLogits" not in types


def test_routed_values_match_tf_eagerly():
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((B, C)), tf.float32)
    y = tf.constant(rng.integers(0, C, B))
    expected = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=x)
    with ops.deterministic_xent():
        got = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=x)
        got_keras = tf_keras.losses.sparse_categorical_crossentropy(y, x, from_logits=True)
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-6)
    np.testing.assert_allclose(got_keras.numpy(), expected.numpy(), rtol=1e-6)


def test_v1_dense_route_keeps_gradients_out_of_labels():
    x = tf.constant(np.zeros((B, C)), tf.float32)
    y = tf.constant(np.full((B, C), 1.0 / C), tf.float32)
    with ops.deterministic_xent():
        with tf.GradientTape() as tape:
            tape.watch(y)
            loss = tf.compat.v1.nn.softmax_cross_entropy_with_logits(labels=y, logits=x)
        assert tape.gradient(loss, y) is None
        with tf.GradientTape() as tape:
            tape.watch(y)
            loss = tf.nn.softmax_cross_entropy_with_logits(labels=y, logits=x)
        assert tape.gradient(loss, y) is not None


def _snapshot():
    return [(module, attr, getattr(module, attr)) for module, attr, _, _ in swap._routes()]


def test_originals_restored_when_the_block_raises():
    before = _snapshot()
    with pytest.raises(KeyError, match="boom"):
        with ops.deterministic_xent():
            assert swap.is_enabled()
            raise KeyError("boom")
    assert not swap.is_enabled()
    for module, attr, value in before:
        assert getattr(module, attr) is value, f"{module.__name__}.{attr} not restored"


def test_every_route_is_patched_inside_the_block():
    before = _snapshot()
    with ops.deterministic_xent():
        unpatched = [f"{m.__name__}.{a}" for m, a, original in before if getattr(m, a) is original]
    assert unpatched == []


def test_enable_and_disable_functions_and_nesting():
    original = tf.nn.sparse_softmax_cross_entropy_with_logits
    ops.enable_deterministic_xent()
    try:
        ops.enable_deterministic_xent()  # idempotent
        with ops.deterministic_xent():
            pass
        assert tf.nn.sparse_softmax_cross_entropy_with_logits is not original  # outer kept
    finally:
        ops.disable_deterministic_xent()
    assert tf.nn.sparse_softmax_cross_entropy_with_logits is original
    ops.disable_deterministic_xent()  # a no-op when not enabled
    assert tf.nn.sparse_softmax_cross_entropy_with_logits is original


def test_enable_patches_nothing_when_the_library_is_missing(monkeypatch):
    from equivtool.ops import _load

    def missing():
        raise _load.OpLibraryError("not built; run `equivtool build-ops`")

    monkeypatch.setattr(swap, "load_library", missing)
    before = _snapshot()
    with pytest.raises(ops.OpLibraryError, match="equivtool build-ops"):
        with ops.deterministic_xent():
            pass  # pragma: no cover
    assert all(getattr(m, a) is v for m, a, v in before) and not swap.is_enabled()


# ---------------------------------------------------------------------------
# A swap that holds: counted blocks, stale traces, Keras models, XLA.

def _in_thread(fn):
    """Runs fn in a new thread and waits for it (sequencing without sleeps)."""
    errors = []

    def run():
        try:
            fn()
        except BaseException as exc:  # pragma: no cover - re-raised below
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def test_overlapping_blocks_on_two_threads_keep_the_routing_until_the_last_exits():
    original = tf.nn.sparse_softmax_cross_entropy_with_logits
    block_a, block_b = ops.deterministic_xent(), ops.deterministic_xent()
    _in_thread(block_a.__enter__)
    _in_thread(block_b.__enter__)
    _in_thread(lambda: block_a.__exit__(None, None, None))
    assert swap.is_enabled() and tf.nn.sparse_softmax_cross_entropy_with_logits is not original
    _in_thread(lambda: block_b.__exit__(None, None, None))
    assert not swap.is_enabled() and tf.nn.sparse_softmax_cross_entropy_with_logits is original


def test_non_nested_enter_and_exit_on_one_thread():
    original = tf.nn.softmax_cross_entropy_with_logits
    first, second = ops.deterministic_xent(), ops.deterministic_xent()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert tf.nn.softmax_cross_entropy_with_logits is not original
    second.__exit__(None, None, None)
    assert tf.nn.softmax_cross_entropy_with_logits is original


def test_disable_leaves_an_open_block_routed():
    original = tf.nn.sparse_softmax_cross_entropy_with_logits
    with ops.deterministic_xent():
        ops.enable_deterministic_xent()
        ops.disable_deterministic_xent()
        assert tf.nn.sparse_softmax_cross_entropy_with_logits is not original
    assert tf.nn.sparse_softmax_cross_entropy_with_logits is original


def _functions_holding(op_type):
    from tensorflow.python.eager import context

    ctx = context.context()
    return {name for name in ctx.list_function_names()
            if any(node.op == op_type for node in ctx.get_function_def(name).node_def)}


def _sparse_loss_fn():
    x = tf.constant(np.ones((B, C)), tf.float32)
    y = tf.constant(np.arange(B) % C)
    return tf.function(lambda: tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=x))


def _trace_names(fn):
    return {tf.compat.as_str(cf.name) for cf in fn._list_all_concrete_functions()}


def test_entering_warns_about_functions_traced_before_with_tfs_op():
    early = _sparse_loss_fn()
    early()  # traced with TensorFlow's op
    assert _trace_names(early) <= set(swap.traced_functions_holding_tf_xent())
    with pytest.warns(swap.StaleTraceWarning, match=r"function\(s\) traced before .*__inference"):
        with ops.deterministic_xent():
            early()
    del early


def test_functions_traced_inside_a_block_are_not_reported_as_stale():
    before = swap.traced_functions_holding_tf_xent()
    with ops.deterministic_xent():
        inside = _sparse_loss_fn()
        inside()
    assert swap.traced_functions_holding_tf_xent() == before
    outside = _sparse_loss_fn()
    outside()  # planted: a trace with TF's op is reported
    assert len(set(swap.traced_functions_holding_tf_xent()) - set(before)) == 1


def test_function_traced_inside_keeps_equivtools_op_after_the_block():
    with ops.deterministic_xent():
        inside = _sparse_loss_fn()
        expected = inside().numpy()
    assert inside().numpy().tobytes() == expected.tobytes()
    names = _functions_holding(xent.SPARSE_OP)
    assert any(name for name in names), "no traced function holds equivtool's op"


def _small_model():
    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.layers.Dense(C, input_shape=(3,))])
    model.compile(optimizer="sgd",
                  loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = (np.random.default_rng(0).standard_normal((8, 3)).astype("float32"),
            np.arange(8) % C)
    return model, data


def _train_functions_holding(op_type):
    return {name for name in _functions_holding(op_type) if "train_function" in name}


def test_keras_model_fitted_before_is_retraced_when_passed_to_the_block():
    model, (x, y) = _small_model()
    model.fit(x, y, epochs=1, verbose=0)
    with pytest.warns(swap.StaleTraceWarning):  # the model not passed: its trace is stale
        with ops.deterministic_xent():
            pass
    # a training step runs the fused op (a gradient tape records the logits)
    before = _train_functions_holding(xent.SPARSE_STEP_OP)
    old_traces = _trace_names(model.train_function)
    assert old_traces <= set(swap.traced_functions_holding_tf_xent())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", swap.StaleTraceWarning)
        with ops.deterministic_xent(model):
            model.fit(x, y, epochs=1, verbose=0)
            routed = _train_functions_holding(xent.SPARSE_STEP_OP) - before
    reported = " ".join(str(w.message) for w in caught)
    assert not any(name in reported for name in old_traces), reported  # released, not stale
    assert routed, "fit inside deterministic_xent(model) did not trace with equivtool's op"
    assert model.train_function is None  # reset on exit: the next fit traces with TF's op


def test_deterministic_xent_rejects_a_non_model_argument():
    with pytest.raises(TypeError, match="argument 0 must be a Keras model"):
        with ops.deterministic_xent("model"):
            pass  # pragma: no cover
    assert not swap.is_enabled()


@pytest.mark.parametrize("dense", [False, True], ids=["sparse", "dense"])
def test_jit_compiled_function_inside_the_block_runs_and_matches_tf(dense):
    rng = np.random.default_rng(3)
    x = tf.constant(rng.standard_normal((64, 100)), tf.float32)
    if dense:
        y = tf.constant(rng.dirichlet(np.ones(100), 64), tf.float32)
        loss_fn = lambda: tf.nn.softmax_cross_entropy_with_logits  # noqa: E731
    else:
        y = tf.constant(rng.integers(0, 100, 64))
        loss_fn = lambda: tf.nn.sparse_softmax_cross_entropy_with_logits  # noqa: E731

    def step(x, y):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(loss_fn()(labels=y, logits=x))
        return loss, tape.gradient(loss, x)

    expected = step(x, y)
    with ops.deterministic_xent():
        compiled = tf.function(step, jit_compile=True)
        runs = [compiled(x, y) for _ in range(3)]
    for got, want in zip(runs[0], expected):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    for run in runs[1:]:  # determinism on the CPU: bitwise equal run to run
        for a, b in zip(run, runs[0]):
            assert a.numpy().tobytes() == b.numpy().tobytes()


def test_jit_compiled_exact_gradient_is_the_derivative():
    x = tf.constant([[0.0, 2.0]])
    y = tf.constant([[1.0, 2.0]])  # sums to 3

    @tf.function(jit_compile=True)
    def grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = ops.softmax_cross_entropy_with_logits(labels=y, logits=x, exact_gradient=True)
        return tape.gradient(loss, x)

    p = tf.nn.softmax(x).numpy()
    np.testing.assert_allclose(grad(x).numpy(), 3 * p - y.numpy(), rtol=1e-6)
