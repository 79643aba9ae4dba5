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

import base64
import html
import io
import json
import math
import os
import traceback as _traceback
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import numpy as np

from equivtool.comparison import Comparison, LeafComparison, _fmt_err
from equivtool.localize import result as _localize

__all__ = ["StepResult", "EquivalenceReport", "STATUSES"]

STATUSES = ("passed", "failed", "error", "skipped")
_STATUS_TEXT = {"passed": "passed", "failed": "FAILED", "error": "ERROR", "skipped": "skipped"}
_MESSAGE_WIDTH = 72


# ---------------------------------------------------------------------------
# JSON-safe plain data
# ---------------------------------------------------------------------------


def _json_safe(x: Any) -> Any:
    """Plain JSON data: str keys, lists, and non-finite floats as strings."""
    if isinstance(x, Mapping):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [_json_safe(v) for v in x]
    if isinstance(x, np.ndarray):
        return _json_safe(x.tolist())
    if isinstance(x, np.generic):
        return _json_safe(x.item())
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return x
    if isinstance(x, complex):
        return {"real": _json_safe(x.real), "imag": _json_safe(x.imag)}
    if hasattr(x, "to_dict"):
        return _json_safe(x.to_dict())
    return str(x)


def _frozen_mapping(data: Optional[Mapping]) -> Mapping:
    return MappingProxyType(dict(data or {}))


def _shorten(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


# ---------------------------------------------------------------------------
# StepResult
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StepResult:
    """What one step of the equivalence workflow found.

    ``status`` is one of "passed", "failed", "error", "skipped"; ``message``
    says why it failed, was skipped or errored; ``data`` holds step-specific
    extras (JSON-serialisable; kept read-only).
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
        """A step judged by its comparisons: "passed" iff every one is ok.

        With no comparisons at all the step is "skipped" ("nothing to
        compare"): a vacuous pass would hide a step that looked at nothing.
        Without ``message``, a failed step's message names the failing leaves.
        """
        comparisons = (comparisons,) if isinstance(comparisons, Comparison) else tuple(comparisons)
        if not comparisons:
            return cls(name, title, "skipped", seconds, (), message or "nothing to compare", notes, data or {})
        failures = [leaf for c in comparisons for leaf in c.failures]
        total = sum(len(c) for c in comparisons)
        status = "failed" if failures else "passed"
        if failures and not message:
            message = f"{len(failures)} of {total} leaves differ; first divergence: {failures[0].name}"
        return cls(name, title, status, seconds, comparisons, message, tuple(notes), data or {})

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
        """The table's last column: the first divergence, then the message
        unless it only repeats the first divergence."""
        first = self.first_divergence
        parts = [] if first is None else [first]
        if self.message and (first is None or first not in self.message):
            parts.append(self.message)
        return " | ".join(parts)

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


# ---------------------------------------------------------------------------
# EquivalenceReport
# ---------------------------------------------------------------------------


def _fmt_meta_value(value: Any) -> str:
    if isinstance(value, (Mapping, list, tuple)):
        return json.dumps(_json_safe(value), separators=(",", ":"))
    return str(value)


@dataclass(frozen=True)
class EquivalenceReport:
    """The result of an equivalence run: its steps in order, and ``meta``
    (model, versions, options, input shapes: JSON-serialisable)."""

    steps: tuple[StepResult, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        steps = tuple(self.steps)
        for s in steps:
            if not isinstance(s, StepResult):
                raise TypeError(f"EquivalenceReport steps must be StepResult objects, got {type(s).__name__}.")
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "meta", _frozen_mapping(self.meta))

    @property
    def passed(self) -> bool:
        """No failed or errored step, and at least one step passed."""
        return not self.failed_steps and any(s.passed for s in self.steps)

    @property
    def failed_steps(self) -> tuple[StepResult, ...]:
        """Steps with status "failed" or "error", in order."""
        return tuple(s for s in self.steps if s.failed)

    def step(self, name: str) -> StepResult:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"no step named {name!r}; steps: {', '.join(s.name for s in self.steps)}")

    # -- text --------------------------------------------------------------

    def verdict(self) -> str:
        counts = {status: sum(s.status == status for s in self.steps) for status in STATUSES}
        tally = ", ".join(f"{counts[k]} {k}" for k in STATUSES if counts[k])
        if self.passed:
            return f"Verdict: EQUIVALENT ({tally})"
        if self.failed_steps:
            names = ", ".join(s.name for s in self.failed_steps)
            return f"Verdict: NOT EQUIVALENT ({tally}); failing: {names}"
        return f"Verdict: INCONCLUSIVE, no step passed ({tally or 'no steps'})"

    def table(self) -> str:
        """The fixed-width summary table."""
        header = ("step", "status", "time", "max abs err", "first divergence / message")
        rows = [
            (
                s.name,
                _STATUS_TEXT[s.status],
                f"{s.seconds:.2f}s",
                "-" if math.isnan(s.max_abs) else _fmt_err(s.max_abs),
                _shorten(s.summary_text(), _MESSAGE_WIDTH),
            )
            for s in self.steps
        ]
        widths = [max(len(r[i]) for r in (header, *rows)) for i in range(4)]
        align = ("<", "<", ">", ">")

        def line(row: Sequence[str]) -> str:
            cells = [f"{row[i]:{align[i]}{widths[i]}}" for i in range(4)]
            return "  ".join([*cells, row[4]]).rstrip()

        rule = "  ".join("-" * w for w in [*widths, len(header[4])])
        return "\n".join([line(header), rule, *(line(r) for r in rows)])

    def meta_line(self) -> str:
        return "  ".join(self._meta_items())

    def _meta_items(self) -> list:
        return [f"{k}: {_shorten(_fmt_meta_value(v), 80)}" for k, v in self.meta.items()]

    def meta_lines(self, width: int = 100) -> list:
        """The metadata as ``key: value`` items, packed into indented lines of at most ``width``."""
        lines, current = [], ""
        for item in self._meta_items():
            if current and len(current) + 2 + len(item) > width - 2:
                lines.append("  " + current)
                current = item
            else:
                current = f"{current}  {item}" if current else item
        if current:
            lines.append("  " + current)
        return lines

    def __str__(self) -> str:
        parts = ["Equivalence report"] + (self.meta_lines() if self.meta else [])
        parts += [self.table(), self.verdict()]
        for s in self.failed_steps:
            parts += ["", s.details()]
        return "\n".join(parts)

    def raise_for_failure(self) -> "EquivalenceReport":
        """Raise AssertionError with the report text unless passed; return self."""
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
        }

    def to_json(self, path: Union[str, os.PathLike, None] = None, *, indent: Optional[int] = 2) -> str:
        """Strict JSON (``allow_nan=False``); written to ``path`` when given."""
        text = json.dumps(_json_safe(self.to_dict()), indent=indent, allow_nan=False)
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text + "\n")
        return text

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "EquivalenceReport":
        return cls(steps=tuple(StepResult.from_dict(s) for s in d.get("steps", ())), meta=d.get("meta", {}))

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
        _matplotlib()
        plots = {i: _error_plot_png(s) for i, s in enumerate(self.steps) if _plot_leaves(s)}
        localizations = {i: _localize.as_localization(s.data.get("localization")) for i, s in enumerate(self.steps)}
        paths = {i: _localize.path_plot_png(loc, f"{self.steps[i].name}: path to the first divergent op "
                                                 f"{loc.tf1_op}")
                 for i, loc in localizations.items() if loc is not None and loc.diverged and loc.path}
        document = _render_html(self, plots, paths)
        path = os.fspath(path)
        with open(path, "w", encoding="utf-8") as f:
            f.write(document)
        return path


# ---------------------------------------------------------------------------
# HTML rendering
# ---------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em;color:#222;max-width:80em}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:.5em 0}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top;font-size:.9em}
th{background:#f4f4f4}td.num{text-align:right;font-family:monospace}
.passed{color:#176f2c;font-weight:bold}.failed,.error{color:#b00020;font-weight:bold}
.skipped{color:#777;font-weight:bold}
.verdict{font-size:1.2em;padding:.5em;border-radius:4px;display:inline-block}
.verdict.ok{background:#e6f4ea}.verdict.bad{background:#fdecea}.verdict.none{background:#eee}
pre{background:#f8f8f8;padding:.6em;overflow:auto;font-size:.85em}
img{max-width:100%}code{font-family:monospace}
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _plot_leaves(step: StepResult) -> tuple[LeafComparison, ...]:
    """Leaves worth a per-leaf plot: a step that compared two or more."""
    leaves = step.leaves
    return leaves if len(leaves) >= 2 else ()


def _matplotlib():
    """matplotlib's Figure and Agg canvas (no pyplot, no global backend switch)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(
            "EquivalenceReport.to_html needs matplotlib for its plots: pip install 'equivtool[report]'"
        ) from exc
    return Figure, FigureCanvasAgg


def _error_plot_png(step: StepResult) -> str:
    """Max abs error per leaf, in forward order, log scale, with the atol line."""
    Figure, FigureCanvasAgg = _matplotlib()
    leaves = _plot_leaves(step)
    x = np.arange(len(leaves))
    errors = np.array([leaf.max_abs for leaf in leaves], dtype=float)
    atol = np.array([leaf.tolerance.atol for leaf in leaves], dtype=float)
    positive = errors[np.isfinite(errors) & (errors > 0)]
    positive_atol = atol[atol > 0]
    floor = min([*positive, *positive_atol, 1e-8]) / 10.0
    shown = np.where(np.isfinite(errors) & (errors > 0), errors, floor)
    ok = np.array([leaf.ok for leaf in leaves])
    exact_zero = np.isfinite(errors) & (errors == 0)

    width = min(max(6.0, 0.25 * len(leaves) + 2.0), 24.0)
    fig = Figure(figsize=(width, 4.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_yscale("log")
    ax.plot(x, shown, color="#999", linewidth=0.8, zorder=1)
    groups = (
        (ok & ~exact_zero, dict(color="#176f2c", s=18, label="close")),
        (ok & exact_zero, dict(color="#176f2c", marker="v", s=18, label="no difference (drawn at the floor)")),
        (~ok, dict(color="#b00020", marker="x", s=30, label="not close")),
    )
    for mask, style in groups:
        if mask.any():
            ax.scatter(x[mask], shown[mask], zorder=3, **style)
    if np.all(atol == atol[0]):
        if atol[0] > 0:
            ax.axhline(atol[0], color="#1f5fbf", linestyle="--", linewidth=1, label=f"atol = {atol[0]:g}")
    else:
        ax.step(x, np.where(atol > 0, atol, floor), where="mid", color="#1f5fbf", linestyle="--",
                linewidth=1, label="atol (per leaf)")
    first = step.first_failure
    if first is not None:
        index = next(i for i, leaf in enumerate(leaves) if leaf is first)
        ax.axvline(index, color="#b00020", linestyle=":", linewidth=1, label=f"first divergence: {first.name}")
    ax.set_ylabel("max |actual - expected|")
    ax.set_xlabel("leaf, in forward order")
    ax.set_title(f"{step.name}: max abs error per leaf")
    if len(leaves) <= 60:
        ax.set_xticks(x)
        ax.set_xticklabels([_shorten(leaf.name, 40) for leaf in leaves], rotation=90, fontsize=6)
    ax.legend(fontsize=7, loc="best")
    ax.grid(True, which="major", axis="y", alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _status_cell(status: str) -> str:
    return f'<span class="{_e(status)}">{_e(_STATUS_TEXT[status])}</span>'


def _leaf_rows(leaves: Sequence[LeafComparison]) -> str:
    head = (
        "<tr><th>leaf</th><th>ok</th><th>shape</th><th>dtype</th><th>mismatched</th>"
        "<th>max abs</th><th>max rel</th><th>first mismatch</th><th>tolerance</th><th>note</th></tr>"
    )
    rows = []
    for leaf in leaves:
        shape = leaf.expected_shape if leaf.expected_shape == leaf.actual_shape else (
            f"{leaf.expected_shape} vs {leaf.actual_shape}"
        )
        dtype = leaf.expected_dtype if leaf.expected_dtype == leaf.actual_dtype else (
            f"{leaf.expected_dtype} vs {leaf.actual_dtype}"
        )
        mismatched = f"{leaf.mismatched} / {leaf.size}" if leaf.values_compared else "-"
        rows.append(
            "<tr>"
            f"<td><code>{_e(leaf.name)}</code></td>"
            f"<td>{_status_cell('passed' if leaf.ok else 'failed')}</td>"
            f"<td>{_e(shape)}</td><td>{_e(dtype)}</td>"
            f'<td class="num">{_e(mismatched)}</td>'
            f'<td class="num">{_e(_fmt_err(leaf.max_abs))}</td>'
            f'<td class="num">{_e(_fmt_err(leaf.max_rel))}</td>'
            f"<td>{_e(leaf.first_mismatch_str)}</td><td>{_e(leaf.tolerance)}</td>"
            f"<td>{_e(leaf.note)}</td>"
            "</tr>"
        )
    return f"<table>{head}{''.join(rows)}</table>"


def _comparison_html(c: Comparison) -> str:
    parts = [f"<p>{_e(c.summary())}</p>"]
    if c.failures:
        parts.append("<p>Failing leaves:</p>" + _leaf_rows(c.failures))
        parts.append(f"<pre>{_e(c.format())}</pre>")
    parts.append(f"<details><summary>all {len(c)} leaves</summary>{_leaf_rows(c.leaves)}</details>")
    return "".join(parts)


def _render_html(report: EquivalenceReport, plots: Mapping[int, str],
                 path_plots: Optional[Mapping[int, str]] = None) -> str:
    verdict_class = "ok" if report.passed else ("bad" if report.failed_steps else "none")
    summary_rows = "".join(
        "<tr>"
        f'<td><a href="#step-{i}"><code>{_e(s.name)}</code></a></td><td>{_e(s.title)}</td>'
        f"<td>{_status_cell(s.status)}</td>"
        f'<td class="num">{s.seconds:.2f}s</td>'
        f'<td class="num">{_e("-" if math.isnan(s.max_abs) else _fmt_err(s.max_abs))}</td>'
        f"<td>{_e(s.summary_text())}</td>"
        "</tr>"
        for i, s in enumerate(report.steps)
    )
    meta_rows = "".join(
        f"<tr><th>{_e(k)}</th><td><code>{_e(_fmt_meta_value(v))}</code></td></tr>" for k, v in report.meta.items()
    )
    sections = []
    for i, s in enumerate(report.steps):
        body = [f'<h2 id="step-{i}"><code>{_e(s.name)}</code>: {_e(s.title)} {_status_cell(s.status)}</h2>',
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
        f"<style>{_CSS}</style></head><body>"
        "<h1>Equivalence report</h1>"
        f'<p class="verdict {verdict_class}">{_e(report.verdict())}</p>'
        + (f"<table>{meta_rows}</table>" if meta_rows else "")
        + "<table><tr><th>step</th><th>title</th><th>status</th><th>time</th><th>max abs err</th>"
        "<th>first divergence / message</th></tr>"
        f"{summary_rows}</table>"
        + "".join(sections)
        + "</body></html>\n"
    )
