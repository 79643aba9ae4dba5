"""One place that reads a variable's name, dtype and shape, for TensorFlow,
tf-keras and Keras 3 alike.

``import equivtool`` makes ``tf.keras`` tf-keras, whose variables are
``tf.Variable``\\ s (``name`` ``"dense/kernel:0"``, ``dtype`` a ``tf.DType``,
``shape`` a ``tf.TensorShape``). ``import keras`` still gives Keras 3, whose
variables are its own class: ``name`` is the short name (``"kernel"``), the
scoped name is ``path`` (``"dense/kernel"``), ``dtype`` is a string and
``shape`` a tuple. Every part of equivtool that names, sizes or types a TF2
variable asks here, so both flavours give the same keys (the scoped name
without ``:N``) and the same ``tf.DType``.

A Keras 3 layer also lists its random-number state
(``seed_generator_state``, one per ``SeedGenerator``) among its
``variables``; that is not model state, has no TF1 counterpart and changes on
every dropout call, so :func:`layer_variables` leaves it out.
"""

from __future__ import annotations

import tensorflow as tf

from equivtool._base.names import strip_output_index

__all__ = ["is_keras3", "variable_name", "variable_dtype", "variable_shape", "layer_variables"]


def is_keras3(obj) -> bool:
    """True for a Keras 3 object (layer, model, variable, optimizer): one whose
    class, or a class it derives from, is defined in the ``keras`` package
    (tf-keras lives in ``tf_keras``)."""
    return any(cls.__module__.split(".", 1)[0] == "keras" for cls in type(obj).__mro__)


def variable_name(variable) -> str:
    """The scoped name without ``:N``: Keras 3's ``path``, else ``name``."""
    if is_keras3(variable):
        return str(variable.path)
    return strip_output_index(variable.name)


def variable_dtype(variable) -> tf.DType:
    """The variable's base ``tf.DType`` (a Keras 3 dtype is a string; a TF1
    reference variable's is ``float32_ref``)."""
    return tf.as_dtype(variable.dtype).base_dtype


def variable_shape(variable) -> tf.TensorShape:
    """The variable's shape as a ``tf.TensorShape`` (a Keras 3 shape is a tuple)."""
    return tf.TensorShape(variable.shape)


def layer_variables(layer) -> list:
    """The model state of a TF2 layer or model: its ``variables``, except a Keras 3
    layer's random-number state (its ``weights`` are exactly the rest)."""
    if is_keras3(layer):
        return list(layer.weights)
    return list(layer.variables)
