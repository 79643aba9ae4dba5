"""Small Keras 3 models for tests/test_keras3_end_state.py (and the CLI tests there).

* ``tf1_net``: a tf-slim conv + batch norm (``fused=False``: the update Keras 3
  makes) + dense net, without dropout, so a resumed run draws no random numbers;
* ``Net``: its faithful Keras 3 rewrite, registered with Keras so that
  ``keras.saving.load_model`` rebuilds it from a ``.keras`` file;
* ``TO_TF1``: the rules mapping ``Net``'s variable paths to ``tf1_net``'s names;
* optimizer factories for ``convert-checkpoint --optimizer``.
"""

from __future__ import annotations

import equivtool  # noqa: F401  (environment fix before TensorFlow)
import keras
import numpy as np
import tensorflow as tf
import tf_slim as slim

X = np.random.RandomState(0).randn(4, 5, 5, 2).astype("float32")
TO_TF1 = {r"/kernel$": "/weights", r"/bias$": "/biases", r"^net/bn/": "net/conv1/BatchNorm/"}


def tf1_net(x, training):
    with tf.compat.v1.variable_scope("net"):
        h = slim.conv2d(x, 3, [3, 3], scope="conv1")
        h = slim.batch_norm(h, decay=0.9, epsilon=1e-3, scale=True, is_training=training, fused=False,
                            scope="conv1/BatchNorm")
        return slim.fully_connected(slim.flatten(h), 4, activation_fn=None, scope="logits")


@keras.saving.register_keras_serializable("equivtool_tests")
class Net(keras.Model):
    def __init__(self, momentum=0.9, name="net", **kwargs):
        super().__init__(name=name, **kwargs)
        self.momentum = momentum
        self.conv = keras.layers.Conv2D(3, 3, padding="same", activation="relu", name="conv1")
        self.bn = keras.layers.BatchNormalization(momentum=momentum, epsilon=1e-3, name="bn")
        self.flat = keras.layers.Flatten()
        self.fc = keras.layers.Dense(4, name="logits")

    def call(self, x, training=False):
        return self.fc(self.flat(self.bn(self.conv(x), training=training)))

    def get_config(self):
        return {"momentum": self.momentum, "name": self.name}


def adam():
    return keras.optimizers.Adam(0.01, epsilon=1e-8)


def tf_keras_net():
    """A tf-keras model: a .keras file with a Keras 3 optimizer cannot hold it."""
    return tf.keras.Sequential([tf.keras.Input((5, 5, 2)), tf.keras.layers.Flatten(), tf.keras.layers.Dense(4)],
                               name="net")


def features_model():
    """features [N, 6] -> relu(dense 4) -> dense 3 ``scores``: the model of a ``.weights.h5`` file."""
    inputs = keras.Input((6,), name="features")
    hidden = keras.layers.Dense(4, activation="relu", name="hidden")(inputs)
    return keras.Model(inputs, keras.layers.Dense(3, name="scores")(hidden))


def deeper_model():
    """``features_model`` with one more layer: not the model of its weights file."""
    inputs = keras.Input((6,), name="features")
    hidden = keras.layers.Dense(4, activation="relu", name="hidden")(inputs)
    hidden = keras.layers.Dense(4, activation="relu", name="extra")(hidden)
    return keras.Model(inputs, keras.layers.Dense(3, name="scores")(hidden))


SMALL_BATCH = np.random.RandomState(0).randn(2, 4, 4, 2).astype("float32")  # n = 2 x 16 per channel
BN_RENAME = {r"/weights$": "/kernel", r"/biases$": "/bias", r"conv1/BatchNorm/": "bn/"}


def fused_slim_net(x, training, decay=0.9):
    """slim's batch norm left at its default: fused for a 4-D input."""
    with tf.compat.v1.variable_scope("net"):
        h = slim.conv2d(x, 3, [3, 3], scope="conv1")
        h = slim.batch_norm(h, decay=decay, epsilon=1e-3, scale=True, is_training=training, scope="conv1/BatchNorm")
        return slim.fully_connected(slim.flatten(h), 4, activation_fn=None, scope="logits")


# A one-layer Transformer encoder on dict int inputs (token ids and a padding mask):
# the TF1 original (BERT's layout: query/key/value/output dense layers) and its
# Keras 3 rewrite (Embedding, MultiHeadAttention, LayerNormalization, Dense).
VOCAB, LENGTH, HIDDEN, HEADS, CLASSES = 11, 5, 8, 2, 3
HEAD_SIZE = HIDDEN // HEADS
FEATURES = {"input_ids": np.random.RandomState(0).randint(0, VOCAB, (2, LENGTH)).astype("int32"),
            "input_mask": np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], "int32")}


def tf1_encoder(features, training, heads_last=False):
    """``heads_last``: the projected width split as ``i * heads + head`` (not BERT's ``head * head_size + i``)."""
    v1 = tf.compat.v1
    ids, mask = features["input_ids"], features["input_mask"]
    with v1.variable_scope("encoder"):
        table = v1.get_variable("word_embeddings", [VOCAB, HIDDEN],
                                initializer=v1.truncated_normal_initializer(stddev=0.02))
        x = tf.gather(table, ids)

        def heads(t):  # [batch, length, heads * head_size] -> [batch, heads, length, head_size]
            if heads_last:
                return tf.transpose(tf.reshape(t, [-1, LENGTH, HEAD_SIZE, HEADS]), [0, 3, 1, 2])
            return tf.transpose(tf.reshape(t, [-1, LENGTH, HEADS, HEAD_SIZE]), [0, 2, 1, 3])
        with v1.variable_scope("attention"):
            query = heads(v1.layers.dense(x, HIDDEN, name="query")) * np.float32(1.0 / np.sqrt(HEAD_SIZE))
            key = heads(v1.layers.dense(x, HIDDEN, name="key"))
            value = heads(v1.layers.dense(x, HIDDEN, name="value"))
            scores = tf.matmul(query, key, transpose_b=True)
            scores += (1.0 - tf.cast(mask[:, None, None, :], tf.float32)) * np.float32(-1e9)
            context = tf.matmul(tf.nn.softmax(scores), value)
            context = tf.reshape(tf.transpose(context, [0, 2, 3, 1] if heads_last else [0, 2, 1, 3]),
                                 [-1, LENGTH, HIDDEN])
            attended = v1.layers.dense(context, HIDDEN, name="output")
        x = slim.layer_norm(x + attended, begin_norm_axis=-1, begin_params_axis=-1, scope="layer_norm")
        x = v1.layers.dense(x, HIDDEN, activation=tf.nn.relu, name="intermediate")
        return v1.layers.dense(x[:, 0], CLASSES, name="classifier")


class TransposedDense(keras.layers.Dense):
    """A planted slip: a square kernel applied transposed."""

    def call(self, inputs):
        return self.activation(tf.einsum("btj,ij->bti", inputs, self.kernel) + self.bias)


class Encoder(keras.Model):
    def __init__(self, slip=False):
        super().__init__(name="encoder")
        self.embedding = keras.layers.Embedding(VOCAB, HIDDEN, name="word_embeddings")
        self.attention = keras.layers.MultiHeadAttention(HEADS, HEAD_SIZE, name="attention")
        self.norm = keras.layers.LayerNormalization(epsilon=1e-12, name="layer_norm")
        self.intermediate = (TransposedDense if slip else keras.layers.Dense)(HIDDEN, activation="relu",
                                                                             name="intermediate")
        self.classifier = keras.layers.Dense(CLASSES, name="classifier")

    def call(self, features, training=False):
        x = self.embedding(features["input_ids"])
        mask = tf.cast(features["input_mask"], tf.bool)[:, None, :]
        x = self.norm(x + self.attention(x, x, attention_mask=mask, training=training))
        return self.classifier(self.intermediate(x)[:, 0])


# A tf-keras end state: a .keras file that tf_keras.models.load_model reads, optimizer included.
TF_KERAS_TO_TF1 = {r"^logits/": "net/logits/", r"/kernel$": "/weights", r"/bias$": "/biases"}


def tf1_dense_net(x, training):
    with tf.compat.v1.variable_scope("net"):
        return slim.fully_connected(slim.flatten(x), 4, activation_fn=None, scope="logits")


def tf_keras_dense_net():
    """``tf1_dense_net`` rewritten in tf-keras (``tf.keras`` under equivtool)."""
    return tf.keras.Sequential([tf.keras.Input((5, 5, 2)), tf.keras.layers.Flatten(),
                                tf.keras.layers.Dense(4, name="logits")], name="net")


def tf_keras_adam():
    return tf.keras.optimizers.Adam(0.01, epsilon=1e-8)


def bare_dense():
    """A bare Keras 3 layer: no model, so no compiled optimizer to save."""
    return keras.layers.Dense(4, name="logits")
