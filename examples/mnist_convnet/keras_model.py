"""The MNIST convnet as a TF2 Keras layer that runs the TF1 code unchanged.

:class:`MnistConvNet` wraps :func:`examples.mnist_convnet.tf1_model.tf1_forward`
in a ``call`` decorated with ``track_tf1_style_variables``: the
``tf.compat.v1.layers`` calls are the same, so the layer's variables carry the
TF1 graph's names (``mnist_convnet/conv1/kernel`` ...). Only the first call
may create them (``equivtool.creates_variables_once``).
"""

from __future__ import annotations

import equivtool  # noqa: F401  (must come before tensorflow)

import tensorflow as tf

from .tf1_model import synthetic_batch, tf1_forward

__all__ = ["MnistConvNet", "make_model", "synthetic_batch"]


class MnistConvNet(tf.keras.layers.Layer):
    """``call(images, training=None) -> logits``; ``training=None`` is inference."""

    @equivtool.creates_variables_once
    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, inputs, training=None):
        return tf1_forward(inputs, False if training is None else training)


def make_model(name: str | None = None) -> MnistConvNet:
    """Returns a new, unbuilt :class:`MnistConvNet` layer."""
    return MnistConvNet(name=name)
