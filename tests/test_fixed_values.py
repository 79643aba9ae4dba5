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
