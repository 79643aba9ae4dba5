"""Temporary files and folders a run owns, named so that a later run can tell when their owner died.

A run stopped by SIGTERM or Ctrl-C removes what it wrote in its ``finally``
blocks (see :mod:`equivtool.engine.signals`); a run killed by SIGKILL, the OOM
killer or a power cut runs none, and its folder of node values or its partial
record stays. So every such name says whose it is:
``equivtool-<kind>-<host>-<pid>-<random>`` (with a leading dot where it sits
beside the user's own files), and :func:`remove_stale` removes, in one folder,
those of one kind made on this host by a process that no longer runs. A name
whose pid runs (the owner, or another process that reused its pid) is left:
a live run's files are never removed. The host is part of the name because
containers sharing a folder each count pids from 1.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket

__all__ = ["prefix", "remove_stale", "process_gone"]


def _host() -> str:
    return hashlib.sha1(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:8]


def prefix(kind: str, hidden: bool = False) -> str:
    """The name prefix of a temporary file or folder of ``kind`` owned by this process."""
    return f"{'.' if hidden else ''}equivtool-{kind}-{_host()}-{os.getpid()}-"


def process_gone(pid: int) -> bool:
    """True when no process ``pid`` runs (a zombie counts as gone: it runs no code)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # EPERM: it exists, owned by someone else
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def remove_stale(folder: str, kind: str, hidden: bool = False) -> list:
    """Remove, in ``folder``, the files and folders of ``kind`` (named by :func:`prefix`)
    whose owner process is gone; returns their paths. Errors are ignored: what
    cannot be removed now stays for a later run."""
    pattern = re.compile(rf"^{re.escape('.' if hidden else '')}equivtool-{re.escape(kind)}-{_host()}-(\d+)-")
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    removed = []
    for name in names:
        found = pattern.match(name)
        if found is None or int(found.group(1)) == os.getpid() or not process_gone(int(found.group(1))):
            continue
        path = os.path.join(folder, name)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except OSError:
            continue
        removed.append(path)
    return removed
