"""Weight alignment for a native rewrite: both sides start from the same values.

TF1's initializers and tf-keras' draw different numbers for the same
distribution and shape, even under the random tool (tf-keras initializers
draw from a counter of their own), so a faithful native rewrite
(``tf.keras.layers.Conv2D`` for ``slim.conv2d``) would fail every step that
runs from initial values (``random/*``, ``gradients``, ``optimizer``) through
no fault of its own, and those failures would hide real ones.

With ``check_equivalence(..., rename=map_variables(...))`` every variable
starts, on both sides, from a fixed value that depends only on its mapped
name and shape (:func:`equivtool.engine.sides.tf1_side.fixed_value`, the ``fixed_weights``
step's values: kernels scaled by fan-in, batch-norm variances positive):

* TF1: the variable's initializer is replaced before it is built, so it adds
  no random op and the forward pass's random ops (dropout, noise) get the
  operation seeds they would get first in line;
* TF2: the variable is created by its own initializer (tf-keras' counter,
  which seeds no forward op) and then assigned the value. A Keras 3 variable
  wraps a ``tf.Variable`` named by its short name (``kernel``); it is assigned
  once it exists, by its ``path``, from Keras 3's own ``_initialize`` (wrapped
  for the scope, on the scope's thread only, and put back on exit).

What those steps then compare is the forward pass's random ops and its
arithmetic. Each side computes the values itself, so the sides stay
independent (``workers=2`` still runs them in two processes).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

import tensorflow as tf

from equivtool._platform import tf_internals as _tfi
from equivtool.engine.sides.tf1_side import fixed_value, variable_key
from equivtool.variables.flavour import variable_dtype, variable_name, variable_shape


@contextlib.contextmanager
def tf1_aligned(options, side) -> Iterator[None]:
    """In the graph of ``side`` (a TF1Side): each variable built with its fixed
    value instead of its initializer."""
    if not getattr(options, "aligned", None):
        yield
        return
    renamer = options.renamer

    def creator(next_creator, **kwargs):
        shape, dtype = kwargs.get("shape"), kwargs.get("dtype")
        name = kwargs.get("name")
        if name and shape is not None and tf.TensorShape(shape).is_fully_defined() and dtype is not None:
            value = fixed_value(variable_key(name, renamer), tf.TensorShape(shape).as_list(), dtype)
            kwargs["initial_value"] = lambda: tf.constant(value)
        return next_creator(**kwargs)

    with side.graph.as_default(), tf.compat.v1.variable_creator_scope(creator):
        yield


@contextlib.contextmanager
def tf2_aligned(options) -> Iterator[None]:
    """Each variable created in this scope takes its fixed value right after it
    is created (eagerly, once, also while a ``tf.function`` is traced)."""
    if not getattr(options, "aligned", None):
        yield
        return
    renamer: Callable[[str], str] = options.renamer

    def assign_fixed(variable) -> None:
        shape = variable_shape(variable)
        if shape.is_fully_defined():
            key = variable_key(variable_name(variable), renamer)
            # A declared transform (a VariableMapping's renamer): the TF1 variable's
            # value, in this variable's layout.
            declared = hasattr(renamer, "tf2_value")
            tf1_shape = renamer.tf1_shape(key, shape.as_list()) if declared else shape.as_list()
            value = fixed_value(key, tf1_shape, variable_dtype(variable))
            with tf.init_scope():  # now, not as an op of the function being traced
                variable.assign(renamer.tf2_value(key, value) if declared else value)

    def creator(next_creator, **kwargs):
        variable = next_creator(**kwargs)
        assign_fixed(variable)  # a Keras 3 variable's inner one is assigned again below, by path
        return variable

    with tf.variable_creator_scope(creator), _keras3_assigned(assign_fixed):
        yield


# Open _keras3_assigned scopes: token -> (thread, assign). Keras 3's _initialize is
# wrapped while there is one, and put back when the last one ends, in whatever
# order they end and on whichever thread.
_keras3_lock = threading.Lock()
_keras3_scopes: dict = {}
_keras3_saved: list = []  # [(class, its own _initialize)] while wrapped


def _keras3_initialize(original):
    def _initialize(self, value):
        original(self, value)
        here = threading.get_ident()
        for thread, assign in list(_keras3_scopes.values()):
            if thread == here:
                assign(self)
    return _initialize


@contextlib.contextmanager
def _keras3_assigned(assign: Callable) -> Iterator[None]:
    """Keras 3 variables created on this thread in the scope get ``assign(variable)``
    once their value exists."""
    cls = _tfi.keras3_variable_class()
    if cls is None:
        yield
        return
    token = object()
    with _keras3_lock:
        if not _keras3_saved:
            original = cls.__dict__["_initialize"]
            _keras3_saved.append((cls, original))
            cls._initialize = _keras3_initialize(original)
        _keras3_scopes[token] = (threading.get_ident(), assign)
    try:
        yield
    finally:
        with _keras3_lock:
            _keras3_scopes.pop(token, None)
            if not _keras3_scopes and _keras3_saved:
                saved_cls, original = _keras3_saved.pop()
                saved_cls._initialize = original
