"""Finds, checks and loads the compiled cross-entropy op library.

The library (``_xent_ops<EXT_SUFFIX>`` next to this file) is built by the
package install or by ``equivtool build-ops``. It embeds a build stamp,
``EQUIVTOOL_XENT_BUILD{tensorflow=<version>;cuda=<0|1>...}``, which is read
from the file's bytes *before* loading: a library compiled against another
TensorFlow may fail to load or, worse, load and misbehave, so a mismatch is
refused with an error naming the fix.
"""

from __future__ import annotations

import os
import re
import threading

import equivtool  # noqa: F401  (environment fix before TensorFlow)

from equivtool.ops._build import default_output

FIX_COMMAND = "equivtool build-ops"
_STAMP = re.compile(rb"EQUIVTOOL_XENT_BUILD\{([^}]*)\}")

_lock = threading.Lock()
_library = None


class OpLibraryError(RuntimeError):
    """The cross-entropy op library is missing, stale, or failed to load."""


def library_path() -> str:
    return os.environ.get("EQUIVTOOL_OPS_LIBRARY") or default_output()


def read_stamp(path: str) -> dict[str, str] | None:
    """The build stamp embedded in the library file, or None if it has none."""
    with open(path, "rb") as f:
        match = _STAMP.search(f.read())
    if match is None:
        return None
    fields = (item.split("=", 1) for item in match.group(1).decode().split(";") if item)
    return {key: value for key, value in fields}


def _check(path: str) -> dict[str, str]:
    import tensorflow as tf

    if not os.path.isfile(path):
        raise OpLibraryError(
            f"The equivtool cross-entropy op library is not built (looked for {path}). "
            f"Build it with `{FIX_COMMAND}` (it compiles against the TensorFlow "
            "installed in this environment).")
    stamp = read_stamp(path)
    if stamp is None or "tensorflow" not in stamp:
        raise OpLibraryError(
            f"{path} carries no equivtool build stamp, so the TensorFlow it was built "
            f"for is unknown. Rebuild it with `{FIX_COMMAND}`.")
    if stamp["tensorflow"] != tf.__version__:
        raise OpLibraryError(
            f"The equivtool cross-entropy op library at {path} was built for TensorFlow "
            f"{stamp['tensorflow']}, but this interpreter runs TensorFlow {tf.__version__}. "
            f"Rebuild it with `{FIX_COMMAND}`.")
    return stamp


def load_library():
    """The loaded op module (cached); raises :class:`OpLibraryError` with the fix."""
    global _library
    if _library is not None:
        return _library
    with _lock:
        if _library is None:
            import tensorflow as tf

            path = library_path()
            _check(path)
            try:
                _library = tf.load_op_library(path)
            except Exception as exc:  # NotFoundError for missing symbols, and the like
                raise OpLibraryError(
                    f"Loading the equivtool cross-entropy op library {path} failed: {exc}. "
                    f"Rebuild it with `{FIX_COMMAND}`.") from exc
    return _library


def op_status() -> dict:
    """The op library's state, for ``equivtool doctor``; never raises.

    Keys: built (file present), path, built_for_tf (from the stamp), cuda
    (GPU kernels compiled in), error (None when the library loads).
    """
    path = library_path()
    status = {"built": os.path.isfile(path), "path": path, "built_for_tf": None,
              "cuda": False, "error": None}
    try:
        if status["built"]:
            stamp = read_stamp(path) or {}
            status["built_for_tf"] = stamp.get("tensorflow")
            status["cuda"] = stamp.get("cuda") == "1"
        load_library()
    except OpLibraryError as exc:
        status["error"] = str(exc)
    except OSError as exc:
        status["error"] = f"cannot read {path}: {exc}. Rebuild it with `{FIX_COMMAND}`."
    return status
