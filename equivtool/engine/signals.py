"""SIGTERM during a check: an orderly stop, as Ctrl-C is, then the death the caller expected.

CI timeouts, ``kill`` and batch schedulers send SIGTERM. Its default action
ends the process at once: no ``finally`` runs, so worker processes and the
check's temporary folder (``/tmp/equivtool-*``) would be left behind. While a
check runs on the main thread and SIGTERM has its default action,
:func:`sigterm_unwinds` installs a handler that raises :class:`Terminated`
there, as SIGINT raises ``KeyboardInterrupt``: the check's ``finally`` blocks
stop the workers and remove the folder. Then the previous handler is put
back and the signal delivered again, so the process ends by SIGTERM as it
would have without equivtool (exit status -15, 143 in a shell).

A handler the user installed is left alone (it decides what SIGTERM means),
and so is a check on another thread (Python runs handlers on the main
thread only). Cleanup that must not be cut short runs in :func:`shielded`: a
SIGTERM arriving there waits until the check has cleaned up.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

__all__ = ["Terminated", "sigterm_unwinds", "shielded"]


class Terminated(BaseException):
    """SIGTERM arrived during a check (a BaseException, as KeyboardInterrupt is,
    so that ``except Exception`` in a step does not swallow it)."""


_local = threading.local()


def _shield_depth() -> int:
    return getattr(_local, "depth", 0)


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """A SIGTERM arriving inside waits until :func:`sigterm_unwinds` exits."""
    _local.depth = _shield_depth() + 1
    try:
        yield
    finally:
        _local.depth -= 1


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Run the body with SIGTERM turned into :class:`Terminated` on the main
    thread; afterwards the previous handler is back, and a SIGTERM that came
    is delivered again to it (by default: the process ends)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    came = []

    def handler(signum, frame):
        first = not came
        came.append(signum)
        if first and not _shield_depth():
            raise Terminated("SIGTERM: the check was stopped")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except Terminated:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        if came:  # whatever else is propagating: the process ends here, by SIGTERM
            signal.raise_signal(signal.SIGTERM)
    if came:  # only if this thread blocks SIGTERM
        raise Terminated("SIGTERM: the check was stopped")


# --------------------------------------------------------------------------
# A worker process: it dies with its parent, whatever kills the parent
# --------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_ORPHAN_WAIT_MS = 2000  # after a SIGTERM, how long a worker waits to learn whether its parent is dying


def _parent_death_signal(signum: int) -> bool:
    """Have Linux send ``signum`` to this process when its parent dies; False elsewhere."""
    import ctypes
    import sys
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


_owned = {"workdir": None}  # this worker's parent's temporary folder, removed by an orphan


def own_workdir(workdir: str) -> None:
    """The parent's temporary folder, told to a worker started before its check had one."""
    _owned["workdir"] = workdir


def _leave(orphaned: bool, code: int) -> None:
    """End this worker now, silently; an orphan removes the parent's temporary
    folder first (the parent, killed, cannot)."""
    import os
    import shutil
    if orphaned and _owned["workdir"]:
        shutil.rmtree(_owned["workdir"], ignore_errors=True)
    os._exit(code)


def watch_parent(conn_fd: int, parent_pid: int, workdir: str | None) -> None:
    """Make this worker process end with its parent, at once and silently.

    Two ways, either enough: the parent's end of the socket pair closes when
    the parent dies, however it dies (a thread polls for the hang-up, not
    reading, so messages are left to the main thread); and Linux sends
    SIGTERM when the parent dies (``PR_SET_PDEATHSIG``), for the case where
    another process holds the parent's end open (a fork). The thread ends the
    process, so neither waits for the main thread to leave a long TensorFlow
    op. SIGTERM from anyone else (a group kill) ends the worker the same way;
    the folder is removed only when the parent is gone. SIGINT is ignored: a
    Ctrl-C reaches the whole group, and the parent stops its workers.
    """
    import os
    import select

    _owned["workdir"] = workdir
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    wake_out, wake_in = os.pipe()
    os.set_blocking(wake_in, False)
    signal.set_wakeup_fd(wake_in)  # written by the C-level handler, whatever the main thread is doing
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    _parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent_pid:  # the parent died before the line above
        _leave(True, 1)

    hang_up = getattr(select, "POLLRDHUP", 0)  # POLLHUP and POLLERR are always reported

    def parent_gone(timeout_ms: int) -> bool:
        """The parent's end of the socket closed (within ``timeout_ms``)."""
        poller = select.poll()
        poller.register(conn_fd, hang_up)
        return any(events & (select.POLLHUP | select.POLLERR | hang_up) for _, events in poller.poll(timeout_ms))

    def watch() -> None:
        poller = select.poll()
        poller.register(conn_fd, hang_up)
        poller.register(wake_out, select.POLLIN)
        while True:
            for fd, events in poller.poll():
                if fd == conn_fd and events & select.POLLNVAL:  # this process closed it: a normal exit
                    poller.unregister(conn_fd)
                    continue
                if fd == conn_fd:  # the parent's end closed: the parent is gone
                    _leave(True, 1)
                if os.read(wake_out, 1) == bytes([signal.SIGTERM]):
                    # The parent-death signal comes as soon as the thread that started this
                    # process exits, while the rest of the parent may still be going
                    # (getppid() still names it): an orphan is told by the closed socket.
                    orphaned = os.getppid() != parent_pid or parent_gone(_ORPHAN_WAIT_MS)
                    _leave(orphaned, 128 + signal.SIGTERM)

    threading.Thread(target=watch, name="equivtool-parent-watch", daemon=True).start()
