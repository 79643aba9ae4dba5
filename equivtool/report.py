"""The equivalence report: one object, three renderers (text, JSON, HTML).

A :class:`StepResult` is what one workflow step ("variables_once", "parity",
"fixed_weights", ...) found; an :class:`EquivalenceReport` is the run. ``str``
gives a fixed-width table to read at a glance, a verdict line and the failing
steps' details; ``to_json`` gives strict JSON (non-finite floats become the
strings "nan", "inf", "-inf"); ``to_html`` writes one self-contained file with
a per-leaf error plot for every step that compared several leaves.

NumPy only: matplotlib is imported inside ``to_html`` (``pip install
'equivtool[report]'``), and TensorFlow never.
"""

from __future__ import annotations

import json
import math
import os
import textwrap
import traceback as _traceback
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from equivtool._base import render as _render
from equivtool._base.render import STATUS_TEXT as _STATUS_TEXT
from equivtool._base.render import escape as _e
from equivtool._base.render import fmt_err as _fmt_err
from equivtool._base.render import json_safe as _json_safe
from equivtool._base.render import shorten as _shorten
from equivtool.comparison import Comparison, LeafComparison
from equivtool.coverage import Coverage
from equivtool.localize import result as _localize

__all__ = ["StepResult", "EquivalenceReport", "STATUSES"]

STATUSES = ("passed", "failed", "inconclusive", "error", "skipped")
_MESSAGE_WIDTH = 72
_UNMATCHED = "unmatched_tolerance_keys"  # meta: tolerance keys that matched no leaf (see check_equivalence)


def _frozen_mapping(data: Optional[Mapping]) -> Mapping:
    return MappingProxyType(dict(data or {}))


# ---------------------------------------------------------------------------
# StepResult
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StepResult:
    """What one step of the equivalence workflow found.

    ``status`` is one of "passed", "failed", "inconclusive" (nothing that
    could differ was compared: see :mod:`equivtool.comparison`), "error",
    "skipped"; ``message`` says why it failed, was inconclusive, skipped or
    errored; ``data`` holds step-specific extras (JSON-serialisable; kept
    read-only).
    """

    name: str
    title: str
    status: str
    seconds: float
    comparisons: tuple[Comparison, ...] = ()
    message: str = ""
    notes: tuple[str, ...] = ()
    data: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"StepResult name must be a non-empty str, got {self.name!r}.")
        if self.status not in STATUSES:
            raise ValueError(
                f"StepResult {self.name!r}: status must be one of {', '.join(STATUSES)}; got {self.status!r}."
            )
        seconds = float(self.seconds)
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"StepResult {self.name!r}: seconds must be finite and >= 0, got {self.seconds!r}.")
        comparisons = tuple(self.comparisons)
        for c in comparisons:
            if not isinstance(c, Comparison):
                raise TypeError(
                    f"StepResult {self.name!r}: comparisons must be Comparison objects, got {type(c).__name__}."
                )
        notes = (self.notes,) if isinstance(self.notes, str) else tuple(str(n) for n in self.notes)
        object.__setattr__(self, "seconds", seconds)
        object.__setattr__(self, "comparisons", comparisons)
        object.__setattr__(self, "notes", notes)
        object.__setattr__(self, "message", str(self.message))
        object.__setattr__(self, "data", _frozen_mapping(self.data))

    # -- building --------------------------------------------------------

    @classmethod
    def from_comparisons(
        cls,
        name: str,
        title: str,
        comparisons: Union[Comparison, Iterable[Comparison]],
        *,
        seconds: float = 0.0,
        message: str = "",
        notes: Sequence[str] = (),
        data: Optional[Mapping[str, Any]] = None,
    ) -> "StepResult":
        """A step judged by the leaves of its comparisons.

        "failed" when a leaf failed; else "inconclusive" when a leaf compared
        nothing that could differ (zero-size, or non-finite at the same
        places on both sides), even if other leaves passed, or when there is
        no leaf at all ("nothing to compare": a vacuous pass would hide a step
        that looked at nothing); else "passed". Without ``message``, the
        message names the failing leaves (missing and extra keys, shapes and
        dtypes first) or says why the step is inconclusive.
        """
        comparisons = (comparisons,) if isinstance(comparisons, Comparison) else tuple(comparisons)
        leaves = [leaf for c in comparisons for leaf in c.leaves]
        failures = [leaf for leaf in leaves if leaf.failed]
        pending = [leaf for leaf in leaves if leaf.inconclusive]
        if failures:
            status, default = "failed", _failure_message(failures, len(leaves))
        elif pending or not leaves:
            status, default = "inconclusive", _inconclusive_message(pending, len(leaves))
        elif all(leaf.below_atol for leaf in leaves):
            status, default = "inconclusive", _below_atol_message(leaves)
        else:
            status, default = "passed", ""
        below = sum(leaf.below_atol for leaf in leaves)
        if below:
            data = {**(data or {}), "below_atol_leaves": below}
        return cls(name, title, status, seconds, comparisons, message or default, tuple(notes), data or {})

    @classmethod
    def from_exception(
        cls,
        name: str,
        title: str,
        exc: BaseException,
        *,
        seconds: float = 0.0,
        notes: Sequence[str] = (),
        data: Optional[Mapping[str, Any]] = None,
    ) -> "StepResult":
        """An "error" step; the traceback goes to ``data["traceback"]``."""
        tb = "".join(_traceback.format_exception(type(exc), exc, exc.__traceback__))
        extras = {**(data or {}), "traceback": tb}
        return cls(name, title, "error", seconds, (), f"{type(exc).__name__}: {exc}", tuple(notes), extras)

    @classmethod
    def skipped(cls, name: str, title: str, reason: str, *, notes: Sequence[str] = ()) -> "StepResult":
        return cls(name, title, "skipped", 0.0, (), reason, tuple(notes))

    # -- reading ---------------------------------------------------------

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def failed(self) -> bool:
        """True for "failed" and "error"."""
        return self.status in ("failed", "error")

    @property
    def inconclusive(self) -> bool:
        return self.status == "inconclusive"

    def error_cell(self) -> str:
        """The table's "max abs err": over the leaves that failed on values when the
        step failed ("-" when it failed on structure, shapes or dtypes only), over
        the leaves that compared something otherwise."""
        if self.status == "failed":
            leaves = [leaf for leaf in self.leaves if leaf.failed and _value_failure(leaf)]
            if any(leaf.nan_mismatch or leaf.inf_mismatch for leaf in leaves):
                return "non-finite"
        else:
            leaves = [leaf for leaf in self.leaves if leaf.compared]
        values = [leaf.max_abs for leaf in leaves if not math.isnan(leaf.max_abs)]
        return _fmt_err(max(values)) if values else "-"

    @property
    def first_failure(self) -> Optional[LeafComparison]:
        for c in self.comparisons:
            first = c.first_failure
            if first is not None:
                return first
        return None

    @property
    def first_divergence(self) -> Optional[str]:
        """Name of the first failing leaf over the comparisons, in order."""
        first = self.first_failure
        return None if first is None else first.name

    @property
    def leaves(self) -> tuple[LeafComparison, ...]:
        return tuple(leaf for c in self.comparisons for leaf in c.leaves)

    @property
    def max_abs(self) -> float:
        values = [c.max_abs for c in self.comparisons if not math.isnan(c.max_abs)]
        return max(values) if values else math.nan

    def summary_text(self) -> str:
        """The table's last column: the first divergence and the message; just
        the message when it names the first divergence (missing: ..., shape: ...),
        just the first divergence when the message only points at it."""
        first = self.first_divergence
        if first is None or self.message.endswith(f"first divergence: {first}"):
            return first or self.message
        if first in self.message:
            return self.message
        return " | ".join(x for x in (first, self.message) if x)

    def details(self, max_failures: int = 10) -> str:
        """The full text of this step: header, message, notes, comparisons."""
        lines = [f"== {self.name}: {self.title} ({_STATUS_TEXT[self.status]}, {self.seconds:.2f}s) =="]
        if self.message:
            lines.append(self.message)
        lines.extend(f"note: {n}" for n in self.notes)
        localization = _localize.as_localization(self.data.get("localization"))
        if localization is not None:
            lines.append(str(localization))
        hint = _localize.rerun_hint(self.name, self.status, self.data)
        if hint:
            lines.append(f"hint: {hint}")
        for c in self.comparisons:
            lines.append(c.format(max_failures=max_failures) if not c.ok else c.summary())
        if self.status == "inconclusive" and self.comparisons:
            lines.append("note: an inconclusive step compared nothing that could differ in at least one leaf; "
                         "it does not count as passed")
        tb = self.data.get("traceback")
        if self.status == "error" and tb:
            lines.append(str(tb).rstrip())
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.details()

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "status": self.status,
            "seconds": self.seconds,
            "max_abs": self.max_abs,
            "first_divergence": self.first_divergence,
            "message": self.message,
            "notes": list(self.notes),
            "data": dict(self.data),
            "comparisons": [c.to_dict() for c in self.comparisons],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "StepResult":
        return cls(
            name=d["name"],
            title=d.get("title", d["name"]),
            status=d["status"],
            seconds=float(d.get("seconds", 0.0)),
            comparisons=tuple(Comparison.from_dict(c) for c in d.get("comparisons", ())),
            message=d.get("message", ""),
            notes=tuple(d.get("notes", ())),
            data=d.get("data", {}),
        )


def _value_failure(leaf: LeafComparison) -> bool:
    """A leaf that failed on its values only (not on structure, shape or dtype)."""
    return (leaf.values_compared and leaf.mismatched > 0 and not leaf.shape_mismatch
            and not leaf.structure_mismatch)


def _names(leaves: Sequence[LeafComparison], limit: int = 3) -> str:
    text = ", ".join(leaf.name for leaf in leaves[:limit])
    return text + (f" (+{len(leaves) - limit} more)" if len(leaves) > limit else "")


def _failure_message(failures: Sequence[LeafComparison], total: int) -> str:
    """Names the structural failures first (missing/extra keys, structure, shapes, dtypes), then the count."""
    groups = [
        ("missing", [f for f in failures if f.missing_in_actual]),
        ("extra", [f for f in failures if f.missing_in_expected]),
        ("structure", [f for f in failures if f.structure_mismatch]),
    ]
    parts = [f"{label}: {_names(leaves)}" for label, leaves in groups if leaves]
    shapes = [f for f in failures if f.shape_mismatch]
    if shapes:
        parts.append("shape: " + ", ".join(f"{f.name} {_shape(f.expected_shape)} vs {_shape(f.actual_shape)}"
                                           for f in shapes[:3]) + (" ..." if len(shapes) > 3 else ""))
    dtypes = [f for f in failures if f.dtype_mismatch and not f.shape_mismatch and not _value_failure(f)]
    if dtypes:
        parts.append("dtype: " + ", ".join(f"{f.name} {f.expected_dtype} vs {f.actual_dtype}"
                                           for f in dtypes[:3]) + (" ..." if len(dtypes) > 3 else ""))
    count = f"{len(failures)} of {total} leaves differ"
    if not parts:
        return f"{count}; first divergence: {failures[0].name}"
    return "; ".join(parts) + f"; {count}"


def _shape(shape) -> str:
    return "-" if shape is None else str(tuple(shape))


def _inconclusive_message(pending: Sequence[LeafComparison], total: int) -> str:
    if not pending:
        return "inconclusive: nothing to compare"
    first = pending[0]
    return f"{first.name}: {first.inconclusive_reason}; {len(pending)} of {total} leaves compared nothing"


def _step_sections(steps: Sequence[StepResult]) -> list:
    """The report text's sections: each failed or inconclusive step's details, and
    each distinct error once (its message, with the user's frame, and the steps it
    broke), where the first step it broke stands; the full tracebacks stay in the
    JSON and HTML reports (``data["traceback"]``)."""
    broken: dict = {}
    for s in steps:
        if s.status == "error":
            broken.setdefault(s.message, []).append(s)
    sections = []
    for s in steps:
        if s.status == "error":
            group = broken.get(s.message)
            if group is not None and group[0] is s:
                sections.append(_error_section(group))
        elif s.failed or s.inconclusive:
            sections.append(s.details())
    return sections


def _table_message(step: StepResult, first_broken: Mapping) -> str:
    """The table's last column; an error another step showed first points at that step."""
    first = first_broken.get(step.message) if step.status == "error" else None
    if first is not None and first is not step:
        return f"the same error as {first.name}"
    return step.summary_text()


def _error_section(group: Sequence[StepResult]) -> str:
    names = ", ".join(s.name for s in group)
    lines = [f"== error in {len(group)} step{'s' if len(group) > 1 else ''}: {names} ==", group[0].message]
    notes = dict.fromkeys(n for s in group for n in s.notes)
    lines.extend(f"note: {n}" for n in notes)
    if any(s.data.get("traceback") for s in group):
        lines.append("full traceback: in the JSON report (steps[].data.traceback) and the HTML report")
    return "\n".join(lines)


def _below_atol_message(leaves: Sequence[LeafComparison]) -> str:
    """Why a step whose every leaf is below ``atol`` is not a pass, and what to do."""
    atol = max(leaf.tolerance.atol for leaf in leaves)
    return (f"inconclusive: every value compared ({len(leaves)} of {len(leaves)} leaves, e.g. {leaves[0].name}) "
            f"is below atol={atol:g} in magnitude on both sides, so no difference could show; make the "
            "step meaningful with an rtol-only tolerance (Tolerance(rtol=..., atol=0)), larger inputs, "
            "or fixed weights (the fixed_weights step)")


# ---------------------------------------------------------------------------
# EquivalenceReport
# ---------------------------------------------------------------------------


def _fmt_meta_value(value: Any) -> str:
    if isinstance(value, (Mapping, list, tuple)):
        return json.dumps(_json_safe(value), separators=(",", ":"))
    return str(value)


@dataclass(frozen=True)
class EquivalenceReport:
    """The result of an equivalence run: its steps in order, ``meta``
    (model, versions, options, input shapes: JSON-serialisable), and the
    ``coverage`` ledger (:class:`~equivtool.coverage.Coverage`: what the steps
    proved, variable by variable and output by output; None for a report
    built without one)."""

    steps: tuple[StepResult, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)
    coverage: Optional[Coverage] = None

    def __post_init__(self) -> None:
        steps = tuple(self.steps)
        for s in steps:
            if not isinstance(s, StepResult):
                raise TypeError(f"EquivalenceReport steps must be StepResult objects, got {type(s).__name__}.")
        if self.coverage is not None and not isinstance(self.coverage, Coverage):
            raise TypeError(f"EquivalenceReport coverage must be a Coverage, got {type(self.coverage).__name__}.")
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "meta", _frozen_mapping(self.meta))

    @property
    def passed(self) -> bool:
        """EQUIVALENT: every step passed, except steps skipped with a stated
        reason, at least one passed, and the coverage ledger (when there is
        one) owes nothing: every output leaf compared above ``atol`` in some
        step, every variable's value compared after training, every trainable
        variable's gradient compared, as far as the steps run could prove
        them. A failed, errored or inconclusive step, or an unproven item,
        means not passed."""
        return (not self.failed_steps and not self.inconclusive_steps
                and any(s.passed for s in self.steps) and self.coverage_complete)

    @property
    def coverage_complete(self) -> bool:
        """True without a ledger, else :attr:`Coverage.complete`."""
        return self.coverage is None or self.coverage.complete

    @property
    def failed_steps(self) -> tuple[StepResult, ...]:
        """Steps with status "failed" or "error", in order."""
        return tuple(s for s in self.steps if s.failed)

    @property
    def inconclusive_steps(self) -> tuple[StepResult, ...]:
        """Steps that compared nothing that could differ in some leaf, in order."""
        return tuple(s for s in self.steps if s.inconclusive)

    def step(self, name: str) -> StepResult:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"no step named {name!r}; steps: {', '.join(s.name for s in self.steps)}")

    # -- text --------------------------------------------------------------

    @property
    def verdict(self) -> _render.Verdict:
        """The verdict line (a str; ``report.verdict()`` also works)."""
        return _render.Verdict(self._verdict_text())

    def _verdict_text(self) -> str:
        counts = {status: sum(s.status == status for s in self.steps) for status in STATUSES}
        tally = ", ".join(f"{counts[k]} {k}" for k in STATUSES if counts[k])
        uncovered = self.coverage.not_in_scope if self.coverage is not None else []
        scope = f"; not covered by the steps run: {', '.join(uncovered)}" if uncovered else ""
        if self.passed:
            hidden = _localize.hidden_divergence(self.steps)
            if hidden:
                return f"Verdict: EQUIVALENT at the outputs; an intermediate differs: {hidden} ({tally}){scope}"
            return f"Verdict: EQUIVALENT ({tally}){scope}"
        if self.failed_steps:
            names = ", ".join(s.name for s in self.failed_steps)
            return f"Verdict: NOT EQUIVALENT ({tally}); failing: {names}"
        if self.inconclusive_steps:
            names = ", ".join(s.name for s in self.inconclusive_steps)
            return f"Verdict: INCONCLUSIVE ({tally}); nothing that could differ was compared in: {names}"
        if any(s.passed for s in self.steps) and not self.coverage_complete:
            return f"Verdict: INCONCLUSIVE ({tally}); never proven: {self.coverage.unproven_text()}"
        return f"Verdict: INCONCLUSIVE, no step passed ({tally or 'no steps'})"

    def table(self) -> str:
        """The fixed-width summary table."""
        header = ("step", "status", "time", "max abs err", "first divergence / message")
        first_broken: dict = {}
        for s in self.steps:
            if s.status == "error":
                first_broken.setdefault(s.message, s)
        rows = [
            (
                s.name,
                _STATUS_TEXT[s.status],
                f"{s.seconds:.2f}s",
                s.error_cell(),
                _shorten(_table_message(s, first_broken), _MESSAGE_WIDTH),
            )
            for s in self.steps
        ]
        return "\n".join(_render.text_table(header, rows, "<<>>", free_last=True))

    def _meta_items(self) -> list:
        return [f"{k}: {_fmt_meta_value(v)}" for k, v in self.meta.items()
                if k not in ("platform", _UNMATCHED)]  # lines of their own (see __str__)

    def platform_lines(self) -> list:
        """What the verdict depends on (the header's ``platform``), a line each."""
        platform = self.meta.get("platform")
        if not isinstance(platform, Mapping):
            return []
        cpu, threads = platform.get("cpu") or {}, platform.get("threads") or {}
        machine = [str(cpu.get("model", "unknown CPU"))]
        if cpu.get("isa"):
            machine.append(", ".join(cpu["isa"]))
        if "onednn" in platform:
            machine.append(f"oneDNN {'on' if platform['onednn'] else 'off'}")
        if threads:
            machine.append(f"threads: intra-op {threads.get('intra_op')}, inter-op {threads.get('inter_op')}"
                           + (" (TensorFlow's default)" if threads.get("default") else ""))
        lines = ["  machine: " + " · ".join(machine)]
        if "graph_rewrites" in platform:
            off = platform.get("rewrites_off") or {}

            def side(value) -> str:
                if isinstance(value, str):
                    return value
                return ", ".join(value) if value else "none"
            tf1, tf2 = side(off.get("tf1")), side(off.get("tf2"))
            where = (f"off in the TF1 session and the TF2 function graphs: {tf1}" if tf1 == tf2 else
                     f"off in the TF1 session: {tf1} · TF2: {tf2}")
            lines.append(f"  graph rewrites: {platform['graph_rewrites']} · {where}")
        if platform.get("depends_on_cpu"):
            lines.append(f"  note: {platform['depends_on_cpu']}")
        return lines

    def tolerance_warning(self) -> str:
        """A line naming the tolerance keys that matched no leaf ("" when none did)."""
        keys = self.meta.get(_UNMATCHED)
        if not keys:
            return ""
        return ("Warning: tolerance keys matched no leaf, so their tolerance applied to nothing "
                f"(a typo?): {', '.join(map(str, keys))}")

    def meta_lines(self, width: int = 100) -> list:
        """The metadata as ``key: value`` items, packed into indented lines of at most
        ``width``; an item longer than a line is wrapped, never cut (the end of a
        value, such as a caveat, is often what matters)."""
        lines, current = [], ""
        for item in self._meta_items():
            if len(item) > width - 2:
                if current:
                    lines.append("  " + current)
                    current = ""
                lines += ["  " + line for line in textwrap.wrap(item, width - 2, subsequent_indent="    ",
                                                                break_on_hyphens=False)]
                continue
            if current and len(current) + 2 + len(item) > width - 2:
                lines.append("  " + current)
                current = item
            else:
                current = f"{current}  {item}" if current else item
        if current:
            lines.append("  " + current)
        return lines

    def __str__(self) -> str:
        parts = ["Equivalence report"] + (self.meta_lines() if self.meta else []) + self.platform_lines()
        parts += [self.table(), self.verdict()]
        if self.coverage is not None:
            parts += self.coverage.lines()
        if isinstance(self.meta.get("platform"), Mapping) and self.meta["platform"].get("depends_on_cpu"):
            parts.append("  (TensorFlow's graph rewrites were on: this verdict may differ on another CPU)")
        if self.tolerance_warning():
            parts.append(self.tolerance_warning())
        for section in _step_sections(self.steps):
            parts += ["", section]
        quiet = [(s.name, note) for s in self.steps if not (s.failed or s.inconclusive or s.status == "error")
                 for note in s.notes]
        if quiet:  # the notes of passed and skipped steps (a failed step's are in its section)
            parts += ["", "Notes:"] + [f"  {name}: {note}" for name, note in quiet]
        return "\n".join(parts)

    def raise_for_failure(self) -> "EquivalenceReport":
        """Raise AssertionError with the report text unless passed (failed, error or inconclusive); return self."""
        if not self.passed:
            raise AssertionError(str(self))
        return self

    # -- JSON --------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "verdict": self.verdict(),
            "meta": dict(self.meta),
            "steps": [s.to_dict() for s in self.steps],
            **({"coverage": self.coverage.to_dict()} if self.coverage is not None else {}),
        }

    def to_json(self, path: Union[str, os.PathLike, None] = None, *, indent: Optional[int] = 2) -> str:
        """Strict JSON (``allow_nan=False``); written to ``path`` when given."""
        return _render.json_text(self.to_dict(), path, indent)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "EquivalenceReport":
        return cls(steps=tuple(StepResult.from_dict(s) for s in d.get("steps", ())), meta=d.get("meta", {}),
                   coverage=Coverage.from_dict(d.get("coverage")))

    @classmethod
    def from_json(cls, text_or_path: Union[str, os.PathLike]) -> "EquivalenceReport":
        """Inverse of ``to_json``: a JSON string, or a path to a file holding one.

        ``meta`` and ``data`` come back as JSON data (tuples as lists,
        non-finite floats as strings); comparisons come back in full.
        """
        text = os.fspath(text_or_path)
        if not text.lstrip().startswith("{"):
            with open(text, encoding="utf-8") as f:
                text = f.read()
        return cls.from_dict(json.loads(text))

    # -- HTML --------------------------------------------------------------

    def to_html(self, path: Union[str, os.PathLike]) -> str:
        """Write a self-contained HTML report (inline CSS, plots as base64 PNG)
        and return its path. Needs matplotlib."""
        _render.matplotlib_figure()
        plots = {i: _render.error_plot_png(_plot_leaves(s), s.name, s.first_failure)
                 for i, s in enumerate(self.steps) if _plot_leaves(s)}
        localizations = {i: _localize.as_localization(s.data.get("localization")) for i, s in enumerate(self.steps)}
        paths = {i: _localize.path_plot_png(loc, f"{self.steps[i].name}: path to the first divergent op "
                                                 f"{loc.tf1_op}")
                 for i, loc in localizations.items() if loc is not None and loc.diverged and loc.path}
        return _render.write_text_atomic(path, _render_html(self, plots, paths))


# ---------------------------------------------------------------------------
# HTML rendering
# ---------------------------------------------------------------------------

def _plot_leaves(step: StepResult) -> tuple[LeafComparison, ...]:
    """Leaves worth a per-leaf plot: a step that compared two or more."""
    leaves = step.leaves
    return leaves if len(leaves) >= 2 else ()


def _comparison_html(c: Comparison) -> str:
    parts = [f"<p>{_e(c.summary())}</p>"]
    if c.failures:
        parts.append("<p>Failing leaves:</p>" + _render.leaf_rows(c.failures))
    if c.inconclusive_leaves:
        parts.append("<p>Inconclusive leaves (nothing that could differ was compared):</p>"
                     + _render.leaf_rows(c.inconclusive_leaves))
    if not c.ok:
        parts.append(f"<pre>{_e(c.format())}</pre>")
    parts.append(f"<details><summary>all {len(c)} leaves</summary>{_render.leaf_rows(c.leaves)}</details>")
    return "".join(parts)


def _coverage_html(coverage: Optional[Coverage]) -> str:
    """The ledger: its summary lines, then a row per variable and output leaf."""
    if coverage is None:
        return ""
    scope = ["not covered by the steps run: " + ", ".join(coverage.not_in_scope)] if coverage.not_in_scope else []
    lines = "".join(f"<p>{_e(line)}</p>" for line in coverage.lines() + scope)
    rows = "".join(f"<tr><td>{_e(kind)}</td><td><code>{_e(name)}</code></td><td>{_e(proved)}</td></tr>"
                   for kind, name, proved in coverage.rows())
    return (f'<h2 id="coverage">Coverage</h2>{lines}<details><summary>ledger: what proved each variable '
            f"and output leaf</summary><table><tr><th>kind</th><th>name</th><th>proved by</th></tr>{rows}"
            "</table></details>")


def _render_html(report: EquivalenceReport, plots: Mapping[int, str],
                 path_plots: Optional[Mapping[int, str]] = None) -> str:
    verdict_class = "ok" if report.passed else ("bad" if report.failed_steps else "none")
    summary_rows = "".join(
        "<tr>"
        f'<td><a href="#step-{i}"><code>{_e(s.name)}</code></a></td><td>{_e(s.title)}</td>'
        f"<td>{_render.status_cell(s.status)}</td>"
        f'<td class="num">{s.seconds:.2f}s</td>'
        f'<td class="num">{_e(s.error_cell())}</td>'
        f"<td>{_e(s.summary_text())}</td>"
        "</tr>"
        for i, s in enumerate(report.steps)
    )
    meta_rows = "".join(
        f"<tr><th>{_e(k)}</th><td><code>{_e(_fmt_meta_value(v))}</code></td></tr>" for k, v in report.meta.items()
    )
    sections = []
    for i, s in enumerate(report.steps):
        body = [f'<h2 id="step-{i}"><code>{_e(s.name)}</code>: {_e(s.title)} {_render.status_cell(s.status)}</h2>',
                f"<p>time {s.seconds:.2f}s</p>"]
        if s.message:
            body.append(f"<p>{_e(s.message)}</p>")
        if s.notes:
            body.append("<ul>" + "".join(f"<li>{_e(n)}</li>" for n in s.notes) + "</ul>")
        if i in plots:
            body.append(
                f'<img alt="{_e(s.name)}: max abs error per leaf" src="data:image/png;base64,{plots[i]}">'
            )
        localization = _localize.as_localization(s.data.get("localization"))
        if localization is not None:
            body.append(_localize.localization_html(localization, _e, (path_plots or {}).get(i)))
        hint = _localize.rerun_hint(s.name, s.status, s.data)
        if hint:
            body.append(f"<p><em>{_e(hint)}</em></p>")
        body.extend(_comparison_html(c) for c in s.comparisons)
        if s.data:
            data_text = json.dumps(_json_safe(dict(s.data)), indent=2, allow_nan=False)
            body.append(f"<details><summary>data</summary><pre>{_e(data_text)}</pre></details>")
        sections.append("".join(body))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<title>equivtool equivalence report</title>"
        f"<style>{_render.CSS}</style></head><body>"
        "<h1>Equivalence report</h1>"
        f'<p class="verdict {verdict_class}">{_e(report.verdict())}</p>'
        + (f"<table>{meta_rows}</table>" if meta_rows else "")
        + "<table><tr><th>step</th><th>title</th><th>status</th><th>time</th><th>max abs err</th>"
        "<th>first divergence / message</th></tr>"
        f"{summary_rows}</table>"
        + _coverage_html(report.coverage)
        + "".join(sections)
        + "</body></html>\n"
    )
