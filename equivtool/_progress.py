"""The progress line the CLI prints per step (shared by ``check`` and ``demo``)."""

from __future__ import annotations

import sys
import time


def print_progress(start: float, stream=None):
    """A ``progress=`` callback printing step name, elapsed time and status."""
    def report(step) -> None:
        out = stream or sys.stdout
        elapsed = time.perf_counter() - start
        extra = f"  {step.first_divergence}" if getattr(step, "first_divergence", None) else ""
        print(f"  [{elapsed:7.1f}s] {step.name:<34} {step.status.upper():<8} ({step.seconds:.1f}s){extra}",
              file=out, flush=True)
    return report
