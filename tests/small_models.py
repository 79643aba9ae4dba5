"""Small models shared by the tests: a tf-slim network written the TF1 way,
its shim layer, and the TF guide's layer that creates variables on every call."""

from __future__ import annotations

import collections

import equivtool
import tensorflow as tf
import tf_slim as slim

NUM_CLASSES = 5
INPUT_SHAPE = (2, 8, 8, 3)


def slim_net(inputs, training, *, bn_epsilon=1e-3, fc_regularizer=True, dropout_after="pool",
             weights_initializer=None, fc_scope="logits", extra_variable=False,
             scope="small_net"):
    """conv -> batch_norm(scale) -> pool -> dropout -> flatten -> fully_connected, with endpoints.

    The keyword arguments exist so that tests can build deliberately broken
    variants of the same network.
    """
    end_points = collections.OrderedDict()
    conv_init = weights_initializer or tf.compat.v1.truncated_normal_initializer(stddev=0.1)
    with tf.compat.v1.variable_scope(scope, values=[inputs]):
        with slim.arg_scope([slim.conv2d, slim.fully_connected],
                            weights_regularizer=slim.l2_regularizer(0.01)):
            net = slim.conv2d(inputs, 4, [3, 3], activation_fn=None,
                              weights_initializer=conv_init, scope="conv1")
            end_points["conv1"] = net
            net = slim.batch_norm(net, scale=True, epsilon=bn_epsilon, is_training=training,
                                  scope="bn1")
            net = tf.nn.relu(net)
            end_points["bn1"] = net
            if dropout_after == "bn":
                net = slim.dropout(net, 0.7, is_training=training, scope="dropout")
            net = slim.max_pool2d(net, [2, 2], scope="pool1")
            end_points["pool1"] = net
            if dropout_after == "pool":
                net = slim.dropout(net, 0.7, is_training=training, scope="dropout")
            net = slim.flatten(net)
            if extra_variable:
                tf.compat.v1.get_variable("unexpected", shape=[3])
            regularizer = slim.l2_regularizer(0.01) if fc_regularizer else None
            logits = slim.fully_connected(net, NUM_CLASSES, activation_fn=None,
                                          weights_regularizer=regularizer, scope=fc_scope)
            end_points["logits"] = logits
    return end_points


class SlimNetShim(tf.keras.layers.Layer):
    """The same network as a TF2 shim layer."""

    def __init__(self, **net_kwargs):
        super().__init__()
        self.net_kwargs = net_kwargs

    @equivtool.creates_variables_once
    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, inputs, training=None):
        return slim_net(inputs, bool(training), **self.net_kwargs)


class RecreatingDense(tf.keras.layers.Layer):
    """The guide's faulty layer: a new Keras layer (so new variables) on every call."""

    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, inputs):
        return tf.keras.layers.Dense(3, name="dense")(inputs)


class ReusingDense(tf.keras.layers.Layer):
    """The guide's fix: get_variable-based code reuses its variables on later calls."""

    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, inputs):
        with tf.compat.v1.variable_scope("dense"):
            kernel = tf.compat.v1.get_variable("kernel", shape=[inputs.shape[-1], 3])
            bias = tf.compat.v1.get_variable("bias", shape=[3],
                                             initializer=tf.compat.v1.zeros_initializer())
        return tf.matmul(inputs, kernel) + bias
