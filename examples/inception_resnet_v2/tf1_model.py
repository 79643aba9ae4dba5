"""Inception-ResNet-v2 written the TF1 way, with tf-slim.

This is equivtool's showcase "before" model: a TF1 graph built from
``tf.compat.v1.variable_scope`` and ``tf_slim`` layers, laid out so that every
variable has the name, shape, initializer, regularizer and creation position of
the tf-slim model zoo's ``nets/inception_resnet_v2.py`` (Szegedy et al. 2016,
"Inception-v4, Inception-ResNet and the Impact of Residual Connections on
Learning", arXiv 1602.07261). Published checkpoints therefore load into it by
name, and published figures reproduce.

Naming facts worth knowing when reading a checkpoint:

* the stem and the three reduction/mixed blocks live directly under
  ``InceptionResnetV2/`` (``Conv2d_1a_3x3``, ..., ``Mixed_5b``, ``Mixed_6a``,
  ``Mixed_7a``, ``Conv2d_7b_1x1``);
* the repeated residual blocks are built by ``slim.repeat``, which names its
  scopes after the block *function*: ``Repeat/block35_1`` .. ``block35_10``,
  ``Repeat_1/block17_1`` .. ``block17_20``, ``Repeat_2/block8_1`` ..
  ``block8_9``; the last, unactivated 8x8 block uses the default scope
  ``Block8``. The block functions must therefore keep their names;
* the auxiliary head is ``AuxLogits/...``, the classifier ``Logits/Logits``.

One deliberate difference from the reference: invalid ``final_endpoint`` /
``output_stride`` combinations are rejected *before* any layer is built (the
reference builds the whole tower and then raises), so a caller that catches
the ``ValueError`` is not left with a graph full of orphan variables. The
exception type is the same.

``import equivtool`` must precede ``import tensorflow``: it selects tf-keras
and lets tf-slim 1.1.0 find tf-keras' legacy layers.
"""

from __future__ import annotations

import equivtool  # noqa: F401  (must come before tensorflow; see docstring)

import tensorflow as tf
import tf_slim as slim

__all__ = [
    "ENDPOINTS",
    "block17",
    "block35",
    "block8",
    "default_image_size",
    "inception_resnet_v2",
    "inception_resnet_v2_arg_scope",
    "inception_resnet_v2_base",
]

default_image_size = 299

# The end points of inception_resnet_v2_base, in the order they are built.
ENDPOINTS = (
    "Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "MaxPool_3a_3x3",
    "Conv2d_3b_1x1", "Conv2d_4a_3x3", "MaxPool_5a_3x3", "Mixed_5b",
    "Mixed_6a", "PreAuxLogits", "Mixed_7a", "Conv2d_7b_1x1",
)

_v1 = tf.compat.v1


# Branch layouts of the residual blocks: one tuple per branch (Branch_0,
# Branch_1, ...), each a chain of (depth, kernel, scope) convolutions applied
# to the block input. Branches are built, and their variables created, in
# this order.
_BLOCK35_BRANCHES = (
    ((32, 1, "Conv2d_1x1"),),
    ((32, 1, "Conv2d_0a_1x1"), (32, 3, "Conv2d_0b_3x3")),
    ((32, 1, "Conv2d_0a_1x1"), (48, 3, "Conv2d_0b_3x3"), (64, 3, "Conv2d_0c_3x3")),
)
_BLOCK17_BRANCHES = (
    ((192, 1, "Conv2d_1x1"),),
    ((128, 1, "Conv2d_0a_1x1"), (160, [1, 7], "Conv2d_0b_1x7"),
     (192, [7, 1], "Conv2d_0c_7x1")),
)
_BLOCK8_BRANCHES = (
    ((192, 1, "Conv2d_1x1"),),
    ((192, 1, "Conv2d_0a_1x1"), (224, [1, 3], "Conv2d_0b_1x3"),
     (256, [3, 1], "Conv2d_0c_3x1")),
)


def _residual_block(net, branches, scale, activation_fn, scope, default_scope,
                    reuse):
    """Concatenates the branches, projects back to the input depth, adds.

    The projection (scope ``Conv2d_1x1`` directly in the block's scope) has
    biases and neither normalizer nor activation. For relu6 the scaled update
    is clipped to [-6, 6] before the addition, as in the reference.
    """
    with _v1.variable_scope(scope, default_scope, [net], reuse=reuse):
        outputs = []
        for index, chain in enumerate(branches):
            with _v1.variable_scope(f"Branch_{index}"):
                tower = net
                for depth, kernel, name in chain:
                    tower = slim.conv2d(tower, depth, kernel, scope=name)
                outputs.append(tower)
        mixed = tf.concat(axis=3, values=outputs)
        up = slim.conv2d(mixed, net.get_shape()[3], 1, normalizer_fn=None,
                         activation_fn=None, scope="Conv2d_1x1")
        scaled_up = up * scale
        if activation_fn == tf.nn.relu6:
            scaled_up = tf.clip_by_value(scaled_up, -6.0, 6.0)
        net += scaled_up
        if activation_fn:
            net = activation_fn(net)
        return net


# slim.repeat names its scopes after these functions (Repeat/block35_1, ...),
# so their names are part of the checkpoint layout.
def block35(net, scale=1.0, activation_fn=tf.nn.relu, scope=None, reuse=None):
    """The 35x35 residual block (Inception-ResNet-A); default scope Block35."""
    return _residual_block(net, _BLOCK35_BRANCHES, scale, activation_fn,
                           scope, "Block35", reuse)


def block17(net, scale=1.0, activation_fn=tf.nn.relu, scope=None, reuse=None):
    """The 17x17 residual block (Inception-ResNet-B); default scope Block17."""
    return _residual_block(net, _BLOCK17_BRANCHES, scale, activation_fn,
                           scope, "Block17", reuse)


def block8(net, scale=1.0, activation_fn=tf.nn.relu, scope=None, reuse=None):
    """The 8x8 residual block (Inception-ResNet-C); default scope Block8."""
    return _residual_block(net, _BLOCK8_BRANCHES, scale, activation_fn,
                           scope, "Block8", reuse)


def _check_base_arguments(final_endpoint, output_stride):
    if output_stride not in (8, 16):
        raise ValueError(
            f"output_stride must be 8 or 16, got {output_stride!r}.")
    if final_endpoint not in ENDPOINTS:
        raise ValueError(
            f"final_endpoint {final_endpoint!r} not recognized; expected one "
            f"of {list(ENDPOINTS)}.")
    if (output_stride == 8
            and ENDPOINTS.index(final_endpoint) > ENDPOINTS.index("PreAuxLogits")):
        raise ValueError(
            "output_stride==8 is only supported up to the PreAuxLogits end "
            f"point; got final_endpoint={final_endpoint!r}. Use "
            "output_stride=16 or stop at 'PreAuxLogits'.")


def inception_resnet_v2_base(inputs,
                             final_endpoint="Conv2d_7b_1x1",
                             output_stride=16,
                             align_feature_maps=False,
                             scope=None,
                             activation_fn=tf.nn.relu):
    """Builds the convolutional tower up to ``final_endpoint``.

    Args:
      inputs: a [batch, height, width, channels] tensor.
      final_endpoint: the last end point to build, one of ``ENDPOINTS``.
      output_stride: 16 (the published network) or 8; with 8, Mixed_6a keeps
        stride 1 and the 17x17 blocks use atrous rate 2, which is only
        supported up to 'PreAuxLogits'.
      align_feature_maps: if True, every VALID padding becomes SAME so that
        feature maps align with the input (299 -> 150 -> ... -> 19).
      scope: variable scope; default 'InceptionResnetV2'.
      activation_fn: activation of the residual blocks.

    Returns:
      (tensor at final_endpoint, dict of end points in build order)

    Raises:
      ValueError: output_stride not 8 or 16, unknown final_endpoint, or
        output_stride 8 with an end point after 'PreAuxLogits'. Raised before
        anything is built.
    """
    _check_base_arguments(final_endpoint, output_stride)

    padding = "SAME" if align_feature_maps else "VALID"
    # With output stride 8, Mixed_6a does not reduce and the 17x17 blocks
    # dilate instead.
    atrous = output_stride == 8
    reduce_stride = 1 if atrous else 2

    # Each stage maps the previous end point to the next; sizes are for a
    # 299x299 input with VALID padding.
    def conv(depth, kernel, name, **kwargs):
        return lambda net: slim.conv2d(net, depth, kernel, scope=name, **kwargs)

    def max_pool(name):
        return lambda net: slim.max_pool2d(net, 3, stride=2, padding=padding,
                                           scope=name)

    def blocks35_then_mixed_6a(net):  # 17x17x1088 (33x33 with output stride 8)
        net = slim.repeat(net, 10, block35, scale=0.17,
                          activation_fn=activation_fn)
        return _mixed_6a(net, padding, reduce_stride)

    def blocks17(net):  # 17x17x1088
        with slim.arg_scope([slim.conv2d], rate=2 if atrous else 1):
            return slim.repeat(net, 20, block17, scale=0.10,
                               activation_fn=activation_fn)

    def blocks8_then_conv(net):  # 8x8x1536
        net = slim.repeat(net, 9, block8, scale=0.20,
                          activation_fn=activation_fn)
        net = block8(net, activation_fn=None)
        return slim.conv2d(net, 1536, 1, scope="Conv2d_7b_1x1")

    stages = (
        conv(32, 3, "Conv2d_1a_3x3", stride=2, padding=padding),  # 149x149x32
        conv(32, 3, "Conv2d_2a_3x3", padding=padding),  # 147x147x32
        conv(64, 3, "Conv2d_2b_3x3"),  # 147x147x64
        max_pool("MaxPool_3a_3x3"),  # 73x73x64
        conv(80, 1, "Conv2d_3b_1x1", padding=padding),  # 73x73x80
        conv(192, 3, "Conv2d_4a_3x3", padding=padding),  # 71x71x192
        max_pool("MaxPool_5a_3x3"),  # 35x35x192
        _mixed_5b,  # 35x35x320
        blocks35_then_mixed_6a,
        blocks17,  # PreAuxLogits
        lambda net: _mixed_7a(net, padding),  # 8x8x2080
        blocks8_then_conv,
    )

    end_points = {}
    with _v1.variable_scope(scope, "InceptionResnetV2", [inputs]):
        with slim.arg_scope([slim.conv2d, slim.max_pool2d, slim.avg_pool2d],
                            stride=1, padding="SAME"):
            net = inputs
            for name, stage in zip(ENDPOINTS, stages):
                net = stage(net)
                end_points[name] = net
                if name == final_endpoint:
                    break
    return net, end_points


def _mixed_5b(net):
    with _v1.variable_scope("Mixed_5b"):
        with _v1.variable_scope("Branch_0"):
            b0 = slim.conv2d(net, 96, 1, scope="Conv2d_1x1")
        with _v1.variable_scope("Branch_1"):
            b1 = slim.conv2d(net, 48, 1, scope="Conv2d_0a_1x1")
            b1 = slim.conv2d(b1, 64, 5, scope="Conv2d_0b_5x5")
        with _v1.variable_scope("Branch_2"):
            b2 = slim.conv2d(net, 64, 1, scope="Conv2d_0a_1x1")
            b2 = slim.conv2d(b2, 96, 3, scope="Conv2d_0b_3x3")
            b2 = slim.conv2d(b2, 96, 3, scope="Conv2d_0c_3x3")
        with _v1.variable_scope("Branch_3"):
            b3 = slim.avg_pool2d(net, 3, stride=1, padding="SAME",
                                 scope="AvgPool_0a_3x3")
            b3 = slim.conv2d(b3, 64, 1, scope="Conv2d_0b_1x1")
        return tf.concat([b0, b1, b2, b3], 3)


def _mixed_6a(net, padding, stride):
    with _v1.variable_scope("Mixed_6a"):
        with _v1.variable_scope("Branch_0"):
            b0 = slim.conv2d(net, 384, 3, stride=stride, padding=padding,
                             scope="Conv2d_1a_3x3")
        with _v1.variable_scope("Branch_1"):
            b1 = slim.conv2d(net, 256, 1, scope="Conv2d_0a_1x1")
            b1 = slim.conv2d(b1, 256, 3, scope="Conv2d_0b_3x3")
            b1 = slim.conv2d(b1, 384, 3, stride=stride, padding=padding,
                             scope="Conv2d_1a_3x3")
        with _v1.variable_scope("Branch_2"):
            b2 = slim.max_pool2d(net, 3, stride=stride, padding=padding,
                                 scope="MaxPool_1a_3x3")
        return tf.concat([b0, b1, b2], 3)


def _mixed_7a(net, padding):
    with _v1.variable_scope("Mixed_7a"):
        with _v1.variable_scope("Branch_0"):
            b0 = slim.conv2d(net, 256, 1, scope="Conv2d_0a_1x1")
            b0 = slim.conv2d(b0, 384, 3, stride=2, padding=padding,
                             scope="Conv2d_1a_3x3")
        with _v1.variable_scope("Branch_1"):
            b1 = slim.conv2d(net, 256, 1, scope="Conv2d_0a_1x1")
            b1 = slim.conv2d(b1, 288, 3, stride=2, padding=padding,
                             scope="Conv2d_1a_3x3")
        with _v1.variable_scope("Branch_2"):
            b2 = slim.conv2d(net, 256, 1, scope="Conv2d_0a_1x1")
            b2 = slim.conv2d(b2, 288, 3, scope="Conv2d_0b_3x3")
            b2 = slim.conv2d(b2, 320, 3, stride=2, padding=padding,
                             scope="Conv2d_1a_3x3")
        with _v1.variable_scope("Branch_3"):
            b3 = slim.max_pool2d(net, 3, stride=2, padding=padding,
                                 scope="MaxPool_1a_3x3")
        return tf.concat([b0, b1, b2, b3], 3)


def inception_resnet_v2(inputs, num_classes=1001, is_training=True,
                        dropout_keep_prob=0.8,
                        reuse=None,
                        scope="InceptionResnetV2",
                        create_aux_logits=True,
                        activation_fn=tf.nn.relu):
    """Builds Inception-ResNet-v2 with its auxiliary and final classifiers.

    Build it under ``slim.arg_scope(inception_resnet_v2_arg_scope())`` to get
    the published configuration (batch norm, L2 weight decay); without the
    arg scope slim's defaults apply (biased convolutions, no batch norm).

    Args:
      inputs: [batch, height, width, 3]; batch may be unknown, and height and
        width too when ``create_aux_logits`` is False (global pooling then
        becomes a reduce_mean named 'global_pool').
      num_classes: classifier width. 0 or None omits both classifiers and
        returns the pooled features (end point 'global_pool') instead.
      is_training: selects batch-norm batch statistics and active dropout.
      dropout_keep_prob: keep probability of the dropout before the logits.
      reuse: reuse the variables of an earlier build in ``scope``.
      scope: variable scope of the whole network.
      create_aux_logits: build the auxiliary head on 'PreAuxLogits'.
      activation_fn: activation of the residual blocks.

    Returns:
      (logits, end_points) where end_points is ordered as built: the base's
      end points, then 'AuxLogits', 'global_pool', 'PreLogitsFlatten',
      'Logits', 'Predictions'.
    """
    with _v1.variable_scope(scope, "InceptionResnetV2", [inputs],
                            reuse=reuse) as net_scope:
        with slim.arg_scope([slim.batch_norm, slim.dropout],
                            is_training=is_training):
            net, end_points = inception_resnet_v2_base(
                inputs, scope=net_scope, activation_fn=activation_fn)

            if create_aux_logits and num_classes:
                with _v1.variable_scope("AuxLogits"):
                    aux = end_points["PreAuxLogits"]
                    aux = slim.avg_pool2d(aux, 5, stride=3, padding="VALID",
                                          scope="Conv2d_1a_3x3")
                    aux = slim.conv2d(aux, 128, 1, scope="Conv2d_1b_1x1")
                    # The kernel spans the whole remaining map (5x5 at 299).
                    aux = slim.conv2d(aux, 768, aux.get_shape()[1:3],
                                      padding="VALID", scope="Conv2d_2a_5x5")
                    aux = slim.flatten(aux)
                    aux = slim.fully_connected(aux, num_classes,
                                               activation_fn=None,
                                               scope="Logits")
                    end_points["AuxLogits"] = aux

            with _v1.variable_scope("Logits"):
                spatial = net.get_shape()[1:3]
                if spatial.is_fully_defined():
                    net = slim.avg_pool2d(net, spatial, padding="VALID",
                                          scope="AvgPool_1a_8x8")
                else:
                    net = tf.reduce_mean(input_tensor=net, axis=[1, 2],
                                         keepdims=True, name="global_pool")
                end_points["global_pool"] = net
                if not num_classes:
                    return net, end_points
                net = slim.flatten(net)
                net = slim.dropout(net, dropout_keep_prob,
                                   is_training=is_training, scope="Dropout")
                end_points["PreLogitsFlatten"] = net
                logits = slim.fully_connected(net, num_classes,
                                              activation_fn=None,
                                              scope="Logits")
                end_points["Logits"] = logits
                end_points["Predictions"] = tf.nn.softmax(
                    logits, name="Predictions")
    return logits, end_points


inception_resnet_v2.default_image_size = default_image_size


def inception_resnet_v2_arg_scope(
        weight_decay=0.00004,
        batch_norm_decay=0.9997,
        batch_norm_epsilon=0.001,
        activation_fn=tf.nn.relu,
        batch_norm_updates_collections=_v1.GraphKeys.UPDATE_OPS,
        batch_norm_scale=False):
    """The slim arg scope of the published training configuration.

    Convolutions and fully connected layers get an L2 regularizer of
    ``weight_decay`` on weights *and* biases; convolutions are followed by
    batch norm (fused when possible, gamma only if ``batch_norm_scale``) and
    ``activation_fn``. Use as ``with slim.arg_scope(...returned value...):``.
    """
    regularizer = slim.l2_regularizer(weight_decay)
    with slim.arg_scope([slim.conv2d, slim.fully_connected],
                        weights_regularizer=regularizer,
                        biases_regularizer=regularizer):
        batch_norm_params = {
            "decay": batch_norm_decay,
            "epsilon": batch_norm_epsilon,
            "updates_collections": batch_norm_updates_collections,
            "fused": None,
            "scale": batch_norm_scale,
        }
        with slim.arg_scope([slim.conv2d], activation_fn=activation_fn,
                            normalizer_fn=slim.batch_norm,
                            normalizer_params=batch_norm_params) as arg_sc:
            return arg_sc
