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


# -- kept arrays moved to disk (a worker's next job would otherwise hold them) --

@settings(max_examples=60, deadline=None)
@given(st.lists(arrays(), min_size=1, max_size=6), st.data())
def test_arrays_moved_to_disk_read_back_as_they_were(values, data):
    """Any arrays, any subset read back in any order: the same bytes, shape and dtype."""
    on_disk = _kept.OnDisk(dict(enumerate(values)))
    with on_disk:
        wanted = data.draw(st.lists(st.sampled_from(range(len(values))), unique=True))
        back = on_disk.read(wanted)
    assert sorted(back) == sorted(wanted)
    assert all(same(back[index], values[index]) for index in wanted)


def test_a_file_cut_short_is_an_error_not_other_numbers():
    """Planted fault: the file loses its last bytes; reading that array raises."""
    values = {0: np.arange(1000, dtype=np.float32), 1: np.ones((7, 9), np.float64)}
    with _kept.OnDisk(values) as on_disk:
        on_disk.file.truncate(on_disk.where[1][0] + 8)
        assert same(on_disk.read([0])[0], values[0])
        with pytest.raises(EOFError, match="kept array 1: 496 bytes missing"):
            on_disk.read([1])


def test_arrays_on_disk_leave_no_file_behind(tmp_path, monkeypatch):
    """The file has no name: nothing in the temporary folder while it is open, and
    its descriptor is gone once closed."""
    import os
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    on_disk = _kept.OnDisk({0: np.zeros(1 << 16, np.float32)})
    fd = on_disk.file.fileno()
    assert os.listdir(tmp_path) == [] and os.fstat(fd).st_size == 1 << 18
    on_disk.close()
    assert os.listdir(tmp_path) == []
    with pytest.raises(OSError):
        os.fstat(fd)


def _outbox():
    import socket
    from multiprocessing.connection import Connection

    from equivtool.engine import workers
    here, there = socket.socketpair()
    return workers._Outbox(Connection(here.detach())), Connection(there.detach())


def test_a_worker_moves_to_disk_only_what_it_is_told_and_only_past_the_threshold():
    from equivtool.engine import send
    outbox, parent = _outbox()
    values = {0: np.arange(4096, dtype=np.float32), 1: np.full((3, 5), 2.5)}
    outbox.kept = {("a", "tf2"): dict(values), ("b", "tf2"): {0: np.zeros(10)}}
    outbox.spill([("a", "tf2")], min_bytes=1 << 20)  # 16 KB kept: below it, left in memory
    assert all(isinstance(arrays, dict) for arrays in outbox.kept.values())
    outbox.spill([("a", "tf2"), ("gone", "tf1")], min_bytes=0)
    assert isinstance(outbox.kept[("a", "tf2")], _kept.OnDisk) and isinstance(outbox.kept[("b", "tf2")], dict)
    on_disk = outbox.kept[("a", "tf2")]
    outbox.answer(("fetch", "a", "tf2", [1, 0]))
    kind, name, side, back = send.receive(parent)
    assert (kind, name, side) == ("arrays", "a", "tf2") and sorted(back) == [0, 1]
    assert all(same(back[index], values[index]) for index in values)
    assert on_disk.file.closed and ("a", "tf2") not in outbox.kept
    outbox.spill([("b", "tf2")], min_bytes=0)
    dropped = outbox.kept[("b", "tf2")]
    outbox.answer(("drop", "b", "tf2"))
    assert dropped.file.closed and outbox.kept == {}
    outbox.conn.close()
    parent.close()


def test_a_disk_that_refuses_leaves_the_arrays_in_memory(monkeypatch):
    def full(arrays):
        raise OSError(28, "No space left on device")
    outbox, parent = _outbox()
    kept = {0: np.arange(4096, dtype=np.float32)}
    outbox.kept = {("a", "tf2"): kept}
    monkeypatch.setattr(_kept, "OnDisk", full)
    outbox.spill([("a", "tf2")], min_bytes=0)
    assert outbox.kept == {("a", "tf2"): kept}
    outbox.conn.close()
    parent.close()
