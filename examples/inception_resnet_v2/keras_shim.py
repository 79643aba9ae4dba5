"""Inception-ResNet-v2 as a TF2 Keras layer that reuses the TF1 slim code.

This is step one of the migration workflow ("model mapping"): the TF1 build
function runs unchanged inside a ``tf.keras.layers.Layer`` whose ``call`` is
wrapped with ``track_tf1_style_variables``. The layer then owns the same
variables, under the same names, as the TF1 graph, which is what lets
equivtool compare the two numerically.

Three entry points share one argument convention:

* :class:`InceptionResnetV2` - the TF2 layer (eager or ``tf.function``);
* :func:`tf1_forward` - the TF1 build function the equivalence engine calls
  inside a fresh ``tf.Graph``;
* :func:`make_shim` - a factory returning a new layer.

Keyword arguments are routed by name: ``weight_decay``, ``batch_norm_decay``,
``batch_norm_epsilon``, ``batch_norm_updates_collections`` and
``batch_norm_scale`` configure :func:`inception_resnet_v2_arg_scope`;
``dropout_keep_prob``, ``create_aux_logits`` and ``scope`` configure
:func:`inception_resnet_v2`; ``activation_fn`` goes to both (the arg scope's
convolution activation and the residual blocks' activation), as in the
published configuration.
"""

from __future__ import annotations

from typing import Any, Mapping

import equivtool  # noqa: F401  (must come before tensorflow)

import tensorflow as tf
import tf_slim as slim

from .tf1_model import (
    inception_resnet_v2,
    inception_resnet_v2_arg_scope,
)

__all__ = ["InceptionResnetV2", "make_shim", "tf1_forward"]

_ARG_SCOPE_KWARGS = frozenset({
    "weight_decay", "batch_norm_decay", "batch_norm_epsilon",
    "batch_norm_updates_collections", "batch_norm_scale",
})
_MODEL_KWARGS = frozenset({"dropout_keep_prob", "create_aux_logits", "scope"})
_SHARED_KWARGS = frozenset({"activation_fn"})
_ACCEPTED = _ARG_SCOPE_KWARGS | _MODEL_KWARGS | _SHARED_KWARGS


def _split_kwargs(kwargs: Mapping[str, Any]) -> tuple[dict, dict]:
    """Returns (arg scope kwargs, model kwargs); rejects unknown names."""
    unknown = sorted(set(kwargs) - _ACCEPTED)
    if unknown:
        raise TypeError(
            f"unexpected keyword argument(s) {unknown} for Inception-ResNet-v2; "
            f"accepted: {sorted(_ACCEPTED)}. 'num_classes' is positional-or-"
            "keyword; 'is_training'/'training' is chosen per call.")
    arg_scope_kwargs = {k: v for k, v in kwargs.items()
                        if k in _ARG_SCOPE_KWARGS | _SHARED_KWARGS}
    model_kwargs = {k: v for k, v in kwargs.items()
                    if k in _MODEL_KWARGS | _SHARED_KWARGS}
    return arg_scope_kwargs, model_kwargs


def _build(inputs, is_training, num_classes, arg_scope_kwargs, model_kwargs):
    with slim.arg_scope(inception_resnet_v2_arg_scope(**arg_scope_kwargs)):
        return inception_resnet_v2(inputs, num_classes=num_classes,
                                   is_training=is_training, **model_kwargs)


def tf1_forward(inputs, training, num_classes: int = 1001, **kwargs):
    """Builds the TF1 model in the current graph; returns (logits, end_points).

    ``training`` is the model's ``is_training`` (a Python bool or a boolean
    tensor). Keyword arguments are routed as described in the module
    docstring.
    """
    arg_scope_kwargs, model_kwargs = _split_kwargs(kwargs)
    return _build(inputs, training, num_classes, arg_scope_kwargs, model_kwargs)


class InceptionResnetV2(tf.keras.layers.Layer):
    """The tf-slim Inception-ResNet-v2, mapped into a Keras layer.

    ``call(inputs, training=None)`` returns ``(logits, end_points)`` exactly
    like :func:`inception_resnet_v2`; the end points are ordered as built.
    ``training=None`` (Keras' default outside ``fit``) means inference:
    batch norm uses its moving statistics and dropout is off.

    Only the first call may create variables (``equivtool.creates_variables_once``);
    a later call that would create one raises ``equivtool.VariableCreationError``.
    """

    def __init__(self, num_classes: int = 1001, *, name: str | None = None,
                 **kwargs):
        self._arg_scope_kwargs, self._model_kwargs = _split_kwargs(kwargs)
        super().__init__(name=name)
        self.num_classes = num_classes

    @equivtool.creates_variables_once
    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, inputs, training=None):
        is_training = False if training is None else training
        return _build(inputs, is_training, self.num_classes,
                      self._arg_scope_kwargs, self._model_kwargs)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(num_classes=self.num_classes, **self._arg_scope_kwargs,
                      **self._model_kwargs)
        return config


def make_shim(num_classes: int = 1001, **kwargs) -> InceptionResnetV2:
    """Returns a new :class:`InceptionResnetV2` layer (the TF2 side)."""
    return InceptionResnetV2(num_classes, **kwargs)
