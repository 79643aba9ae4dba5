"""What a step captures: the variables, sessions and datasets ``fn`` reaches, and the random state.

See :mod:`equivtool.determinism` for what "the same starting state" means.
"""

from __future__ import annotations

import functools
import inspect
import random
import types
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from equivtool.determinism import _tf
from equivtool._base.names import strip_output_index
from equivtool.engine.sides.tf1_side import load_by_initializer


def _object_location(fn: Callable) -> str:
    fn = getattr(fn, "python_function", fn)
    fn = inspect.unwrap(fn) if callable(fn) else fn
    code = getattr(fn, "__code__", None)
    if code is None:
        return getattr(fn, "__qualname__", type(fn).__name__)
    return f"{code.co_filename}:{code.co_firstlineno} in {code.co_name}"


def _fn_name(fn: Callable) -> str:
    inner = getattr(fn, "python_function", fn)
    if isinstance(inner, functools.partial):
        inner = inner.func
    return getattr(inner, "__qualname__", None) or getattr(inner, "__name__", None) or type(inner).__name__



# ---------------------------------------------------------------------------
# What fn captures
# ---------------------------------------------------------------------------


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _captured(fn: Callable) -> list[tuple[str, Any]]:
    """(label, object) pairs that ``fn`` can reach directly: see the module docstring."""
    found: list[tuple[str, Any]] = []
    seen_fns: set[int] = set()

    def from_function(f: Any, label: str) -> None:
        if id(f) in seen_fns:
            return
        seen_fns.add(id(f))
        if hasattr(f, "python_function"):  # tf.function
            from_function(f.python_function, label)
            return
        if isinstance(f, functools.partial):
            from_function(f.func, label)
            for i, arg in enumerate(f.args):
                found.append((f"{label} argument {i}", arg))
            for key, arg in (f.keywords or {}).items():
                found.append((f"{label} argument {key}", arg))
            return
        if isinstance(f, types.MethodType):
            found.append((f"{label}.__self__", f.__self__))
            from_function(f.__func__, label)
            return
        f = inspect.unwrap(f)
        code = getattr(f, "__code__", None)
        if code is None:
            if callable(f) and not isinstance(f, type):  # a callable object
                found.append((f"{label} (callable object)", f))
                call = getattr(type(f), "__call__", None)
                if call is not None and hasattr(call, "__code__"):
                    from_function(call, label)
            return
        for name, cell in zip(code.co_freevars, f.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            found.append((name, value))
            if isinstance(value, types.FunctionType) or hasattr(value, "python_function"):
                from_function(value, name)
        module_globals = getattr(f, "__globals__", {})
        for name in sorted(_code_names(code)):
            if name in module_globals:
                value = module_globals[name]
                if isinstance(value, (types.ModuleType, type)):
                    continue
                found.append((name, value))
                if isinstance(value, types.FunctionType) or hasattr(value, "python_function"):
                    from_function(value, name)
        for i, default in enumerate(getattr(f, "__defaults__", None) or ()):
            found.append((f"default {i}", default))

    from_function(fn, _fn_name(fn))

    # One level into containers and plain objects.
    expanded: list[tuple[str, Any]] = []
    for label, obj in found:
        expanded.append((label, obj))
        for sub_label, sub in _children(label, obj):
            expanded.append((sub_label, sub))
            for sub2_label, sub2 in _children(sub_label, sub):
                expanded.append((sub2_label, sub2))
    return expanded


_MAX_CHILDREN = 200


def _children(label: str, obj: Any) -> list[tuple[str, Any]]:
    if isinstance(obj, (str, bytes, np.ndarray, types.ModuleType, type, tf.Tensor)):
        return []
    if isinstance(obj, Mapping):
        return [(f"{label}[{k!r}]", v) for k, v in list(obj.items())[:_MAX_CHILDREN]]
    if isinstance(obj, (list, tuple)):
        return [(f"{label}[{i}]", v) for i, v in enumerate(obj[:_MAX_CHILDREN])]
    if isinstance(obj, (tf.Module, tf.Variable, tf.data.Dataset, tf.data.Iterator, tf.Graph,
                        _tf.BaseSession)) or _is_trackable(obj):
        return []  # their variables are read through .variables, or the session's graph
    attributes = getattr(obj, "__dict__", None)
    if not isinstance(attributes, dict) or isinstance(obj, (types.FunctionType, types.MethodType)):
        return []
    return [(f"{label}.{k}", v) for k, v in list(attributes.items())[:_MAX_CHILDREN]
            if not k.startswith("__")]


def _is_trackable(obj: Any) -> bool:
    return isinstance(obj, _tf.Trackable)


def _is_variable(obj: Any) -> bool:
    # ``v.assign_add(...)`` returns an _UnreadVariable: a view, not a variable to restore.
    return isinstance(obj, tf.Variable) and type(obj).__name__ != "_UnreadVariable"


def _variables_of(obj: Any) -> list:
    if isinstance(obj, tf.Variable):
        return [obj] if _is_variable(obj) else []
    if isinstance(obj, tf.Module) or _is_trackable(obj):
        try:
            value = getattr(obj, "variables", None)
            if callable(value):
                value = value()
        except Exception:  # noqa: BLE001 - an object that cannot list its variables has none for us
            return []
        if isinstance(value, (list, tuple)):
            return [v for v in value if _is_variable(v)]
    return []


def _is_session(obj: Any) -> bool:
    return isinstance(obj, _tf.BaseSession)


# ---------------------------------------------------------------------------
# Variables: reading, writing, naming
# ---------------------------------------------------------------------------


class _VariableStore:
    """The variables being restored: eager ones directly, graph ones through their session."""

    def __init__(self, session=None):
        self.session = session
        self.variables: list = []
        self._ids: set[int] = set()

    def add(self, v) -> bool:
        if id(v) in self._ids:
            return False
        self._ids.add(id(v))
        self.variables.append(v)
        return True

    def holds(self, v) -> bool:
        return id(v) in self._ids

    @staticmethod
    def in_graph(v) -> bool:
        """A TF1 graph variable (RefVariables have no ``_in_graph_mode``: always graph)."""
        return bool(getattr(v, "_in_graph_mode", True))

    def _session_for(self, v):
        session = self.session or tf.compat.v1.get_default_session()
        if session is None or session.graph is not v.graph:
            raise ValueError(
                f"audit_determinism: variable {v.name!r} lives in a TF1 graph, and no session for that "
                "graph was given. Pass session=<the tf.compat.v1.Session that fn runs>.")
        return session

    def read(self) -> list[np.ndarray]:
        values: list = [None] * len(self.variables)
        graph_items = [(i, v) for i, v in enumerate(self.variables) if self.in_graph(v)]
        for i, v in enumerate(self.variables):
            if not self.in_graph(v):
                values[i] = np.array(v.numpy(), copy=True)
        if graph_items:
            session = self._session_for(graph_items[0][1])
            fetched = session.run([v for _, v in graph_items])
            for (i, _), value in zip(graph_items, fetched):
                values[i] = np.array(value, copy=True)
        return values

    def write(self, values: Sequence[np.ndarray]) -> None:
        for v, value in zip(self.variables, values):
            if self.in_graph(v):
                # Variable.load, without its deprecation warning: feed the initializer.
                session = self._session_for(v)
                load_by_initializer(session, [(v, value)])
            else:
                v.assign(value)

    def names(self) -> list[str]:
        counts: dict[str, int] = {}
        names = []
        for v in self.variables:
            name = strip_output_index(v.name)
            counts[name] = counts.get(name, 0) + 1
            names.append(name if counts[name] == 1 else f"{name} ({counts[name]})")
        return names


def _flatten_variables(variables: Any) -> list:
    """Variables from a variable, a list/tuple/set, a dict (values), a tf.Module, Keras object..."""
    if variables is None:
        return []
    if isinstance(variables, tf.Variable):
        return [variables]
    if isinstance(variables, Mapping):
        return [v for value in variables.values() for v in _flatten_variables(value)]
    if isinstance(variables, (list, tuple, set, frozenset)):
        return [v for value in variables for v in _flatten_variables(value)]
    found = _variables_of(variables)
    if found or isinstance(variables, tf.Module) or _is_trackable(variables):
        return found
    raise TypeError(
        f"audit_determinism: variables must be tf.Variables, a list or dict of them, or objects with "
        f"a .variables attribute (tf.Module, Keras layer, model or optimizer); got {type(variables).__name__}.")


# ---------------------------------------------------------------------------
# Seeds
# ---------------------------------------------------------------------------


class _RandomState:
    """The random state at the start of the audit, to start every run from and to restore."""

    def __init__(self) -> None:
        self.tf_seed, self.tf_rng_state = _tf.global_seed_state()
        self.np_state = np.random.get_state()
        self.py_state = random.getstate()

    def start_run(self, seed: Optional[int]) -> None:
        if seed is None:
            self.restore()
        else:
            tf.random.set_seed(seed)  # also clears the kernel cache
            np.random.set_state(self.np_state)
            random.setstate(self.py_state)

    def restore(self) -> None:
        _tf.set_global_seed_state(self.tf_seed, self.tf_rng_state)  # also clears the kernel cache
        np.random.set_state(self.np_state)
        random.setstate(self.py_state)
