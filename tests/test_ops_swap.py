"""deterministic_xent(): every route reaches equivtool's op (seen in the graph),
and TensorFlow's originals come back on every exit path."""

import equivtool  # noqa: F401  (must precede TensorFlow)

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
