"""How ``compare`` judges a ``tf.IndexedSlices`` leaf: by the dense value it denotes.

Two correct programs may give the same ``IndexedSlices`` in another row order,
with one row split into entries of a repeated index (they sum: the gradient of
``tf.gather(table, [1, 1])`` is two entries of row 1, or one of their sum after
``tf.unique``), or with ``dense_shape`` unknown. None of these changes the
tensor it stands for, so the components are not compared one by one. The leaf,
``<path>/dense``, is that tensor: the values summed into their rows, of shape
``dense_shape``; where ``dense_shape`` is unknown, the other side's (if known)
or ``max(index) + 1`` rows over both sides (a trailing row of zeros that one
side lists and the other leaves out is then no difference). Its tolerance, dtype
check and three outcomes are those of any leaf. The note names what the
components were (each side's index dtype, distinct and repeated indices, and
the indices on one side only) and, when the leaf fails, the first row that
differs by its index. An ``IndexedSlices`` with no entry on either side is
inconclusive: it holds nothing that could differ (as a zero-size leaf).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import numpy as np

from equivtool._base.slices import SlicesArrays, index_sets, max_index_rows
from equivtool.comparison._results import LeafComparison

__all__ = ["compare_slices"]

_SHOWN = 8  # indices listed in a note before "..."


def _listed(indices: list) -> str:
    shown = ", ".join(str(i) for i in indices[:_SHOWN])
    return "{" + shown + (", ..." if len(indices) > _SHOWN else "") + "}"


def _describe_side(label: str, slices: SlicesArrays) -> str:
    distinct, repeated = index_sets(slices.indices)
    shape = "unknown" if slices.dense_shape is None else str([int(d) for d in slices.dense_shape.reshape(-1)])
    text = (f"{label} {slices.indices.shape[0]} entries at {len(distinct)} rows {_listed(distinct)}, "
            f"indices {slices.indices.dtype}, values {slices.values.dtype}, dense_shape {shape}")
    return text + (f", repeated {_listed(repeated)} (summed)" if repeated else "")


def _components_note(expected: Any, actual: Any) -> str:
    sides = [(label, s) for label, s in (("expected", expected), ("actual", actual)) if isinstance(s, SlicesArrays)]
    how = ("a tf.IndexedSlices on both sides" if len(sides) == 2 else
           f"a tf.IndexedSlices on the {sides[0][0]} side only, against a dense array")
    parts = [f"{how}, compared as the dense value it denotes (entries of one index summed)"]
    described = [_describe_side(label, s) for label, s in sides]
    if len(sides) == 2 and described[0][len("expected"):] == described[1][len("actual"):]:
        described = ["both sides" + described[0][len("expected"):]]
    parts += described
    if len(sides) == 2:
        e_rows, a_rows = set(index_sets(expected.indices)[0]), set(index_sets(actual.indices)[0])
        if e_rows - a_rows:
            parts.append(f"rows in expected only {_listed(sorted(e_rows - a_rows))}")
        if a_rows - e_rows:
            parts.append(f"rows in actual only {_listed(sorted(a_rows - e_rows))}")
    return "; ".join(parts)


def _entries(slices: Any, row: int) -> str:
    if not isinstance(slices, SlicesArrays):
        return "a dense row"
    count = int(np.count_nonzero(slices.indices == row))
    return f"{count} entr{'y' if count == 1 else 'ies'}"


def _row_note(leaf: LeafComparison, expected: Any, actual: Any) -> Optional[str]:
    """Which row (index) differs first, and how many entries each side gave it."""
    if not leaf.failed or leaf.first_mismatch is None or not leaf.first_mismatch:
        return None
    row = int(leaf.first_mismatch[0])
    return (f"first differing row: index {row} (expected {_entries(expected, row)}, "
            f"actual {_entries(actual, row)} for it)")


def _dense_pair(expected: Any, actual: Any) -> tuple:
    """Both sides as dense arrays, rows agreed as the module docstring says."""
    known = [s.rows() for s in (expected, actual) if isinstance(s, SlicesArrays) and s.rows() is not None]
    arrays = [np.asarray(s) for s in (expected, actual) if not isinstance(s, SlicesArrays)]
    reached = [max_index_rows(s) for s in (expected, actual) if isinstance(s, SlicesArrays)]
    if known:
        rows = known[0]
    elif arrays and arrays[0].ndim:
        rows = arrays[0].shape[0]
    else:
        rows = max(reached)
    return tuple(s.dense(max(rows, max_index_rows(s))) if isinstance(s, SlicesArrays) else s
                 for s in (expected, actual))


def compare_slices(walker, expected: Any, actual: Any, path: tuple) -> LeafComparison:
    """The leaf ``<path>/dense`` of an output that is a ``tf.IndexedSlices`` on
    one side or both (``walker``: the comparison's, for names and tolerances)."""
    child = (*path, "dense")
    for label, value in (("expected", expected), ("actual", actual)):
        if isinstance(value, SlicesArrays) and value.problem():
            shown = [s.values if isinstance(s, SlicesArrays) else s for s in (expected, actual)]
            return walker.structure_leaf(child, *shown, f"{label} tf.IndexedSlices: {value.problem()}")
        if not isinstance(value, SlicesArrays) and (value is None or isinstance(value, (Mapping, list, tuple))):
            return walker.structure_leaf(path, expected, actual)
    note = _components_note(expected, actual)
    if all(isinstance(s, SlicesArrays) and s.indices.size == 0 for s in (expected, actual)):
        dense = expected.dense(expected.rows() or 0)
        return LeafComparison(walker.name(child), False, walker.tolerance(child), tuple(dense.shape),
                              tuple(actual.dense(actual.rows() or 0).shape), str(expected.dtype),
                              str(actual.dtype), size=int(dense.size), max_abs=0.0, max_rel=0.0, note=note,
                              inconclusive_reason="a tf.IndexedSlices with no entry on both sides: "
                                                  "no value that could differ was compared")
    e_dense, a_dense = _dense_pair(expected, actual)
    leaf = walker.compare_leaf(e_dense, a_dense, child)
    notes = [n for n in (leaf.note, note, _row_note(leaf, expected, actual)) if n]
    return dataclasses.replace(leaf, note="; ".join(notes))
