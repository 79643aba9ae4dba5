"""Finds, checks and loads the compiled cross-entropy op library.

The library (``_xent_ops<EXT_SUFFIX>`` next to this file) is built by the
package install or by ``equivtool build-ops``. Before it is handed to
``dlopen`` (a damaged library there kills the interpreter with SIGBUS or
SIGSEGV, no exception), the whole file is checked:

- its integrity trailer, ``EQUIVTOOL_XENT_DIGEST{sha256=<hex>;size=<n>}``,
  which the build appends after the ELF image (the dynamic loader ignores
  trailing bytes): the SHA-256 of the first ``n`` bytes must match, so a
  truncated file, flipped bytes or a library built without the trailer is
  refused;
- its build stamp, ``EQUIVTOOL_XENT_BUILD{tensorflow=<version>;cuda=0;gpu=nvrtc}``:
  a library compiled against another TensorFlow may fail to load or, worse,
  load and misbehave; one with ``cuda=1`` (GPU kernels compiled in by nvcc,
  as equivtool built them before issue 39) is refused too.

Every refusal is an :class:`OpLibraryError` naming the fix, ``equivtool
build-ops``.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading


from equivtool.ops._build import default_output

FIX_COMMAND = "equivtool build-ops"
_STAMP = re.compile(rb"EQUIVTOOL_XENT_BUILD\{([^}]*)\}")
_TRAILER = re.compile(rb"\nEQUIVTOOL_XENT_DIGEST\{sha256=([0-9a-f]{64});size=([0-9]+)\}\n\Z")
_TRAILER_MAX = 128  # bytes: the trailer is searched for in the file's tail only

_lock = threading.Lock()
_library = None
_gpu_kernels = None  # _gpu.GpuKernels, once the library is loaded


class OpLibraryError(RuntimeError):
    """The cross-entropy op library is missing, stale, or failed to load."""


def library_path() -> str:
    return os.environ.get("EQUIVTOOL_OPS_LIBRARY") or default_output()


def _refuse(path: str, what: str) -> OpLibraryError:
    return OpLibraryError(
        f"The equivtool cross-entropy op library at {path} {what}; loading it could crash "
        f"the interpreter, so it is not loaded. Rebuild it with `{FIX_COMMAND}`.")


def _verified_image(path: str, data: bytes) -> bytes:
    """The library's bytes before its trailer, after checking its digest."""
    match = _TRAILER.search(data[-_TRAILER_MAX:])
    if match is None:
        raise _refuse(path, "carries no integrity digest (it is truncated, damaged, or "
                            "was built by an older equivtool)")
    size = int(match.group(2))
    image = data[:size]
    if size != len(data) - len(match.group(0)) \
            or hashlib.sha256(image).hexdigest().encode() != match.group(1):
        raise _refuse(path, "does not match its integrity digest (the file is damaged)")
    return image


def _parse_stamp(path: str, data: bytes) -> dict[str, str] | None:
    match = _STAMP.search(data)
    if match is None:
        return None
    try:
        text = match.group(1).decode("utf-8")
    except UnicodeDecodeError:
        raise _refuse(path, "has a build stamp that is not UTF-8 text") from None
    fields = {}
    for item in filter(None, text.split(";")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise _refuse(path, f"has a malformed build stamp field {item!r} (expected key=value)")
        fields[key] = value
    return fields


def read_stamp(path: str) -> dict[str, str] | None:
    """The build stamp embedded in the library file, or None if it has none.

    Raises OpLibraryError (naming ``equivtool build-ops``) for a malformed stamp.
    """
    with open(path, "rb") as f:
        return _parse_stamp(path, f.read())


def _check(path: str) -> dict[str, str]:
    import tensorflow as tf

    if not os.path.isfile(path):
        raise OpLibraryError(
            f"The equivtool cross-entropy op library is not built (looked for {path}). "
            f"Build it with `{FIX_COMMAND}` (it compiles against the TensorFlow "
            "installed in this environment).")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise _refuse(path, f"cannot be read ({exc})") from exc
    stamp = _parse_stamp(path, _verified_image(path, data))
    if stamp is None or "tensorflow" not in stamp:
        raise OpLibraryError(
            f"{path} carries no equivtool build stamp, so the TensorFlow it was built "
            f"for is unknown. Rebuild it with `{FIX_COMMAND}`.")
    if stamp["tensorflow"] != tf.__version__:
        raise OpLibraryError(
            f"The equivtool cross-entropy op library at {path} was built for TensorFlow "
            f"{stamp['tensorflow']}, but this interpreter runs TensorFlow {tf.__version__}. "
            f"Rebuild it with `{FIX_COMMAND}`.")
    if stamp.get("cuda", "0") != "0":
        raise OpLibraryError(
            f"The equivtool cross-entropy op library at {path} was built by an older equivtool, "
            "with GPU kernels compiled in by nvcc; this equivtool compiles them at run time "
            f"with NVRTC. Rebuild it with `{FIX_COMMAND}`.")
    return stamp


def load_library():
    """The loaded op module (cached); raises :class:`OpLibraryError` with the fix."""
    global _library, _gpu_kernels
    if _library is not None:
        return _library
    with _lock:
        if _library is None:
            import tensorflow as tf

            from equivtool.ops import _gpu

            path = library_path()
            _check(path)
            try:
                library = tf.load_op_library(path)
            except Exception as exc:  # NotFoundError for missing symbols, and the like
                raise OpLibraryError(
                    f"Loading the equivtool cross-entropy op library {path} failed: {exc}. "
                    f"Rebuild it with `{FIX_COMMAND}`.") from exc
            # the run-time GPU kernels, before any op is placed (never raises)
            _gpu_kernels = _gpu.enable(path)
            _library = library
    return _library


def op_status() -> dict:
    """The op library's state, for ``equivtool doctor``; never raises.

    Keys: built (file present), path, built_for_tf (from the stamp),
    gpu_kernels (where the GPU kernels come from, ``_gpu.GpuKernels``: NVRTC
    at run time, or none and why; None before the library loads), error
    (None when the library loads). A library that fails its integrity check
    is never loaded.
    """
    path = library_path()
    status = {"built": os.path.isfile(path), "path": path, "built_for_tf": None,
              "gpu_kernels": None, "error": None}
    try:
        if status["built"]:
            stamp = read_stamp(path) or {}
            status["built_for_tf"] = stamp.get("tensorflow")
        load_library()
        status["gpu_kernels"] = _gpu_kernels
    except OpLibraryError as exc:
        status["error"] = str(exc)
    except OSError as exc:
        status["error"] = f"cannot read {path}: {exc}. Rebuild it with `{FIX_COMMAND}`."
    except Exception as exc:  # documented never to raise
        status["error"] = f"{type(exc).__name__}: {exc}. Rebuild it with `{FIX_COMMAND}`."
    return status
