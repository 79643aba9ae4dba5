"""The audit's result: :class:`DeterminismReport`, its causes and differing leaves, and their rendering."""

from __future__ import annotations

import dataclasses
import math
import os
import types
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Union

from equivtool._base import render as _render
from equivtool._base.render import escape as _e
from equivtool._base.render import fmt_err as _fmt_err
from equivtool.comparison import Comparison, LeafComparison



@dataclass(frozen=True)
class Cause:
    """One detected cause of non-determinism.

    ``kind`` is one of :data:`CAUSE_KINDS`; ``subject`` the op type or the
    dataset; ``location`` the user's source line (``"path:line in function"``)
    or where the object was found; ``count`` how many places matched the same
    kind, subject and location; ``hint`` what to do.
    """

    kind: str
    subject: str
    message: str
    location: str = ""
    hint: str = ""
    count: int = 1

    def __str__(self) -> str:
        where = f" at {self.location}" if self.location else ""
        times = f" (x{self.count})" if self.count > 1 else ""
        text = f"{self.kind}{where}{times}: {self.message}"
        return text + (f"\n    fix: {self.hint}" if self.hint else "")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class LeafDifference:
    """A leaf (output or variable) that differed from run 1 in at least one later run.

    ``runs`` are the run numbers (2, 3, ...) that differed; ``worst`` is the
    comparison with the largest max abs difference among them (run 1 is its
    "expected" side).
    """

    name: str
    runs: tuple[int, ...]
    worst: LeafComparison

    @property
    def max_abs(self) -> float:
        return self.worst.max_abs

    @property
    def mismatched(self) -> int:
        return self.worst.mismatched

    @property
    def size(self) -> int:
        return self.worst.size

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "runs": list(self.runs), "max_abs": self.max_abs,
                "mismatched": self.mismatched, "size": self.size, "worst": self.worst.to_dict()}


def _fmt_count(leaf: LeafComparison) -> str:
    if not leaf.values_compared:
        return "-"
    percent = 100.0 * leaf.fraction
    return f"{leaf.mismatched} / {leaf.size} ({percent:.3g}%)"


@dataclass(frozen=True)
class DeterminismReport:
    """What :func:`audit_determinism` found.

    ``comparisons`` holds one :class:`~equivtool.comparison.Comparison` per run
    after the first ("run 2 vs run 1", ...), exact and bitwise, over the
    leaves ``outputs/...``, ``endpoints/...`` (when given as a callable) and
    ``variables/...``. ``causes`` lists what inspection found, ``notes`` how
    the audit was set up (which variables, what was reset).

    Sparse gradients (``tf.IndexedSlices``, e.g. of an embedding table):
    ``sparse_outputs`` names the leaves ``fn`` returned sparse (eagerly
    ``tf.IndexedSlices``, from a session ``IndexedSlicesValue``), which were
    scattered into dense arrays and compared densely; ``sparse_updates`` names
    the variables that ops applying a sparse gradient wrote (the scatters and
    sparse-apply kernels of TF1's and Keras's optimizers), each with the op
    type: the trained variable itself (TF1's optimizers, Keras's without
    slots) or the optimizer's slot for it (Keras's SGD scatters into its
    momentum slot ``SGD/m/<variable>``, Adam into ``m`` and ``v``), whose
    name contains the variable's. :attr:`sparse_note` says both in one line.
    """

    name: str
    runs: int
    comparisons: tuple[Comparison, ...]
    causes: tuple[Cause, ...] = ()
    endpoint_prefix: Optional[str] = None
    notes: tuple[str, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    sparse_outputs: tuple[str, ...] = ()
    sparse_updates: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "comparisons", tuple(self.comparisons))
        object.__setattr__(self, "sparse_outputs", tuple(self.sparse_outputs))
        object.__setattr__(self, "sparse_updates", tuple(self.sparse_updates))
        object.__setattr__(self, "causes", tuple(self.causes))
        object.__setattr__(self, "notes", tuple(self.notes))
        object.__setattr__(self, "meta", types.MappingProxyType(dict(self.meta)))

    # -- reading -------------------------------------------------------------

    @property
    def reproducible(self) -> bool:
        """Every run matched run 1 bit for bit (no leaf failed)."""
        return not any(c.failures for c in self.comparisons)

    @property
    def compared_anything(self) -> bool:
        """Some leaf held an element to compare (not only zero-size leaves, or none at all)."""
        return any(leaf.compared for c in self.comparisons for leaf in c.leaves)

    @property
    def passed(self) -> bool:
        """Reproducible, something was compared, and no cause of non-determinism was found."""
        return self.reproducible and self.compared_anything and not self.causes

    @property
    def leaf_names(self) -> tuple[str, ...]:
        return tuple(leaf.name for leaf in self.comparisons[0].leaves) if self.comparisons else ()

    @property
    def differing(self) -> tuple[LeafDifference, ...]:
        """The leaves that differed in some run, in forward order."""
        by_name: dict[str, list[tuple[int, LeafComparison]]] = {}
        for run, c in enumerate(self.comparisons, start=2):
            for leaf in c.leaves:
                if leaf.failed:
                    by_name.setdefault(leaf.name, []).append((run, leaf))
        order = {name: i for i, name in enumerate(self.leaf_names)}
        result = []
        for name, found in sorted(by_name.items(), key=lambda kv: order.get(kv[0], len(order))):
            worst = max(found, key=lambda rl: (-1.0 if math.isnan(rl[1].max_abs) else rl[1].max_abs,
                                               rl[1].mismatched))[1]
            result.append(LeafDifference(name, tuple(run for run, _ in found), worst))
        return tuple(result)

    @property
    def first_difference(self) -> Optional[str]:
        """The first differing leaf in forward order (outputs, endpoints, then variables)."""
        diffs = self.differing
        return diffs[0].name if diffs else None

    @property
    def first_differing_endpoint(self) -> Optional[str]:
        """The first endpoint, in the endpoints dict's order, that differs (None without endpoints)."""
        prefix = self.endpoint_prefix
        if prefix is None:
            return None
        for diff in self.differing:
            if diff.name == prefix:
                return diff.name
            if diff.name.startswith(prefix + "/"):
                return diff.name[len(prefix) + 1:]
        return None

    @property
    def sparse_note(self) -> Optional[str]:
        """One line naming the sparse gradients the step returned or applied (None when none were seen)."""
        parts = []
        if self.sparse_outputs:
            parts.append(f"returned as tf.IndexedSlices and compared densely: {', '.join(self.sparse_outputs)}")
        if self.sparse_updates:
            parts.append(f"applied sparsely to: {', '.join(self.sparse_updates)}")
        return "sparse gradients " + "; ".join(parts) if parts else None

    @property
    def max_abs(self) -> float:
        values = [c.max_abs for c in self.comparisons if not math.isnan(c.max_abs)]
        return max(values) if values else math.nan

    # -- text ----------------------------------------------------------------

    @property
    def verdict(self) -> _render.Verdict:
        """The verdict line (a str; ``report.verdict()`` also works)."""
        return _render.Verdict(self._verdict_text())

    def _verdict_text(self) -> str:
        n = len(self.leaf_names)
        if not self.reproducible:
            return (f"Verdict: NOT REPRODUCIBLE ({self.runs} runs; {len(self.differing)} of {n} "
                    f"leaves differ; max abs diff {_fmt_err(self.max_abs)})")
        if not self.compared_anything:
            return (f"Verdict: INCONCLUSIVE: fn returned nothing to compare and no variable was found "
                    f"({n} leaves, none with an element); return the step's tensors from fn")
        if self.causes:
            return (f"Verdict: AT RISK: {self.runs} runs agreed bit for bit on {n} leaves, "
                    f"but {len(self.causes)} cause(s) of non-determinism were found")
        return f"Verdict: REPRODUCIBLE ({self.runs} runs agree bit for bit on {n} leaves)"

    def table(self, max_rows: int = 20) -> str:
        diffs = self.differing
        if not diffs:
            return ""
        header = ("leaf", "runs differing", "mismatched elements", "max abs diff")
        rows = [(d.name, ", ".join(map(str, d.runs)), _fmt_count(d.worst), _fmt_err(d.max_abs))
                for d in diffs[:max_rows]]
        text = _render.text_table(header, rows, "<<>>")
        if len(diffs) > max_rows:
            text.append(f"... and {len(diffs) - max_rows} more differing leaves")
        return "\n".join(text)

    def __str__(self) -> str:
        parts = [f"Determinism audit of {self.name}", self.verdict()]
        table = self.table()
        if table:
            parts.append(table)
        endpoint = self.first_differing_endpoint
        if endpoint is not None:
            parts.append(f"First differing endpoint (forward order): {endpoint}")
        elif self.endpoint_prefix is not None and not self.reproducible:
            parts.append("No endpoint differs: non-determinism enters after the endpoints.")
        if self.causes:
            parts.append("Causes found:")
            parts.extend("  - " + str(c).replace("\n", "\n  ") for c in self.causes)
        elif not self.reproducible:
            parts.append("Causes found: none of the known causes was detected; look at the first "
                         "differing leaf (threads, uninitialised memory, Python-side state, "
                         "GPU ops outside the known list).")
        if self.sparse_note:
            parts.append(f"note: {self.sparse_note}")
        parts.extend(f"note: {n}" for n in self.notes)
        first = next((c for c in self.comparisons if c.failures), None)
        if first is not None:
            parts += ["", f"Details ({first.name}):", first.format(max_failures=5)]
        return "\n".join(parts)

    def raise_for_failure(self) -> "DeterminismReport":
        """Raise AssertionError with the report text unless it passed; return self."""
        if not self.passed:
            raise AssertionError(str(self))
        return self

    # -- JSON and HTML -------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "runs": self.runs,
            "reproducible": self.reproducible,
            "passed": self.passed,
            "verdict": self.verdict(),
            "seconds": self.seconds,
            "max_abs": self.max_abs,
            "first_difference": self.first_difference,
            "endpoint_prefix": self.endpoint_prefix,
            "first_differing_endpoint": self.first_differing_endpoint,
            "differing": [d.to_dict() for d in self.differing],
            "causes": [c.to_dict() for c in self.causes],
            "notes": list(self.notes),
            "sparse_outputs": list(self.sparse_outputs),
            "sparse_updates": list(self.sparse_updates),
            "sparse_note": self.sparse_note,
            "meta": dict(self.meta),
            "comparisons": [c.to_dict() for c in self.comparisons],
        }

    def to_json(self, path: Union[str, os.PathLike, None] = None, *, indent: Optional[int] = 2) -> str:
        """Strict JSON (non-finite floats as "nan"/"inf" strings); written to ``path`` when given."""
        return _render.json_text(self.to_dict(), path, indent)

    def to_html(self, path: Union[str, os.PathLike]) -> str:
        """Write a self-contained HTML page (plots need matplotlib); return its path."""
        verdict_class = "ok" if self.passed else ("bad" if self.reproducible is False or self.causes else "none")
        body = [f"<h1>Determinism audit of <code>{_e(self.name)}</code></h1>",
                f'<p class="verdict {verdict_class}">{_e(self.verdict())}</p>']
        meta = "".join(f"<tr><th>{_e(k)}</th><td><code>{_e(v)}</code></td></tr>" for k, v in self.meta.items())
        if meta:
            body.append(f"<table>{meta}</table>")
        endpoint = self.first_differing_endpoint
        if endpoint is not None:
            body.append(f"<p>First differing endpoint: <code>{_e(endpoint)}</code></p>")
        if self.causes:
            rows = "".join(
                f"<tr><td>{_e(c.kind)}</td><td><code>{_e(c.subject)}</code></td><td>{_e(c.message)}</td>"
                f"<td><code>{_e(c.location)}</code></td><td>{_e(c.hint)}</td></tr>" for c in self.causes)
            body.append("<h2>Causes found</h2><table><tr><th>kind</th><th>subject</th><th>what</th>"
                        f"<th>where</th><th>fix</th></tr>{rows}</table>")
        notes = ((self.sparse_note,) if self.sparse_note else ()) + self.notes
        if notes:
            body.append("<ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>")
        for c in self.comparisons:
            status = "failed" if c.failures else "passed"
            body.append(f"<h2>{_e(c.name)} {_render.status_cell(status)}</h2><p>{_e(c.summary())}</p>")
            if c.failures and len(c.leaves) >= 2:
                png = _render.error_plot_png(c.leaves, c.name, c.first_failure)
                body.append(f'<img alt="{_e(c.name)}" src="data:image/png;base64,{png}">')
            if c.failures:
                body.append(_render.leaf_rows(c.failures))
        document = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                    "<title>equivtool determinism audit</title>"
                    f"<style>{_render.CSS}</style></head><body>{''.join(body)}</body></html>\n")
        return _render.write_text_atomic(path, document)

