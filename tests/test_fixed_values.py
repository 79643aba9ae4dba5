"""The fixed values (workflow step 3) are made chunk by chunk in reused buffers;
every bit is the one the plain expression gives, a fresh array per operation
(the values both sides, and a TensorFlow 1.15 interpreter, must make alike)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from equivtool.engine.sides import tf1_side

STEP = tf1_side._PATTERN_STEP
CHUNK = tf1_side._PATTERN_ROWS * STEP


def plain(name: str, shape: tuple, dtype) -> np.ndarray:
    """offset + amplitude * sin(angle * k + phase), by the angle-addition formula, one fresh array per operation."""
    offset, amplitude, phase = tf1_side._pattern(name, shape)
    size = int(np.prod(shape)) if shape else 1
    out = np.empty(size, dtype)
    for start in range(0, size, CHUNK):
        count = min(CHUNK, size - start)
        rows = -(-count // STEP)
        base = (start + np.arange(rows, dtype=np.float64) * STEP) * tf1_side._ANGLE + phase
        grid = np.sin(base)[:, None] * tf1_side._RUN_COS[None, :] + np.cos(base)[:, None] * tf1_side._RUN_SIN[None, :]
        out[start:start + count] = offset + amplitude * grid.reshape(-1)[:count]
    return out.reshape(shape)


NAMES = st.sampled_from(["net/conv1/weights", "net/bn/gamma", "net/bn/moving_variance", "fc/biases", "b/beta",
                         "emb/embeddings", "x"])


@settings(max_examples=80, deadline=None)
@given(NAMES, st.lists(st.integers(1, 70), min_size=0, max_size=4), st.sampled_from(["float32", "float16",
                                                                                        "float64", "bfloat16"]))
def test_fixed_values_are_the_plain_expression_bit_for_bit(name, shape, dtype):
    import tensorflow as tf
    numpy_dtype = tf.as_dtype(dtype).as_numpy_dtype
    made = tf1_side.fixed_value(name, tuple(shape), dtype)
    expected = plain(name, tuple(shape), numpy_dtype)
    assert made.shape == expected.shape and made.dtype == expected.dtype
    assert made.tobytes() == expected.tobytes()


@pytest.mark.parametrize("size", [CHUNK - 1, CHUNK, CHUNK + STEP + 3, 2 * CHUNK + 1])
def test_fixed_values_across_chunks_and_part_rows_are_the_plain_expression(size):
    made = tf1_side.fixed_value("net/fc6/weights", (size,), "float32")
    assert made.tobytes() == plain("net/fc6/weights", (size,), np.float32).tobytes()


def test_a_planted_change_in_the_order_of_operations_is_seen():
    """Planted fault: the amplitude applied to each term before the sum (the same
    number in exact arithmetic): float64 values differ in their last bits."""
    name, shape = "net/fc6/weights", (CHUNK + 5,)
    offset, amplitude, phase = tf1_side._pattern(name, shape)
    base = np.arange(-(-shape[0] // STEP), dtype=np.float64) * STEP * tf1_side._ANGLE + phase
    grid = ((amplitude * np.sin(base))[:, None] * tf1_side._RUN_COS[None, :]
            + (amplitude * np.cos(base))[:, None] * tf1_side._RUN_SIN[None, :])
    planted = offset + grid.reshape(-1)[:shape[0]]
    assert planted.tobytes() != tf1_side.fixed_value(name, shape, "float64").tobytes()
    assert plain(name, shape, np.float64).tobytes() == tf1_side.fixed_value(name, shape, "float64").tobytes()


# ---------------------------------------------------------------------------
# A TF2 layer takes the fixed values without a copy, and never writes into them.

def _tf2_side(flavour):
    import keras
    import tf_keras

    from equivtool.engine.sides.tf2_side import TF2Side
    from equivtool.variables import make_renamer

    layer = (tf_keras.layers.Dense(64, name="d") if flavour == "tf_keras"
             else keras.layers.Dense(64, name="d"))
    layer.build((None, 32))
    return TF2Side(layer, renamer=make_renamer(None), loss_fn=None)


def _handed(monkeypatch):
    """The arrays the side imported by DLPack (each kept, to look at afterwards)."""
    import tensorflow as tf

    from equivtool.engine.sides import tf2_side

    arrays, real = [], tf2_side._shared

    def spy(value, variable):
        out = real(value, variable)
        if isinstance(out, tf.Tensor):
            arrays.append(value)
        return out

    monkeypatch.setattr(tf2_side, "_shared", spy)
    return arrays


@pytest.mark.parametrize("flavour", ["tf_keras", "keras3"])
def test_fixed_values_reach_a_tf2_layer_uncopied_and_stay_as_made(flavour, monkeypatch):
    import tensorflow as tf

    from equivtool.engine.steps.common import FixedValues
    from equivtool.variables.flavour import layer_variables

    side = _tf2_side(flavour)
    variables = layer_variables(side.layer)
    handed = _handed(monkeypatch)
    side.assign_variables(FixedValues(side.keys(), variables, "p/"))
    assert len(handed) == len(variables) == 2  # both went the DLPack way
    expected = {key: tf1_side.fixed_value("p/" + key, tuple(v.shape), "float32")
                for key, v in zip(side.keys(), variables)}
    for key, value in side.read_variables().items():
        np.testing.assert_array_equal(value.view(np.uint32), expected[key].view(np.uint32))
    # writes to the variables (in place: assign_add) leave the arrays as made
    for v in variables:
        v.assign_add(tf.ones(v.shape))
    for array in handed:
        assert any(np.array_equal(array, e) for e in expected.values())
    for key, value in side.read_variables().items():
        np.testing.assert_array_equal(value, expected[key] + np.float32(1))


def test_arrays_of_a_mapping_that_may_share_them_are_copied(monkeypatch):
    # the planted case: the same values in a plain dict (a caller's arrays,
    # which it may change later) take the copying path
    from equivtool.engine.steps.common import FixedValues
    from equivtool.variables.flavour import layer_variables

    side = _tf2_side("tf_keras")
    handed = _handed(monkeypatch)
    values = dict(FixedValues(side.keys(), layer_variables(side.layer), "p/"))
    side.assign_variables(values)
    assert handed == []
    values[side.keys()[0]][...] = 7.0  # the caller changes its array: the variable does not
    assert not (side.read_variables()[side.keys()[0]] == 7.0).any()


def test_shared_takes_only_arrays_tensorflow_can_use_as_they_are():
    import tensorflow as tf

    from equivtool.engine.sides.tf2_side import _shared

    variable = tf.Variable(tf.zeros([4, 16]))
    good = tf1_side.aligned_empty(64, np.float32).reshape(4, 16)
    good[...] = 1.5
    assert isinstance(_shared(good, variable), tf.Tensor)
    unaligned = tf1_side.aligned_empty(65, np.float32)[1:].reshape(4, 16)
    other_dtype = tf1_side.aligned_empty(64, np.float64).reshape(4, 16)
    read_only = tf1_side.aligned_empty(64, np.float32).reshape(4, 16)
    read_only.flags.writeable = False
    strided = tf1_side.aligned_empty(128, np.float32).reshape(4, 32)[:, ::2]
    for value in (unaligned, other_dtype, read_only, strided, [1.0] * 64):
        assert _shared(value, variable) is value
