"""``tf1_python``'s arguments, checked before any work (see :mod:`equivtool.engine.sides.old_python`).

Apart from the side itself so that the options (:mod:`equivtool.engine.options`)
can check them without importing the engine's sides.
"""

from __future__ import annotations

import os
import pkgutil
import shutil
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from equivtool.engine.options import Options

#: The reason a step or option is not run in the TF1 interpreter.
NOT_YET = "not yet run in the TF1 interpreter (tf1_python)"


def _is_name(value) -> bool:
    """``"module:function"``."""
    return isinstance(value, str) and value.count(":") == 1 and all(value.split(":"))


def check_tf1_python(tf1_python, tf1_fn, tf1_path, loss_fn, optimizers=None) -> tuple:
    """``(tf1_python, tf1_path, loss_fn, tf1_loss)`` checked before any work: an
    executable interpreter, ``tf1_fn`` and the TF1 optimizer factory named as
    ``"module:function"``, ``tf1_path`` a sequence of folders (returned with the
    current folder last). ``loss_fn`` is None or a ``"module:function"`` name too:
    imported there for the TF1 side (``tf1_loss``, the name) and here for the
    TF2 side (``loss_fn``, the function)."""
    if not isinstance(tf1_python, (str, os.PathLike)) or not os.fspath(tf1_python):
        raise TypeError(f"tf1_python: expected the path of a TensorFlow 1.x interpreter, got {tf1_python!r}")
    path = shutil.which(os.fspath(tf1_python)) or os.fspath(tf1_python)
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise ValueError(f"tf1_python: {os.fspath(tf1_python)!r} is not an executable file; expected the path of "
                         "a TensorFlow 1.x interpreter (make one with: equivtool tf1-env DIR)")
    if optimizers is not None and not (isinstance(optimizers, (tuple, list)) and len(optimizers) == 2
                                       and _is_name(optimizers[0]) and callable(optimizers[1])):
        raise TypeError("optimizers: with tf1_python, expected (\"module:make_tf1_optimizer\", "
                        f"make_tf2_optimizer): the TF1 factory is imported in that interpreter; got {optimizers!r}")
    if not _is_name(tf1_fn):
        raise TypeError("tf1_fn: with tf1_python, expected \"module:function\" (imported in that interpreter), "
                        f"got {tf1_fn!r}")
    if isinstance(tf1_path, (str, os.PathLike)) or not all(isinstance(p, (str, os.PathLike)) for p in tf1_path):
        raise TypeError(f"tf1_path: expected a list of folders, got {tf1_path!r}")
    folders = tuple(dict.fromkeys([os.path.abspath(os.fspath(p)) for p in tf1_path] + [os.getcwd()]))
    if loss_fn is None:
        return os.path.abspath(path), folders, None, None
    if not _is_name(loss_fn):
        raise TypeError("loss_fn: with tf1_python, expected \"module:function\" (imported in both interpreters: "
                        f"the same loss for each side), got {loss_fn!r}")
    return os.path.abspath(path), folders, _import_here(loss_fn, folders), loss_fn


def _import_here(name: str, folders: tuple):
    """``name`` (``"module:function"``) imported in this interpreter, ``folders`` after its own path."""
    added = [folder for folder in folders if folder not in sys.path]
    sys.path.extend(added)
    try:
        found = pkgutil.resolve_name(name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"loss_fn: cannot import {name!r} here, where the TF2 side computes the same loss: "
                         f"{type(exc).__name__}: {exc}") from None
    finally:
        for folder in added:
            sys.path.remove(folder)
    if not callable(found):
        raise TypeError(f"loss_fn: {name!r} is {type(found).__name__}, expected a function "
                        "loss_fn(outputs, regularization_loss)")
    return found


def refusal_reason(options: "Options") -> str | None:
    """Why these options cannot run with ``tf1_python`` yet (one line), or None."""
    if options.strategy is not None:
        return "strategy: not supported with tf1_python"
    if options.aligned:
        return "rename=VariableMapping: not supported with tf1_python"
    return None
