"""Find the user's source line behind a TensorFlow call.

Variable creations and random ops happen deep inside TensorFlow, Keras and
tf-slim; a message is only useful when it points at the line the user wrote.
"""

from __future__ import annotations

import sys

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
