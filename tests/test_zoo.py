"""equivtool.slim_shim and the tf_slim.nets zoo (examples/slim_zoo).

Fast tests use a tiny slim network with the end-point machinery of the real
nets (a variable scope's `_end_points` collection, pooling named by its name
scope). Every real zoo network runs at its smallest input under `slow`.
"""

import os

import equivtool
import numpy as np
import pytest
import tensorflow as tf
import tf_slim as slim

from equivtool.engine.sides.tf1_graph_reading import align_pass_keys

SGD = (lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1), lambda: tf.keras.optimizers.SGD(0.1))
ALL_STEPS = {"variables_once", "parity", "fixed_weights", "random/constant/inference", "random/constant/training",
             "random/num_random_ops/inference", "random/num_random_ops/training", "gradients", "optimizer"}


def tiny_net(inputs, num_classes=10, is_training=True, dropout_keep_prob=0.5, scope="tiny"):
    with tf.compat.v1.variable_scope(scope, "tiny", [inputs]) as sc:
        collection = sc.original_name_scope + "_end_points"
        with slim.arg_scope([slim.conv2d, slim.max_pool2d, slim.fully_connected],
                            outputs_collections=[collection]):
            net = slim.conv2d(inputs, 4, [3, 3], scope="conv1")
            net = slim.max_pool2d(net, [2, 2], scope="pool1")
            net = slim.dropout(net, dropout_keep_prob, is_training=is_training, scope="dropout")
            net = slim.fully_connected(slim.flatten(net), num_classes, activation_fn=None, scope="logits")
        end_points = slim.utils.convert_collection_to_dict(collection)
    return net, end_points


def tiny_arg_scope(weight_decay=1e-3):
    with slim.arg_scope([slim.conv2d, slim.fully_connected],
                        weights_regularizer=slim.l2_regularizer(weight_decay)) as sc:
        return sc


X = np.random.RandomState(0).uniform(-1, 1, (2, 8, 8, 3)).astype(np.float32)
EXPECTED_KEYS = ["tiny/conv1", "tiny/pool1", "tiny/logits"]


# -- slim_shim -----------------------------------------------------------------

@pytest.mark.parametrize("tf_function", [False, True])
def test_slim_shim_end_point_keys_are_the_tf1_graphs(tf_function):
    layer = equivtool.slim_shim(tiny_net, tiny_arg_scope(), num_classes=5)
    call = tf.function(layer) if tf_function else layer
    logits, end_points = call(tf.constant(X), training=False)
    assert list(end_points) == EXPECTED_KEYS
    assert logits.shape == (2, 5)
    assert len(layer.losses) == 2  # the arg scope's regularizers were applied
    with tf.Graph().as_default():
        _, tf1_end_points = layer.tf1_fn(tf.constant(X), False)
        assert list(tf1_end_points) == EXPECTED_KEYS


def test_slim_shim_passes_training_and_empties_eager_end_point_collections():
    layer = equivtool.slim_shim(tiny_net, tiny_arg_scope)  # a callable arg scope works too
    graph = tf.compat.v1.get_default_graph()
    outputs = [layer(tf.constant(X), training=True)[0].numpy() for _ in range(2)]
    assert not np.array_equal(outputs[0], outputs[1])  # dropout is on: is_training=True was passed
    np.testing.assert_array_equal(layer(tf.constant(X), training=False)[0], layer(tf.constant(X), training=False)[0])
    assert all(len(graph.get_collection(key)) == 0 for key in graph.get_all_collection_keys()
               if isinstance(key, str) and key.endswith("_end_points"))


def test_slim_shim_rejects_bad_arguments_before_building():
    with pytest.raises(TypeError, match="fn: expected a slim network function"):
        equivtool.slim_shim("vgg_16")
    with pytest.raises(TypeError, match="arg_scope: expected a slim arg scope"):
        equivtool.slim_shim(tiny_net, arg_scope=3)
    with pytest.raises(ValueError, match="training_arg: tiny_net has no parameter 'training'"):
        equivtool.slim_shim(tiny_net, training_arg="training")


@pytest.mark.parametrize("tf_function", [False, True])
def test_tiny_slim_net_is_equivalent_through_slim_shim(tf_function):
    make = lambda: equivtool.slim_shim(tiny_net, tiny_arg_scope())  # noqa: E731
    report = equivtool.check_equivalence(make().tf1_fn, make, X, optimizers=SGD, train_steps=1,
                                         tf_function=tf_function)
    assert {s.name: s.status for s in report.steps} == {name: "passed" for name in ALL_STEPS}, str(report)
    training = next(s for s in report.steps if s.name == "random/constant/training")
    assert [leaf.name for leaf in training.comparisons[0].leaves] == [
        f"end_points/{key}" for key in EXPECTED_KEYS]


# -- names line up in the engine (a hand-written shim, no slim_shim) -------------

class HandShim(tf.keras.layers.Layer):
    def __init__(self, fault=1.0, **kwargs):
        super().__init__(**kwargs)
        self.fault = fault

    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, x, training=None):
        logits, end_points = tiny_net(x, is_training=bool(training))
        return logits * self.fault, end_points


@pytest.mark.parametrize("tf_function", [False, True])
def test_engine_removes_the_layer_name_scope_from_end_point_keys(tf_function):
    report = equivtool.check_equivalence(lambda x, t: tiny_net(x, is_training=t),
                                         lambda: HandShim(name="tiny_shim"), X,
                                         steps=["random"], modes=["constant"], tf_function=tf_function)
    for step in report.steps:
        assert step.status == "passed", str(report)
        assert [leaf.name for leaf in step.comparisons[0].leaves] == [f"end_points/{k}" for k in EXPECTED_KEYS]
        assert any("'tiny_shim/' removed" in note for note in step.notes)


def test_layer_name_scope_is_not_removed_when_keys_differ_otherwise():
    def renamed_tf1(x, training):
        logits, end_points = tiny_net(x, is_training=training)
        return logits, {k.replace("pool1", "pool_one"): v for k, v in end_points.items()}

    report = equivtool.check_equivalence(renamed_tf1, lambda: HandShim(name="tiny_shim"), X,
                                         steps=["random"], modes=["constant"], tf_function=True)
    inference = report.steps[0]
    assert inference.status == "failed"
    names = [leaf.name for leaf in inference.comparisons[0].leaves]
    assert "end_points/tiny_shim/tiny/pool1" in names  # left as it was: pool1 vs pool_one is a real difference


def test_rename_applies_to_end_point_keys():
    def other_scope(x, training):
        return tiny_net(x, is_training=training, scope="old")

    report = equivtool.check_equivalence(other_scope, lambda: HandShim(name="tiny_shim"), X,
                                         steps=["random"], modes=["constant"], rename={"^old/": "tiny/"})
    for step in report.steps:
        assert step.status == "passed", str(report)
        assert [leaf.name for leaf in step.comparisons[0].leaves] == [f"end_points/{k}" for k in EXPECTED_KEYS]


def test_a_wrong_output_still_fails_with_aligned_keys():
    report = equivtool.check_equivalence(lambda x, t: tiny_net(x, is_training=t),
                                         lambda: HandShim(fault=1.001, name="tiny_shim"), X,
                                         steps=["fixed_weights"])
    assert report.steps[0].status == "failed"
    assert [leaf.name for c in report.steps[0].comparisons for leaf in c.failures] == ["outputs/0"]


def test_align_pass_keys_maps_uniquified_scopes_only():
    first = {"net/conv1": 1, "net/pool1": 2}
    assert list(align_pass_keys({"net/conv1": 1, "net_1/pool1": 2}, first)) == ["net/conv1", "net/pool1"]
    # a different name, not a _N suffix: left alone
    assert list(align_pass_keys({"net/conv1": 1, "net/pool2": 2}, first)) == ["net/conv1", "net/pool2"]
    nested = align_pass_keys((0, {"a_3/b": 1}), (0, {"a/b": 1}))
    assert list(nested[1]) == ["a/b"]


# -- the zoo ----------------------------------------------------------------------

def test_a_zoo_row_shows_a_training_steps_floor_at_its_largest_difference():
    import types
    from examples.slim_zoo.zoo import _floor_of_largest
    floor = {"steps": [{"a": [1e-5, 1e-3], "b": [4e-5, 2e-2]}, {"c": [None, None], "d": [2e-5, None]}]}
    assert _floor_of_largest(types.SimpleNamespace(data={"noise_floor": floor})) == " (floor 2.0e-02)"
    assert _floor_of_largest(types.SimpleNamespace(data={})) == ""


ZOO_NAMES = ["resnet_v1_50", "resnet_v2_50", "inception_v3", "inception_v2", "inception_v1", "alexnet_v2",
             "resnet_v1_101", "resnet_v2_101", "overfeat", "vgg_a", "vgg_16", "vgg_19"]


# Every run of a real net takes minutes on CI's 2 cores, so CI runs three that
# cover the three families' machinery (VALID fully-connected convolutions,
# residual units with batch norm, inception branches with an auxiliary head and
# a per-step tolerance, eagerly and under tf.function); EQUIVTOOL_ZOO=all runs
# all 24 (benchmarks/RESULTS.md has the zoo table).
CI_ZOO = {("alexnet_v2", False), ("resnet_v1_50", False), ("inception_v3", True)}
_FULL_ZOO = os.environ.get("EQUIVTOOL_ZOO") == "all"


def _zoo_param(name, tf_function):
    marks = [pytest.mark.slow]
    if (name, tf_function) not in CI_ZOO:
        marks.append(pytest.mark.skipif(not _FULL_ZOO, reason=(
            "full zoo only with EQUIVTOOL_ZOO=all: each net takes minutes on 2 cores; "
            "CI runs alexnet_v2, resnet_v1_50 (eager) and inception_v3 (tf.function)")))
    return pytest.param(name, tf_function, marks=marks, id=f"{name}-{'tf_function' if tf_function else 'eager'}")


@pytest.mark.parametrize("name,tf_function", [_zoo_param(n, t) for n in ZOO_NAMES for t in (False, True)])
def test_zoo_network_is_equivalent(name, tf_function):
    from examples.slim_zoo.zoo import run
    report = run(name, tf_function=tf_function)
    assert {s.name: s.status for s in report.steps} == {step: "passed" for step in ALL_STEPS}, str(report)
