"""Find the user's source line behind a TensorFlow call.

Variable creations and random ops happen deep inside TensorFlow, Keras and
tf-slim; a message is only useful when it points at the line the user wrote.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Optional

# Modules whose frames are never "the user's line".
_LIBRARY_PREFIXES = (
    "tensorflow", "tf_keras", "keras", "tf_slim", "equivtool", "absl",
    "contextlib", "functools", "threading", "wrapt", "numpy", "six",
    "typing", "abc", "importlib", "runpy", "unittest", "_pytest", "pluggy",
)


def _is_library(module_name: str, filename: str) -> bool:
    if "__autograph_generated_file" in filename:
        return True
    head = module_name.split(".", 1)[0]
    return head in _LIBRARY_PREFIXES or filename.startswith("<frozen ")


def user_frame_location(skip: int = 1) -> str:
    """Return ``"path:line in function"`` for the first frame outside the libraries.

    Falls back to ``"<unknown>"`` when every frame belongs to a library (for
    example code running on a TensorFlow-owned thread).
    """
    frame = sys._getframe(skip)
    while frame is not None:
        code = frame.f_code
        name = frame.f_globals.get("__name__", "")
        if not _is_library(name, code.co_filename):
            return f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
        frame = frame.f_back
    return "<unknown>"


def innermost_user_frame(tb) -> Optional[str]:
    """``"path:line in function"`` of the innermost traceback entry outside the libraries, or None."""
    for frame, lineno in reversed(list(traceback.walk_tb(tb))):
        code = frame.f_code
        if not _is_library(frame.f_globals.get("__name__", ""), code.co_filename):
            return f"{code.co_filename}:{lineno} in {code.co_name}"
    return None


def _library_roots() -> list:
    """Folders (and single-file modules) of the imported library modules."""
    roots = []
    for name in _LIBRARY_PREFIXES:
        module = sys.modules.get(name)
        if module is None:
            continue
        paths = list(getattr(module, "__path__", None) or [])
        if not paths and getattr(module, "__file__", None):
            paths = [module.__file__]
        roots.extend(os.path.realpath(path) for path in paths)
    return roots


def is_library_file(filename: str) -> bool:
    """True when a source file belongs to one of the libraries (by path, for
    frames known only by their file name, as in TensorFlow's error messages)."""
    if "__autograph_generated_file" in filename or filename.startswith("<frozen "):
        return True
    real = os.path.realpath(filename)
    return any(real == root or real.startswith(root + os.sep) for root in _library_roots())
