"""What a localization found, as plain data (NumPy only, no TensorFlow).

A :class:`Localization` is attached to a forward-pass step's
``StepResult.data["localization"]`` and is read by the report's renderers; it
survives a JSON round trip (``to_dict`` / ``from_dict``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from equivtool._base.render import finished_png, log_error_axes
from equivtool._base.render import fmt_err as _fmt_err
from equivtool.comparison import LeafComparison

__all__ = ["Localization", "OpError", "LOCALIZATION_STATUSES", "as_localization"]

#: ``diverged``: an aligned op exceeds tolerance (the first one is named);
#: ``no_divergence``: every aligned op is within tolerance;
#: ``inconclusive``: nothing could be compared (the reason says why).
LOCALIZATION_STATUSES = ("diverged", "no_divergence", "inconclusive")


@dataclass(frozen=True)
class OpError:
    """One compared op: its TF1 name and type and its largest absolute error.

    ``ok``: within tolerance with something that could differ compared;
    ``inconclusive``: no output differs but nothing that could differ was compared
    (all values below atol, or only NaN/inf): never shown as a difference.
    """

    name: str
    op_type: str
    max_abs: float
    atol: float
    ok: bool
    inconclusive: bool = False

    def __post_init__(self) -> None:
        if self.ok and self.inconclusive:
            raise ValueError(f"OpError {self.name!r}: an inconclusive op cannot be ok")

    @property
    def mark(self) -> str:
        """The op's word in a report: "ok", "INCONCLUSIVE" or "DIFFERS"."""
        return "ok" if self.ok else "INCONCLUSIVE" if self.inconclusive else "DIFFERS"

    def to_dict(self) -> dict:
        return {"name": self.name, "op_type": self.op_type, "max_abs": self.max_abs,
                "atol": self.atol, "ok": self.ok, "inconclusive": self.inconclusive, "mark": self.mark}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "OpError":
        return cls(str(d["name"]), str(d["op_type"]), _float(d["max_abs"]), _float(d["atol"]), bool(d["ok"]),
                   bool(d.get("inconclusive", False)))


def _float(x: Any) -> float:
    if isinstance(x, str):
        return {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}.get(x, math.nan)
    return math.nan if x is None else float(x)


@dataclass(frozen=True)
class Localization:
    """The first op, in execution order, whose output differs between the sides.

    ``divergence`` is the comparison of that op's output (shapes, error
    statistics, first mismatching index); ``tf1_op``/``tf2_op`` and
    ``tf1_type``/``tf2_type`` name it on each side and ``tf1_source``/
    ``tf2_source`` give the line that created it. ``path`` runs from the input
    to the divergent op through the compared ops (at each op, the input with the
    largest error), with each op's largest absolute error. ``unaligned_tf1``
    and ``unaligned_tf2`` list (a few of) the ops that found no counterpart.
    """

    status: str
    reason: str = ""
    mode: str = "eager"
    compared: int = 0
    tf1_ops: int = 0
    tf2_ops: int = 0
    tf1_op: str = ""
    tf2_op: str = ""
    tf1_type: str = ""
    tf2_type: str = ""
    tf1_source: str = ""
    tf2_source: str = ""
    divergence: Optional[LeafComparison] = None
    path: tuple = ()
    unaligned_tf1: tuple = ()
    unaligned_tf2: tuple = ()
    unaligned_tf1_count: int = 0
    unaligned_tf2_count: int = 0
    seconds: float = 0.0
    notes: tuple = field(default=())
    sides: tuple = ("TF1", "TF2")  # what the report calls the two sides (exported models: OLD, NEW)
    inconclusive_ops: tuple = ()  # (a few of) the aligned ops where nothing that could differ was compared
    inconclusive_count: int = 0

    def __post_init__(self) -> None:
        if self.status not in LOCALIZATION_STATUSES:
            raise ValueError(f"Localization status must be one of {LOCALIZATION_STATUSES}, got {self.status!r}")
        if self.status == "diverged" and self.divergence is None:
            raise ValueError("a 'diverged' Localization needs the divergent op's comparison")
        if self.status == "no_divergence" and self.compared == 0:
            raise ValueError("'no_divergence' needs at least one compared op; use 'inconclusive'")
        object.__setattr__(self, "path", tuple(self.path))
        object.__setattr__(self, "unaligned_tf1", tuple(self.unaligned_tf1))
        object.__setattr__(self, "unaligned_tf2", tuple(self.unaligned_tf2))
        object.__setattr__(self, "notes", tuple(str(n) for n in self.notes))
        object.__setattr__(self, "inconclusive_ops", tuple(self.inconclusive_ops))
        if len(tuple(self.sides)) != 2 or not all(isinstance(x, str) and x for x in self.sides):
            raise ValueError(f"Localization sides must be two names, got {self.sides!r}")
        object.__setattr__(self, "sides", tuple(self.sides))

    @property
    def counted(self) -> str:
        """How many ops each side had to compare, in the sides' words."""
        if self.sides == ("TF1", "TF2"):
            return f"TF1 forward: {self.tf1_ops} ops, TF2 call: {self.tf2_ops} ops"
        return f"{self.sides[0]}: {self.tf1_ops} nodes, {self.sides[1]}: {self.tf2_ops} nodes"

    @property
    def diverged(self) -> bool:
        return self.status == "diverged"

    def summary(self) -> str:
        if self.status == "diverged":
            d = self.divergence
            types = self.tf1_type if self.tf1_type == self.tf2_type else (
                f"{self.tf1_type} ({self.sides[0]}) vs {self.tf2_type} ({self.sides[1]})")
            where = "shapes differ" if d.shape_mismatch else (
                f"max abs {_fmt_err(d.max_abs)}, first mismatch at {d.first_mismatch_str}")
            return f"first divergent op: {self.tf1_op} [{types}] ({where})"
        if self.status == "no_divergence":
            return f"no divergence: {self.compared} aligned ops within tolerance{self._inconclusive_words}"
        return f"localization inconclusive: {self.reason}"

    @property
    def _inconclusive_words(self) -> str:
        if not self.inconclusive_count:
            return ""
        return f"; {self.inconclusive_count} INCONCLUSIVE (nothing that could differ was compared)"

    def __str__(self) -> str:
        lines = [f"Localization ({self.mode}): {self.summary()}",
                 f"  compared {self.compared} ops ({self.counted})"]
        if self.status == "diverged":
            first, second = self.sides
            lines.append(f"  {first} op: {self.tf1_op} ({self.tf1_type}) created at {self.tf1_source}")
            lines.append(f"  {second} op: {self.tf2_op} ({self.tf2_type}) created at {self.tf2_source}")
            lines.extend("  " + line for line in str(self.divergence).splitlines())
            if self.path:
                lines.append("  path from the input (max abs error per op):")
                for point in self.path[-12:]:
                    lines.append(f"    {point.name} [{point.op_type}] {_fmt_err(point.max_abs)} {point.mark}")
                if len(self.path) > 12:
                    lines.append(f"    ({len(self.path) - 12} earlier ops on the path not shown)")
        elif self.status == "inconclusive" and self.reason:
            pass
        if self.unaligned_tf1_count or self.unaligned_tf2_count:
            lines.append(f"  not aligned: {self.unaligned_tf1_count} {self.sides[0]} ops, "
                         f"{self.unaligned_tf2_count} {self.sides[1]} ops")
            if self.unaligned_tf1:
                lines.append(f"    {self.sides[0]}: " + ", ".join(self.unaligned_tf1))
            if self.unaligned_tf2:
                lines.append(f"    {self.sides[1]}: " + ", ".join(self.unaligned_tf2))
        if self.inconclusive_ops:
            lines.append(f"  INCONCLUSIVE ({self.inconclusive_count} ops, only values below atol or only "
                         "NaN/inf compared): " + ", ".join(self.inconclusive_ops))
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "status": self.status, "reason": self.reason, "mode": self.mode, "compared": self.compared,
            "tf1_ops": self.tf1_ops, "tf2_ops": self.tf2_ops, "tf1_op": self.tf1_op, "tf2_op": self.tf2_op,
            "tf1_type": self.tf1_type, "tf2_type": self.tf2_type, "tf1_source": self.tf1_source,
            "tf2_source": self.tf2_source,
            "divergence": None if self.divergence is None else self.divergence.to_dict(),
            "path": [p.to_dict() for p in self.path],
            "unaligned_tf1": list(self.unaligned_tf1), "unaligned_tf2": list(self.unaligned_tf2),
            "unaligned_tf1_count": self.unaligned_tf1_count, "unaligned_tf2_count": self.unaligned_tf2_count,
            "seconds": self.seconds, "notes": list(self.notes), "sides": list(self.sides),
            "inconclusive_ops": list(self.inconclusive_ops), "inconclusive_count": self.inconclusive_count,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Localization":
        divergence = d.get("divergence")
        return cls(
            status=d["status"], reason=d.get("reason", ""), mode=d.get("mode", "eager"),
            compared=int(d.get("compared", 0)), tf1_ops=int(d.get("tf1_ops", 0)), tf2_ops=int(d.get("tf2_ops", 0)),
            tf1_op=d.get("tf1_op", ""), tf2_op=d.get("tf2_op", ""), tf1_type=d.get("tf1_type", ""),
            tf2_type=d.get("tf2_type", ""), tf1_source=d.get("tf1_source", ""),
            tf2_source=d.get("tf2_source", ""),
            divergence=None if divergence is None else LeafComparison.from_dict(divergence),
            path=tuple(OpError.from_dict(p) for p in d.get("path", ())),
            unaligned_tf1=tuple(d.get("unaligned_tf1", ())), unaligned_tf2=tuple(d.get("unaligned_tf2", ())),
            unaligned_tf1_count=int(d.get("unaligned_tf1_count", 0)),
            unaligned_tf2_count=int(d.get("unaligned_tf2_count", 0)),
            seconds=_float(d.get("seconds", 0.0)), notes=tuple(d.get("notes", ())),
            sides=tuple(d.get("sides", ("TF1", "TF2"))),
            inconclusive_ops=tuple(d.get("inconclusive_ops", ())),
            inconclusive_count=int(d.get("inconclusive_count", 0)),
        )


def as_localization(value: Any) -> Optional[Localization]:
    """A :class:`Localization` from itself or its ``to_dict`` form (a report read back from JSON)."""
    if isinstance(value, Localization):
        return value
    if isinstance(value, Mapping) and value.get("status") in LOCALIZATION_STATUSES:
        return Localization.from_dict(value)
    return None


def path_plot_png(localization: Localization, title: str = "") -> str:
    """Max abs error per op along the path from the input to the divergent op, as base64 PNG."""
    import numpy as np

    path = localization.path
    errors = np.array([p.max_abs for p in path], dtype=float)
    atol = np.array([p.atol for p in path], dtype=float)
    fig, ax, x, shown, _ = log_error_axes(errors, atol, 0.22)
    ok = np.array([p.ok for p in path], dtype=bool)
    unproven = np.array([p.inconclusive for p in path], dtype=bool)
    differs = ~ok & ~unproven
    if ok.any():
        ax.scatter(x[ok], shown[ok], color="#176f2c", s=16, zorder=3, label="within tolerance")
    if unproven.any():
        ax.scatter(x[unproven], shown[unproven], color="#777777", marker="s", s=16, zorder=3,
                   label="inconclusive")
    if differs.any():
        ax.scatter(x[differs], shown[differs], color="#b00020", marker="x", s=30, zorder=3,
                   label="exceeds tolerance")
    if len(atol) and np.all(atol == atol[0]) and atol[0] > 0:
        ax.axhline(atol[0], color="#1f5fbf", linestyle="--", linewidth=1, label=f"atol = {atol[0]:g}")
    ax.set_ylabel(f"max |{localization.sides[1]} - {localization.sides[0]}|")
    ax.set_xlabel("op on the path from the input, in execution order")
    ax.set_title(title or f"path to the first divergent op: {localization.tf1_op}", fontsize=9)
    return finished_png(fig, ax, [p.name.rsplit("/", 2)[-2] + "/" + p.name.rsplit("/", 1)[-1]
                                  if p.name.count("/") >= 2 else p.name for p in path])


# --------------------------------------------------------------------------
# Rendering helpers for the report (text hint, HTML section)
# --------------------------------------------------------------------------

#: The steps that compare forward outputs, which ``localize=True`` localizes.
LOCALIZABLE_STEPS = ("fixed_weights", "random/", "checkpoint")

RERUN_HINT = ("to find the first op whose output differs, re-run this step localized: "
              "check_equivalence(..., steps=[{step!r}], localize=True) or "
              "`equivtool check ... --steps {step} --localize`")


def is_localizable(step_name: str) -> bool:
    return any(step_name == s or (s.endswith("/") and step_name.startswith(s)) for s in LOCALIZABLE_STEPS)


def rerun_hint(step_name: str, status: str, data: Mapping) -> Optional[str]:
    """For a failed forward-pass step run without localization: how to localize it."""
    if status != "failed" or not is_localizable(step_name) or "localization" in data:
        return None
    step = step_name.split("/", 1)[0]
    return RERUN_HINT.format(step=step)


def hidden_divergence(steps) -> str:
    """``"<node> (step <name>)"`` for the first passing step whose localization
    found an intermediate beyond tolerance ("" when none): the verdict line says
    so, since the outputs alone passed."""
    for step in steps:
        found = as_localization(step.data.get("localization"))
        if step.status == "passed" and found is not None and found.diverged:
            return f"{found.tf1_op} (step {step.name})"
    return ""


def strict_intermediates(step):
    """``step`` failed when it passed at the outputs but its localization found an
    intermediate beyond tolerance (``strict_intermediates=True``); else unchanged."""
    import dataclasses
    found = as_localization(step.data.get("localization"))
    if step.status != "passed" or found is None or not found.diverged:
        return step
    return dataclasses.replace(step, status="failed", message=(
        f"the outputs agree, but an intermediate differs beyond tolerance: {found.summary()} "
        "(strict_intermediates)"))


def localization_html(localization: Localization, escape, plot_png: Optional[str]) -> str:
    """The report's section for one step's localization (``escape`` is html.escape)."""
    e = escape
    parts = [f"<h3>Localization ({e(localization.mode)})</h3><p>{e(localization.summary())}</p>",
             f"<p>compared {localization.compared} ops ({e(localization.counted)})</p>"]
    if localization.diverged:
        d = localization.divergence
        rows = [("", *localization.sides),
                ("op", localization.tf1_op, localization.tf2_op),
                ("type", localization.tf1_type, localization.tf2_type),
                ("shape", d.expected_shape, d.actual_shape),
                ("dtype", d.expected_dtype, d.actual_dtype),
                ("created at", localization.tf1_source, localization.tf2_source),
                ("first mismatch", f"{d.first_mismatch_str}: {d.first_expected!r}", repr(d.first_actual))]
        parts.append("<table>" + "".join(
            f"<tr><th>{e(a)}</th><td><code>{e(b)}</code></td><td><code>{e(c)}</code></td></tr>"
            for a, b, c in rows) + "</table>")
        parts.append(f"<pre>{e(str(d))}</pre>")
        if plot_png:
            parts.append(f'<img alt="max abs error per op on the path to {e(localization.tf1_op)}" '
                         f'src="data:image/png;base64,{plot_png}">')
    if localization.unaligned_tf1_count or localization.unaligned_tf2_count:
        first, second = (e(x) for x in localization.sides)
        parts.append(f"<p>not aligned: {localization.unaligned_tf1_count} {first} ops, "
                     f"{localization.unaligned_tf2_count} {second} ops</p>")
        if localization.unaligned_tf1:
            parts.append(f"<p>{first}: <code>" + e(", ".join(localization.unaligned_tf1)) + "</code></p>")
        if localization.unaligned_tf2:
            parts.append(f"<p>{second}: <code>" + e(", ".join(localization.unaligned_tf2)) + "</code></p>")
    if localization.inconclusive_ops:
        parts.append(f"<p>INCONCLUSIVE ({localization.inconclusive_count} ops, only values below atol or only "
                     "NaN/inf compared): <code>" + e(", ".join(localization.inconclusive_ops)) + "</code></p>")
    if localization.notes:
        parts.append("<ul>" + "".join(f"<li>{e(n)}</li>" for n in localization.notes) + "</ul>")
    return "".join(parts)
