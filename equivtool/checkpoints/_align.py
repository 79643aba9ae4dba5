"""Weight alignment for a native rewrite: both sides start from the same values.

TF1's initializers and tf-keras' draw different numbers for the same
distribution and shape, even under the random tool (tf-keras initializers
draw from a counter of their own), so a faithful native rewrite
(``tf.keras.layers.Conv2D`` for ``slim.conv2d``) would fail every step that
runs from initial values (``random/*``, ``gradients``, ``optimizer``) through
no fault of its own, and those failures would hide real ones.

With ``check_equivalence(..., rename=map_variables(...))`` every variable
starts, on both sides, from a fixed value that depends only on its mapped
name and shape (:func:`equivtool.engine.sides.runners.fixed_value`, the ``fixed_weights``
step's values: kernels scaled by fan-in, batch-norm variances positive):

* TF1: the variable's initializer is replaced before it is built, so it adds
  no random op and the forward pass's random ops (dropout, noise) get the
  operation seeds they would get first in line;
* TF2: the variable is created by its own initializer (tf-keras' counter,
  which seeds no forward op) and then assigned the value.

What those steps then compare is the forward pass's random ops and its
arithmetic. Each side computes the values itself, so the sides stay
independent (``workers=2`` still runs them in two processes).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import tensorflow as tf

from equivtool.engine.sides.runners import fixed_value, variable_key

#: How the report says the weights were aligned.
ALIGNED = ("weights aligned: every variable starts on both sides from a fixed value of its mapped name and "
           "shape (a native rewrite's initializers draw other numbers than TF1's, so initializers are not "
           "compared; the forward pass's random ops and arithmetic are)")


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

    def creator(next_creator, **kwargs):
        variable = next_creator(**kwargs)
        if variable.shape.is_fully_defined():
            key = variable_key(variable.name, renamer)
            # A declared transform (a VariableMapping's renamer): the TF1 variable's
            # value, in this variable's layout.
            declared = hasattr(renamer, "tf2_value")
            shape = renamer.tf1_shape(key, variable.shape.as_list()) if declared else variable.shape.as_list()
            value = fixed_value(key, shape, variable.dtype.base_dtype)
            with tf.init_scope():  # now, not as an op of the function being traced
                variable.assign(renamer.tf2_value(key, value) if declared else value)
        return variable

    with tf.variable_creator_scope(creator):
        yield
