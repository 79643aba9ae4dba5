"""Where a conversion may write: one check for the checkpoint prefix and the ``.keras`` file alike."""

from __future__ import annotations

import os

__all__ = ["output_path", "check_folder"]


def output_path(output, overwrite, what: str) -> str:
    """``output`` as an absolute path, after checking the two arguments' types
    (``TypeError`` naming the argument; ``what`` words what is written)."""
    if not isinstance(output, (str, os.PathLike)) or not os.fspath(output):
        raise TypeError(f"output: expected the {what} to write (str or os.PathLike), got {output!r}")
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite: expected True or False, got {overwrite!r}")
    return os.path.abspath(os.fspath(output))


def check_folder(path: str, expected: str) -> None:
    """Refuse (``ValueError``) an absolute ``path`` whose nearest existing folder is
    not a folder or not writable; missing folders are created on writing.
    ``expected`` words what ``path`` should be ("a checkpoint prefix")."""
    existing_folder = os.path.dirname(path)
    while not os.path.lexists(existing_folder):
        existing_folder = os.path.dirname(existing_folder)
    if not os.path.isdir(existing_folder):
        raise ValueError(f"output: {existing_folder!r} is not a folder; expected {expected} in a folder")
    if not os.access(existing_folder, os.W_OK | os.X_OK):
        raise ValueError(f"output: folder {existing_folder!r} is not writable; choose another OUTPUT")
