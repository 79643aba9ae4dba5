"""Values kept or read without copying them: a TF2 layer's variables kept as the
tensors read from them (``snapshot_layer``, which the pair's ``preserved`` and the
user's layer instance use) and put back after any update; eager tensors read as
read-only NumPy views of their own buffers (``_base.tree``)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import equivtool  # noqa: F401  (tf.keras is tf-keras)
from equivtool._base.tree import dense_gradient, to_numpy
from equivtool.engine.sides.tf2_side import restore_snapshot, snapshot_layer

UPDATES = ["assign", "assign_add", "assign_sub", "scatter", "sgd", "adam", "batch_norm_training_call"]
X = np.random.RandomState(0).rand(4, 3).astype(np.float32)


def _model():
    model = tf.keras.Sequential([tf.keras.layers.Dense(5), tf.keras.layers.BatchNormalization()])
    model(X)
    return model


def _update(model, how: str, rng) -> None:
    variables = model.variables
    target = variables[rng.randint(len(variables))]
    if how == "assign":
        target.assign(rng.standard_normal(target.shape).astype(np.float32))
    elif how == "assign_add":
        target.assign_add(tf.ones_like(target))
    elif how == "assign_sub":
        target.assign_sub(tf.ones_like(target) * 2)
    elif how == "scatter":
        target.scatter_nd_add([[0]], tf.ones([1, *target.shape[1:]]))
    elif how in ("sgd", "adam"):
        optimizer = tf.keras.optimizers.SGD(0.1) if how == "sgd" else tf.keras.optimizers.Adam(0.1)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(model(X, training=True)))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    else:
        model(X * 3.0, training=True)  # the moving statistics move


def _kept_through(updates, seed, snapshot=snapshot_layer) -> bool:
    """Whether a snapshot still holds, and puts back, the values it was taken at
    after ``updates``."""
    rng = np.random.RandomState(seed)
    model = _model()
    before = [v.numpy() for v in model.variables]
    saved = snapshot(model)
    assert len(saved) == len(before) > 0, "nothing kept: the property would hold for nothing"
    for how in updates:
        _update(model, how, rng)
    held = all(np.array_equal(np.asarray(value), old) for (_, value), old in zip(saved, before))
    restore_snapshot(saved)
    back = all(np.array_equal(v.numpy(), old) for v, old in zip(model.variables, before))
    return held and back


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(UPDATES), min_size=1, max_size=4), st.integers(0, 2 ** 16))
def test_a_snapshot_holds_and_puts_back_its_values_after_any_updates(updates, seed):
    assert _kept_through(updates, seed)


def test_a_snapshot_that_follows_its_variables_is_caught():
    """Planted fault: a "snapshot" holding the variables themselves."""
    assert not _kept_through(["assign_add"], 0, snapshot=lambda model: [(v, v) for v in model.variables])


def test_a_snapshot_of_nothing_proves_nothing():
    with pytest.raises(AssertionError, match="nothing kept"):
        _kept_through(["assign"], 0, snapshot=lambda model: [])


DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32, tf.int64, tf.uint8, tf.bool, tf.complex64]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(DTYPES), st.lists(st.integers(0, 4), max_size=3), st.integers(0, 2 ** 16))
def test_a_tensor_read_without_copying_is_its_values(dtype, shape, seed):
    """A gradient (or a composite's part) read as NumPy: the tensor's own buffer,
    read-only, where the buffer protocol can name its dtype; equal in dtype, shape
    and every value to ``numpy()``'s copy (a scalar is NumPy's scalar, as before)."""
    values = np.random.RandomState(seed).standard_normal(shape) * 5
    tensor = tf.cast(tf.constant(values), dtype)
    read, sparse = dense_gradient(tensor)
    expected = tensor.numpy()
    assert not sparse and type(read) is type(expected) and read.dtype == expected.dtype
    assert np.shape(read) == np.shape(expected) and np.array_equal(read, expected)
    if dtype != tf.bfloat16 and shape:  # a buffer the protocol can name: the tensor's own, read-only
        assert not read.flags.writeable
        if read.size:
            with pytest.raises(ValueError):
                read.reshape(-1)[0] = read.reshape(-1)[0]


def test_strings_and_variables_are_copied_as_before():
    strings = tf.constant([b"a", b"bc"])
    assert list(dense_gradient(strings)[0]) == [b"a", b"bc"] and list(to_numpy(strings)) == [b"a", b"bc"]
    variable = tf.Variable([1.0, 2.0])
    read = dense_gradient(variable)[0]
    variable.assign([5.0, 6.0])
    assert list(read) == [1.0, 2.0] and read.flags.writeable


def test_a_sides_variables_read_without_copying_keep_the_values_read():
    """``TF2Side.read_variables`` reads each variable as its tensor's buffer (read-only,
    no copy); updating the variables afterwards changes no value read."""
    from equivtool.engine.sides.tf2_side import TF2Side

    model = _model()
    side = TF2Side(model, renamer=lambda name: name, loss_fn=None)
    read = side.read_variables()
    expected = {v.name: v.numpy() for v in model.variables}
    assert len(read) == len(expected) > 0
    rng = np.random.RandomState(1)
    for how in UPDATES:
        _update(model, how, rng)
    assert all(not value.flags.writeable for value in read.values())
    assert sorted(np.asarray(v).tobytes() for v in read.values()) == sorted(v.tobytes() for v in expected.values())
