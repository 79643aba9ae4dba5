"""Compare the numbers two models produced: NumPy only, no TensorFlow.

``compare(expected, actual, tol)`` walks two nested structures (dicts in
*insertion* order, lists, tuples, namedtuples) of array-likes, compares each
pair of leaves within a :class:`Tolerance`, and returns a :class:`Comparison`:
one :class:`LeafComparison` per leaf, in forward order, so that
``Comparison.first_failure`` is where divergence begins (slim's ``end_points``
dict is built in the order the layers run).

Each leaf reads like ``numpy.testing.assert_allclose``'s failure text, plus the
tensor's name and the index where it first diverges::

    'end_points/Mixed_5b': NOT close (rtol=1e-06, atol=1e-05)
      shape (1, 35, 35, 320), dtype float32
      Mismatched elements: 28415 / 392000 (7.25%)
      Max absolute difference: 2.38e-07
      Max relative difference: 0.000275
      First mismatch at (0, 3, 17, 5): expected 0.123456791, actual 0.123500012

Rules, decided once here:

* A pair of values is close when ``|actual - expected| <= atol + rtol * |expected|``
  (``expected`` is the reference, as in ``assert_allclose``). NaN matches NaN at
  the same place; ``+inf`` matches ``+inf`` and ``-inf`` matches ``-inf``.
* Floating point (float16, bfloat16 and other ``ml_dtypes`` floats included)
  is upcast to float64 (complex to complex128) for the arithmetic.
* Integer, bool and string leaves are compared exactly, whatever the tolerance
  (the leaf records ``Tolerance.exact()``).
* A shape mismatch fails the leaf. When both sides hold the same number of
  elements, the values are still compared (actual reshaped to expected's
  shape) so that the report tells a squeeze bug from a real difference.
* A dtype mismatch is reported (``dtype_mismatch``) and the values are
  compared after promotion; it fails the leaf unless ``check_dtype=False``.
  Python scalars (``1.0``, ``3``) are weakly typed, as in NumPy's NEP 50:
  their dtype is not checked.
* ``max_abs`` and ``max_rel`` cover the positions where both sides are finite,
  passing or not (the report plots them for passing leaves too). ``max_rel``
  divides by ``|expected|`` and leaves out positions where expected is 0,
  unless those are the only differing positions: then it is ``inf`` (as
  ``numpy.testing`` does).
* A ``tf.IndexedSlices`` (held as ``SlicesArrays``) is one leaf,
  ``<path>/dense``: the dense value it denotes (see ``_slices``), whatever
  order or repetition of indices each side used.
* Structure differences (a key on one side only, a list against a dict, a
  container against an array, different lengths) become failing leaves with
  ``missing_in_actual``, ``missing_in_expected`` or ``structure_mismatch`` and a
  note; ``compare`` does not raise on them.

Three outcomes
--------------

Each leaf, and each comparison, is **passed**, **failed** or
**inconclusive**. A leaf is inconclusive when nothing that could differ was
compared: it has no element (zero-size, or ``None`` on both sides), or every
element is non-finite at the same places on both sides (NaN against NaN, inf
against inf), so no finite pair was compared. ``LeafComparison.compared``
counts the element pairs compared (finite on both sides). An output that is
legitimately non-finite (a ``-inf`` attention mask) opts out per leaf with
``Tolerance(allow_nonfinite=True)`` in the tolerance spec: its matching
non-finite elements then count as compared. A comparison passes only when
every leaf passed; it is inconclusive when no leaf failed but one was
inconclusive, or when it holds no leaf at all. ``ok`` means passed.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import numpy as np

from equivtool.comparison._advice import tolerance_advice
from equivtool.comparison._agree import agreement
from equivtool.comparison._results import Comparison, LeafComparison
from equivtool.comparison._slices import compare_slices
from equivtool.comparison.tolerance import (COMPLEX, EXACT, FLOAT, OTHER, Index, Tolerance, ToleranceSpec,
                                  close_mask, common_kind, count_compared, value_kind, max_errors,
                                  why_nothing_compared, resolve_with_key, scalar_at, validate_spec, resolve_tolerance,
                                  unmatched_keys)
from equivtool._base.slices import SlicesArrays
from equivtool._base.tree import is_namedtuple as _is_namedtuple

__all__ = [
    "Tolerance",
    "ToleranceSpec",
    "LeafComparison",
    "Comparison",
    "compare",
    "resolve_tolerance",
    "unmatched_keys",
]


# ---------------------------------------------------------------------------
# compare()
# ---------------------------------------------------------------------------


def _describe(x: Any) -> str:
    if isinstance(x, Mapping):
        return f"a {type(x).__name__} with {len(x)} key(s)"
    if isinstance(x, (list, tuple)):
        return f"a {type(x).__name__} of {len(x)} item(s)"
    if x is None:
        return "None"
    try:
        arr = np.asarray(x)
    except Exception:  # noqa: BLE001 - only describing it
        return f"a {type(x).__name__}"
    return f"a {type(x).__name__} (shape {arr.shape}, dtype {arr.dtype})"


def _shape_dtype(x: Any) -> tuple[Optional[Index], str]:
    if isinstance(x, (Mapping, list, tuple)) or x is None:
        return None, type(x).__name__
    try:
        arr = np.asarray(x)
    except Exception:  # noqa: BLE001
        return None, type(x).__name__
    return tuple(arr.shape), str(arr.dtype)


class _Walker:
    def __init__(self, spec: ToleranceSpec, prefix: str, check_dtype: bool):
        self.spec = spec
        self.prefix = prefix
        self.check_dtype = check_dtype
        self.leaves: list[LeafComparison] = []
        self.used_keys: set[str] = set()

    def name(self, path: tuple[str, ...]) -> str:
        parts = (self.prefix, *path) if self.prefix else path
        return "/".join(parts) if parts else "value"

    def tolerance(self, path: tuple[str, ...]) -> Tolerance:
        full = self.name(path)
        relative = "/".join(path)
        names = (full, relative) if relative and relative != full else (full,)
        tol, key = resolve_with_key(self.spec, names)
        if key is not None:
            self.used_keys.add(key)
        return tol

    def structure_leaf(
        self, path, expected, actual, note=None, *, missing_in_actual=False, missing_in_expected=False
    ) -> LeafComparison:
        """A failing leaf for a structural difference (no values compared)."""
        if note is None:
            note = f"expected is {_describe(expected)}, actual is {_describe(actual)}"
        e_shape, e_dtype = _shape_dtype(expected) if not missing_in_expected else (None, "missing")
        a_shape, a_dtype = _shape_dtype(actual) if not missing_in_actual else (None, "missing")
        return LeafComparison(
                name=self.name(path),
                ok=False,
                tolerance=self.tolerance(path),
                expected_shape=e_shape,
                actual_shape=a_shape,
                expected_dtype=e_dtype,
                actual_dtype=a_dtype,
                note=note,
                values_compared=False,
                missing_in_actual=missing_in_actual,
                missing_in_expected=missing_in_expected,
                structure_mismatch=not (missing_in_actual or missing_in_expected),
        )

    def walk(self, expected: Any, actual: Any, path: tuple[str, ...]) -> None:
        e_map, a_map = isinstance(expected, Mapping), isinstance(actual, Mapping)
        e_seq, a_seq = isinstance(expected, (list, tuple)), isinstance(actual, (list, tuple))
        if isinstance(expected, SlicesArrays) or isinstance(actual, SlicesArrays):
            self.leaves.append(compare_slices(self, expected, actual, path))  # by its dense value
        elif e_map and a_map:
            self.walk_mapping(expected, actual, path)
        elif e_seq and a_seq:
            self.walk_sequence(expected, actual, path)
        elif e_map or a_map or e_seq or a_seq:
            self.leaves.append(self.structure_leaf(path, expected, actual))
        else:
            self.leaves.append(self.compare_leaf(expected, actual, path))

    def walk_mapping(self, expected: Mapping, actual: Mapping, path: tuple[str, ...]) -> None:
        for key, value in expected.items():
            child = (*path, str(key))
            if key in actual:
                self.walk(value, actual[key], child)
            else:
                self.leaves.append(self.structure_leaf(
                    child, value, None, f"key {key!r} is in expected but not in actual", missing_in_actual=True
                ))
        for key, value in actual.items():
            if key not in expected:
                self.leaves.append(self.structure_leaf(
                    (*path, str(key)), None, value,
                    f"key {key!r} is in actual but not in expected", missing_in_expected=True,
                ))

    def walk_sequence(self, expected: Sequence, actual: Sequence, path: tuple[str, ...]) -> None:
        if _is_namedtuple(expected) and _is_namedtuple(actual) and expected._fields != actual._fields:
            self.leaves.append(self.structure_leaf(
                path, expected, actual,
                f"expected is {type(expected).__name__}{expected._fields}, "
                f"actual is {type(actual).__name__}{actual._fields}",
            ))
            return
        fields = expected._fields if _is_namedtuple(expected) else (
            actual._fields if _is_namedtuple(actual) else None
        )
        labels = [fields[i] if fields else str(i) for i in range(max(len(expected), len(actual)))]
        for i in range(min(len(expected), len(actual))):
            self.walk(expected[i], actual[i], (*path, labels[i]))
        for i in range(len(actual), len(expected)):
            self.leaves.append(self.structure_leaf(
                (*path, labels[i]), expected[i], None,
                f"item {i} is in expected ({len(expected)} items) but not in actual ({len(actual)} items)",
                missing_in_actual=True,
            ))
        for i in range(len(expected), len(actual)):
            self.leaves.append(self.structure_leaf(
                (*path, labels[i]), None, actual[i],
                f"item {i} is in actual ({len(actual)} items) but not in expected ({len(expected)} items)",
                missing_in_expected=True,
            ))

    def compare_leaf(self, expected: Any, actual: Any, path: tuple[str, ...]) -> LeafComparison:
        name, requested = self.name(path), self.tolerance(path)
        if expected is None or actual is None:
            if expected is None and actual is None:
                return LeafComparison(name, False, requested, None, None, "None", "None", size=0,
                                      max_abs=0.0, max_rel=0.0, note="None on both sides",
                                      inconclusive_reason="None on both sides: nothing to compare")
            return self.structure_leaf(path, expected, actual)
        try:
            e, a = np.asarray(expected), np.asarray(actual)
        except Exception as exc:  # noqa: BLE001 - reported, never raised
            return self.structure_leaf(path, expected, actual, f"cannot convert to an array: {exc}")
        weak = type(expected) in (bool, int, float, complex) or type(actual) in (bool, int, float, complex)
        e_kind, a_kind = value_kind(e.dtype), value_kind(a.dtype)
        kind = common_kind(e_kind, a_kind)
        shape_mismatch = e.shape != a.shape
        dtype_mismatch = e.dtype != a.dtype and not weak
        notes: list[str] = []
        tol = Tolerance.exact() if kind in (EXACT, OTHER) else requested
        if kind in (EXACT, OTHER) and requested.allow_nonfinite:
            tol = Tolerance(0.0, 0.0, allow_nonfinite=True)
        if kind in (EXACT, OTHER) and not requested.is_exact:
            notes.append("compared exactly (integer, bool, string or object values)")
        if dtype_mismatch:
            how = {FLOAT: "as float64", COMPLEX: "as complex128"}.get(kind, "exactly")
            verdict = "fails the leaf" if self.check_dtype else "ignored (check_dtype=False)"
            notes.append(f"dtypes differ ({e.dtype} vs {a.dtype}), values compared {how}; {verdict}")
        base = dict(
            name=name, tolerance=tol, expected_shape=tuple(e.shape), actual_shape=tuple(a.shape),
            expected_dtype=str(e.dtype), actual_dtype=str(a.dtype),
            shape_mismatch=shape_mismatch, dtype_mismatch=dtype_mismatch,
        )
        if shape_mismatch:
            if e.size != a.size:
                notes.insert(0, f"shapes differ ({e.shape} vs {a.shape}) and sizes differ "
                                f"({e.size} vs {a.size}); values not compared")
                return LeafComparison(ok=False, size=int(e.size), values_compared=False,
                                      note="; ".join(notes), **base)
            notes.insert(0, f"shapes differ ({e.shape} vs {a.shape}); same size, so values were "
                            f"compared with actual reshaped to {e.shape}")
            a = a.reshape(e.shape)
        agreed = agreement(e, a, tol) if kind == FLOAT and not shape_mismatch else None
        if agreed is not None:  # every element close: summarised in chunks, no whole-size temporaries
            ok = not (dtype_mismatch and self.check_dtype)
            reason = why_nothing_compared(e) if ok and agreed.compared == 0 else ""
            return LeafComparison(
                ok=ok and not reason, compared=agreed.compared, inconclusive_reason=reason,
                below_atol=ok and not reason and agreed.below_atol, size=int(e.size),
                max_abs=agreed.max_abs, max_rel=agreed.max_rel, note="; ".join(notes), **base)
        try:
            close, stats = close_mask(e, a, tol, kind)
        except (TypeError, ValueError) as exc:
            notes.append(f"values could not be compared: {exc}")
            return LeafComparison(ok=False, size=int(e.size), values_compared=False,
                                  note="; ".join(notes), **base)
        mismatched = int(close.size - np.count_nonzero(close))
        max_abs, max_rel = max_errors(stats)
        first = first_e = first_a = None
        if mismatched:
            flat = int(np.argmin(close.reshape(-1)))  # first False in C order
            first = tuple(int(i) for i in np.unravel_index(flat, close.shape))
            first_e, first_a = scalar_at(e, first, kind), scalar_at(a, first, kind)
        ok = mismatched == 0 and not shape_mismatch and not (dtype_mismatch and self.check_dtype)
        compared = count_compared(close, stats, tol)
        reason = why_nothing_compared(e) if ok and compared == 0 else ""
        advice = None
        if mismatched and stats is not None and kind in (FLOAT, COMPLEX):
            advice = tolerance_advice(e, a, stats["diff"], stats["abs_e"], stats["finite"], tol.rtol, tol.atol,
                                      stats["nan"] + stats["inf"])
        return LeafComparison(
            ok=ok and not reason, compared=compared, inconclusive_reason=reason, advice=advice,
            below_atol=ok and not reason and _below_atol(e, a, tol, kind),
            size=int(close.size), mismatched=mismatched,
            fraction=mismatched / close.size if close.size else 0.0,
            max_abs=max_abs, max_rel=max_rel, first_mismatch=first,
            first_expected=first_e, first_actual=first_a,
            nan_mismatch=stats["nan"] if stats and "nan" in stats else 0,
            inf_mismatch=stats["inf"] if stats and "inf" in stats else 0,
            note="; ".join(notes), **base,
        )


def _below_atol(e: np.ndarray, a: np.ndarray, tol: Tolerance, kind: str) -> bool:
    """Every finite value on both sides smaller than ``atol`` in magnitude: then
    ``|actual - expected| <= atol`` holds almost whatever the two sides compute,
    so the leaf could not have shown a difference. Matching non-finite values
    (compared under ``allow_nonfinite``) could have differed: not below."""
    if kind not in (FLOAT, COMPLEX) or not tol.atol > 0:
        return False
    largest = 0.0
    for side in (e, a):
        values = np.abs(side.astype(np.complex128 if kind == COMPLEX else np.float64))
        finite = np.isfinite(values)
        if not finite.all():
            return False
        values = values[finite]
        if values.size:
            largest = max(largest, float(values.max()))
    return largest < tol.atol


def compare(
    expected: Any,
    actual: Any,
    tol: ToleranceSpec = None,
    *,
    name: str = "",
    check_dtype: bool = True,
) -> Comparison:
    """Compare two nested structures of arrays leaf by leaf.

    ``expected`` is the reference (the TF1 side), ``actual`` the candidate.
    Dicts are walked in ``expected``'s insertion order (keys only in
    ``actual`` come last), sequences by position, namedtuples by field. Leaves
    are named by their path joined with "/", prefixed by ``name`` when given;
    a bare array is named ``name`` or ``"value"``. ``tol`` is a
    :data:`ToleranceSpec` (see :func:`resolve_tolerance`). See the module
    docstring for the rules on dtypes, shapes, NaN and infinity.
    """
    validate_spec(tol)
    walker = _Walker(tol, name, check_dtype)
    walker.walk(expected, actual, ())
    unmatched: tuple[str, ...] = ()
    if isinstance(tol, Mapping):
        unmatched = tuple(k for k in tol if k != "*" and k not in walker.used_keys)
    return Comparison(leaves=tuple(walker.leaves), name=name, unmatched_tolerance_keys=unmatched)
