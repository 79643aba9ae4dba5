"""The results of :func:`equivtool.comparison.compare`: :class:`LeafComparison` and
:class:`Comparison`, with their text and JSON forms (NumPy only)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional

from equivtool.comparison._advice import ToleranceAdvice
from equivtool.comparison.tolerance import Index, Tolerance
from equivtool._base.render import fmt_err

__all__ = ["LeafComparison", "Comparison"]

_NONFINITE_HINT = ("no finite value was compared; if this output is legitimately non-finite "
                   "(a -inf mask), give it Tolerance(allow_nonfinite=True)")


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
    the counts are then 0 and the errors NaN. ``compared`` counts the element
    pairs actually compared (finite on both sides, plus matching non-finite
    ones under ``Tolerance(allow_nonfinite=True)``). ``inconclusive_reason``
    is set, and ``ok`` False, when the leaf agreed but nothing that could
    differ was compared; ``status`` is "passed", "failed" or "inconclusive".
    ``below_atol`` is True for a passing floating-point leaf whose every
    value on both sides is smaller than ``atol`` in magnitude: within such a
    tolerance it could not have shown a difference (a step made only of such
    leaves is inconclusive, see :meth:`StepResult.from_comparisons`).
    ``advice`` (a leaf whose floating-point values differ) says what would
    have passed: the smallest ``atol`` (``rtol`` unchanged) and ``rtol``
    (``atol`` unchanged), error quantiles and the largest distance in ULPs.
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
    compared: int = 0
    inconclusive_reason: str = ""
    advice: Optional[ToleranceAdvice] = None
    below_atol: bool = False

    def __post_init__(self) -> None:
        if self.inconclusive_reason and self.ok:
            raise ValueError(f"LeafComparison {self.name!r}: an inconclusive leaf cannot be ok.")

    @property
    def status(self) -> str:
        """ "passed", "failed" or "inconclusive" (nothing that could differ was compared)."""
        if self.inconclusive_reason:
            return "inconclusive"
        return "passed" if self.ok else "failed"

    @property
    def inconclusive(self) -> bool:
        return bool(self.inconclusive_reason)

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    @property
    def first_mismatch_str(self) -> str:
        return "-" if self.first_mismatch is None else _fmt_index(self.first_mismatch)

    def _header(self) -> str:
        verdict = {"passed": "close", "failed": "NOT close", "inconclusive": "INCONCLUSIVE"}[self.status]
        return f"{self.name!r}: {verdict} ({self.tolerance})"

    @property
    def compared_str(self) -> str:
        """How many element pairs were compared, e.g. "6 / 8 compared" ("-" when none could be)."""
        return f"{self.compared} / {self.size} compared" if self.values_compared else "-"

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
            line = (f"{self._header()}; {self._shape_line()}; {self.compared_str}; "
                    f"max abs diff {fmt_err(self.max_abs)}")
            return line + (f"; {self.note}" if self.note else "")
        lines = [self._header(), "  " + self._shape_line()]
        if self.inconclusive:
            lines.append(f"  Nothing compared: {self.inconclusive_reason}")
            if "non-finite" in self.inconclusive_reason:
                lines.append(f"  ({_NONFINITE_HINT})")
        elif self.values_compared:
            lines.append(f"  Compared (finite on both sides): {self.compared} / {self.size}")
            percent = 100.0 * self.fraction
            lines.append(f"  Mismatched elements: {self.mismatched} / {self.size} ({percent:.3g}%)")
            where = " (where both sides are finite)" if self.nan_mismatch or self.inf_mismatch else ""
            if not math.isnan(self.max_abs):
                lines.append(f"  Max absolute difference{where}: {fmt_err(self.max_abs)}")
                lines.append(f"  Max relative difference{where}: {fmt_err(self.max_rel)}")
            if self.first_mismatch is not None:
                lines.append(
                    f"  First mismatch at {_fmt_index(self.first_mismatch)}: "
                    f"expected {_fmt_value(self.first_expected)}, actual {_fmt_value(self.first_actual)}"
                )
            if self.nan_mismatch:
                lines.append(f"  NaN on one side only: {self.nan_mismatch} element(s)")
            if self.inf_mismatch:
                lines.append(f"  Infinity differs: {self.inf_mismatch} element(s)")
            lines.extend("  " + line for line in self.advice_lines())
        if self.note:
            lines.append(f"  Note: {self.note}")
        return "\n".join(lines)

    def advice_lines(self) -> list[str]:
        """The tolerance advice as text lines (none without advice)."""
        adv = self.advice
        if adv is None:
            return []
        if math.isinf(adv.needed_atol) and math.isinf(adv.needed_rtol):
            lines = ["No tolerance passes it: "
                     + ("NaN or infinity on one side only" if self.nan_mismatch or self.inf_mismatch
                        else "expected is 0 where values differ, and no atol reaches them")]
        else:
            rtol_text = "no rtol" if math.isinf(adv.needed_rtol) else f"rtol >= {adv.needed_rtol:.3g}"
            lines = [f"Would pass with atol >= {adv.needed_atol:.3g} (rtol {self.tolerance.rtol:g} unchanged) "
                     f"or {rtol_text} (atol {self.tolerance.atol:g} unchanged)"]
        if self.shape_mismatch or (self.dtype_mismatch and not self.ok):
            lines[0] += "; the shapes or dtypes must match too"
        ulp = "" if math.isnan(adv.max_ulp) else f"; largest distance {adv.max_ulp:.0f} ULP ({adv.ulp_dtype})"
        lines.append(f"|actual - expected| where finite: median {fmt_err(adv.median)}, "
                     f"p99 {fmt_err(adv.p99)}, max {fmt_err(adv.max)}{ulp}")
        return lines

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
            "status": self.status,
            "compared": self.compared,
            "inconclusive_reason": self.inconclusive_reason,
            "below_atol": self.below_atol,
            "advice": None if self.advice is None else self.advice.to_dict(),
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
            tolerance=Tolerance(rtol=_float_field(tol["rtol"]), atol=_float_field(tol["atol"]),
                                allow_nonfinite=bool(tol.get("allow_nonfinite", False))),
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
            compared=int(d.get("compared", d.get("size", 0) if d.get("values_compared", True) else 0)),
            inconclusive_reason=d.get("inconclusive_reason", ""),
            below_atol=bool(d.get("below_atol", False)),
            advice=None if not d.get("advice") else ToleranceAdvice.from_dict(d["advice"]),
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
    def status(self) -> str:
        """ "failed" if a leaf failed; else "inconclusive" if a leaf was (or there is no leaf); else "passed"."""
        if any(leaf.failed for leaf in self.leaves):
            return "failed"
        if not self.leaves or any(leaf.inconclusive for leaf in self.leaves):
            return "inconclusive"
        return "passed"

    @property
    def ok(self) -> bool:
        """Passed: every leaf compared something and agreed."""
        return self.status == "passed"

    @property
    def failures(self) -> tuple[LeafComparison, ...]:
        """The failed leaves (inconclusive ones are in :attr:`inconclusive_leaves`)."""
        return tuple(leaf for leaf in self.leaves if leaf.failed)

    @property
    def inconclusive_leaves(self) -> tuple[LeafComparison, ...]:
        return tuple(leaf for leaf in self.leaves if leaf.inconclusive)

    @property
    def first_failure(self) -> Optional[LeafComparison]:
        """The first failing leaf in forward order: where divergence begins."""
        return next((leaf for leaf in self.leaves if leaf.failed), None)

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
        status = self.status
        if status == "passed":
            line = f"{label}: all {n} leaves close; max abs diff {fmt_err(self.max_abs)}"
        elif status == "inconclusive":
            pending = self.inconclusive_leaves
            if not pending:
                line = f"{label}: INCONCLUSIVE, no leaf to compare"
            else:
                line = (f"{label}: INCONCLUSIVE, {pending[0].name!r}: {pending[0].inconclusive_reason}; "
                        f"{len(pending)} of {n} leaves compared nothing")
        else:
            first = self.first_failure
            line = (
                f"{label}: {len(self.failures)} of {n} leaves differ; "
                f"max abs diff {fmt_err(self.max_abs)}; first divergence: {first.name!r}"
            )
        if self.unmatched_tolerance_keys:
            keys = ", ".join(repr(k) for k in self.unmatched_tolerance_keys)
            line += f"\n  Warning: tolerance keys applied to no leaf: {keys}"
        return line

    def format(self, max_failures: int = 10) -> str:
        """The summary line and the text of the first ``max_failures`` failing leaves."""
        parts = [self.summary()]
        for kind, leaves in (("failing", self.failures), ("inconclusive", self.inconclusive_leaves)):
            parts.extend(str(leaf) for leaf in leaves[:max_failures])
            if len(leaves) > max_failures:
                parts.append(f"... and {len(leaves) - max_failures} more {kind} leaves")
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.format()

    def raise_for_failure(self) -> "Comparison":
        """Raise AssertionError with the comparison text unless passed (failed or inconclusive); return self."""
        if not self.ok:
            raise AssertionError(str(self))
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "status": self.status,
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
