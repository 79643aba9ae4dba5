"""The environment fix that importing equivtool applies.

TensorFlow 2.16+ routes ``tf.keras`` to Keras 3, which has neither
``track_tf1_style_variables`` nor ``DeterministicRandomTestTool``; the TF1
tooling lives on in the ``tf-keras`` package, selected by
``TF_USE_LEGACY_KERAS=1`` *before* TensorFlow decides which Keras to load.
tf-slim 1.1.0 (through ``tensorflow.python.layers``) imports
``tf_keras.legacy_tf_layers.*``, which tf-keras moved to
``tf_keras.src.legacy_tf_layers.*``.

``apply()`` is idempotent and is the one documented global change equivtool
makes: it sets the environment variable, installs an import alias that is
consulted only when the old module names do not resolve by themselves, and
arms the repairs of ``equivtool._platform.compat``: TensorFlow's (graphs written as text
on protobuf 7) and tf-slim's (moved TensorFlow symbols, collection membership by
identity, eager name scopes, checkpoint slices), which run when that library is
imported and each do nothing where it already works. ``equivtool doctor`` lists
what each repair did.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from dataclasses import dataclass

from equivtool._platform.tf_internals import KERAS_LEGACY_TF_LAYERS

LEGACY_KERAS_VAR = "TF_USE_LEGACY_KERAS"
_TRUE_VALUES = ("1", "true", "True")
_OLD_PREFIX = "tf_keras.legacy_tf_layers"
_NEW_PREFIX = KERAS_LEGACY_TF_LAYERS  # a private tf-keras location, named in _tf_internals


class EquivtoolEnvironmentError(RuntimeError):
    """Raised when TensorFlow's TF1 tooling cannot work in this interpreter."""


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str):
        self._target = target

    def create_module(self, spec):
        module = importlib.import_module(self._target)
        return module

    def exec_module(self, module):  # the target module is already executed
        return None


class _LegacyLayersAliasFinder(importlib.abc.MetaPathFinder):
    """Resolves ``tf_keras.legacy_tf_layers[.x]`` to ``tf_keras.src.legacy_tf_layers[.x]``.

    It sits first in ``sys.meta_path`` so that a submodule is served as the
    very module object tf-keras itself uses (the regular path finder would
    otherwise execute ``normalization.py`` a second time under the old name,
    duplicating its classes). It steps aside when the old package resolves by
    itself, so a tf-keras that still ships the old layout is left untouched.
    """

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _OLD_PREFIX and not fullname.startswith(_OLD_PREFIX + "."):
            return None
        if fullname == _OLD_PREFIX:
            if importlib.machinery.PathFinder.find_spec(fullname, path) is not None:
                return None  # the old layout exists natively
        elif sys.modules.get(_OLD_PREFIX) is not sys.modules.get(_NEW_PREFIX):
            return None  # the parent is the native package, not our alias
        new_name = _NEW_PREFIX + fullname[len(_OLD_PREFIX):]
        try:
            new_spec = importlib.util.find_spec(new_name)
        except (ImportError, ValueError):
            return None
        if new_spec is None:
            return None
        return importlib.util.spec_from_loader(
            fullname, _AliasLoader(new_name),
            is_package=new_spec.submodule_search_locations is not None)


_FINDER = _LegacyLayersAliasFinder()


def _legacy_keras_requested() -> bool:
    return os.environ.get(LEGACY_KERAS_VAR) in _TRUE_VALUES


def _tf_keras_resolution() -> str | None:
    """Which Keras ``tf.keras`` resolved to, if TensorFlow already decided."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return None
    loader = tf.__dict__.get("keras")
    if loader is None or not getattr(loader, "_tfll_initialized", False):
        return None
    return getattr(loader, "_tfll_keras_version", None)


def apply() -> None:
    """Make the TF1 tooling importable; raise if it is too late to do so."""
    if "tensorflow" not in sys.modules:
        if not _legacy_keras_requested():
            os.environ[LEGACY_KERAS_VAR] = "1"
    else:
        resolved = _tf_keras_resolution()
        if resolved == "keras_3" or (resolved is None and not _legacy_keras_requested()):
            raise EquivtoolEnvironmentError(
                "TensorFlow was imported before equivtool without "
                f"{LEGACY_KERAS_VAR}=1, so tf.keras is Keras 3, which has no "
                "track_tf1_style_variables and no DeterministicRandomTestTool. "
                f"Either set {LEGACY_KERAS_VAR}=1 in the environment before "
                "starting Python, or put `import equivtool` before "
                "`import tensorflow`.")
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    from equivtool._platform import compat as _compat
    _compat.install()


@dataclass(frozen=True)
class VersionCheck:
    tensorflow: str
    tf_keras: str
    tf_slim: str | None
    numpy: str


def _minor(version: str) -> tuple[int, int]:
    parts = version.split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def check_versions() -> VersionCheck:
    """Import TensorFlow and tf-keras and refuse a pair of different minor versions."""
    import numpy
    import tensorflow as tf
    try:
        import tf_keras
    except ImportError as exc:
        raise EquivtoolEnvironmentError(
            "tf-keras is not installed; install the one matching TensorFlow "
            f"{tf.__version__}: pip install 'tf-keras~={'.'.join(map(str, _minor(tf.__version__)))}.0'"
        ) from exc
    if _minor(tf.__version__) != _minor(tf_keras.__version__):
        raise EquivtoolEnvironmentError(
            f"tf-keras {tf_keras.__version__} does not match TensorFlow "
            f"{tf.__version__}: their minor versions must be equal. Install "
            f"pip install 'tf-keras~={'.'.join(map(str, _minor(tf.__version__)))}.0'")
    try:
        import tf_slim
        slim_version = getattr(tf_slim, "__version__", None) or _dist_version("tf-slim")
    except ImportError:
        slim_version = None
    return VersionCheck(tf.__version__, tf_keras.__version__, slim_version, numpy.__version__)


def _dist_version(dist: str) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def legacy_keras_active() -> bool:
    """True when ``tf.keras`` is (or will be) tf-keras."""
    resolved = _tf_keras_resolution()
    if resolved is not None:
        return resolved == "tf_keras"
    return _legacy_keras_requested()


def slim_fix_state() -> str:
    """``"native"`` if tf-keras still ships the old layer modules, ``"aliased"``
    if they resolve through equivtool's alias, ``"broken"`` if neither."""
    try:
        parent = importlib.import_module("tf_keras")
        if importlib.machinery.PathFinder.find_spec(_OLD_PREFIX, parent.__path__) is not None:
            return "native"
        module = importlib.import_module(_OLD_PREFIX + ".normalization")
    except ImportError:
        return "broken"
    return "aliased" if module is sys.modules.get(_NEW_PREFIX + ".normalization") else "broken"
