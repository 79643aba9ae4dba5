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


def _residual_update(net, mixed, scale, activation_fn):
    """Adds the scaled 1x1 projection of ``mixed`` to ``net`` and activates.

    The projection (scope ``Conv2d_1x1``, directly in the block's scope) has
    biases and neither normalizer nor activation. For relu6 the scaled update
    is clipped to [-6, 6] first, as in the reference.
    """
    depth = net.get_shape()[3]
    up = slim.conv2d(mixed, depth, 1, normalizer_fn=None, activation_fn=None,
                     scope="Conv2d_1x1")
    scaled_up = up * scale
    if activation_fn == tf.nn.relu6:
        scaled_up = tf.clip_by_value(scaled_up, -6.0, 6.0)
    net += scaled_up
    if activation_fn:
        net = activation_fn(net)
    return net


def block35(net, scale=1.0, activation_fn=tf.nn.relu, scope=None, reuse=None):
    """The 35x35 residual block (Inception-ResNet-A); default scope Block35."""
    with _v1.variable_scope(scope, "Block35", [net], reuse=reuse):
        with _v1.variable_scope("Branch_0"):
            b0 = slim.conv2d(net, 32, 1, scope="Conv2d_1x1")
        with _v1.variable_scope("Branch_1"):
            b1 = slim.conv2d(net, 32, 1, scope="Conv2d_0a_1x1")
            b1 = slim.conv2d(b1, 32, 3, scope="Conv2d_0b_3x3")
        with _v1.variable_scope("Branch_2"):
            b2 = slim.conv2d(net, 32, 1, scope="Conv2d_0a_1x1")
            b2 = slim.conv2d(b2, 48, 3, scope="Conv2d_0b_3x3")
            b2 = slim.conv2d(b2, 64, 3, scope="Conv2d_0c_3x3")
        mixed = tf.concat(axis=3, values=[b0, b1, b2])
        return _residual_update(net, mixed, scale, activation_fn)


def block17(net, scale=1.0, activation_fn=tf.nn.relu, scope=None, reuse=None):
    """The 17x17 residual block (Inception-ResNet-B); default scope Block17."""
    with _v1.variable_scope(scope, "Block17", [net], reuse=reuse):
        with _v1.variable_scope("Branch_0"):
            b0 = slim.conv2d(net, 192, 1, scope="Conv2d_1x1")
        with _v1.variable_scope("Branch_1"):
            b1 = slim.conv2d(net, 128, 1, scope="Conv2d_0a_1x1")
            b1 = slim.conv2d(b1, 160, [1, 7], scope="Conv2d_0b_1x7")
            b1 = slim.conv2d(b1, 192, [7, 1], scope="Conv2d_0c_7x1")
        mixed = tf.concat(axis=3, values=[b0, b1])
        return _residual_update(net, mixed, scale, activation_fn)


def block8(net, scale=1.0, activation_fn=tf.nn.relu, scope=None, reuse=None):
    """The 8x8 residual block (Inception-ResNet-C); default scope Block8."""
    with _v1.variable_scope(scope, "Block8", [net], reuse=reuse):
        with _v1.variable_scope("Branch_0"):
            b0 = slim.conv2d(net, 192, 1, scope="Conv2d_1x1")
        with _v1.variable_scope("Branch_1"):
            b1 = slim.conv2d(net, 192, 1, scope="Conv2d_0a_1x1")
            b1 = slim.conv2d(b1, 224, [1, 3], scope="Conv2d_0b_1x3")
            b1 = slim.conv2d(b1, 256, [3, 1], scope="Conv2d_0c_3x1")
        mixed = tf.concat(axis=3, values=[b0, b1])
        return _residual_update(net, mixed, scale, activation_fn)


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
    atrous = output_stride == 8
    reduce_stride = 1 if atrous else 2
    end_points = {}

    def done(name, net):
        end_points[name] = net
        return name == final_endpoint

    with _v1.variable_scope(scope, "InceptionResnetV2", [inputs]):
        with slim.arg_scope([slim.conv2d, slim.max_pool2d, slim.avg_pool2d],
                            stride=1, padding="SAME"):
            # Stem. Sizes in comments are for a 299x299 input, VALID padding.
            net = slim.conv2d(inputs, 32, 3, stride=2, padding=padding,
                              scope="Conv2d_1a_3x3")  # 149x149x32
            if done("Conv2d_1a_3x3", net):
                return net, end_points
            net = slim.conv2d(net, 32, 3, padding=padding,
                              scope="Conv2d_2a_3x3")  # 147x147x32
            if done("Conv2d_2a_3x3", net):
                return net, end_points
            net = slim.conv2d(net, 64, 3, scope="Conv2d_2b_3x3")  # 147x147x64
            if done("Conv2d_2b_3x3", net):
                return net, end_points
            net = slim.max_pool2d(net, 3, stride=2, padding=padding,
                                  scope="MaxPool_3a_3x3")  # 73x73x64
            if done("MaxPool_3a_3x3", net):
                return net, end_points
            net = slim.conv2d(net, 80, 1, padding=padding,
                              scope="Conv2d_3b_1x1")  # 73x73x80
            if done("Conv2d_3b_1x1", net):
                return net, end_points
            net = slim.conv2d(net, 192, 3, padding=padding,
                              scope="Conv2d_4a_3x3")  # 71x71x192
            if done("Conv2d_4a_3x3", net):
                return net, end_points
            net = slim.max_pool2d(net, 3, stride=2, padding=padding,
                                  scope="MaxPool_5a_3x3")  # 35x35x192
            if done("MaxPool_5a_3x3", net):
                return net, end_points

            with _v1.variable_scope("Mixed_5b"):  # 35x35x320
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
                net = tf.concat([b0, b1, b2, b3], 3)
            if done("Mixed_5b", net):
                return net, end_points

            net = slim.repeat(net, 10, block35, scale=0.17,
                              activation_fn=activation_fn)

            with _v1.variable_scope("Mixed_6a"):  # 17x17x1088 (33x33 atrous)
                with _v1.variable_scope("Branch_0"):
                    b0 = slim.conv2d(net, 384, 3, stride=reduce_stride,
                                     padding=padding, scope="Conv2d_1a_3x3")
                with _v1.variable_scope("Branch_1"):
                    b1 = slim.conv2d(net, 256, 1, scope="Conv2d_0a_1x1")
                    b1 = slim.conv2d(b1, 256, 3, scope="Conv2d_0b_3x3")
                    b1 = slim.conv2d(b1, 384, 3, stride=reduce_stride,
                                     padding=padding, scope="Conv2d_1a_3x3")
                with _v1.variable_scope("Branch_2"):
                    b2 = slim.max_pool2d(net, 3, stride=reduce_stride,
                                         padding=padding,
                                         scope="MaxPool_1a_3x3")
                net = tf.concat([b0, b1, b2], 3)
            if done("Mixed_6a", net):
                return net, end_points

            with slim.arg_scope([slim.conv2d], rate=2 if atrous else 1):
                net = slim.repeat(net, 20, block17, scale=0.10,
                                  activation_fn=activation_fn)
            if done("PreAuxLogits", net):
                return net, end_points

            with _v1.variable_scope("Mixed_7a"):  # 8x8x2080
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
                net = tf.concat([b0, b1, b2, b3], 3)
            if done("Mixed_7a", net):
                return net, end_points

            net = slim.repeat(net, 9, block8, scale=0.20,
                              activation_fn=activation_fn)
            net = block8(net, activation_fn=None)
            net = slim.conv2d(net, 1536, 1, scope="Conv2d_7b_1x1")  # 8x8x1536
            done("Conv2d_7b_1x1", net)
            return net, end_points


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
