"""Step 1 of the equivalence workflow: variables are created once.

The guards behind :func:`equivtool.assert_no_variable_creations`,
:func:`equivtool.catch_and_raise_created_variables` and
:func:`equivtool.creates_variables_once` (see :mod:`equivtool.variables`,
which exports them). Each installs a variable creator as
``tf.variable_creator_scope`` does, so it sees ``tf.Variable``,
``tf.compat.v1.get_variable`` (tf-slim, ``tf.compat.v1.layers``) and Keras
``add_weight``, eagerly and while a ``tf.function`` is traced, and removes
exactly its own creator when it ends, in whatever order guards end and on
whichever thread.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import re
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from equivtool._base.stack import user_frame_location
from equivtool._platform import tf_internals as _tfi
from equivtool._platform.tf_internals import tf_decorator
from equivtool._base.names import strip_output_index as _strip_output_index
from equivtool.variables.flavour import variable_dtype, variable_name, variable_shape


class VariableCreationError(ValueError):
    """A variable was created where the workflow expects every variable to be reused."""

    # tf.function's autograph re-raises an error from traced code as the same
    # type only when its constructor is Exception's; otherwise users would see a
    # StagingError instead of this class.
    __init__ = Exception.__init__


# --------------------------------------------------------------------------
# What a creation request looks like
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class CreatedVariable:
    """One variable creation seen by a guard: what was asked for, and from where."""

    name: str
    shape: str
    dtype: str
    trainable: bool
    location: str

    def __str__(self) -> str:
        return (f"{self.name} (shape={self.shape}, dtype={self.dtype}, "
                f"trainable={self.trainable}) created at {self.location}")


def _requested_shape(kwargs: Mapping[str, Any]) -> str:
    shape = kwargs.get("shape")
    if shape is None:
        initial_value = kwargs.get("initial_value")
        if isinstance(initial_value, functools.partial):
            shape = initial_value.keywords.get("shape")
            if shape is None and initial_value.args:
                shape = initial_value.args[0]
        elif initial_value is not None and not callable(initial_value):
            shape = getattr(initial_value, "shape", None)
            if shape is None:
                shape = np.shape(initial_value)
    if shape is None:
        return "?"
    try:
        return str(tuple(tf.TensorShape(shape).as_list()))
    except (TypeError, ValueError):
        return str(shape)


def _requested_dtype(kwargs: Mapping[str, Any]) -> str:
    dtype = kwargs.get("dtype")
    if dtype is None:
        initial_value = kwargs.get("initial_value")
        dtype = getattr(initial_value, "dtype", None)
    if dtype is None:
        return "?"
    try:
        return tf.as_dtype(dtype).name
    except TypeError:
        return str(dtype)


def _requested_trainable(kwargs: Mapping[str, Any]) -> bool:
    trainable = kwargs.get("trainable")
    if trainable is None:
        # TensorFlow's own default: ON_READ variables are not trainable.
        return kwargs.get("synchronization") != tf.VariableSynchronization.ON_READ
    return bool(trainable)


def _requested_name(kwargs: Mapping[str, Any]) -> str:
    name = kwargs.get("name") or "Variable"
    name = str(name)
    if "/" not in name:
        scope = tf.get_current_name_scope()
        if scope:
            name = f"{scope.rstrip('/')}/{name}"
    return name


def _describe_request(kwargs: Mapping[str, Any]) -> CreatedVariable:
    return CreatedVariable(
        name=_requested_name(kwargs), shape=_requested_shape(kwargs),
        dtype=_requested_dtype(kwargs), trainable=_requested_trainable(kwargs),
        location=user_frame_location(skip=2))


def _describe_variable(variable, location: str) -> CreatedVariable:
    return CreatedVariable(
        name=variable_name(variable),
        shape=str(tuple(variable_shape(variable).as_list())) if variable_shape(variable).rank is not None else "?",
        dtype=variable_dtype(variable).name, trainable=bool(variable.trainable),
        location=location)


# --------------------------------------------------------------------------
# Step 1: guards
# --------------------------------------------------------------------------

# tf.variable_creator_scope's priority for user creators.
_CREATOR_PRIORITY = 100


@dataclass(frozen=True, eq=False)
class _InstalledCreator:
    """One entry of a guard: the creator-stack item it added, and where."""

    slots: dict
    item: tuple
    thread: int
    previous: list   # the stack before the entry, put back on an in-order exit
    installed: list  # the stack the entry made


class _GuardBase(contextlib.ContextDecorator):
    """A variable creator installed on the current default graph for the current thread.

    It adds ``(100, creator)`` to the graph's creator stack as
    ``tf.variable_creator_scope`` does (which is per graph and per thread;
    ``tf.function`` traces inherit the outer graph's creators, so a guard
    entered eagerly also covers functions traced inside it). On exit it
    removes exactly its own item from the stack of the thread that entered
    it, whatever the order of exits and on whichever thread the exit runs;
    TensorFlow's own scope refuses an out-of-order exit and leaves the later
    guard installed.
    """

    def __init__(self) -> None:
        self._installed: list = []

    def _creator(self, next_creator, **kwargs):  # pragma: no cover - abstract
        raise NotImplementedError

    def __enter__(self):
        slots = _tfi.variable_creator_slots(tf.compat.v1.get_default_graph())
        item = (_CREATOR_PRIORITY, self._creator)  # a new tuple: identity marks this entry
        stack = list(slots["_variable_creator_stack"])
        stack.append(item)
        stack.sort(key=lambda entry: entry[0])  # stable, as TensorFlow's
        previous = slots["_variable_creator_stack"]
        slots["_variable_creator_stack"] = stack
        self._installed.append(_InstalledCreator(slots, item, threading.get_ident(), previous, stack))
        return self

    def __exit__(self, exc_type, exc, tb):
        self._uninstall()
        return False

    def _uninstall(self) -> None:
        # The latest entry made on this thread; an exit on another thread
        # (a generator closed elsewhere) ends the latest entry of all.
        me = threading.get_ident()
        index = next((i for i in range(len(self._installed) - 1, -1, -1)
                      if self._installed[i].thread == me), len(self._installed) - 1)
        entry = self._installed.pop(index)
        stack = entry.slots.get("_variable_creator_stack", [])
        if stack is entry.installed:
            # In order: the very list that was there before, as TensorFlow's own
            # scopes expect (they check the stack's identity when they exit).
            entry.slots["_variable_creator_stack"] = entry.previous
        else:
            entry.slots["_variable_creator_stack"] = [item for item in stack if item is not entry.item]


class assert_no_variable_creations(_GuardBase):  # noqa: N801 (reads as a function)
    """Fail at the moment a variable is created inside the block.

    Use it as a context manager or a decorator::

        layer(x)                      # first call creates the weights
        with equivtool.assert_no_variable_creations():
            layer(x)                  # must reuse them

    Raises :class:`VariableCreationError` naming the variable (name, shape,
    dtype, trainable) and the user's source line that asked for it.
    """

    def _creator(self, next_creator, **kwargs):
        created = _describe_request(kwargs)
        raise VariableCreationError(
            f"Variable {created.name} was about to be created inside "
            f"assert_no_variable_creations(): shape={created.shape}, "
            f"dtype={created.dtype}, trainable={created.trainable}, requested at "
            f"{created.location}. Every variable must be created on the first "
            "call and reused afterwards; in a shim layer, create variables with "
            "tf.compat.v1.get_variable or tf-slim inside the "
            "track_tf1_style_variables-decorated method, or create Keras layers "
            "once (in __init__ or via get_or_create_layer).")


def _group_by_prefix(created: Sequence[CreatedVariable]) -> "collections.OrderedDict[str, list]":
    groups: "collections.OrderedDict[str, list]" = collections.OrderedDict()
    for item in created:
        prefix = item.name.rsplit("/", 1)[0] if "/" in item.name else "(no scope)"
        groups.setdefault(prefix, []).append(item)
    return groups


class catch_and_raise_created_variables(_GuardBase):  # noqa: N801
    """Let variables be created inside the block, then raise listing all of them.

    Unlike :func:`assert_no_variable_creations`, the block runs to its end, so
    one run shows every offending variable, grouped by scope. An exception
    raised inside the block propagates unchanged.
    """

    def __init__(self) -> None:
        super().__init__()
        self.created: list[CreatedVariable] = []

    def _creator(self, next_creator, **kwargs):
        location = user_frame_location(skip=2)
        variable = next_creator(**kwargs)
        self.created.append(_describe_variable(variable, location))
        return variable

    def __enter__(self):
        self.created = []
        return super().__enter__()

    def __exit__(self, exc_type, exc, tb):
        self._uninstall()
        if exc_type is None and self.created:
            lines = [f"{len(self.created)} variable(s) were created inside "
                     "catch_and_raise_created_variables(); expected none:"]
            for prefix, items in _group_by_prefix(self.created).items():
                lines.append(f"  {prefix}/ ({len(items)})")
                lines.extend(f"    {item}" for item in items)
            raise VariableCreationError("\n".join(lines))
        return False


def creates_variables_once(method: Callable) -> Callable:
    """Decorate a layer method so that only each instance's first call may create variables.

    Works stacked with ``track_tf1_style_variables`` in either order::

        class MyLayer(tf.keras.layers.Layer):
            @equivtool.creates_variables_once
            @tf.compat.v1.keras.utils.track_tf1_style_variables
            def call(self, inputs, training=None):
                ...

    A later call that creates a variable raises :class:`VariableCreationError`
    naming it. The first call counts as done only when it returns; instances
    are tracked separately (and weakly, so layers are not kept alive).
    """
    if not callable(method):
        raise TypeError(
            f"creates_variables_once expects a method to decorate, got {type(method).__name__}")
    completed: "weakref.WeakSet" = weakref.WeakSet()
    in_first_call: "weakref.WeakSet" = weakref.WeakSet()

    def wrapper(self, *args, **kwargs):
        if self in completed:
            try:
                with assert_no_variable_creations():
                    return method(self, *args, **kwargs)
            except VariableCreationError as exc:
                message = second_call_message(str(exc), [v.name for v in getattr(self, "variables", ())])
                if message == str(exc):
                    raise
                raise VariableCreationError(message) from None
        if self in in_first_call:  # a re-entrant call during the first call
            return method(self, *args, **kwargs)
        in_first_call.add(self)
        try:
            result = method(self, *args, **kwargs)
        finally:
            in_first_call.discard(self)
        completed.add(self)
        return result

    # A TFDecorator (like track_tf1_style_variables uses) keeps the wrapped
    # method's signature visible to Keras, which decides from it whether to
    # pass `training` and `mask`.
    decorated = tf_decorator.make_decorator(method, wrapper, decorator_name="creates_variables_once")
    decorated._equivtool_creates_variables_once = True  # type: ignore[attr-defined]
    return decorated


# --------------------------------------------------------------------------
# The cause behind a second call's new variable: a uniquified scope
# --------------------------------------------------------------------------

_CREATED = re.compile(r"Variable (?P<name>\S+) was about to be created")
_UNIQUIFIED = re.compile(r"^(?P<base>.+)_(?P<number>\d+)$")


def _base(part: str) -> str:
    match = _UNIQUIFIED.match(part)
    return part if match is None else match["base"]


def uniquified_scope(created: str, existing: Sequence[str]) -> tuple[str, str] | None:
    """``(new scope, first call's scope)`` when ``created`` lies in a scope that is a
    uniquified copy (``bert_1/``) of the scope of an ``existing`` variable with the
    same path otherwise (``bert/``, or ``bert_2/`` after earlier copies); ``None``
    otherwise. Matched by structure (the paths with that scope's number removed),
    not by the suffix number."""
    parts = _strip_output_index(created).split("/")
    known = [_strip_output_index(name).split("/") for name in existing]
    for i, part in enumerate(parts[:-1]):
        if _UNIQUIFIED.match(part) is None:
            continue
        wanted = parts[:i] + [_base(part)] + parts[i + 1:]
        for other in known:
            tail = other[len(other) - len(parts):] if len(other) >= len(parts) else None
            if tail is None or tail == parts or tail[i] == part:
                continue
            if tail[:i] + [_base(tail[i])] + tail[i + 1:] == wanted:
                return "/".join(parts[:i + 1]), "/".join(tail[:i + 1])
    return None


def second_call_message(message: str, existing: Sequence[str]) -> str:
    """A guard's message on a layer's second call, with the cause named when the
    new variable's scope is a uniquified copy of the first call's (``default_name``)."""
    found = _CREATED.search(message)
    scopes = None if found is None else uniquified_scope(found["name"], existing)
    if scopes is None:
        return message
    new, original = scopes
    head = message.split(" Every variable must be created", 1)[0]
    return (f"{head}. Its scope {new}/ is a uniquified copy of {original}/, where the first call created it: "
            f"the variable scope gets a new name on every call, as variable_scope(None, default_name=...) "
            f"does (or a scope name entered again without reuse). Pass an explicit scope, or reuse "
            f"(variable_scope(..., reuse=tf.compat.v1.AUTO_REUSE)).")
