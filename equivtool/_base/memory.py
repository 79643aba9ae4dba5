"""Giving memory back once a step's models are gone.

A step that builds its own models (a fresh TF1 graph and session, a fresh TF2
layer) leaves them in reference cycles that only the cyclic collector frees,
and glibc's allocator keeps freed heap pages for its next request instead of
handing them back to the system: without help, a process stays at the size of
its largest step, and the next step's peak stacks on top of what the last one
freed but still holds. :func:`return_freed_memory` collects the cycles, then
asks glibc (``malloc_trim(0)``) to return what it can; where the C library has
no such call (musl, macOS) it only collects. It changes no value: it runs
between steps, on memory nothing refers to.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc


def return_freed_memory() -> bool:
    """Collect reference cycles and hand freed heap pages back to the system.

    Returns whether the C library trimmed (``malloc_trim`` exists and ran).
    """
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)
        return True
    return False
