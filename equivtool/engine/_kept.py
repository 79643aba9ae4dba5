"""A worker's large arrays sent as digests, and matched to the other side's.

A side's capture holds a model's worth of values per training step (223 MB
for Inception-ResNet-v2), and most of them are bit-identical to the other
side's: the same fixed or seeded initial values, read back. A worker keeps
each large array of a capture it sends and sends a :class:`Kept` in its place
(the array's SHA-256, shape and dtype). Once the other side of the step is in,
:func:`match` puts in its place the other side's array with the same bytes,
shape and dtype, where there is one, so the step is judged on the same values
it would have been sent; only the arrays nothing matches are asked for
(:func:`fill`). A matched array is made read-only: both sides then hold one
buffer, and a judgement that wrote to it would change the other side too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import tempfile

import numpy as np

from equivtool._base.tree import flatten_tensors, pack_like

#: Arrays this large or larger travel as a digest first (the parent tells its workers).
KEEP_BYTES = 1 << 16
#: A worker moves its kept arrays to disk before its next job when they come to this much.
SPILL_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class Kept:
    """An array a worker kept: ``index`` names it there."""
    index: int
    digest: bytes
    shape: tuple
    dtype: str


def _keepable(value, min_bytes: int) -> bool:
    return (type(value) is np.ndarray and value.nbytes >= min_bytes
            and value.dtype.kind in "biufc" and not value.dtype.hasobject)


def digest(array: np.ndarray) -> bytes:
    """SHA-256 of the array's bytes in C order."""
    flat = np.ascontiguousarray(array).reshape(-1)
    return hashlib.sha256(flat.view(np.uint8)).digest()


def _key(array: np.ndarray) -> tuple:
    return tuple(array.shape), array.dtype.str


def _walk(value, leaf):
    """``value`` with each leaf replaced by ``leaf(it)``, containers kept."""
    return pack_like(value, [leaf(item) for item in flatten_tensors(value)])


def keep(capture, min_bytes: int) -> tuple:
    """``(capture with each array of ``min_bytes`` or more replaced by a Kept, {index: array})``."""
    arrays: dict = {}

    def leaf(value):
        if not _keepable(value, min_bytes):
            return value
        index = len(arrays)
        arrays[index] = value
        return Kept(index, digest(value), *_key(value))
    return _walk(capture, leaf), arrays


def kept(capture) -> list:
    """The Kept placeholders in ``capture``."""
    return [leaf for leaf in flatten_tensors(capture) if isinstance(leaf, Kept)]


def match(capture, other) -> tuple:
    """``(capture with each Kept replaced by an array of ``other`` of the same
    bytes, shape and dtype, [indices of the Kept nothing matched])``. Matched
    arrays are made read-only (they are then shared by both captures)."""
    wanted = {(leaf.shape, leaf.dtype) for leaf in kept(capture)}
    found: dict = {}
    for array in flatten_tensors(other):
        if _keepable(array, 0) and _key(array) in wanted:
            found.setdefault((digest(array), *_key(array)), array)
    missing = []

    def leaf(value):
        if not isinstance(value, Kept):
            return value
        array = found.get((value.digest, value.shape, value.dtype))
        if array is None:
            missing.append(value.index)
            return value
        array.flags.writeable = False
        return array
    return _walk(capture, leaf), missing


def fill(capture, arrays: dict):
    """``capture`` with each Kept replaced by ``arrays[its index]``."""
    return _walk(capture, lambda value: arrays[value.index] if isinstance(value, Kept) else value)


class OnDisk:
    """Kept arrays moved to a temporary file, read back by index when asked for.

    The file has no name (``tempfile.TemporaryFile``: ``O_TMPFILE`` on Linux, or
    unlinked at once): its space is freed when it is closed or this process
    ends, however it ends. Its pages are the kernel's page cache, written back
    and dropped under memory pressure, not this process's memory (on a tmpfs
    temporary folder they stay memory: point ``TMPDIR`` at a disk)."""

    def __init__(self, arrays: dict):
        self.where: dict = {}  # index -> (offset, shape, dtype)
        self.file = tempfile.TemporaryFile(prefix="equivtool-kept-")
        try:
            for index, array in arrays.items():
                data = np.ascontiguousarray(array)  # (1-d for a 0-d array: its shape is the array's)
                self.where[index] = (self.file.tell(), array.shape, array.dtype)
                self.file.write(data.reshape(-1).view(np.uint8).data)
            self.file.flush()
        except BaseException:
            self.file.close()
            raise

    def read(self, indices) -> dict:
        """``{index: array}``: fresh arrays with the bytes written."""
        arrays = {}
        for index in indices:
            offset, shape, dtype = self.where[index]
            array = np.empty(shape, dtype)
            view, got = array.reshape(-1).view(np.uint8), 0
            self.file.seek(offset)
            while got < view.nbytes:
                count = self.file.readinto(view[got:])
                if not count:
                    raise EOFError(f"kept array {index}: {view.nbytes - got} bytes missing from its file")
                got += count
            arrays[index] = array
        return arrays

    def close(self) -> None:
        self.file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
