"""``engine._kept``: a worker's large arrays travel as digests and are matched to
the other side's arrays with the same bytes; whatever the captures, the step is
judged on exactly the values it would have been sent."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from equivtool.engine import _kept

DTYPES = ["float32", "float64", "float16", "int32", "int64", "uint8", "bool", "complex64"]


@st.composite
def arrays(draw):
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=3)))
    seed = draw(st.integers(0, 2 ** 16))
    values = np.random.RandomState(seed).standard_normal(int(np.prod(shape, dtype=np.int64))) * 3
    return values.reshape(shape).astype(dtype)


def captures(leaf):
    scalar = st.one_of(st.none(), st.integers(), st.text(max_size=3), st.floats(allow_nan=False))
    return st.recursive(st.one_of(leaf, scalar),
                        lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                st.tuples(inner, inner),
                                                st.dictionaries(st.text(max_size=4), inner, max_size=3)),
                        max_leaves=8)


def _flat(value):
    from equivtool._base.tree import flatten_tensors
    return flatten_tensors(value)


def same(a, b) -> bool:
    """The same structure and leaves; arrays by bytes, shape and dtype."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()
    return a == b


@settings(max_examples=200, deadline=None)
@given(captures(arrays()), st.integers(0, 64))
def test_kept_then_filled_is_the_capture(capture, min_bytes):
    stripped, kept = _kept.keep(capture, min_bytes)
    placeholders = _kept.kept(stripped)
    assert sorted(leaf.index for leaf in placeholders) == sorted(kept)
    assert all(array.nbytes >= min_bytes for array in kept.values())
    assert not any(isinstance(leaf, np.ndarray) and leaf.nbytes >= min_bytes and leaf.dtype.kind in "biufc"
                   for leaf in _flat(stripped))
    assert same(_kept.fill(stripped, kept), capture)


def _variant(array, how):
    """``array`` itself, a copy, or arrays that differ in bytes, shape or dtype only."""
    if how == "copy":
        return array.copy()
    if how == "changed" and array.size:
        changed = array.copy().reshape(-1)
        changed[0] = changed[0] + 1 if changed.dtype != bool else not changed[0]
        return changed.reshape(array.shape)
    if how == "reshaped" and array.ndim:
        return array.reshape(-1, 1) if array.ndim == 1 else array.reshape(-1)
    if how == "retyped" and array.dtype.itemsize == 4 and array.dtype.kind == "f":
        return array.view(np.int32)
    return array.copy()


@settings(max_examples=200, deadline=None)
@given(captures(arrays()), st.lists(st.sampled_from(["copy", "changed", "reshaped", "retyped", "absent"]),
                                    min_size=8, max_size=8), st.integers(0, 64))
def test_a_match_is_the_same_bytes_shape_and_dtype_or_it_is_asked_for(capture, hows, min_bytes):
    """Whatever the other side holds, matching then filling what is missing from
    the worker's arrays gives the capture it would have sent; a matched array is
    the other side's own object, read-only."""
    stripped, kept = _kept.keep(capture, min_bytes)
    others = [_variant(array, how) for array, how in zip(kept.values(), hows) if how != "absent"]
    matched, missing = _kept.match(stripped, {"other": others})
    assert same(_kept.fill(matched, {index: kept[index] for index in missing}), capture)
    asked = set(missing)
    for leaf in _kept.kept(stripped):
        if leaf.index not in asked:  # matched: some array of the other side, byte for byte
            equal = [a for a in others if a.shape == leaf.shape and a.dtype.str == leaf.dtype
                     and a.tobytes() == kept[leaf.index].tobytes()]
            assert equal
    for leaf in _flat(matched):
        if isinstance(leaf, np.ndarray) and any(leaf is other for other in others):
            assert not leaf.flags.writeable


def test_a_planted_change_in_one_element_is_asked_for():
    a = np.arange(1000, dtype=np.float32)
    stripped, kept = _kept.keep({"v": a}, 1)
    b = a.copy()
    b[999] = np.nextafter(b[999], np.float32(np.inf))  # one ULP
    matched, missing = _kept.match(stripped, {"v": b})
    assert missing == [0] and isinstance(matched["v"], _kept.Kept)
    matched, missing = _kept.match(stripped, {"v": a.copy()})
    assert missing == [] and matched["v"].tobytes() == a.tobytes()


def test_nothing_to_match_leaves_every_array_to_be_asked_for():
    stripped, kept = _kept.keep([np.zeros(300, np.float32), np.ones(300, np.float32)], 1)
    matched, missing = _kept.match(stripped, {})
    assert sorted(missing) == [0, 1] == sorted(kept)
    assert _kept.keep({"a": 1, "b": [np.zeros(2)]}, 1 << 20)[1] == {}


@pytest.mark.parametrize("value", [np.array(["a", "b"]), np.array([object(), 1], dtype=object)])
def test_arrays_without_numbers_travel_whole(value):
    stripped, kept = _kept.keep({"x": value}, 0)
    assert kept == {} and stripped["x"] is value
