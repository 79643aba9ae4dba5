"""Tolerance that explains itself: for a leaf whose values differ, what would have passed.

NumPy only. For the element pairs that are finite on both sides:

* the smallest ``atol`` that passes with the leaf's ``rtol`` unchanged, and the
  smallest ``rtol`` that passes with its ``atol`` unchanged (each checked
  against the same closeness rule ``compare`` applies, so using it passes);
* quantiles of ``|actual - expected|``: median, 99th percentile, max;
* the largest distance in units in the last place of the expected side's
  floating-point type (ULP: how many representable values lie between them).

A NaN or infinity on one side only cannot be passed by any tolerance: the
needed values are then ``inf``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import numpy as np

__all__ = ["ToleranceAdvice", "tolerance_advice", "ulp_distance"]

_INT_OF_SIZE = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


@dataclass(frozen=True)
class ToleranceAdvice:
    """What a failing leaf would have needed; see the module docstring."""

    needed_atol: float
    needed_rtol: float
    median: float
    p99: float
    max: float
    max_ulp: float = math.nan
    ulp_dtype: str = ""

    def __str__(self) -> str:
        ulp = "" if math.isnan(self.max_ulp) else f", {self.max_ulp:.0f} ULP ({self.ulp_dtype})"
        return (f"passes with atol >= {self.needed_atol:.3g} or rtol >= {self.needed_rtol:.3g}; "
                f"|error| median {self.median:.3g}, p99 {self.p99:.3g}, max {self.max:.3g}{ulp}")

    def to_dict(self) -> dict[str, Any]:
        return {"needed_atol": self.needed_atol, "needed_rtol": self.needed_rtol, "median": self.median,
                "p99": self.p99, "max": self.max, "max_ulp": self.max_ulp, "ulp_dtype": self.ulp_dtype}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ToleranceAdvice":
        def f(x: Any) -> float:
            return math.nan if x is None else float(x)
        return cls(f(d.get("needed_atol")), f(d.get("needed_rtol")), f(d.get("median")), f(d.get("p99")),
                   f(d.get("max")), f(d.get("max_ulp")), str(d.get("ulp_dtype", "")))


def _smallest_passing(base: float, passes) -> float:
    """Nudge ``base`` up until ``passes(value)``: guards the last bit of float64 rounding."""
    value = max(float(base), 0.0)
    step = max(value, 1e-300) * 2.0 ** -52
    for _ in range(64):
        if passes(value):
            return value
        value += step
        step *= 2.0
    return math.inf  # pragma: no cover - only for pathological inputs


def ulp_distance(expected: np.ndarray, actual: np.ndarray) -> Optional[np.ndarray]:
    """Element-wise distance in ULPs of ``expected``'s floating-point type (float64 counts),
    or None for non-float or complex types. Both are cast to that type first."""
    dtype = expected.dtype
    is_float = dtype.kind == "f" or (dtype.kind == "V" and dtype.fields is None and _ml_float(dtype))
    if not is_float or dtype.itemsize not in _INT_OF_SIZE:
        return None
    int_type = _INT_OF_SIZE[dtype.itemsize]
    lowest = np.iinfo(int_type).min

    def ordered(x: np.ndarray) -> np.ndarray:
        bits = np.ascontiguousarray(x.astype(dtype)).view(int_type).astype(np.int64)
        # negative floats have the sign bit set: mirror them so the integers are monotone
        return np.where(bits < 0, np.int64(lowest) - bits, bits)

    oa, oe = ordered(actual), ordered(expected)
    same_sign = (oa >= 0) == (oe >= 0)
    # the same sign: an exact int64 difference; opposite signs: a sum of magnitudes, which
    # could overflow int64 and is only ever huge, so float64 carries it
    exact = np.abs(np.where(same_sign, oa - np.where(same_sign, oe, 0), 0)).astype(np.float64)
    across = np.abs(oa.astype(np.float64)) + np.abs(oe.astype(np.float64))
    return np.where(same_sign, exact, across)


def _ml_float(dtype: np.dtype) -> bool:
    try:
        import ml_dtypes
        ml_dtypes.finfo(dtype)
        return True
    except (ImportError, ValueError, TypeError):
        return False


def tolerance_advice(e: np.ndarray, a: np.ndarray, diff: np.ndarray, abs_e: np.ndarray,
                     finite: Optional[np.ndarray], rtol: float, atol: float,
                     nonfinite_mismatches: int) -> Optional[ToleranceAdvice]:
    """The advice for one leaf (``diff = |a - e|``, ``abs_e = |e|`` in float64 or complex128
    magnitudes; ``finite`` the positions finite on both sides, None for all); None when no
    finite pair exists."""
    if finite is not None:
        diff, abs_e = diff[finite], abs_e[finite]
        e_f, a_f = e[finite], a[finite]
    else:
        diff, abs_e = diff.reshape(-1), abs_e.reshape(-1)
        e_f, a_f = e.reshape(-1), a.reshape(-1)
    if diff.size == 0:
        return None
    median, p99, largest = (float(q) for q in np.quantile(diff, [0.5, 0.99, 1.0]))
    if nonfinite_mismatches:
        needed_atol = needed_rtol = math.inf
    else:
        needed_atol = _smallest_passing(float(np.max(diff - rtol * abs_e)),
                                        lambda t: bool(np.all(diff <= t + rtol * abs_e)))
        over = diff > atol
        if not over.any():
            needed_rtol = 0.0
        elif np.any(over & (abs_e == 0)):
            needed_rtol = math.inf  # expected is 0 there: no relative tolerance reaches it
        else:
            base = float(np.max((diff[over] - atol) / abs_e[over]))
            needed_rtol = _smallest_passing(base, lambda r: bool(np.all(diff <= atol + r * abs_e)))
    ulps = ulp_distance(np.asarray(e_f), np.asarray(a_f))
    max_ulp = float(ulps.max()) if ulps is not None and ulps.size else math.nan
    return ToleranceAdvice(needed_atol, needed_rtol, median, p99, largest, max_ulp,
                           str(e.dtype) if ulps is not None else "")
