"""tf-slim 1.1.0 on TensorFlow 2.16+: the repairs, each a no-op where things work.

tf-slim 1.1.0 (the last release) reaches into TensorFlow's private modules.
TensorFlow has since moved some of those names elsewhere, TF2 semantics
changed two things tf-slim relies on, and NumPy 1.23 one more. Four kinds of
repair, all in memory (installed files are never edited):

1. **Moved TensorFlow symbols** (``ops.Tensor``, ``array_ops.unstack``, ...):
   where a private module lacks a name tf-slim uses, the name is added to that
   module, pointing at the object's new home. A name that exists is never
   touched.
2. **Collection membership by identity**: ``var not in ops.get_collection(c)``
   compares with ``==``, which under TF2 tensor equality is element-wise for
   eager variables (``ValueError: The truth value of an array ... is
   ambiguous``). Where that happens, the tf-slim modules that test membership
   see collections as lists whose ``in`` compares identity, which is what
   ``==`` meant for variables in TF1.
3. **Name scopes in eager execution**: ``ops.name_scope`` yields ``None`` when
   executing eagerly, so slim layers that name their outputs after their name
   scope (``max_pool2d``, ``flatten``, ...) fail with ``'NoneType' object is not
   subscriptable`` when ``outputs_collections`` is set (vgg, alexnet,
   overfeat). Where that happens, ``tf_slim.layers.layers`` gets a name scope
   that yields the scope's name eagerly too, as it does in a graph.
4. **Partitioned variables from a checkpoint**: ``slim.assign_from_checkpoint``
   cuts each partition's slice out of the checkpoint value with
   ``value[[slice, slice]]``, a list of slices, which NumPy >= 1.23 rejects
   (``IndexError: only integers, slices ...``). Where NumPy rejects it, the
   checkpoint reader ``tf_slim.ops.variables`` opens hands out values that
   read such a list as the tuple it meant.

Each module-level patch of repairs 2 to 4 goes through a ``ModuleProxy`` inside one
tf-slim module, so TensorFlow's own modules keep their behaviour; repair 1 adds names only.
"""

from __future__ import annotations

import importlib
import sys
import warnings

import numpy as np

from equivtool._platform.compat import APPLIED, FAILED, NOT_NEEDED, ModuleProxy, Repair, proxied, real_module

LIBRARY = "tf-slim"

# (module, name, home module, name there): names tf-slim 1.1.0 and its tests use
# that TensorFlow moved. Found by scanning tf-slim for attribute uses of the
# TensorFlow modules it imports, and by running tf-slim's own test suite.
MOVED_SYMBOLS = (
    ("tensorflow.python.framework.ops", "Tensor", "tensorflow.python.framework.tensor", "Tensor"),
    ("tensorflow.python.framework.ops", "IndexedSlices",
     "tensorflow.python.framework.indexed_slices", "IndexedSlices"),
    ("tensorflow.python.ops.array_ops", "stack", "tensorflow.python.ops.array_ops_stack", "stack"),
    ("tensorflow.python.ops.array_ops", "unstack", "tensorflow.python.ops.array_ops_stack", "unstack"),
    ("tensorflow.python.ops.control_flow_ops", "Assert",
     "tensorflow.python.ops.control_flow_assert", "Assert"),
    ("tensorflow.python.ops.control_flow_ops", "case", "tensorflow.python.ops.control_flow_case", "case"),
    ("tensorflow.python.ops.control_flow_ops", "cond", "tensorflow.python.ops.cond", "cond"),
    ("tensorflow.python.ops.control_flow_ops", "while_loop", "tensorflow.python.ops.while_loop", "while_loop"),
    ("tensorflow.python.ops.variable_scope", "enable_resource_variables",
     "tensorflow.python.ops.resource_variables_toggle", "enable_resource_variables"),
    ("tensorflow.python.ops.variable_scope", "disable_resource_variables",
     "tensorflow.python.ops.resource_variables_toggle", "disable_resource_variables"),
    ("tensorflow.python.ops.variable_scope", "resource_variables_enabled",
     "tensorflow.python.ops.resource_variables_toggle", "resource_variables_enabled"),
    # variable_scope.variable(...) was VariableV1 with TF1's keyword arguments.
    ("tensorflow.python.ops.variable_scope", "variable", "tensorflow.python.ops.variable_v1", "VariableV1"),
    ("tensorflow.python.ops.variables", "VariableV1", "tensorflow.python.ops.variable_v1", "VariableV1"),
)

# tf-slim modules whose `x not in ops.get_collection(...)` guards a variable's
# collection membership (layers._add_variable_to_collections, variables.add_model_variable).
MEMBERSHIP_MODULES = ("tf_slim.layers.layers", "tf_slim.ops.variables")
# tf-slim modules whose layers name their outputs after `ops.name_scope(...)`.
NAME_SCOPE_MODULES = ("tf_slim.layers.layers",)
# tf-slim modules that slice checkpoint values with a list of slices (assign_from_checkpoint).
CHECKPOINT_MODULES = ("tf_slim.ops.variables",)


def apply() -> list:
    """Make every repair that is needed; return one :class:`Repair` per repair."""
    results = [_moved_symbols()]
    for make in (_membership, _eager_name_scope, _checkpoint_slices):
        try:
            results.append(make())
        except Exception as exc:  # a repair that cannot be made is reported, never raised at import
            results.append(Repair(LIBRARY, make.__name__.strip("_").replace("_", " "), FAILED,
                                  f"{type(exc).__name__}: {exc}"))
    return results


# -- 1. moved symbols -------------------------------------------------------

def _moved_symbols() -> Repair:
    added, failed = [], []
    for module_name, name, home_name, home_attr in MOVED_SYMBOLS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue  # nothing uses a module that does not exist
        if hasattr(module, name):
            continue
        try:
            value = getattr(importlib.import_module(home_name), home_attr)
        except (ImportError, AttributeError) as exc:
            failed.append(f"{module_name.rsplit('.', 1)[-1]}.{name} ({exc})")
            continue
        setattr(module, name, value)
        added.append(f"{module_name.rsplit('.', 1)[-1]}.{name}")
    name = "moved TensorFlow symbols"
    if failed:
        return Repair(LIBRARY, name, FAILED, "cannot find " + ", ".join(failed))
    if not added:
        return Repair(LIBRARY, name, NOT_NEEDED, "")
    return Repair(LIBRARY, name, APPLIED, "added " + ", ".join(added))


class _IdentityList(list):
    """A collection's items, where ``in`` compares identity (TF1's ``==`` for variables)."""

    def __contains__(self, item) -> bool:
        return any(member is item for member in self)


# -- 2. collection membership -------------------------------------------------

def _membership_is_broken() -> bool:
    """Whether ``==`` between tensors/variables is element-wise (TF2's tensor
    equality), which makes tf-slim's ``var in collection`` raise. Read from
    TensorFlow's switch rather than by comparing two variables: creating
    eager variables here would initialise the runtime at ``import tf_slim``,
    before the user could configure devices (logical CPUs, GPU memory growth)."""
    from equivtool._platform import tf_internals as _tf_internals
    return _tf_internals.tensor_equality_enabled()


def _repaired(module_name: str, attribute: str) -> bool:
    """Whether the module's ``ops`` is already our proxy with ``attribute`` repaired."""
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    return isinstance(module.ops, ModuleProxy) and attribute in vars(module.ops)


def _membership() -> Repair:
    name = "collection membership by identity"
    todo = [m for m in MEMBERSHIP_MODULES if not _repaired(m, "get_collection")]
    if not todo or not _membership_is_broken():
        return Repair(LIBRARY, name, NOT_NEEDED, "")
    for module_name in todo:
        proxy = proxied(module_name, "ops")
        real_get_collection = real_module(proxy).get_collection

        def get_collection(key, scope=None, _real=real_get_collection):
            return _IdentityList(_real(key, scope))

        object.__setattr__(proxy, "get_collection", get_collection)
    return Repair(LIBRARY, name, APPLIED, "ops.get_collection in " + ", ".join(todo))


# -- 3. eager name scopes ------------------------------------------------------

def _name_scope_is_broken(module_name: str) -> bool:
    import tensorflow as tf
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    with tf.init_scope():
        with module.ops.name_scope("equivtool_probe", "Probe", []) as scope:
            return scope is None


def _eager_name_scope() -> Repair:
    name = "eager name scopes for outputs_collections"
    broken = [m for m in NAME_SCOPE_MODULES if _name_scope_is_broken(m)]
    if not broken:
        return Repair(LIBRARY, name, NOT_NEEDED, "")
    for module_name in broken:
        proxy = proxied(module_name, "ops")
        real_name_scope = real_module(proxy).name_scope

        def name_scope(name, default_name=None, values=None, skip_on_eager=True, _real=real_name_scope):
            # In a graph this is the real call; eagerly the scope is entered
            # (and its name returned) instead of skipped.
            return _real(name, default_name, values, skip_on_eager=False)

        object.__setattr__(proxy, "name_scope", name_scope)
    return Repair(LIBRARY, name, APPLIED, "ops.name_scope in " + ", ".join(broken))


# -- 4. checkpoint values sliced with a list of slices ---------------------------

def _slice_list_is_rejected() -> bool:
    """Whether NumPy refuses ``array[[slice, ...]]`` (NumPy >= 1.23; before, a FutureWarning)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            np.zeros(2)[[slice(0, 1)]]
        except IndexError:
            return True
    return False


class _SliceListArray(np.ndarray):
    """A checkpoint value whose ``[...]`` reads a list of slices as a tuple of
    them (what NumPy < 1.23 did); what indexing returns is a plain array."""

    def __getitem__(self, key):
        if isinstance(key, list) and key and all(isinstance(k, slice) for k in key):
            key = tuple(key)
        result = super().__getitem__(key)
        return result.view(np.ndarray) if isinstance(result, np.ndarray) else result


class _CheckpointReader:
    """A ``tf.train.NewCheckpointReader`` whose ``get_tensor`` values are :class:`_SliceListArray`."""

    def __init__(self, reader):
        self._equivtool_real = reader

    def __getattr__(self, name):
        return getattr(self._equivtool_real, name)

    def get_tensor(self, name):
        value = self._equivtool_real.get_tensor(name)
        return value.view(_SliceListArray) if isinstance(value, np.ndarray) else value


def _checkpoint_slices() -> Repair:
    name = "checkpoint slices of partitioned variables"
    todo = []
    for module_name in CHECKPOINT_MODULES:
        module = sys.modules.get(module_name) or importlib.import_module(module_name)
        if not (isinstance(module.tf, ModuleProxy) and "train" in vars(module.tf)):
            todo.append(module_name)
    if not todo or not _slice_list_is_rejected():
        return Repair(LIBRARY, name, NOT_NEEDED, "")
    for module_name in todo:
        tf_proxy = proxied(module_name, "tf")
        train = ModuleProxy(real_module(tf_proxy).train)
        real_reader = real_module(train).NewCheckpointReader

        def new_checkpoint_reader(filepattern, _real=real_reader):
            return _CheckpointReader(_real(filepattern))

        object.__setattr__(train, "NewCheckpointReader", new_checkpoint_reader)
        object.__setattr__(tf_proxy, "train", train)
    return Repair(LIBRARY, name, APPLIED, "tf.train.NewCheckpointReader in " + ", ".join(todo))
