"""Repairs for TensorFlow and old TF1 libraries, part of the one import-time environment fix.

``equivtool._platform.env.apply()`` (run by ``import equivtool``) calls :func:`install`.
Nothing here imports TensorFlow by itself: the repairs of a library run right
after it is first imported (through a post-import hook on ``sys.meta_path``),
or at once if it was imported before equivtool. The libraries, and the module
here that repairs each, are :data:`LIBRARIES`: TensorFlow (``_tensorflow``:
its own defects on a dependency it allows) and tf-slim (``_tf_slim``).

Each repair is small, probes first whether the thing it repairs is missing or
broken, and does nothing where it works. What each one did is kept in a
:class:`Repair` record; ``equivtool doctor`` lists them (:func:`repairs`).
A module-level patch goes through a :class:`ModuleProxy`, so the module it
stands for keeps its own behaviour everywhere else.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import threading
import types
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


# top-level module -> the module of equivtool._platform.compat whose apply() repairs it, in import order
LIBRARIES = {"tensorflow": "_tensorflow", "tf_slim": "_tf_slim"}

_lock = threading.RLock()
_records: dict = {}  # (library, name) -> Repair
_done: set = set()   # the top-level modules whose repairs have run


def _record(repair: Repair) -> None:
    _records[(repair.library, repair.name)] = repair


def repairs(import_libraries: bool = False) -> tuple:
    """The repairs made so far, in the order they were made.

    With ``import_libraries=True`` (``equivtool doctor``), TensorFlow and
    tf-slim are imported first where installed, so that their repairs are known.
    """
    for name in LIBRARIES:
        if import_libraries and name not in sys.modules:
            try:
                importlib.import_module(name)  # the post-import hook repairs it
            except ImportError:
                pass
        _repair_if_imported(name)
    with _lock:
        return tuple(_records.values())


def _repair_if_imported(name: str) -> None:
    if name not in sys.modules or name in _done:
        return
    with _lock:
        if name in _done:
            return
        _done.add(name)
        module = importlib.import_module(f"{__name__}.{LIBRARIES[name]}")
        for repair in module.apply():
            _record(repair)


class ModuleProxy(types.ModuleType):
    """Stands for a module (``tensorflow.python.framework.ops``, ``tf.compat.v1``,
    protobuf's ``text_format``) inside one other module: every attribute is the
    real module's except the few repaired ones, set with ``object.__setattr__``."""

    def __init__(self, real: types.ModuleType):
        super().__init__(real.__name__, real.__doc__)
        object.__setattr__(self, "_equivtool_real", real)

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "_equivtool_real"), name)


def real_module(proxy: ModuleProxy) -> types.ModuleType:
    """The module a :class:`ModuleProxy` stands for."""
    return object.__getattribute__(proxy, "_equivtool_real")


def proxied(module_name: str, attribute: str) -> ModuleProxy:
    """The module's ``attribute`` (a module), replaced by a proxy the first time it is needed."""
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    current = getattr(module, attribute)
    if not isinstance(current, ModuleProxy):
        current = ModuleProxy(current)
        setattr(module, attribute, current)
    return current


class _RepairingLoader(importlib.abc.Loader):
    """Runs the real loader, then the repairs of the library just executed."""

    def __init__(self, loader, name: str):
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _repair_if_imported(self._name)

    def __getattr__(self, name):  # get_resource_reader, is_package, ...
        return getattr(self._loader, name)


class _ImportHook(importlib.abc.MetaPathFinder):
    """Wraps the loader of a repaired library's top-level package; steps aside for anything else."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in LIBRARIES or fullname in _done:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _RepairingLoader(spec.loader, fullname)
        return spec


_HOOK = _ImportHook()


def install() -> None:
    """Arm the repairs (idempotent): at once for a library already imported, else on its import."""
    for name in LIBRARIES:
        _repair_if_imported(name)
    if not all(name in sys.modules for name in LIBRARIES) and _HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _HOOK)
