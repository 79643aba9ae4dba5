"""Command-line output shared by ``check``, ``demo`` and ``audit``: the progress
line per step, and where the report files went."""

from __future__ import annotations

import os
import sys
import time

from equivtool._base.render import fixed_row


def print_progress(start: float, stream=None):
    """A ``progress=`` callback printing step name, elapsed time and status."""
    def report(step) -> None:
        out = stream or sys.stdout
        elapsed = time.perf_counter() - start
        extra = f"  {step.first_divergence}" if getattr(step, "first_divergence", None) else ""
        cells = (f"[{elapsed:7.1f}s]", step.name, step.status.upper(), f"({step.seconds:.1f}s){extra}")
        print("  " + fixed_row(cells, (0, 34, 12, 0), sep=" "), file=out, flush=True)
    return report


def write_reports(report, json_path=None, html_path=None) -> None:
    """Write the report as JSON and/or HTML, printing each file's absolute path."""
    if json_path:
        report.to_json(json_path)
        print(f"JSON report: {os.path.abspath(json_path)}")
    if html_path:
        report.to_html(html_path)
        print(f"HTML report: {os.path.abspath(html_path)}")
