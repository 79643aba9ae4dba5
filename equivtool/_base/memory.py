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

A full collection is not free: with TensorFlow loaded a process holds some
300 thousand tracked objects, and ``gc.collect()`` takes about 0.1 s. Between
the steps of a small model that is most of a step's cost, and there is little
to give back. :class:`StepMemory` therefore collects only when the process
grew by :data:`STEP_GROWTH` or more since it last did (or since the check
began); where the resident size cannot be read it always collects. And
:func:`collections_skip_older_objects` keeps a check's collections off the
objects that were there before it.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os

#: Growth of the resident size (bytes) after which a step's memory is worth a
#: full collection: well above a small model's, well below one large layer's.
STEP_GROWTH = 64 << 20


def resident_bytes() -> int | None:
    """This process's resident size in bytes (``/proc/self/statm``), or None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def return_freed_memory() -> bool:
    """Collect reference cycles and hand freed heap pages back to the system.

    Returns whether the C library trimmed (``malloc_trim`` exists and ran).
    """
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)
        return True
    return False


@contextlib.contextmanager
def collections_skip_older_objects():
    """Within: full collections leave out every object that existed on entry.

    With TensorFlow loaded a process holds some 300 thousand tracked objects
    (its modules, the user's), which every full collection walks; the cycles a
    check leaves behind are all made after it starts. ``gc.freeze()`` moves
    the objects there are into a generation the collector does not walk
    (alexnet_v2: a collection after the constant-mode pair 0.15 -> 0.0 s); on
    exit, whatever the exit, ``gc.unfreeze()`` hands them back to the oldest
    generation, as before. A process that froze objects of its own is left as
    it is (there is no unfreezing ours alone)."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class StepMemory:
    """Gives freed memory back between steps, when there is enough to give.

    Calling it runs :func:`return_freed_memory` only if the resident size grew
    by ``STEP_GROWTH`` bytes (read when called) since the last time it ran, or
    since this object was made; it returns whether it ran.
    """

    def __init__(self):
        self.mark = resident_bytes()

    def __call__(self) -> bool:
        now = resident_bytes()
        if now is not None and self.mark is not None and now - self.mark < STEP_GROWTH:
            return False
        return_freed_memory()
        self.mark = resident_bytes()
        return True
