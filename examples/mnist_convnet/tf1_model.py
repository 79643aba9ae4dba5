"""The classic Keras MNIST convnet, written as a TF1 graph with ``tf.compat.v1.layers``.

Conv 32 3x3 relu -> Conv 64 3x3 relu -> MaxPool 2 -> Dropout 0.25 -> Flatten
-> Dense 128 relu -> Dropout 0.5 -> Dense 10 (logits; the softmax belongs to
the loss). Valid padding throughout: 28 -> 26 -> 24 -> 12, so the flattened
features have 12 * 12 * 64 = 9216 entries and the model 1,199,882 parameters.

It is equivtool's small example: cheap enough to train for a few steps on
both sides of a migration. :func:`synthetic_batch` makes learnable data
without downloading MNIST.
"""

from __future__ import annotations

import equivtool  # noqa: F401  (must come before tensorflow)

import numpy as np
import tensorflow as tf

__all__ = ["IMAGE_SHAPE", "NUM_CLASSES", "SCOPE", "synthetic_batch", "tf1_forward"]

IMAGE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
SCOPE = "mnist_convnet"

_layers = tf.compat.v1.layers
_TEMPLATE_SEED = 20_150_612  # fixes the class templates, whatever the batch seed


def tf1_forward(images, training, reuse=None):
    """Builds the convnet on ``images`` [N, 28, 28, 1]; returns logits [N, 10].

    ``training`` (Python bool or boolean tensor) switches the two dropouts on.
    Variables live under ``mnist_convnet/`` as ``conv1``, ``conv2``, ``dense1``
    and ``logits``, each with ``kernel`` and ``bias``; creation order is the
    layer order. Pass ``reuse=True`` to build a second tower (e.g. for
    evaluation) on the same variables in one graph. Works unchanged inside a
    ``track_tf1_style_variables`` layer (see ``keras_model``), which reuses
    by itself.
    """
    with tf.compat.v1.variable_scope(SCOPE, reuse=reuse):
        net = _layers.conv2d(images, 32, 3, activation=tf.nn.relu, name="conv1")
        net = _layers.conv2d(net, 64, 3, activation=tf.nn.relu, name="conv2")
        net = _layers.max_pooling2d(net, 2, 2, name="pool")
        net = _layers.dropout(net, rate=0.25, training=training, name="dropout1")
        net = _layers.flatten(net, name="flatten")
        net = _layers.dense(net, 128, activation=tf.nn.relu, name="dense1")
        net = _layers.dropout(net, rate=0.5, training=training, name="dropout2")
        return _layers.dense(net, NUM_CLASSES, name="logits")


def synthetic_batch(batch_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A learnable stand-in for an MNIST batch, with no download.

    Each of the 10 classes has a fixed smooth 28x28 template (the same for
    every ``seed``); an image is its label's template plus Gaussian noise,
    clipped to [0, 1]. Returns ``(images, labels)``: float32 [N, 28, 28, 1]
    and int32 [N] in 0..9. The same ``(batch_size, seed)`` gives the same
    arrays on every machine.
    """
    if batch_size < 0:
        raise ValueError(f"batch_size must be >= 0, got {batch_size}.")
    templates = _class_templates()
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, NUM_CLASSES, size=batch_size).astype(np.int32)
    noise = rng.normal(0.0, 0.2, size=(batch_size,) + IMAGE_SHAPE)
    images = np.clip(templates[labels] + noise, 0.0, 1.0).astype(np.float32)
    return images, labels


def _class_templates() -> np.ndarray:
    """[10, 28, 28, 1] templates: a random 7x7 pattern upsampled 4x."""
    rng = np.random.default_rng(_TEMPLATE_SEED)
    coarse = rng.uniform(0.0, 1.0, size=(NUM_CLASSES, 7, 7))
    fine = np.kron(coarse, np.ones((4, 4)))
    return fine[..., np.newaxis]
