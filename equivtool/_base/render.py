"""One set of renderers for every equivtool report: text tables, JSON data, HTML pieces, plots, files.

Used by the equivalence report, the determinism audit, the variable parity
table and the command line's progress lines. NumPy only: matplotlib is
imported when a plot is drawn, TensorFlow never.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import tempfile
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence, Union

import numpy as np

if TYPE_CHECKING:  # for annotations only: comparison sits above _base
    from equivtool.comparison import LeafComparison


__all__ = ["CSS", "STATUS_TEXT", "escape", "json_safe", "shorten", "fmt_err", "text_table", "fixed_row",
           "status_cell", "leaf_rows", "error_plot_png", "matplotlib_figure", "write_text_atomic", "json_text"]

STATUS_TEXT = {"passed": "passed", "failed": "FAILED", "inconclusive": "INCONCLUSIVE", "error": "ERROR",
               "skipped": "skipped"}


def fmt_err(x: float) -> str:
    """A difference as the reports print it: three significant digits, "n/a" for NaN."""
    return "n/a" if math.isnan(x) else f"{x:.3g}"


# ---------------------------------------------------------------------------
# Plain text
# ---------------------------------------------------------------------------


def shorten(text: str, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters with "..."."""
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def fixed_row(cells: Sequence[str], widths: Sequence[int], align: str = "", sep: str = "  ") -> str:
    """One fixed-width line: cell ``i`` padded to ``widths[i]`` (a width of 0 leaves it as is),
    aligned by ``align[i]`` ("<" or ">", default "<"); trailing blanks removed."""
    parts = []
    for i, cell in enumerate(cells):
        width = widths[i] if i < len(widths) else 0
        a = align[i] if i < len(align) else "<"
        parts.append(f"{cell:{a}{width}}" if width else str(cell))
    return sep.join(parts).rstrip()


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "", *,
               free_last: bool = False, indent: str = "") -> list[str]:
    """A fixed-width table: header, a rule of dashes, one line per row.

    Columns are as wide as their widest cell; ``align`` gives "<" or ">" per
    column. With ``free_last`` the last column is not padded (long messages
    do not widen the table) and its rule is as long as its header.
    """
    n = len(header)
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(n)]
    padded = widths[:-1] + [0] if free_last else widths
    rule = [("-" * w) for w in widths[:-1]] + ["-" * (len(header[-1]) if free_last else widths[-1])]
    lines = [fixed_row(header, padded, align), fixed_row(rule, padded, align)]
    lines += [fixed_row([str(c) for c in r], padded, align) for r in rows]
    return [indent + line for line in lines]


# ---------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------


def json_safe(x: Any) -> Any:
    """Plain JSON data: str keys, lists, and non-finite floats as strings."""
    if isinstance(x, Mapping):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in x]
    if isinstance(x, np.ndarray):
        return json_safe(x.tolist())
    if isinstance(x, np.generic):
        return json_safe(x.item())
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return x
    if isinstance(x, complex):
        return {"real": json_safe(x.real), "imag": json_safe(x.imag)}
    if hasattr(x, "to_dict"):
        return json_safe(x.to_dict())
    return str(x)


def json_text(data: Any, path: Union[str, os.PathLike, None] = None, indent: Optional[int] = 2) -> str:
    """Strict JSON of ``data`` (non-finite floats as "nan"/"inf"/"-inf" strings),
    written atomically to ``path`` when given."""
    text = json.dumps(json_safe(data), indent=indent, allow_nan=False)
    if path is not None:
        write_text_atomic(path, text + "\n")
    return text


# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------


def write_text_atomic(path: Union[str, os.PathLike], text: str) -> str:
    """Write ``text`` (UTF-8) to ``path`` atomically and return the path
    (see :func:`write_bytes_atomic`)."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Union[str, os.PathLike], data: bytes) -> str:
    """Write ``data`` to ``path`` atomically and return the path.

    The bytes go to a temporary file in the destination's folder, flushed to
    disk, which then replaces the destination by rename: a reader (another
    process included) sees the old file or the whole new one, never half of
    it. A symlink at the destination is replaced, never written through.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".equivtool-", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise _write_error(exc, path, folder) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise _write_error(exc, path, folder) from None
        raise
    return path


def _write_error(exc: OSError, path: str, folder: str) -> OSError:
    """``exc`` (of the same class and errno) saying why ``path`` cannot be written,
    rather than naming the temporary file it happened on."""
    if os.path.isdir(path):
        reason = "it is a directory; expected a file path"
    elif not os.path.isdir(folder):
        reason = f"folder {folder!r} does not exist"
    else:
        reason = exc.strerror or str(exc)
    return type(exc)(exc.errno, f"cannot write {path!r}: {reason}")


def _umask() -> int:
    """The process umask, read without changing it where the system says it (Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# ---------------------------------------------------------------------------
# HTML
# ---------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em;color:#222;max-width:80em}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:.5em 0}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top;font-size:.9em}
th{background:#f4f4f4}td.num{text-align:right;font-family:monospace}
.passed{color:#176f2c;font-weight:bold}.failed,.error{color:#b00020;font-weight:bold}
.skipped{color:#777;font-weight:bold}.inconclusive{color:#a15c00;font-weight:bold}
.verdict{font-size:1.2em;padding:.5em;border-radius:4px;display:inline-block}
.verdict.ok{background:#e6f4ea}.verdict.bad{background:#fdecea}.verdict.none{background:#eee}
pre{background:#f8f8f8;padding:.6em;overflow:auto;font-size:.85em}
img{max-width:100%}code{font-family:monospace}
"""


def escape(x: Any) -> str:
    """HTML-escaped text of ``x`` (quotes too)."""
    return html.escape(str(x), quote=True)


def status_cell(status: str) -> str:
    """A coloured status label: passed, FAILED, INCONCLUSIVE, ERROR, skipped."""
    return f'<span class="{escape(status)}">{escape(STATUS_TEXT.get(status, status))}</span>'


def leaf_rows(leaves: Sequence[LeafComparison]) -> str:
    """An HTML table with one row per leaf."""
    head = (
        "<tr><th>leaf</th><th>status</th><th>shape</th><th>dtype</th><th>compared</th><th>mismatched</th>"
        "<th>max abs</th><th>max rel</th><th>first mismatch</th><th>tolerance</th><th>would pass with / errors</th>"
        "<th>note</th></tr>"
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
        compared = f"{leaf.compared} / {leaf.size}" if leaf.values_compared else "-"
        note = "; ".join(x for x in (leaf.inconclusive_reason, leaf.note) if x)
        rows.append(
            "<tr>"
            f"<td><code>{escape(leaf.name)}</code></td>"
            f"<td>{status_cell(leaf.status)}</td>"
            f"<td>{escape(shape)}</td><td>{escape(dtype)}</td>"
            f'<td class="num">{escape(compared)}</td>'
            f'<td class="num">{escape(mismatched)}</td>'
            f'<td class="num">{escape(fmt_err(leaf.max_abs))}</td>'
            f'<td class="num">{escape(fmt_err(leaf.max_rel))}</td>'
            f"<td>{escape(leaf.first_mismatch_str)}</td><td>{escape(leaf.tolerance)}</td>"
            f"<td>{'<br>'.join(escape(line) for line in leaf.advice_lines())}</td>"
            f"<td>{escape(note)}</td>"
            "</tr>"
        )
    return f"<table>{head}{''.join(rows)}</table>"


# ---------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------


def matplotlib_figure():
    """matplotlib's Figure and Agg canvas (no pyplot, no global backend switch)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(
            "equivtool's HTML reports need matplotlib for their plots: pip install 'equivtool[report]'"
        ) from exc
    return Figure, FigureCanvasAgg


def error_plot_png(leaves: Sequence[LeafComparison], title: str,
                   first_failure: Optional[LeafComparison] = None) -> str:
    """Max abs error per leaf, in forward order, log scale, with the atol line; base64 PNG.

    ``first_failure`` (one of ``leaves``) is marked with a vertical line.
    """
    leaves = tuple(leaves)
    errors = np.array([leaf.max_abs for leaf in leaves], dtype=float)
    atol = np.array([leaf.tolerance.atol for leaf in leaves], dtype=float)
    fig, ax, x, shown, floor = log_error_axes(errors, atol, 0.25)
    ok = np.array([leaf.ok for leaf in leaves])
    exact_zero = np.isfinite(errors) & (errors == 0)
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
    if first_failure is not None:
        index = next((i for i, leaf in enumerate(leaves) if leaf is first_failure), None)
        if index is not None:
            ax.axvline(index, color="#b00020", linestyle=":", linewidth=1,
                       label=f"first divergence: {first_failure.name}")
    ax.set_ylabel("max |actual - expected|")
    ax.set_xlabel("leaf, in forward order")
    ax.set_title(f"{title}: max abs error per leaf")
    return finished_png(fig, ax, [shorten(leaf.name, 40) for leaf in leaves])


def log_error_axes(errors: np.ndarray, atol: np.ndarray, width_per_point: float) -> tuple:
    """``(fig, ax, x, shown, floor)`` for an error plot on a log scale: the figure
    (wider with more points), its axes with the errors joined by a grey line,
    and the errors as drawn (zero, NaN and inf drawn at ``floor``, a decade
    below the smallest positive error or atol)."""
    Figure, FigureCanvasAgg = matplotlib_figure()
    x = np.arange(len(errors))
    positive = np.isfinite(errors) & (errors > 0)
    floor = min([*errors[positive], *atol[atol > 0], 1e-8]) / 10.0
    shown = np.where(positive, errors, floor)
    fig = Figure(figsize=(min(max(6.0, width_per_point * len(errors) + 2.0), 24.0), 4.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_yscale("log")
    ax.plot(x, shown, color="#999", linewidth=0.8, zorder=1)
    return fig, ax, x, shown, floor


def finished_png(fig, ax, tick_labels: Sequence[str] = ()) -> str:
    """Legend, grid, layout (and the points' labels, up to 60 of them) for one
    of the reports' error plots, as base64 PNG."""
    if tick_labels and len(tick_labels) <= 60:
        ax.set_xticks(np.arange(len(tick_labels)))
        ax.set_xticklabels(tick_labels, rotation=90, fontsize=6)
    ax.legend(fontsize=7, loc="best")
    ax.grid(True, which="major", axis="y", alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


class Verdict(str):
    """A report's verdict line: a ``str``, read as an attribute (``report.verdict``).

    Calling it returns itself, so the former method form ``report.verdict()``
    keeps working.
    """

    __slots__ = ()

    def __call__(self) -> "Verdict":
        return self
