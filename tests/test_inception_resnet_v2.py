"""The TF1 Inception-ResNet-v2 matches tf-slim's published model; its shim matches it.

Shapes come from static shape inference only (no session runs). Graph
construction costs the same at any image size, so each configuration is built
once per module and shared; the two builds of the published configuration
(batch norm under the arg scope) are marked ``slow``.
"""

from __future__ import annotations

import math

import equivtool

import numpy as np
import pytest
import tensorflow as tf

from examples.inception_resnet_v2 import keras_shim, tf1_model
from examples.inception_resnet_v2.tf1_model import ENDPOINTS

BATCH = 2
CLASSES = 1000

# Published figures for Inception-ResNet-v2 with 1000 classes, batch-norm
# gamma and the auxiliary head.
PUBLISHED_GLOBAL_VARIABLES = 1114
PUBLISHED_TRAINABLE_VARIABLES = 702
PUBLISHED_TRAINABLE_PARAMETERS = 59_211_120
BATCH_NORM_LAYERS = (PUBLISHED_GLOBAL_VARIABLES - PUBLISHED_TRAINABLE_VARIABLES) // 2

HEAD_ENDPOINTS = ("AuxLogits", "global_pool", "PreLogitsFlatten", "Logits",
                  "Predictions")

# Channels of each base end point, whatever the image size.
DEPTHS = dict(zip(ENDPOINTS, (32, 32, 64, 64, 80, 192, 192, 320, 1088, 1088, 2080, 1536)))

# Spatial size of each base end point for a 299x299 input, VALID padding,
# output stride 16 (the reference test's table).
SIZES_299 = dict(zip(ENDPOINTS, (149, 147, 147, 73, 73, 71, 35, 35, 17, 17, 8, 8)))


def _image_shapes(sizes, batch=BATCH):
    """{end point: spatial size} -> {end point: [batch, size, size, depth]}."""
    return {name: [batch, size, size, DEPTHS[name]] for name, size in sizes.items()}


def _head_shapes(classes, batch=BATCH):
    return {"AuxLogits": [batch, classes], "global_pool": [batch, 1, 1, 1536],
            "PreLogitsFlatten": [batch, 1536], "Logits": [batch, classes],
            "Predictions": [batch, classes]}


def _static_shapes(end_points):
    return {name: tensor.shape.as_list() for name, tensor in end_points.items()}


def _build_published(image_size, **model_kwargs):
    """Graph, logits and end points of the published configuration."""
    graph = tf.Graph()
    with graph.as_default():
        images = tf.compat.v1.placeholder(
            tf.float32, [BATCH, image_size, image_size, 3], name="images")
        logits, end_points = keras_shim.tf1_forward(
            images, True, CLASSES, batch_norm_scale=True, **model_kwargs)
    return graph, logits, end_points


def _ungated_base(image_size, **kwargs):
    """End points of the bare base (slim defaults, as in the reference test)."""
    with tf.Graph().as_default() as graph:
        images = tf.zeros([BATCH, image_size, image_size, 3])
        net, end_points = tf1_model.inception_resnet_v2_base(images, **kwargs)
    return graph, net, end_points


# --------------------------------------------------------------------------
# The published configuration at 299x299 (one build, slow)
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def published():
    graph, logits, end_points = _build_published(299)
    return graph, logits, end_points


def _collection(graph, key):
    return graph.get_collection(key)


@pytest.mark.slow
def test_published_config_creates_1114_global_variables(published):
    graph, _, _ = published
    assert len(_collection(graph, tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)) \
        == PUBLISHED_GLOBAL_VARIABLES


@pytest.mark.slow
def test_published_config_creates_702_trainable_variables(published):
    graph, _, _ = published
    assert len(_collection(graph, tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)) \
        == PUBLISHED_TRAINABLE_VARIABLES


@pytest.mark.slow
def test_published_config_has_59211120_trainable_parameters(published):
    graph, _, _ = published
    total = sum(int(np.prod(v.shape.as_list()))
                for v in _collection(graph, tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES))
    assert total == PUBLISHED_TRAINABLE_PARAMETERS


@pytest.mark.slow
def test_every_end_point_has_the_reference_shape_at_299(published):
    _, _, end_points = published
    expected = {**_image_shapes(SIZES_299), **_head_shapes(CLASSES)}
    assert _static_shapes(end_points) == expected


@pytest.mark.slow
def test_end_points_are_ordered_as_built(published):
    _, _, end_points = published
    assert tuple(end_points) == ENDPOINTS + HEAD_ENDPOINTS


@pytest.mark.slow
def test_logits_and_aux_logits_live_in_their_reference_scopes(published):
    _, logits, end_points = published
    assert logits is end_points["Logits"]
    assert logits.op.name.startswith("InceptionResnetV2/Logits/Logits/")
    assert end_points["AuxLogits"].op.name.startswith("InceptionResnetV2/AuxLogits/Logits/")
    assert end_points["Predictions"].op.name == "InceptionResnetV2/Logits/Predictions"
    assert end_points["global_pool"].op.name.startswith(
        "InceptionResnetV2/Logits/AvgPool_1a_8x8/")


@pytest.mark.slow
def test_variables_follow_the_checkpoint_layout(published):
    graph, _, _ = published
    variables = _collection(graph, tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    shapes = {v.op.name: tuple(v.shape.as_list()) for v in variables}
    assert variables[0].op.name == "InceptionResnetV2/Conv2d_1a_3x3/weights"
    assert variables[-1].op.name == "InceptionResnetV2/Logits/Logits/biases"
    assert shapes["InceptionResnetV2/Repeat/block35_10/Branch_2/Conv2d_0c_3x3/weights"] \
        == (3, 3, 48, 64)
    assert shapes["InceptionResnetV2/Repeat_1/block17_1/Branch_1/Conv2d_0b_1x7/weights"] \
        == (1, 7, 128, 160)
    assert shapes["InceptionResnetV2/Repeat_1/block17_20/Conv2d_1x1/biases"] == (1088,)
    assert shapes["InceptionResnetV2/Repeat_2/block8_9/Branch_1/Conv2d_0c_3x1/weights"] \
        == (3, 1, 224, 256)
    assert shapes["InceptionResnetV2/Block8/Conv2d_1x1/weights"] == (1, 1, 448, 2080)
    assert shapes["InceptionResnetV2/Conv2d_7b_1x1/BatchNorm/moving_variance"] == (1536,)
    assert shapes["InceptionResnetV2/AuxLogits/Conv2d_2a_5x5/weights"] == (5, 5, 128, 768)
    assert shapes["InceptionResnetV2/Logits/Logits/weights"] == (1536, CLASSES)
    blocks = {name.split("/")[2] for name in shapes if "/Repeat" in name}
    assert len([b for b in blocks if b.startswith("block35_")]) == 10
    assert len([b for b in blocks if b.startswith("block17_")]) == 20
    assert len([b for b in blocks if b.startswith("block8_")]) == 9


@pytest.mark.slow
def test_aux_head_variables_are_created_after_the_tower_and_before_logits(published):
    graph, _, _ = published
    names = [v.op.name for v in _collection(graph, tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)]
    aux = [i for i, n in enumerate(names) if n.startswith("InceptionResnetV2/AuxLogits/")]
    tower_end = max(i for i, n in enumerate(names) if "/Conv2d_7b_1x1/" in n)
    logits = [i for i, n in enumerate(names) if n.startswith("InceptionResnetV2/Logits/")]
    assert aux == list(range(tower_end + 1, tower_end + 1 + len(aux)))
    assert logits == list(range(aux[-1] + 1, len(names)))


@pytest.mark.slow
def test_every_weight_and_bias_has_its_own_l2_loss_of_4e_5(published):
    graph, _, _ = published
    losses = _collection(graph, tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES)
    regularized = []
    for loss in losses:
        scale, l2 = loss.op.inputs
        assert tf.get_static_value(scale) == pytest.approx(4e-5)
        assert l2.op.type == "L2Loss"
        regularized.append(l2.op.inputs[0].op.inputs[0].op.name)
    weights_and_biases = [
        v.op.name for v in _collection(graph, tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
        if v.op.name.endswith(("/weights", "/biases"))]
    assert sorted(regularized) == sorted(weights_and_biases)
    assert len(regularized) == len(set(regularized))


@pytest.mark.slow
def test_published_config_has_no_dilated_convolutions(published):
    graph, _, _ = published
    assert not [op.name for op in graph.get_operations() if op.type == "SpaceToBatchND"]


@pytest.mark.slow
def test_every_batch_norm_registers_two_update_ops(published):
    graph, _, _ = published
    updates = _collection(graph, tf.compat.v1.GraphKeys.UPDATE_OPS)
    assert len(updates) == 2 * BATCH_NORM_LAYERS


@pytest.mark.slow
def test_weights_are_glorot_uniform_and_batch_norm_starts_at_identity(published):
    graph, _, _ = published
    for variable in _collection(graph, tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
        name = variable.op.name
        shape = variable.shape.as_list()
        if name.endswith("/weights"):
            receptive = int(np.prod(shape[:-2]))
            fan_in, fan_out = receptive * shape[-2], receptive * shape[-1]
            limit = graph.get_tensor_by_name(
                name + "/Initializer/random_uniform/max:0")
            assert tf.get_static_value(limit) == pytest.approx(
                math.sqrt(6.0 / (fan_in + fan_out)), rel=1e-6), name
        else:
            ones = name.endswith(("/gamma", "/moving_variance"))
            with graph.as_default():
                initial = tf.get_static_value(variable.initial_value)
            assert initial is not None, name
            np.testing.assert_array_equal(initial, np.full(shape, 1.0 if ones else 0.0),
                                          err_msg=name)


# --------------------------------------------------------------------------
# The base's options (slim defaults, as in the reference tests)
# --------------------------------------------------------------------------

def test_aligned_feature_maps_use_same_padding_throughout():
    _, _, end_points = _ungated_base(299, final_endpoint="PreAuxLogits",
                                     align_feature_maps=True)
    expected = _image_shapes(dict(zip(ENDPOINTS[:10],
                                      (150, 150, 150, 75, 75, 75, 38, 38, 19, 19))))
    assert _static_shapes(end_points) == expected


@pytest.fixture(scope="module")
def output_stride_8():
    return _ungated_base(299, final_endpoint="PreAuxLogits", output_stride=8)


def test_output_stride_8_keeps_mixed_6a_at_33x33(output_stride_8):
    _, _, end_points = output_stride_8
    sizes = dict(SIZES_299)
    sizes.update(Mixed_6a=33, PreAuxLogits=33)
    del sizes["Mixed_7a"], sizes["Conv2d_7b_1x1"]
    assert _static_shapes(end_points) == _image_shapes(sizes)


@pytest.mark.parametrize("block", ["block17_1", "block17_20"])
def test_output_stride_8_uses_atrous_rate_2_in_the_17x17_blocks(output_stride_8, block):
    graph, _, _ = output_stride_8
    # A dilated graph-mode convolution is SpaceToBatchND + Conv2D + BatchToSpaceND.
    rate = graph.get_tensor_by_name(
        f"InceptionResnetV2/Repeat_1/{block}/Branch_1/Conv2d_0b_1x7/Conv2D/dilation_rate:0")
    assert tf.get_static_value(rate).tolist() == [2, 2]


@pytest.mark.parametrize("final_endpoint", ENDPOINTS[:ENDPOINTS.index("Mixed_6a") + 1])
def test_base_stops_at_final_endpoint(final_endpoint):
    _, net, end_points = _ungated_base(299, final_endpoint=final_endpoint)
    assert list(end_points) == list(ENDPOINTS[:ENDPOINTS.index(final_endpoint) + 1])
    assert net is end_points[final_endpoint]
    assert net.op.name.startswith("InceptionResnetV2/" + final_endpoint + "/")


@pytest.mark.parametrize("kwargs, message", [
    (dict(output_stride=32), "output_stride must be 8 or 16"),
    (dict(output_stride=4), "output_stride must be 8 or 16"),
    (dict(final_endpoint="Mixed_9z"), "final_endpoint 'Mixed_9z' not recognized"),
    (dict(final_endpoint="PreLogits"), "not recognized"),
    (dict(output_stride=8), "only supported up to the PreAuxLogits"),
    (dict(output_stride=8, final_endpoint="Mixed_7a"), "only supported up to"),
])
def test_invalid_base_arguments_raise_before_building_anything(kwargs, message):
    with tf.Graph().as_default() as graph:
        with pytest.raises(ValueError, match=message):
            tf1_model.inception_resnet_v2_base(tf.zeros([1, 299, 299, 3]), **kwargs)
        assert graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES) == []


def test_default_image_size_is_299():
    assert tf1_model.default_image_size == 299
    assert tf1_model.inception_resnet_v2.default_image_size == 299


# --------------------------------------------------------------------------
# Small images and unknown shapes (slim defaults)
# --------------------------------------------------------------------------

SMALL = 107  # the smallest input whose PreAuxLogits (5x5) fits the aux head's 5x5 pool


def test_every_end_point_has_the_expected_shape_at_107():
    with tf.Graph().as_default():
        _, end_points = tf1_model.inception_resnet_v2(
            tf.zeros([BATCH, SMALL, SMALL, 3]), 10)
    # VALID 3x3 convolutions take 2 pixels off, stride-2 ones halve (n-3)//2+1.
    sizes = dict(zip(ENDPOINTS, (53, 51, 51, 25, 25, 23, 11, 11, 5, 5, 2, 2)))
    expected = {**_image_shapes(sizes), **_head_shapes(10)}
    assert _static_shapes(end_points) == expected


@pytest.fixture(scope="module")
def headless_unknown_size():
    """num_classes=None on images of unknown batch and spatial size."""
    with tf.Graph().as_default() as graph:
        images = tf.compat.v1.placeholder(tf.float32, [None, None, None, 3])
        net, end_points = tf1_model.inception_resnet_v2(images, num_classes=None)
    return graph, net, end_points


def test_no_classes_returns_pooled_features_without_heads(headless_unknown_size):
    graph, net, end_points = headless_unknown_size
    assert net is end_points["global_pool"]
    assert net.shape.as_list() == [None, 1, 1, 1536]
    assert list(end_points)[-1] == "global_pool"
    assert not {"AuxLogits", "PreLogitsFlatten", "Logits", "Predictions"} & set(end_points)
    assert not [v for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
                if "Logits" in v.op.name]


def test_unknown_spatial_size_pools_with_reduce_mean(headless_unknown_size):
    _, net, _ = headless_unknown_size
    assert net.op.type == "Mean"
    assert net.op.name == "InceptionResnetV2/Logits/global_pool"


# --------------------------------------------------------------------------
# The TF2 shim
# --------------------------------------------------------------------------

SHIM_KWARGS = dict(batch_norm_scale=True)
SHIM_CLASSES = 10


def _shim_images():
    return tf.random.stateless_uniform([BATCH, SMALL, SMALL, 3], seed=[6, 1])


@pytest.fixture(scope="module")
def shim():
    """A shim after its first (variable-creating) call, and that call's output."""
    layer = keras_shim.make_shim(SHIM_CLASSES, **SHIM_KWARGS)
    logits, end_points = layer(_shim_images())
    return layer, logits, end_points


def _signature(variables, trainable_names):
    return sorted((v.name, tuple(v.shape.as_list()), v.name in trainable_names)
                  for v in variables)


@pytest.mark.slow
def test_shim_variables_equal_the_tf1_graph_variables(shim):
    layer, _, _ = shim
    graph = tf.Graph()
    with graph.as_default():
        images = tf.compat.v1.placeholder(tf.float32, [BATCH, SMALL, SMALL, 3])
        keras_shim.tf1_forward(images, False, SHIM_CLASSES, **SHIM_KWARGS)
        tf1_vars = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
        tf1_trainable = {v.name for v in
                         graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)}
    shim_trainable = {v.name for v in layer.trainable_variables}
    expected = _signature(tf1_vars, tf1_trainable)
    assert len(expected) == PUBLISHED_GLOBAL_VARIABLES
    assert _signature(layer.variables, shim_trainable) == expected


def test_shim_owns_the_published_variable_counts(shim):
    layer, _, _ = shim
    assert len(layer.variables) == PUBLISHED_GLOBAL_VARIABLES
    assert len(layer.trainable_variables) == PUBLISHED_TRAINABLE_VARIABLES


def test_shim_second_call_creates_no_variables(shim):
    layer, _, _ = shim
    before = [id(v) for v in layer.variables]
    with equivtool.assert_no_variable_creations():
        layer(_shim_images(), training=False)
    assert [id(v) for v in layer.variables] == before


def test_shim_call_is_guarded_by_creates_variables_once():
    assert getattr(keras_shim.InceptionResnetV2.call,
                   "_equivtool_creates_variables_once", False)


def test_shim_training_none_is_inference(shim):
    layer, logits_none, _ = shim
    logits_false, _ = layer(_shim_images(), training=False)
    np.testing.assert_array_equal(logits_none.numpy(), logits_false.numpy())


def test_shim_training_true_differs_from_inference(shim):
    layer, logits_none, _ = shim
    # training=True moves the batch-norm moving averages; put them back so
    # the shared layer stays as the other tests expect.
    saved = [(v, v.numpy()) for v in layer.non_trainable_variables]
    try:
        logits_true, _ = layer(_shim_images(), training=True)
    finally:
        for variable, value in saved:
            variable.assign(value)
    assert not np.allclose(logits_none.numpy(), logits_true.numpy())


def test_shim_end_points_are_ordered_as_built(shim):
    _, logits, end_points = shim
    assert tuple(end_points) == ENDPOINTS + HEAD_ENDPOINTS
    assert logits.shape == (BATCH, SHIM_CLASSES)
    np.testing.assert_allclose(end_points["Predictions"].numpy().sum(axis=1), 1.0,
                               rtol=1e-5)


def test_shim_config_records_forwarded_keyword_arguments():
    layer = keras_shim.make_shim(SHIM_CLASSES, create_aux_logits=False,
                                 dropout_keep_prob=0.5, weight_decay=1e-3)
    config = layer.get_config()
    assert config["num_classes"] == SHIM_CLASSES
    assert config["create_aux_logits"] is False
    assert config["dropout_keep_prob"] == 0.5
    assert config["weight_decay"] == 1e-3


def test_shim_rejects_unknown_keyword_arguments():
    with pytest.raises(TypeError, match="is_training"):
        keras_shim.make_shim(SHIM_CLASSES, is_training=True)
