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
* Structure differences (a key on one side only, a list against a dict, a
  container against an array, different lengths) become failing leaves with
  ``missing_in_actual``, ``missing_in_expected`` or ``structure_mismatch`` and a
  note; ``compare`` does not raise on them.
"""

from __future__ import annotations

import fnmatch
import math
import numbers
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional, Sequence, Union

import numpy as np

from equivtool._tree import is_namedtuple as _is_namedtuple

__all__ = [
    "Tolerance",
    "ToleranceSpec",
    "LeafComparison",
    "Comparison",
    "compare",
    "resolve_tolerance",
]

Index = tuple[int, ...]


# ---------------------------------------------------------------------------
# Tolerance
# ---------------------------------------------------------------------------


def _check_tolerance_value(argument: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"Tolerance {argument} must be a non-negative finite float, "
            f"got {type(value).__name__} {value!r}."
        )
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(
            f"Tolerance {argument} must be a non-negative finite float, got {value!r}. "
            f"Use {argument}=0.0 for no slack."
        )
    return value


@dataclass(frozen=True)
class Tolerance:
    """How close is close: ``|actual - expected| <= atol + rtol * |expected|``.

    The defaults are the TensorFlow migration guide's (``rtol=1e-6``,
    ``atol=1e-5``). ``Tolerance.exact()`` asks for equal values.
    """

    rtol: float = 1e-6
    atol: float = 1e-5

    def __post_init__(self) -> None:
        object.__setattr__(self, "rtol", _check_tolerance_value("rtol", self.rtol))
        object.__setattr__(self, "atol", _check_tolerance_value("atol", self.atol))

    @classmethod
    def exact(cls) -> "Tolerance":
        """Equal values only (``-0.0 == 0.0``; NaN matches NaN at the same place)."""
        return cls(rtol=0.0, atol=0.0)

    @property
    def is_exact(self) -> bool:
        return self.rtol == 0.0 and self.atol == 0.0

    def close(self, expected: Any, actual: Any) -> np.ndarray:
        """Element-wise closeness (broadcast as NumPy does), as a bool array.

        Integer and bool inputs on both sides are compared exactly.
        """
        e = np.asarray(expected)
        a = np.asarray(actual)
        kind = _common_kind(_kind(e.dtype), _kind(a.dtype))
        close, _ = _close_mask(e, a, self, kind)
        return close

    def to_dict(self) -> dict[str, float]:
        return {"rtol": self.rtol, "atol": self.atol}

    def __str__(self) -> str:
        if self.is_exact:
            return "exact"
        return f"rtol={self.rtol:g}, atol={self.atol:g}"


ToleranceSpec = Union[Tolerance, Mapping[str, Tolerance], None]

_PATTERN_CHARS = frozenset("*?[")


def _key_matches(key: str, name: str) -> Optional[int]:
    """Rank of ``key`` for ``name`` (lower is better), or None if it does not match."""
    if key == name:
        return 0
    if key == "*":
        return 2
    if name.startswith(key + "/"):
        return 1
    if _PATTERN_CHARS.intersection(key) and fnmatch.fnmatchcase(name, key):
        return 1
    return None


def _resolve(spec: ToleranceSpec, names: Sequence[str]) -> tuple[Tolerance, Optional[str]]:
    if spec is None:
        return Tolerance(), None
    if isinstance(spec, Tolerance):
        return spec, None
    best: Optional[tuple[tuple[int, int, int], str, Tolerance]] = None
    for order, (key, tol) in enumerate(spec.items()):
        for name in names:
            rank = _key_matches(key, name)
            if rank is None:
                continue
            # exact name, then the longest (most specific) prefix or pattern,
            # then "*"; ties go to the key that comes first in the mapping.
            score = (rank, -len(key), order)
            if best is None or score < best[0]:
                best = (score, key, tol)
    if best is None:
        return Tolerance(), None
    return best[2], best[1]


def _validate_spec(spec: ToleranceSpec) -> None:
    if spec is None or isinstance(spec, Tolerance):
        return
    if not isinstance(spec, Mapping):
        raise TypeError(
            f"tol must be a Tolerance, a mapping of leaf name -> Tolerance, or None; "
            f"got {type(spec).__name__}."
        )
    for key, value in spec.items():
        if not isinstance(key, str):
            raise TypeError(f"tol keys must be leaf names or patterns (str), got {key!r}.")
        if not isinstance(value, Tolerance):
            raise TypeError(
                f"tol[{key!r}] must be a Tolerance, got {type(value).__name__} {value!r}; "
                f"write Tolerance(rtol=..., atol=...)."
            )


def resolve_tolerance(spec: ToleranceSpec, leaf_name: str, *aliases: str) -> Tolerance:
    """The tolerance that ``spec`` gives the leaf called ``leaf_name``.

    ``spec`` is a ``Tolerance`` (for every leaf), ``None`` (the defaults) or a
    mapping whose keys are, in order of precedence:

    1. an exact leaf name (``"logits"``);
    2. a path prefix (``"end_points"`` covers ``"end_points/Mixed_5b"``) or an
       fnmatch pattern (``"end_points/Mixed_*"``, ``"*/BatchNorm*"``); when
       several match, the longest key wins, then the first in the mapping;
    3. ``"*"``, the default; without it, ``Tolerance()``.

    ``aliases`` are other names the same leaf answers to (``compare`` passes
    the path without its ``name=`` prefix).
    """
    _validate_spec(spec)
    return _resolve(spec, (leaf_name, *aliases))[0]


# ---------------------------------------------------------------------------
# Element-wise arithmetic
# ---------------------------------------------------------------------------

_FLOAT, _COMPLEX, _EXACT, _OTHER = "float", "complex", "exact", "other"


def _kind(dtype: np.dtype) -> str:
    if dtype.kind == "f":
        return _FLOAT
    if dtype.kind == "c":
        return _COMPLEX
    if dtype.kind in "biuUSMm":
        return _EXACT
    if dtype.kind == "V" and dtype.fields is None:
        try:  # bfloat16, float8_*, int4 ... come from ml_dtypes (no TensorFlow needed)
            import ml_dtypes
        except ImportError:  # pragma: no cover - ml_dtypes ships with numpy-based TF stacks
            return _OTHER
        try:
            ml_dtypes.finfo(dtype)
            return _FLOAT
        except (ValueError, TypeError):
            pass
        try:
            ml_dtypes.iinfo(dtype)
            return _EXACT
        except (ValueError, TypeError):
            pass
    return _OTHER


def _common_kind(k1: str, k2: str) -> str:
    if k1 == k2:
        return k1
    if _OTHER in (k1, k2):
        return _OTHER
    if _COMPLEX in (k1, k2):
        return _COMPLEX
    return _FLOAT  # exact against float: compare numerically after promotion


def _as_number_array(x: np.ndarray, kind: str) -> np.ndarray:
    if kind == _COMPLEX:
        return x.astype(np.complex128, copy=False)
    return x.astype(np.float64, copy=False)


def _close_mask(e: np.ndarray, a: np.ndarray, tol: Tolerance, kind: str) -> tuple[np.ndarray, Optional[dict]]:
    """The closeness mask and, for numbers, what the error statistics need:
    ``diff`` (|a - e|), ``abs_e`` (|e|), ``finite`` (None when all positions
    are finite on both sides), ``nan`` and ``inf`` mismatch counts."""
    if kind in (_EXACT, _OTHER):
        close = np.asarray(e == a, dtype=bool)
        if close.shape != np.broadcast_shapes(e.shape, a.shape):
            raise TypeError("the values cannot be compared element by element")
        if kind == _OTHER or e.dtype.kind in "USMm" or a.dtype.kind in "USMm":
            return close, None
        e64, a64 = e.astype(np.float64), a.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(a64 - e64)
        return close, {"diff": diff, "abs_e": np.abs(e64), "finite": None, "nan": 0, "inf": 0}
    e64, a64 = _as_number_array(e, kind), _as_number_array(a, kind)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(a64 - e64)
        abs_e = np.abs(e64)
        close = np.asarray(diff <= tol.atol + tol.rtol * abs_e)
    stats = {"diff": diff, "abs_e": abs_e, "finite": None, "nan": 0, "inf": 0}
    finite = np.isfinite(e64)
    finite &= np.isfinite(a64)
    if not finite.all():
        nan_e, nan_a = np.isnan(e64), np.isnan(a64)
        nonfinite = ~finite
        # NaN matches NaN; an infinity matches the same infinity; the
        # arithmetic above got these positions wrong (inf - inf is NaN,
        # inf <= atol + rtol * inf is True).
        same_special = (nan_e & nan_a) | (~nan_e & ~nan_a & (e64 == a64))
        close = np.where(finite, close, same_special)
        stats["finite"] = finite
        stats["nan"] = int(np.count_nonzero(nan_e ^ nan_a))
        stats["inf"] = int(np.count_nonzero(nonfinite & ~nan_e & ~nan_a & (e64 != a64)))
    return close, stats


def _max_errors(stats: Optional[dict]) -> tuple[float, float]:
    """Largest absolute and relative differences where both sides are finite."""
    if stats is None:
        return math.nan, math.nan
    diff, abs_e, finite = stats["diff"], stats["abs_e"], stats["finite"]
    if diff.size == 0 or (finite is not None and not finite.any()):
        return 0.0, 0.0
    where = True if finite is None else finite
    max_abs = float(np.max(diff, where=where, initial=0.0))
    nonzero = abs_e != 0
    if finite is not None:
        nonzero &= finite
    rel = np.divide(diff, abs_e, out=np.zeros_like(diff), where=nonzero)
    max_rel = float(rel.max())
    if max_rel == 0.0 and max_abs > 0.0:
        max_rel = math.inf  # the only differences are where expected is 0
    return max_abs, max_rel


def _scalar(x: np.ndarray, index: Index, kind: str) -> Any:
    value = x[index]
    if kind == _FLOAT and x.dtype.kind == "V":
        return float(value)
    item = value.item() if hasattr(value, "item") else value
    if isinstance(item, bytes):
        return item.decode("utf-8", "replace")
    if isinstance(item, (bool, int, float, complex, str)) or item is None:
        return item
    return str(item)


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------


def _fmt_err(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.3g}"


def _fmt_value(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.9g}"
    if isinstance(x, complex):
        return f"({x.real:.9g}{x.imag:+.9g}j)"
    return repr(x)


def _fmt_shape(shape: Optional[Index]) -> str:
    return "-" if shape is None else str(tuple(shape))


def _fmt_index(index: Index) -> str:
    return str(tuple(index))


def _fmt_side(shape: Optional[Index], dtype: str) -> str:
    return dtype if shape is None else f"shape {_fmt_shape(shape)} dtype {dtype}"


def _float_field(x: Any) -> float:
    """Inverse of the report's JSON encoding: "nan"/"inf"/"-inf"/None -> float."""
    if x is None:
        return math.nan
    return float(x)


@dataclass(frozen=True)
class LeafComparison:
    """One leaf of a comparison: an array (or scalar) against its reference.

    ``values_compared`` is False when no element-wise comparison was possible
    (a missing or structurally different leaf, or shapes of different sizes);
    the counts are then 0 and the errors NaN.
    """

    name: str
    ok: bool
    tolerance: Tolerance
    expected_shape: Optional[Index]
    actual_shape: Optional[Index]
    expected_dtype: str
    actual_dtype: str
    shape_mismatch: bool = False
    dtype_mismatch: bool = False
    size: int = 0
    mismatched: int = 0
    fraction: float = 0.0
    max_abs: float = math.nan
    max_rel: float = math.nan
    first_mismatch: Optional[Index] = None
    first_expected: Any = None
    first_actual: Any = None
    nan_mismatch: int = 0
    inf_mismatch: int = 0
    note: str = ""
    values_compared: bool = True
    missing_in_actual: bool = False
    missing_in_expected: bool = False
    structure_mismatch: bool = False

    @property
    def first_mismatch_str(self) -> str:
        return "-" if self.first_mismatch is None else _fmt_index(self.first_mismatch)

    def _header(self) -> str:
        verdict = "close" if self.ok else "NOT close"
        return f"{self.name!r}: {verdict} ({self.tolerance})"

    def _shape_line(self) -> str:
        expected = _fmt_side(self.expected_shape, self.expected_dtype)
        actual = _fmt_side(self.actual_shape, self.actual_dtype)
        if self.missing_in_actual:
            return f"missing in actual; expected: {expected}"
        if self.missing_in_expected:
            return f"missing in expected; actual: {actual}"
        if expected == actual:
            return f"shape {_fmt_shape(self.expected_shape)}, dtype {self.expected_dtype}"
        return f"expected: {expected}; actual: {actual}"

    def __str__(self) -> str:
        if self.ok:
            line = f"{self._header()}; {self._shape_line()}; max abs diff {_fmt_err(self.max_abs)}"
            return line + (f"; {self.note}" if self.note else "")
        lines = [self._header(), "  " + self._shape_line()]
        if self.values_compared:
            percent = 100.0 * self.fraction
            lines.append(f"  Mismatched elements: {self.mismatched} / {self.size} ({percent:.3g}%)")
            where = " (where both sides are finite)" if self.nan_mismatch or self.inf_mismatch else ""
            if not math.isnan(self.max_abs):
                lines.append(f"  Max absolute difference{where}: {_fmt_err(self.max_abs)}")
                lines.append(f"  Max relative difference{where}: {_fmt_err(self.max_rel)}")
            if self.first_mismatch is not None:
                lines.append(
                    f"  First mismatch at {_fmt_index(self.first_mismatch)}: "
                    f"expected {_fmt_value(self.first_expected)}, actual {_fmt_value(self.first_actual)}"
                )
            if self.nan_mismatch:
                lines.append(f"  NaN on one side only: {self.nan_mismatch} element(s)")
            if self.inf_mismatch:
                lines.append(f"  Infinity differs: {self.inf_mismatch} element(s)")
        if self.note:
            lines.append(f"  Note: {self.note}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "tolerance": self.tolerance.to_dict(),
            "expected_shape": None if self.expected_shape is None else list(self.expected_shape),
            "actual_shape": None if self.actual_shape is None else list(self.actual_shape),
            "expected_dtype": self.expected_dtype,
            "actual_dtype": self.actual_dtype,
            "shape_mismatch": self.shape_mismatch,
            "dtype_mismatch": self.dtype_mismatch,
            "size": self.size,
            "mismatched": self.mismatched,
            "fraction": self.fraction,
            "max_abs": self.max_abs,
            "max_rel": self.max_rel,
            "first_mismatch": None if self.first_mismatch is None else list(self.first_mismatch),
            "first_expected": self.first_expected,
            "first_actual": self.first_actual,
            "nan_mismatch": self.nan_mismatch,
            "inf_mismatch": self.inf_mismatch,
            "note": self.note,
            "values_compared": self.values_compared,
            "missing_in_actual": self.missing_in_actual,
            "missing_in_expected": self.missing_in_expected,
            "structure_mismatch": self.structure_mismatch,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LeafComparison":
        """Rebuild from ``to_dict()`` output, also after a JSON round trip
        (where non-finite floats are the strings "nan", "inf", "-inf")."""

        def shape(x: Any) -> Optional[Index]:
            return None if x is None else tuple(int(i) for i in x)

        def value(x: Any) -> Any:
            return float(x) if x in ("nan", "inf", "-inf") else x

        tol = d["tolerance"]
        return cls(
            name=d["name"],
            ok=bool(d["ok"]),
            tolerance=Tolerance(rtol=_float_field(tol["rtol"]), atol=_float_field(tol["atol"])),
            expected_shape=shape(d.get("expected_shape")),
            actual_shape=shape(d.get("actual_shape")),
            expected_dtype=d.get("expected_dtype", ""),
            actual_dtype=d.get("actual_dtype", ""),
            shape_mismatch=bool(d.get("shape_mismatch", False)),
            dtype_mismatch=bool(d.get("dtype_mismatch", False)),
            size=int(d.get("size", 0)),
            mismatched=int(d.get("mismatched", 0)),
            fraction=_float_field(d.get("fraction", 0.0)),
            max_abs=_float_field(d.get("max_abs")),
            max_rel=_float_field(d.get("max_rel")),
            first_mismatch=shape(d.get("first_mismatch")),
            first_expected=value(d.get("first_expected")),
            first_actual=value(d.get("first_actual")),
            nan_mismatch=int(d.get("nan_mismatch", 0)),
            inf_mismatch=int(d.get("inf_mismatch", 0)),
            note=d.get("note", ""),
            values_compared=bool(d.get("values_compared", True)),
            missing_in_actual=bool(d.get("missing_in_actual", False)),
            missing_in_expected=bool(d.get("missing_in_expected", False)),
            structure_mismatch=bool(d.get("structure_mismatch", False)),
        )


@dataclass(frozen=True)
class Comparison:
    """All leaves of one comparison, in forward (insertion) order."""

    leaves: tuple[LeafComparison, ...]
    name: str = ""
    unmatched_tolerance_keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "leaves", tuple(self.leaves))
        object.__setattr__(self, "unmatched_tolerance_keys", tuple(self.unmatched_tolerance_keys))

    @property
    def ok(self) -> bool:
        return all(leaf.ok for leaf in self.leaves)

    @property
    def failures(self) -> tuple[LeafComparison, ...]:
        return tuple(leaf for leaf in self.leaves if not leaf.ok)

    @property
    def first_failure(self) -> Optional[LeafComparison]:
        """The first failing leaf in forward order: where divergence begins."""
        return next((leaf for leaf in self.leaves if not leaf.ok), None)

    @property
    def max_abs(self) -> float:
        """Largest ``max_abs`` over the leaves; NaN when no values were compared."""
        values = [leaf.max_abs for leaf in self.leaves if not math.isnan(leaf.max_abs)]
        return max(values) if values else math.nan

    def __len__(self) -> int:
        return len(self.leaves)

    def __iter__(self) -> Iterator[LeafComparison]:
        return iter(self.leaves)

    def leaf(self, name: str) -> LeafComparison:
        for leaf in self.leaves:
            if leaf.name == name:
                return leaf
        known = ", ".join(repr(leaf.name) for leaf in self.leaves[:10])
        raise KeyError(f"no leaf named {name!r} in comparison {self.name!r}; leaves: {known}")

    def summary(self) -> str:
        """One line: verdict, counts, largest error, first divergence."""
        label = f"Comparison {self.name!r}" if self.name else "Comparison"
        n = len(self.leaves)
        if self.ok:
            line = f"{label}: all {n} leaves close; max abs diff {_fmt_err(self.max_abs)}"
        else:
            first = self.first_failure
            line = (
                f"{label}: {len(self.failures)} of {n} leaves differ; "
                f"max abs diff {_fmt_err(self.max_abs)}; first divergence: {first.name!r}"
            )
        if self.unmatched_tolerance_keys:
            keys = ", ".join(repr(k) for k in self.unmatched_tolerance_keys)
            line += f"\n  Warning: tolerance keys applied to no leaf: {keys}"
        return line

    def format(self, max_failures: int = 10) -> str:
        """The summary line and the text of the first ``max_failures`` failing leaves."""
        parts = [self.summary()]
        failures = self.failures
        parts.extend(str(leaf) for leaf in failures[:max_failures])
        if len(failures) > max_failures:
            parts.append(f"... and {len(failures) - max_failures} more failing leaves")
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.format()

    def raise_for_failure(self) -> "Comparison":
        """Raise AssertionError with the comparison text unless ok; return self."""
        if not self.ok:
            raise AssertionError(str(self))
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "max_abs": self.max_abs,
            "first_failure": None if self.first_failure is None else self.first_failure.name,
            "unmatched_tolerance_keys": list(self.unmatched_tolerance_keys),
            "leaves": [leaf.to_dict() for leaf in self.leaves],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Comparison":
        return cls(
            leaves=tuple(LeafComparison.from_dict(x) for x in d.get("leaves", ())),
            name=d.get("name", ""),
            unmatched_tolerance_keys=tuple(d.get("unmatched_tolerance_keys", ())),
        )


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
        tol, key = _resolve(self.spec, names)
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
        if e_map and a_map:
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
                return LeafComparison(name, True, requested, None, None, "None", "None", size=0,
                                      max_abs=0.0, max_rel=0.0, note="None on both sides")
            return self.structure_leaf(path, expected, actual)
        try:
            e, a = np.asarray(expected), np.asarray(actual)
        except Exception as exc:  # noqa: BLE001 - reported, never raised
            return self.structure_leaf(path, expected, actual, f"cannot convert to an array: {exc}")
        weak = type(expected) in (bool, int, float, complex) or type(actual) in (bool, int, float, complex)
        e_kind, a_kind = _kind(e.dtype), _kind(a.dtype)
        kind = _common_kind(e_kind, a_kind)
        shape_mismatch = e.shape != a.shape
        dtype_mismatch = e.dtype != a.dtype and not weak
        notes: list[str] = []
        tol = Tolerance.exact() if kind in (_EXACT, _OTHER) else requested
        if kind in (_EXACT, _OTHER) and not requested.is_exact:
            notes.append("compared exactly (integer, bool, string or object values)")
        if dtype_mismatch:
            how = {_FLOAT: "as float64", _COMPLEX: "as complex128"}.get(kind, "exactly")
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
        try:
            close, stats = _close_mask(e, a, tol, kind)
        except (TypeError, ValueError) as exc:
            notes.append(f"values could not be compared: {exc}")
            return LeafComparison(ok=False, size=int(e.size), values_compared=False,
                                  note="; ".join(notes), **base)
        mismatched = int(close.size - np.count_nonzero(close))
        max_abs, max_rel = _max_errors(stats)
        first = first_e = first_a = None
        if mismatched:
            flat = int(np.argmin(close.reshape(-1)))  # first False in C order
            first = tuple(int(i) for i in np.unravel_index(flat, close.shape))
            first_e, first_a = _scalar(e, first, kind), _scalar(a, first, kind)
        ok = mismatched == 0 and not shape_mismatch and not (dtype_mismatch and self.check_dtype)
        return LeafComparison(
            ok=ok, size=int(close.size), mismatched=mismatched,
            fraction=mismatched / close.size if close.size else 0.0,
            max_abs=max_abs, max_rel=max_rel, first_mismatch=first,
            first_expected=first_e, first_actual=first_a,
            nan_mismatch=stats["nan"] if stats and "nan" in stats else 0,
            inf_mismatch=stats["inf"] if stats and "inf" in stats else 0,
            note="; ".join(notes), **base,
        )


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
    _validate_spec(tol)
    walker = _Walker(tol, name, check_dtype)
    walker.walk(expected, actual, ())
    unmatched: tuple[str, ...] = ()
    if isinstance(tol, Mapping):
        unmatched = tuple(k for k in tol if k != "*" and k not in walker.used_keys)
    return Comparison(leaves=tuple(walker.leaves), name=name, unmatched_tolerance_keys=unmatched)
