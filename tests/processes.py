"""Processes as the tests see them, from ``/proc``."""

from __future__ import annotations

import time


def alive(pid: int) -> bool:
    """Running (a zombie, which a container's pid 1 may never reap, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def gone_within(pid: int, seconds: float) -> bool:
    """Whether ``pid`` is no longer running within ``seconds`` (a process sent
    SIGKILL ends a moment later, not at once)."""
    end = time.monotonic() + seconds
    while alive(pid):
        if time.monotonic() >= end:
            return False
        time.sleep(0.05)  # polling, with a deadline: not a synchronisation by sleep
    return True
