"""A ``tf.IndexedSlices`` held as NumPy, and the dense value it denotes.

An ``IndexedSlices`` (the gradient of ``tf.gather`` or an embedding lookup, or
one built by user code) is a list of rows: ``values[i]`` belongs at row
``indices[i]`` of a tensor of shape ``dense_shape``. Two correct programs may
list the rows in another order, split one row into several entries of the same
index (which sum) or leave ``dense_shape`` unknown, so the components cannot be
compared one by one: what both must agree on is the dense tensor they denote.
This module keeps the components as they came (so a report can name the index
sets and dtypes) and computes that dense tensor. NumPy only: the TF1 session's
``IndexedSlicesValue``, an eager ``tf.IndexedSlices`` and the components the
TensorFlow 1.x interpreter sends all become :class:`SlicesArrays`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

__all__ = ["SlicesArrays", "slices_arrays", "index_sets", "max_index_rows"]


def _array(value) -> np.ndarray:
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


@dataclass(frozen=True, eq=False)
class SlicesArrays:
    """The components of one ``tf.IndexedSlices``: ``values`` (rows), ``indices``
    (1-D, one per row of ``values``) and ``dense_shape`` (``None`` when unknown).

    A leaf of a capture (not a container): the comparison judges it by the dense
    value it denotes (see :mod:`equivtool.comparison._slices`)."""

    values: np.ndarray
    indices: np.ndarray
    dense_shape: Optional[np.ndarray] = None

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    def problem(self) -> str:
        """Why these components denote no dense tensor ("" when they do)."""
        if self.indices.ndim != 1 or self.values.ndim < 1 or self.values.shape[0] != self.indices.shape[0]:
            return (f"indices of shape {self.indices.shape} do not index the rows of values of shape "
                    f"{self.values.shape} (expected 1-D indices, one per row)")
        if self.indices.dtype.kind not in "iu":
            return f"indices of dtype {self.indices.dtype} (expected integers)"
        if self.dense_shape is not None:
            shape = tuple(int(d) for d in self.dense_shape.reshape(-1))
            if len(shape) != self.values.ndim or shape[1:] != tuple(self.values.shape[1:]):
                return (f"values of shape {self.values.shape} do not fit dense_shape {list(shape)} "
                        f"(expected rows of shape {list(shape[1:])})")
            outside = self.indices[(self.indices < 0) | (self.indices >= shape[0])]
            if outside.size:
                return f"index {int(outside[0])} is outside dense_shape {list(shape)} (rows 0 to {shape[0] - 1})"
        elif self.indices.size and int(self.indices.min()) < 0:
            return f"index {int(self.indices.min())} is negative"
        return ""

    def rows(self) -> Optional[int]:
        """The dense row count ``dense_shape`` gives (``None`` when unknown)."""
        return None if self.dense_shape is None else int(self.dense_shape.reshape(-1)[0])

    def dense(self, rows: Optional[int] = None) -> np.ndarray:
        """The dense tensor: ``values`` summed into their rows (a repeated index
        sums, in index order); ``rows`` when ``dense_shape`` is unknown (default
        ``max(index) + 1``). Call only when :meth:`problem` is ""."""
        if self.dense_shape is not None:
            shape = tuple(int(d) for d in self.dense_shape.reshape(-1))
        else:
            shape = (max_index_rows(self) if rows is None else int(rows), *self.values.shape[1:])
        dense = np.zeros(shape, dtype=self.values.dtype)
        np.add.at(dense, self.indices, self.values)
        return dense


def max_index_rows(slices: SlicesArrays) -> int:
    """``max(index) + 1`` (0 for no index): the rows the indices reach."""
    return int(slices.indices.max()) + 1 if slices.indices.size else 0


def index_sets(indices: np.ndarray) -> tuple[list, list]:
    """``(the distinct indices sorted, the ones given more than once)`` as ints."""
    unique, counts = np.unique(indices, return_counts=True)
    return [int(i) for i in unique], [int(i) for i in unique[counts > 1]]


def slices_arrays(value: Any) -> SlicesArrays:
    """A ``tf.IndexedSlices`` (eager), an ``IndexedSlicesValue`` (from a session)
    or a mapping of its components (``values``, ``indices``, optional
    ``dense_shape``, as the TensorFlow 1.x interpreter sends them) as NumPy."""
    get = value.get if isinstance(value, dict) else (lambda name: getattr(value, name, None))
    shape = get("dense_shape")
    return SlicesArrays(_array(get("values")), _array(get("indices")), None if shape is None else _array(shape))
