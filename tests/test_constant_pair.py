"""Constant mode builds the TF1 inference and training passes once for several steps;
that must change no key, name or number compared with a standalone build of each pass."""

import numpy as np
import tensorflow as tf

import equivtool
from small_models import INPUT_SHAPE, SlimNetShim, slim_net

X = np.ones([2, 4], np.float32)


def scoped_tf1(x, training):
    """The issue's model: its output key is its name scope."""
    with tf.compat.v1.variable_scope("net"):
        with tf.compat.v1.name_scope("block") as sc:
            y = tf.compat.v1.layers.dense(x, 3)
    return {sc.rstrip("/"): y}


class ScopedShim(tf.keras.layers.Layer):
    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, x, training=None):
        with tf.compat.v1.variable_scope("net"):
            y = tf.compat.v1.layers.dense(x, 3)
        return {"net/block": y}  # the key a standalone TF1 build gives


def test_training_pass_keeps_the_standalone_name_scope_keys():
    report = equivtool.check_equivalence(scoped_tf1, ScopedShim, X, steps=["random"], modes=["constant"])
    for name in ("random/constant/inference", "random/constant/training"):
        step = report.step(name)
        assert step.status == "passed", str(report)
        assert [leaf.name for leaf in step.leaves][:1] == ["end_points/net/block"], name


def _names_seen(record):
    """A TF1 function recording, per call, every name its graph gave it."""
    def tf1_fn(x, training):
        with tf.compat.v1.variable_scope("net") as vs:
            with tf.compat.v1.name_scope("block") as sc:
                y = tf.compat.v1.layers.dense(x, 3)
                y = tf.compat.v1.layers.dropout(y, 0.5, training=training)
        graph = y.graph
        record.append({
            "training": bool(training), "name_scope": sc, "variable_scope": vs.original_name_scope,
            "output": y.name, "ops": sorted(op.name for op in graph.get_operations()
                                            if not op.name.startswith("equivtool_input")),
            "collections": sorted(graph.get_all_collection_keys()),
        })
        return {sc.rstrip("/"): y}
    return tf1_fn


def _standalone(training):
    record = []
    tool = equivtool.DeterministicRandomTestTool(mode="constant")
    with tool.scope(), tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, X.shape, name="equivtool_input_0")
        _names_seen(record)(x, training)
    return record[0]


def test_each_pass_sees_exactly_the_names_of_a_standalone_build():
    record = []
    # The TF2 side (without dropout) is irrelevant here; only what TF1 saw is checked.
    report = equivtool.check_equivalence(_names_seen(record), ScopedShim, X, steps=["random", "gradients"],
                                         modes=["constant"])
    assert report.step("random/constant/training").status != "error", str(report)
    built = {entry["training"]: entry for entry in record}
    assert set(built) == {False, True}
    for training in (False, True):
        assert built[training] == _standalone(training), training
    assert built[True]["name_scope"] == "net/block/"


def test_training_pass_numbers_match_tf2_with_batch_norm_and_dropout():
    # slim_net's training pass updates batch-norm statistics and draws dropout
    # masks; the later steps read the statistics the training pass left.
    x = np.random.RandomState(0).rand(*INPUT_SHAPE).astype(np.float32)
    optimizers = (lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
                  lambda: tf.keras.optimizers.SGD(0.1))
    report = equivtool.check_equivalence(slim_net, SlimNetShim, x, modes=["constant"],
                                         optimizers=optimizers, train_steps=2)
    assert report.passed, str(report)


def test_training_pass_runs_on_the_inference_graphs_variable_values():
    # Initial values the random tool cannot pin: each build draws new ones.
    rng = np.random.RandomState(7)

    def numpy_init_tf1(x, training):
        w = tf.compat.v1.get_variable("w", initializer=rng.rand(4, 3).astype(np.float32))
        return tf.matmul(x, w)

    class NumpyInitShim(tf.keras.layers.Layer):
        @tf.compat.v1.keras.utils.track_tf1_style_variables
        def call(self, x, training=None):
            return numpy_init_tf1(x, training)

    layer = NumpyInitShim()
    layer(X)  # built before the check: it receives the TF1 graph's values
    report = equivtool.check_equivalence(numpy_init_tf1, layer, X, steps=["random"], modes=["constant"])
    assert report.step("random/constant/training").status == "passed", str(report)


def test_a_variable_only_the_training_pass_creates_is_initialised():
    def training_extra_tf1(x, training):
        y = tf.compat.v1.layers.dense(x, 3, name="d")
        if training:
            y = y * tf.compat.v1.get_variable("gain", initializer=tf.constant(2.0))
        return y

    class TrainingExtraShim(tf.keras.layers.Layer):
        @tf.compat.v1.keras.utils.track_tf1_style_variables
        def call(self, x, training=None):  # creates its variables on the first call
            y = tf.compat.v1.layers.dense(x, 3, name="d")
            gain = tf.compat.v1.get_variable("gain", initializer=tf.constant(2.0))
            return y * gain if training else y

    report = equivtool.check_equivalence(training_extra_tf1, TrainingExtraShim, X, steps=["random"],
                                         modes=["constant"])
    assert report.step("random/constant/training").status == "passed", str(report)
