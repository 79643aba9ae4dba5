"""Small models for the native TF2 end state (tests/test_checkpoints*.py).

* ``slim_net``: a tf-slim conv + batch norm + dropout + dense model (TF1);
* ``NativeNet``: its faithful native tf-keras rewrite (``Conv2D``,
  ``BatchNormalization`` with slim's decay and epsilon, ``Dropout``, ``Dense``),
  whose variables have other names (``net/conv2d/kernel`` for ``net/conv1/weights``);
* ``two_dense`` / ``TwoDense``: two same-shape dense layers (a swap of their
  kernels is a planted fault the mapping cannot see by shape);
* ``embedding_net`` / ``NativeEmbedding``: an embedding lookup (sparse
  gradients), optionally with a partitioned table on the TF1 side.
"""

from __future__ import annotations

import equivtool  # noqa: F401  (environment fix before TensorFlow)
import numpy as np
import tensorflow as tf
import tf_slim as slim

v1 = tf.compat.v1
IMAGE = (2, 6, 6, 3)


def images(seed: int = 0) -> np.ndarray:
    return np.random.RandomState(seed).uniform(-1, 1, IMAGE).astype(np.float32)


def slim_net(inputs, training):
    end_points = {}
    with v1.variable_scope("net"):
        net = slim.conv2d(inputs, 4, 3, scope="conv1")
        end_points["conv1"] = net
        net = slim.batch_norm(net, decay=0.9, epsilon=1e-3, scale=True, is_training=training, scope="bn1")
        end_points["bn1"] = net
        net = slim.dropout(slim.flatten(net), 0.8, is_training=training, scope="dropout")
        end_points["logits"] = slim.fully_connected(net, 3, activation_fn=None, scope="logits")
    return end_points


class NativeNet(tf.keras.layers.Layer):
    """The native rewrite; ``momentum``, ``epsilon`` and ``rate`` plant faults."""

    def __init__(self, momentum=0.9, epsilon=1e-3, rate=0.2, activation="relu", **kwargs):
        super().__init__(name="net", **kwargs)
        self.conv = tf.keras.layers.Conv2D(4, 3, padding="same", activation=activation)
        self.bn = tf.keras.layers.BatchNormalization(momentum=momentum, epsilon=epsilon)
        self.flatten = tf.keras.layers.Flatten()
        self.dropout = tf.keras.layers.Dropout(rate)
        self.dense = tf.keras.layers.Dense(3)

    def call(self, inputs, training=None):
        end_points = {}
        net = self.conv(inputs)
        end_points["conv1"] = net
        net = self.bn(net, training=training)
        end_points["bn1"] = net
        net = self.dropout(self.flatten(net), training=training)
        end_points["logits"] = self.dense(net)
        return end_points


def two_dense(inputs, training):
    end_points = {}
    with v1.variable_scope("mlp"):
        net = slim.flatten(inputs)
        net = slim.fully_connected(net, 8, scope="fc1")
        end_points["fc1"] = net
        net = slim.fully_connected(net, 8, scope="fc2")
        end_points["fc2"] = net
        net = slim.fully_connected(net, 8, activation_fn=None, scope="fc3")
        end_points["fc3"] = net
    return end_points


class TwoDense(tf.keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(name="mlp", **kwargs)
        self.flatten = tf.keras.layers.Flatten()
        # Named sublayers: their variable names do not depend on how many
        # Dense layers this process made before, so the proposed rules hold.
        self.fc1 = tf.keras.layers.Dense(8, activation="relu", name="first")
        self.fc2 = tf.keras.layers.Dense(8, activation="relu", name="hidden")
        self.fc3 = tf.keras.layers.Dense(8, name="top")

    def call(self, inputs, training=None):
        end_points = {}
        net = self.fc1(self.flatten(inputs))
        end_points["fc1"] = net
        net = self.fc2(net)
        end_points["fc2"] = net
        end_points["fc3"] = self.fc3(net)
        return end_points


VOCAB, EMBED = 12, 4


def token_ids(seed: int = 0) -> np.ndarray:
    ids = np.random.RandomState(seed).randint(0, VOCAB, size=(2, 5)).astype(np.int32)
    ids[0, 0] = ids[1, 2] = 3  # a repeated id: its gradient rows add up
    return ids


def embedding_net(ids, training, partitions: int = 1):
    with v1.variable_scope("emb"):
        partitioner = v1.fixed_size_partitioner(partitions) if partitions > 1 else None
        table = v1.get_variable("table", [VOCAB, EMBED], partitioner=partitioner,
                                initializer=v1.random_uniform_initializer(-0.5, 0.5))
        net = tf.reduce_mean(tf.nn.embedding_lookup(table, ids), axis=1)
        return slim.fully_connected(net, 2, activation_fn=None, scope="out")


def partitioned_embedding_net(ids, training):
    return embedding_net(ids, training, partitions=3)


class NativeEmbedding(tf.keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(name="emb", **kwargs)
        self.table = tf.keras.layers.Embedding(VOCAB, EMBED)
        self.out = tf.keras.layers.Dense(2)

    def call(self, ids, training=None):
        return self.out(tf.reduce_mean(self.table(ids), axis=1))


def train_tf1(tf1_fn, inputs, make_optimizer, steps: int, prefix: str, global_step: bool = True) -> str:
    """Train ``tf1_fn`` ``steps`` steps in TF1 (the engine's default loss) and save
    everything, slots included, with ``tf.compat.v1.train.Saver``; returns the path."""
    from equivtool.engine.sides.tf1_side import default_loss
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(1)
        outputs = tf1_fn(tf.constant(inputs), True)
        loss = default_loss(outputs, None)
        step = v1.train.get_or_create_global_step() if global_step else None
        with tf.control_dependencies(v1.get_collection(v1.GraphKeys.UPDATE_OPS)):
            train = make_optimizer().minimize(loss, global_step=step)
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            for _ in range(steps):
                session.run(train)
            return v1.train.Saver().save(session, prefix)


# The rules map_variables proposes for NativeNet, committed as a user would
# (tests/test_checkpoints_cli.py checks that they are still the proposal).
NATIVE_RENAME = [
    ('^net(?:_\\d+)?/conv2d(?:_\\d+)?/kernel$', 'net/conv1/weights'),
    ('^net(?:_\\d+)?/conv2d(?:_\\d+)?/bias$', 'net/conv1/biases'),
    ('^net(?:_\\d+)?/batch_normalization(?:_\\d+)?/gamma$', 'net/bn1/gamma'),
    ('^net(?:_\\d+)?/batch_normalization(?:_\\d+)?/beta$', 'net/bn1/beta'),
    ('^net(?:_\\d+)?/batch_normalization(?:_\\d+)?/moving_mean$', 'net/bn1/moving_mean'),
    ('^net(?:_\\d+)?/batch_normalization(?:_\\d+)?/moving_variance$', 'net/bn1/moving_variance'),
    ('^net(?:_\\d+)?/dense(?:_\\d+)?/kernel$', 'net/logits/weights'),
    ('^net(?:_\\d+)?/dense(?:_\\d+)?/bias$', 'net/logits/biases'),
]


def keras_adam():
    return tf.keras.optimizers.Adam(0.01, epsilon=1e-8)


EMBEDDING_RENAME = [(r"^emb(?:_\d+)?/embedding(?:_\d+)?/embeddings$", "emb/table"),
                    (r"^emb(?:_\d+)?/dense(?:_\d+)?/kernel$", "emb/out/weights"),
                    (r"^emb(?:_\d+)?/dense(?:_\d+)?/bias$", "emb/out/biases")]


def keras_adagrad():
    return tf.keras.optimizers.Adagrad(0.1, epsilon=0.0)


def rewrite_checkpoint(path, out, **changes):
    """A copy of the checkpoint at ``path`` with some values changed (or removed: None)."""
    reader = tf.train.load_checkpoint(path)
    graph = tf.Graph()
    with graph.as_default():
        variables = []
        for name in reader.get_variable_to_shape_map():
            if name in changes and changes[name] is None:
                continue
            value = changes.get(name, reader.get_tensor(name))
            variables.append(v1.Variable(np.asarray(value, reader.get_variable_to_dtype_map()[name].as_numpy_dtype),
                                         name=name))
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            return v1.train.Saver(variables).save(session, out)
