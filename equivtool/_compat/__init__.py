"""Repairs for old TF1 libraries, part of the one import-time environment fix.

``equivtool._env.apply()`` (run by ``import equivtool``) calls :func:`install`.
Nothing here imports TensorFlow by itself: the tf-slim repairs run right after
``tf_slim`` is first imported (through a post-import hook on ``sys.meta_path``),
or at once if ``tf_slim`` was imported before equivtool.

Each repair is small, probes first whether the thing it repairs is missing or
broken, and does nothing where it works. What each one did is kept in a
:class:`Repair` record; ``equivtool doctor`` lists them (:func:`repairs`).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from dataclasses import dataclass

APPLIED, NOT_NEEDED, FAILED = "applied", "not needed", "failed"


@dataclass(frozen=True)
class Repair:
    """What one repair found and did.

    ``state`` is ``"applied"`` (the thing was missing or broken and is
    repaired), ``"not needed"`` (it already works: nothing changed) or
    ``"failed"`` (the repair could not be made; ``detail`` says why).
    """

    library: str
    name: str
    state: str
    detail: str

    def __str__(self) -> str:
        return f"{self.library} {self.name}: {self.state}" + (f" ({self.detail})" if self.detail else "")


_lock = threading.RLock()
_records: dict = {}  # (library, name) -> Repair
_slim_done = False


def _record(repair: Repair) -> None:
    _records[(repair.library, repair.name)] = repair


def repairs(import_libraries: bool = False) -> tuple:
    """The repairs made so far, in the order they were made.

    With ``import_libraries=True`` (``equivtool doctor``), tf-slim is imported
    first if it is installed, so that its repairs are known.
    """
    if import_libraries and "tf_slim" not in sys.modules:
        try:
            import tf_slim  # noqa: F401  (the post-import hook repairs it)
        except ImportError:
            pass
    _repair_slim_if_imported()
    with _lock:
        return tuple(_records.values())


def _repair_slim_if_imported() -> None:
    global _slim_done
    if "tf_slim" not in sys.modules or _slim_done:
        return
    with _lock:
        if _slim_done:
            return
        _slim_done = True
        from equivtool._compat import _tf_slim
        for repair in _tf_slim.apply():
            _record(repair)


class _RepairingLoader(importlib.abc.Loader):
    """Runs the real loader, then the repairs for the module just executed."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _repair_slim_if_imported()

    def __getattr__(self, name):  # get_resource_reader, is_package, ...
        return getattr(self._loader, name)


class _SlimImportHook(importlib.abc.MetaPathFinder):
    """Wraps the loader of the top-level ``tf_slim`` package; steps aside for anything else."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "tf_slim" or _slim_done:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _RepairingLoader(spec.loader)
        return spec


_HOOK = _SlimImportHook()


def install() -> None:
    """Arm the repairs (idempotent): at once if tf-slim is imported, else on its import."""
    if "tf_slim" in sys.modules:
        _repair_slim_if_imported()
    elif _HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _HOOK)
