"""Small models written the way published TF1 model code is (issue 23), ours, not copied.

* ``mobile_net``: a MobileNet-v2-like stack of inverted-residual blocks in
  tf-slim; each block names its depthwise output with ``tf.identity(...,
  name="depthwise_output")`` and an end-point collector finds them by scanning
  ``net.graph.get_operations()``, as the published mobile networks do. It also
  reads ``net.name`` for its end-point keys. Both are graph-only.
* ``encoder``: a Transformer-encoder-like block on a dict of int32 inputs
  (token ids, mask), with ``get_variable``, ``variable_scope(scope,
  default_name=...)``, a shape helper that reads ``tensor.name``, layer norm and
  dropout on the attention probabilities and the output.

``fault=True`` plants a fault (an activation changed in one place).
"""

from __future__ import annotations

import collections
import math

import equivtool  # noqa: F401  (the environment fix, before tensorflow)
import numpy as np
import tensorflow as tf
import tf_slim as slim

IMAGE = (2, 8, 8, 3)
VOCAB, SEQ, HIDDEN, HEADS = 11, 5, 8, 2


# -- the mobile network -----------------------------------------------------------

def _expanded_conv(net, depth, expansion, stride, training, fault, scope):
    with tf.compat.v1.variable_scope(scope, default_name="expanded_conv"):
        shortcut = net
        net = slim.conv2d(net, int(net.shape[-1]) * expansion, [1, 1], scope="expand")
        net = slim.separable_conv2d(net, None, [3, 3], depth_multiplier=1, stride=stride, scope="depthwise")
        net = tf.identity(net, name="depthwise_output")
        net = slim.conv2d(net, depth, [1, 1], activation_fn=tf.nn.relu if fault else tf.identity,
                          scope="project")
        if stride == 1 and int(shortcut.shape[-1]) == depth:
            net = tf.add(net, shortcut, name="residual")
        return tf.identity(net, name="output")


def _graph_end_points(net, scope_name: str) -> dict:
    """End points found by scanning the graph (graph-only: ``net.graph``, ``op.name``)."""
    found = collections.OrderedDict()
    prefix = scope_name
    for op in net.graph.get_operations():
        if op.name.startswith(prefix) and op.name.endswith("/depthwise_output"):
            found[op.name[len(prefix):]] = op.outputs[0]
    return found


def mobile_net(inputs, training, fault=False):
    end_points = collections.OrderedDict()
    with tf.compat.v1.variable_scope("MobileNet", values=[inputs]) as scope:
        with slim.arg_scope([slim.conv2d, slim.separable_conv2d], normalizer_fn=slim.batch_norm,
                            activation_fn=tf.nn.relu6), \
                slim.arg_scope([slim.batch_norm], is_training=training, scale=True):
            net = slim.conv2d(inputs, 4, [3, 3], stride=2, scope="Conv")
            end_points[net.name.split(":")[0][len(scope.original_name_scope):]] = net  # reads Tensor.name
            for i, (depth, stride) in enumerate([(4, 1), (6, 2)]):
                net = _expanded_conv(net, depth, 2, stride, training, fault and i == 1,
                                     scope="expanded_conv" if i == 0 else f"expanded_conv_{i}")
                end_points[f"layer_{i + 1}"] = net
            end_points.update(_graph_end_points(net, scope.original_name_scope))
            net = tf.reduce_mean(net, [1, 2], name="pool")
            net = slim.dropout(net, 0.8, is_training=training, scope="Dropout")
            end_points["Logits"] = slim.fully_connected(net, 3, activation_fn=None, scope="Logits")
    return end_points


def shim_of(tf1_fn):
    """A shim layer class calling ``tf1_fn(inputs, training, fault)``; ``fault=True`` plants the fault."""
    class Shim(tf.keras.layers.Layer):
        def __init__(self, fault=False, **kwargs):
            super().__init__(**kwargs)
            self.fault = fault

        @tf.compat.v1.keras.utils.track_tf1_style_variables
        def call(self, inputs, training=None):
            return tf1_fn(inputs, bool(training), self.fault)
    Shim.__name__ = Shim.__qualname__ = f"{tf1_fn.__name__}_shim"
    return Shim


MobileNetShim = shim_of(mobile_net)


def image_inputs(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=IMAGE).astype(np.float32)


# -- the encoder --------------------------------------------------------------------

def get_shape_list(tensor, name=None):
    """Static dimensions where known, dynamic ones otherwise; names the tensor in errors."""
    name = name or tensor.name  # graph-only: Tensor.name is undefined eagerly
    shape = tensor.shape.as_list()
    if any(d is None for d in shape):
        raise ValueError(f"tensor {name} needs a static shape here, got {shape}")
    return shape


def _dense(x, units, name, activation=None):
    with tf.compat.v1.variable_scope(name):
        width = get_shape_list(x)[-1]
        w = tf.compat.v1.get_variable("kernel", [width, units],
                                      initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.2))
        b = tf.compat.v1.get_variable("bias", [units], initializer=tf.compat.v1.zeros_initializer())
        y = tf.matmul(x, w) + b
        return activation(y) if activation is not None else y


def encoder(features, training, scope="bert", fault=False):
    ids, mask = features["input_ids"], features["input_mask"]
    keep = 0.9 if training else 1.0
    with tf.compat.v1.variable_scope(scope, default_name="bert"):
        table = tf.compat.v1.get_variable("word_embeddings", [VOCAB, HIDDEN],
                                          initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.2))
        x = tf.gather(table, ids)  # [batch, seq, hidden]
        batch, seq, width = get_shape_list(x, name="embeddings")
        flat = tf.reshape(x, [batch * seq, width])
        size = HIDDEN // HEADS

        def heads(t):
            return tf.transpose(tf.reshape(t, [batch, seq, HEADS, size]), [0, 2, 1, 3])

        with tf.compat.v1.variable_scope("attention"):
            q, k, v = (heads(_dense(flat, HIDDEN, n)) for n in ("query", "key", "value"))
            scores = tf.matmul(q, k, transpose_b=True) / math.sqrt(size)
            adder = (1.0 - tf.cast(mask[:, None, None, :], tf.float32)) * -10000.0
            probs = tf.nn.softmax(scores + adder)
            probs = tf.nn.dropout(probs, rate=1 - keep) if training else probs
            context = tf.reshape(tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3]), [batch * seq, HIDDEN])
            attended = _dense(context, HIDDEN, "output")
            attended = slim.layer_norm(attended + flat, begin_norm_axis=-1, begin_params_axis=-1,
                                       scope="LayerNorm")
        act = tf.nn.relu if fault else (lambda t: tf.nn.gelu(t, approximate=True))
        hidden = _dense(attended, 2 * HIDDEN, "intermediate", activation=act)
        out = _dense(hidden, HIDDEN, "output")
        out = tf.nn.dropout(out, rate=1 - keep) if training else out
        out = slim.layer_norm(out + attended, begin_norm_axis=-1, begin_params_axis=-1, scope="LayerNorm")
        return {"sequence_output": tf.reshape(out, [batch, seq, HIDDEN])}


class EncoderShim(tf.keras.layers.Layer):
    def __init__(self, scope="bert", fault=False, **kwargs):
        super().__init__(**kwargs)
        self.scope, self.fault = scope, fault

    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, features, training=None):
        return encoder(features, bool(training), scope=self.scope, fault=self.fault)


def token_inputs(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    mask = np.ones((2, SEQ), np.int32)
    mask[1, 3:] = 0
    return {"input_ids": rng.integers(0, VOCAB, size=(2, SEQ)).astype(np.int32), "input_mask": mask}
