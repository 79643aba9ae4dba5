"""Find the user's source line behind a TensorFlow call.

Variable creations, random ops and graph ops happen deep inside TensorFlow,
Keras and tf-slim; a message is only useful when it points at the line the
user wrote. One detector, :func:`is_library_frame`, decides which frames are
not the user's: it is used for live Python frames (by module name) and for
recorded stacks such as a graph op's creation traceback (by file path).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from typing import Iterable, Optional

# Top-level packages whose frames are never "the user's line".
LIBRARY_PACKAGES = (
    "tensorflow", "tf_keras", "keras", "tf_slim", "equivtool", "absl", "google",
    "contextlib", "functools", "threading", "wrapt", "numpy", "six",
    "typing", "abc", "importlib", "runpy", "unittest", "_pytest", "pluggy",
)


def find_library_dirs() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Folders of the library packages imported so far, and of the standard library."""
    packages = []
    for name in LIBRARY_PACKAGES:
        module = sys.modules.get(name)
        for path in getattr(module, "__path__", None) or ():
            packages.append(os.path.realpath(path) + os.sep)
    stdlib = []
    for key in ("stdlib", "platstdlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            stdlib.append(os.path.realpath(path) + os.sep)
    return tuple(packages), tuple(stdlib)


def is_library_frame(filename: str, module_name: Optional[str] = None,
                     library_dirs: Optional[tuple[tuple[str, ...], tuple[str, ...]]] = None) -> bool:
    """Whether a frame in ``filename`` (of module ``module_name`` when known) belongs to a library.

    Generated code (autograph, frozen importlib) is a library frame. With a
    module name, its top-level package decides; without one, the file's
    folder does: a folder of :data:`LIBRARY_PACKAGES`, or the standard
    library outside site-packages (``library_dirs`` as :func:`find_library_dirs`
    returns them, computed when not given).
    """
    if "__autograph_generated_file" in filename or filename.startswith("<frozen"):
        return True
    if module_name:
        return module_name.split(".", 1)[0] in LIBRARY_PACKAGES
    packages, stdlib = library_dirs or find_library_dirs()
    path = os.path.realpath(filename)
    if path.startswith(packages):
        return True
    installed = f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path
    return path.startswith(stdlib) and not installed


def user_frame_location(skip: int = 1) -> str:
    """Return ``"path:line in function"`` for the first frame outside the libraries.

    Falls back to ``"<unknown>"`` when every frame belongs to a library (for
    example code running on a TensorFlow-owned thread).
    """
    frame = sys._getframe(skip)
    while frame is not None:
        code = frame.f_code
        if not is_library_frame(code.co_filename, frame.f_globals.get("__name__", "")):
            return f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
        frame = frame.f_back
    return "<unknown>"


def innermost_user_frame(frames: Iterable) -> str:
    """``"path:line in function"`` of the innermost user frame of a recorded stack, or "".

    ``frames`` are outermost first, each with ``filename``, ``lineno`` and
    ``name`` (``traceback.FrameSummary`` or a graph op's ``op.traceback``).
    """
    library = find_library_dirs()
    for frame in reversed(list(frames)):
        if not is_library_frame(frame.filename, library_dirs=library):
            return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return ""
