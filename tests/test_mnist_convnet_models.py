"""The MNIST convnet: TF1 graph and TF2 shim own the same variables and compute the same logits."""

from __future__ import annotations

import equivtool

import numpy as np
import pytest
import tensorflow as tf

from examples.mnist_convnet import keras_model, tf1_model

EXPECTED_VARIABLES = [  # (name, shape) in creation order
    ("mnist_convnet/conv1/kernel", (3, 3, 1, 32)),
    ("mnist_convnet/conv1/bias", (32,)),
    ("mnist_convnet/conv2/kernel", (3, 3, 32, 64)),
    ("mnist_convnet/conv2/bias", (64,)),
    ("mnist_convnet/dense1/kernel", (12 * 12 * 64, 128)),
    ("mnist_convnet/dense1/bias", (128,)),
    ("mnist_convnet/logits/kernel", (128, 10)),
    ("mnist_convnet/logits/bias", (10,)),
]
KERAS_EXAMPLE_PARAMETERS = 1_199_882  # the Keras mnist_cnn example's model.summary()


def _name(variable):
    return variable.name[:-2] if variable.name.endswith(":0") else variable.name


@pytest.fixture(scope="module")
def tf1_graph():
    graph = tf.Graph()
    with graph.as_default():
        images = tf.compat.v1.placeholder(tf.float32, [None, 28, 28, 1], name="images")
        training = tf.compat.v1.placeholder_with_default(False, [], name="training")
        logits = tf1_model.tf1_forward(images, training)
        init = tf.compat.v1.global_variables_initializer()
    return graph, images, training, logits, init


@pytest.fixture(scope="module")
def shim():
    model = keras_model.make_model()
    images, _ = tf1_model.synthetic_batch(8, seed=3)
    logits = model(images)
    return model, images, logits


# -- variables ---------------------------------------------------------------

def test_tf1_graph_creates_the_expected_variables_in_layer_order(tf1_graph):
    graph = tf1_graph[0]
    variables = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    assert [(_name(v), tuple(v.shape.as_list())) for v in variables] == EXPECTED_VARIABLES
    assert graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES) == variables


def test_tf1_graph_has_the_keras_example_parameter_count(tf1_graph):
    graph = tf1_graph[0]
    total = sum(int(np.prod(v.shape.as_list()))
                for v in graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES))
    assert total == KERAS_EXAMPLE_PARAMETERS


def test_shim_variables_equal_tf1_variables(tf1_graph, shim):
    graph = tf1_graph[0]
    model = shim[0]
    trainable = {v.name for v in model.trainable_variables}
    tf1 = sorted((_name(v), tuple(v.shape.as_list()), True)
                 for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES))
    tf2 = sorted((_name(v), tuple(v.shape.as_list()), v.name in trainable)
                 for v in model.variables)
    assert tf2 == tf1


def test_shim_second_call_creates_no_variables(shim):
    model, images, _ = shim
    before = [id(v) for v in model.variables]
    with equivtool.assert_no_variable_creations():
        model(images, training=True)
    assert [id(v) for v in model.variables] == before


def test_tf1_reuse_builds_a_second_tower_on_the_same_variables():
    with tf.Graph().as_default() as graph:
        images = tf.zeros([2, 28, 28, 1])
        tf1_model.tf1_forward(images, True)
        tf1_model.tf1_forward(images, False, reuse=True)
        assert len(graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)) \
            == len(EXPECTED_VARIABLES)


# -- forward -----------------------------------------------------------------

def test_tf1_logits_shape_keeps_an_unknown_batch(tf1_graph):
    assert tf1_graph[3].shape.as_list() == [None, 10]


def test_shim_logits_shape_is_batch_by_10(shim):
    _, images, logits = shim
    assert logits.shape == (images.shape[0], 10)
    assert logits.dtype == tf.float32


def test_shim_training_none_is_inference(shim):
    model, images, logits_none = shim
    np.testing.assert_array_equal(logits_none.numpy(), model(images, training=False).numpy())


def test_shim_training_true_applies_dropout(shim):
    model, images, logits_none = shim
    assert not np.allclose(logits_none.numpy(), model(images, training=True).numpy())


def test_tf1_training_flag_switches_dropout(tf1_graph):
    graph, images, training, logits, init = tf1_graph
    batch, _ = tf1_model.synthetic_batch(4, seed=5)
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(init)
        first = session.run(logits, {images: batch})
        again = session.run(logits, {images: batch, training: False})
        trained = session.run(logits, {images: batch, training: True})
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, trained)


def test_shim_and_tf1_compute_the_same_inference_logits(tf1_graph, shim):
    graph, images, _, logits, init = tf1_graph
    model, batch, shim_logits = shim
    values = {_name(v): v.numpy() for v in model.variables}
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(init)
        for variable in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
            variable.load(values[_name(variable)], session)
        tf1_logits = session.run(logits, {images: batch})
    np.testing.assert_allclose(tf1_logits, shim_logits.numpy(), rtol=1e-6, atol=1e-5)


# -- synthetic data ----------------------------------------------------------

def test_synthetic_batch_shapes_dtypes_and_ranges():
    images, labels = tf1_model.synthetic_batch(16, seed=0)
    assert images.shape == (16, 28, 28, 1) and images.dtype == np.float32
    assert labels.shape == (16,) and np.issubdtype(labels.dtype, np.integer)
    assert images.min() >= 0.0 and images.max() <= 1.0
    assert labels.min() >= 0 and labels.max() <= 9


def test_synthetic_batch_is_reproducible_per_seed():
    first = tf1_model.synthetic_batch(8, seed=42)
    second = tf1_model.synthetic_batch(8, seed=42)
    other = tf1_model.synthetic_batch(8, seed=43)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], other[0])


def test_synthetic_labels_are_learnable_from_images():
    # Class templates are shared across seeds, so a nearest-class-mean rule
    # fitted on one seed's batch classifies another seed's batch.
    train_x, train_y = tf1_model.synthetic_batch(500, seed=1)
    test_x, test_y = tf1_model.synthetic_batch(200, seed=2)
    means = np.stack([train_x[train_y == c].mean(axis=0) for c in range(10)])
    distances = ((test_x[:, None] - means[None]) ** 2).sum(axis=(2, 3, 4))
    assert (distances.argmin(axis=1) == test_y).mean() > 0.9


def test_synthetic_batch_rejects_negative_size():
    with pytest.raises(ValueError, match="batch_size"):
        tf1_model.synthetic_batch(-1, seed=0)


def test_shim_under_tf_function_matches_eager_inference(shim):
    model, images, logits_none = shim
    traced = tf.function(lambda batch: model(batch, training=False))
    with equivtool.assert_no_variable_creations():
        np.testing.assert_array_equal(traced(images).numpy(), logits_none.numpy())
