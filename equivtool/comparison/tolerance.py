"""Tolerances and the element-wise arithmetic of :mod:`equivtool.comparison` (NumPy only).

:class:`Tolerance`, the per-leaf tolerance spec and its resolution, and the
closeness mask with the statistics the results need. The rules are stated
once, in :mod:`equivtool.comparison`'s docstring.
"""

from __future__ import annotations

import fnmatch
import math
import numbers
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

__all__ = ["Tolerance", "ToleranceSpec", "resolve_tolerance", "tolerance_spec"]

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
    ``allow_nonfinite=True`` is for leaves that are legitimately non-finite
    (a ``-inf`` mask): NaN/inf elements matching at the same places then count
    as compared, so a leaf holding only those passes instead of being
    inconclusive.
    """

    rtol: float = 1e-6
    atol: float = 1e-5
    allow_nonfinite: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "rtol", _check_tolerance_value("rtol", self.rtol))
        object.__setattr__(self, "atol", _check_tolerance_value("atol", self.atol))
        if not isinstance(self.allow_nonfinite, bool):
            raise TypeError(f"Tolerance allow_nonfinite must be True or False, got {self.allow_nonfinite!r}.")

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
        kind = common_kind(value_kind(e.dtype), value_kind(a.dtype))
        close, _ = close_mask(e, a, self, kind)
        return close

    def to_dict(self) -> dict[str, Any]:
        return {"rtol": self.rtol, "atol": self.atol, "allow_nonfinite": self.allow_nonfinite}

    def __str__(self) -> str:
        text = "exact" if self.is_exact else f"rtol={self.rtol:g}, atol={self.atol:g}"
        return text + (", non-finite allowed" if self.allow_nonfinite else "")


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


def unmatched_keys(spec: ToleranceSpec, names: Sequence[str]) -> list:
    """The keys of a tolerance mapping (``"*"`` aside) that would give no leaf
    among ``names`` a tolerance (as :func:`resolve_tolerance` matches them):
    checked before a run, a typo'd key is found before any work."""
    if not isinstance(spec, Mapping):
        return []
    return [key for key in spec if key != "*" and not any(_key_matches(key, n) is not None for n in names)]


def resolve_with_key(spec: ToleranceSpec, names: Sequence[str]) -> tuple[Tolerance, Optional[str]]:
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


def validate_spec(spec: ToleranceSpec) -> None:
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
    validate_spec(spec)
    return resolve_with_key(spec, (leaf_name, *aliases))[0]


# ---------------------------------------------------------------------------
# Element-wise arithmetic
# ---------------------------------------------------------------------------

FLOAT, COMPLEX, EXACT, OTHER = "float", "complex", "exact", "other"


def value_kind(dtype: np.dtype) -> str:
    if dtype.kind == "f":
        return FLOAT
    if dtype.kind == "c":
        return COMPLEX
    if dtype.kind in "biuUSMm":
        return EXACT
    if dtype.kind == "V" and dtype.fields is None:
        try:  # bfloat16, float8_*, int4 ... come from ml_dtypes (no TensorFlow needed)
            import ml_dtypes
        except ImportError:  # pragma: no cover - ml_dtypes ships with numpy-based TF stacks
            return OTHER
        try:
            ml_dtypes.finfo(dtype)
            return FLOAT
        except (ValueError, TypeError):
            pass
        try:
            ml_dtypes.iinfo(dtype)
            return EXACT
        except (ValueError, TypeError):
            pass
    return OTHER


def common_kind(k1: str, k2: str) -> str:
    if k1 == k2:
        return k1
    if OTHER in (k1, k2):
        return OTHER
    if COMPLEX in (k1, k2):
        return COMPLEX
    return FLOAT  # exact against float: compare numerically after promotion


def _as_number_array(x: np.ndarray, kind: str) -> np.ndarray:
    if kind == COMPLEX:
        return x.astype(np.complex128, copy=False)
    return x.astype(np.float64, copy=False)


def _integer_diff(e: np.ndarray, a: np.ndarray) -> np.ndarray:
    """``|a - e|`` of two integer arrays, as float64, nonzero wherever they differ:
    float64 holds 53 bits, so converting first would make 2**62 and 2**62 + 1
    equal and report a difference of 0 for a mismatch. The difference is taken
    in uint64 (modulo 2**64 it is exact, as |a - e| < 2**64 for 64-bit values)."""
    e, a = np.broadcast_arrays(e, a)
    signed = e.dtype.kind == "i" or a.dtype.kind == "i"
    if signed and (e.dtype == np.uint64 or a.dtype == np.uint64):  # no common 64-bit type: Python ints
        return np.abs(a.astype(object) - e.astype(object)).astype(np.float64)
    common = np.int64 if signed else np.uint64
    high, low = np.maximum(e.astype(common), a.astype(common)), np.minimum(e.astype(common), a.astype(common))
    return (high.astype(np.uint64) - low.astype(np.uint64)).astype(np.float64)


def close_mask(e: np.ndarray, a: np.ndarray, tol: Tolerance, kind: str) -> tuple[np.ndarray, Optional[dict]]:
    """The closeness mask and, for numbers, what the error statistics need:
    ``diff`` (|a - e|), ``abs_e`` (|e|), ``finite`` (None when all positions
    are finite on both sides), ``nan`` and ``inf`` mismatch counts."""
    if kind in (EXACT, OTHER):
        close = np.asarray(e == a, dtype=bool)
        if close.shape != np.broadcast_shapes(e.shape, a.shape):
            raise TypeError("the values cannot be compared element by element")
        if kind == OTHER or e.dtype.kind in "USMm" or a.dtype.kind in "USMm":
            return close, None
        e64, a64 = e.astype(np.float64), a.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = _integer_diff(e, a) if e.dtype.kind in "iu" and a.dtype.kind in "iu" else np.abs(a64 - e64)
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


def max_errors(stats: Optional[dict]) -> tuple[float, float]:
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


def count_compared(close: np.ndarray, stats: Optional[dict], tol: Tolerance) -> int:
    """How many element pairs were compared: finite on both sides (matching
    non-finite ones too under ``allow_nonfinite``); all of them for exact kinds."""
    finite = None if stats is None else stats["finite"]
    if finite is None:
        return int(close.size)
    count = int(np.count_nonzero(finite))
    if tol.allow_nonfinite:
        count += int(np.count_nonzero(close & ~finite))
    return count


def why_nothing_compared(e: np.ndarray) -> str:
    """Why a leaf that agreed compared nothing."""
    if e.size == 0:
        return f"zero-size (shape {tuple(e.shape)}), no element to compare"
    numbers = e.astype(np.complex128 if e.dtype.kind == "c" else np.float64)
    nans = int(np.count_nonzero(np.isnan(numbers)))
    return f"all {e.size} elements non-finite on both sides ({nans} NaN, {e.size - nans} inf)"



def scalar_at(x: np.ndarray, index: Index, kind: str) -> Any:
    value = x[index]
    if kind == FLOAT and x.dtype.kind == "V":
        return float(value)
    item = value.item() if hasattr(value, "item") else value
    if isinstance(item, bytes):
        return item.decode("utf-8", "replace")
    if isinstance(item, (bool, int, float, complex, str)) or item is None:
        return item
    return str(item)


# Tolerances as a command line gives them: `--atol [OUTPUT:]VALUE`, `--rtol [OUTPUT:]VALUE`, each repeatable
# (`equivtool check`, `equivtool compare` and compare_models' atol=/rtol=).

def tolerance_spec(atol, rtol) -> dict:
    """``--atol [OUT:]V`` / ``--rtol [OUT:]V`` (floats, lists of strings or mappings) ->
    a tolerance spec: output name or pattern -> Tolerance, ``"*"`` the default (the
    guide's, where no ``*`` value is given). A value that is not a finite number >= 0
    is a ``ValueError`` naming the argument."""
    def collect(value, argument):
        if value is None:
            return {}
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = {"*": value}
        elif isinstance(value, str):
            value = [value]
        if isinstance(value, Mapping):
            items = [(str(k), v) for k, v in value.items()]
        else:
            items = []
            for text in value:
                name, _, number = str(text).rpartition(":")
                items.append((name or "*", number))
        result = {}
        for name, text in items:
            where = name + ":" if name != "*" else ""
            try:
                number = float(text)
            except (TypeError, ValueError):
                raise ValueError(f"{argument}: not a number: {str(text)!r}" + (f" (in {where}{text})" if where
                                 else "") + "; expected [OUTPUT:]VALUE with VALUE a finite number >= 0") from None
            if not np.isfinite(number) or number < 0:
                raise ValueError(f"{argument}: expected [OUTPUT:]VALUE with VALUE a finite number >= 0, "
                                 f"got {where}{number}")
            result[name] = number
        return result

    atols, rtols = collect(atol, "--atol"), collect(rtol, "--rtol")
    default = Tolerance(rtol=rtols.get("*", Tolerance().rtol), atol=atols.get("*", Tolerance().atol))
    spec = {name: Tolerance(rtol=rtols.get(name, default.rtol), atol=atols.get(name, default.atol))
            for name in (set(atols) | set(rtols)) - {"*"}}
    spec["*"] = default
    return spec
