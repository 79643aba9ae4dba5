"""Keras 3 (the ``keras`` package) as the TF2 side, next to tf-keras in one process.

A tf-slim conv net with batch norm and dropout, rewritten natively in Keras 3,
is EQUIVALENT (eager and under ``tf.function``); planted slips in the rewrite
(batch norm momentum, dropout rate) are NOT EQUIVALENT. The random tool draws
Keras 3's initializers and dropout as the TF1 graph does, and puts Keras 3's
functions back on every exit.
"""

import threading

import equivtool  # noqa: F401  (environment fix before TensorFlow)
import numpy as np
import pytest
import tensorflow as tf

keras = pytest.importorskip("keras")
if not keras.__version__.startswith("3"):
    pytest.skip("Keras 3 is not installed", allow_module_level=True)

import tf_slim as slim  # noqa: E402

from equivtool import DeterministicRandomTestTool, VariableSet, check_equivalence, map_variables  # noqa: E402
from equivtool._platform import tf_internals as _tfi  # noqa: E402
from equivtool.seeding._keras3 import NAMES  # noqa: E402
from equivtool.variables._flavour import (  # noqa: E402
    is_keras3, layer_variables, variable_dtype, variable_name, variable_shape)

RENAME = {r"/weights$": "/kernel", r"/biases$": "/bias", r"conv1/BatchNorm/": "bn/"}
X = np.random.RandomState(0).randn(4, 5, 5, 2).astype("float32")


def slim_net(x, training, decay=0.99):
    with tf.compat.v1.variable_scope("net"):
        h = slim.conv2d(x, 3, [3, 3], scope="conv1", activation_fn=None)
        # fused=False: slim's fused batch norm updates the moving variance with
        # the Bessel-corrected batch variance, Keras 3's with the biased one.
        h = slim.batch_norm(h, decay=decay, epsilon=1e-3, scale=True, is_training=training,
                            fused=False, scope="conv1/BatchNorm")
        h = slim.dropout(tf.nn.relu(h), 0.5, is_training=training, scope="drop")
        return slim.fully_connected(slim.flatten(h), 4, activation_fn=None, scope="logits")


class KerasNet(keras.Model):
    """The faithful Keras 3 rewrite of ``slim_net`` (``momentum``/``rate`` plant slips)."""

    def __init__(self, momentum=0.99, rate=0.5):
        super().__init__(name="net")
        self.conv = keras.layers.Conv2D(3, 3, padding="same", name="conv1")
        self.bn = keras.layers.BatchNormalization(momentum=momentum, epsilon=1e-3, name="bn")
        self.drop = keras.layers.Dropout(rate)
        self.flat = keras.layers.Flatten()
        self.fc = keras.layers.Dense(4, name="logits")

    def call(self, x, training=False):
        h = tf.nn.relu(self.bn(self.conv(x), training=training))
        return self.fc(self.flat(self.drop(h, training=training)))


SGD = (lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1), lambda: keras.optimizers.SGD(0.1))


def _check(tf2, *, tf1=slim_net, tf_function=False, **kwargs):
    kwargs.setdefault("modes", ("constant",))
    return check_equivalence(tf1, tf2, X, rename=RENAME, optimizers=SGD, train_steps=2,
                             tf_function=tf_function, **kwargs)


# --------------------------------------------------------------------------
# one reader of names, dtypes and shapes
# --------------------------------------------------------------------------

def test_flavour_reads_a_keras3_variable_by_its_path():
    layer = keras.layers.Dense(4, name="dense")
    layer(np.ones((2, 3), "float32"))
    kernel = layer.kernel
    assert is_keras3(kernel) and isinstance(kernel.dtype, str)
    assert (variable_name(kernel), variable_dtype(kernel), variable_shape(kernel).as_list()) == (
        "dense/kernel", tf.float32, [3, 4])


def test_flavour_reads_a_tf_variable_without_its_output_index():
    variable = tf.Variable(np.zeros((2, 5), "float64"), name="scope/v")
    assert not is_keras3(variable)
    assert (variable_name(variable), variable_dtype(variable), variable_shape(variable).as_list()) == (
        "scope/v", tf.float64, [2, 5])


def test_a_keras3_layers_seed_generator_state_is_not_model_state():
    model = keras.Sequential([keras.layers.Dense(2, name="d"), keras.layers.Dropout(0.5)], name="m")
    model(np.ones((2, 3), "float32"))
    assert any("seed_generator" in v.path for v in model.variables)  # Keras lists it ...
    assert [variable_name(v) for v in layer_variables(model)] == ["m/d/kernel", "m/d/bias"]  # ... we do not
    assert VariableSet.from_layer(model).names == ("m/d/kernel", "m/d/bias")


def test_map_variables_maps_a_keras3_dense():
    def tf1(x, training):
        return tf.compat.v1.layers.dense(x, 4, name="dense")

    mapping = map_variables(tf1, lambda: keras.layers.Dense(4), np.ones((2, 3), "float32"))
    assert dict(mapping.pairs) == {"dense/kernel": "dense/kernel", "dense/bias": "dense/bias"}
    assert not mapping.ambiguous


# --------------------------------------------------------------------------
# the random tool and Keras 3
# --------------------------------------------------------------------------

def _tf1_graph_value(build):
    graph = tf.Graph()
    with graph.as_default(), DeterministicRandomTestTool(seed=7, mode="constant").scope():
        value = build()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return session.run(value)


def test_a_keras3_initializer_draws_what_the_tf1_graph_draws():
    expected = _tf1_graph_value(lambda: tf.compat.v1.glorot_uniform_initializer()((3, 4)))
    with DeterministicRandomTestTool(seed=7, mode="constant").scope():
        inside = keras.initializers.GlorotUniform()((3, 4)).numpy()
    outside = keras.initializers.GlorotUniform()((3, 4)).numpy()
    np.testing.assert_array_equal(inside, expected)
    assert not np.allclose(outside, expected)  # without the scope Keras 3 draws other numbers


def test_keras3_dropout_keeps_what_tf1_dropout_keeps():
    x = np.arange(1.0, 65.0, dtype="float32").reshape(8, 8)
    expected = _tf1_graph_value(lambda: tf.compat.v1.nn.dropout(tf.constant(x), rate=0.5))
    with DeterministicRandomTestTool(seed=7, mode="constant").scope():
        inside = keras.layers.Dropout(0.5)(x, training=True).numpy()
    outside = keras.layers.Dropout(0.5)(x, training=True).numpy()
    np.testing.assert_array_equal(inside, expected)
    assert not np.array_equal(outside, expected)
    assert 0 < np.count_nonzero(inside) < inside.size


def test_keras3_shape_inference_takes_no_seed():
    """A Keras 3 model's first call runs symbolically first; its draws there are
    thrown away and must not move the ``num_random_ops`` counter."""
    tool = DeterministicRandomTestTool(seed=7, mode="num_random_ops")
    with tool.scope():
        KerasNet()(X, training=False)
    graph_tool = DeterministicRandomTestTool(seed=7, mode="num_random_ops")
    with tf.Graph().as_default(), graph_tool.scope():
        slim_net(tf.constant(X), False)
    assert [(r.operation_seed, r.shape) for r in tool.trace] == [
        (r.operation_seed, r.shape) for r in graph_tool.trace] == [(0, (3, 3, 2, 3)), (1, (75, 4))]


def _keras3_functions():
    module = _tfi.keras3_random_backend()
    return {name: getattr(module, name) for name in NAMES}


def test_keras3_functions_are_restored_after_an_exception():
    before = _keras3_functions()
    with pytest.raises(KeyError):
        with DeterministicRandomTestTool(seed=7).scope():
            assert _keras3_functions() != before  # replaced inside
            raise KeyError("planted")
    assert _keras3_functions() == before


def test_keras3_functions_are_restored_when_the_scope_exits_on_another_thread():
    before = _keras3_functions()
    scope = DeterministicRandomTestTool(seed=7).scope()
    scope.__enter__()
    exited = []
    thread = threading.Thread(target=lambda: exited.append(scope.__exit__(None, None, None)))
    thread.start()
    thread.join()
    assert exited and _keras3_functions() == before


def test_another_thread_draws_keras3s_own_numbers_during_a_scope():
    tool = DeterministicRandomTestTool(seed=7, mode="constant")
    drawn = []
    with tool.scope():
        thread = threading.Thread(target=lambda: drawn.append(keras.random.uniform((4,), seed=3).numpy()))
        thread.start()
        thread.join()
    np.testing.assert_array_equal(drawn[0], keras.random.uniform((4,), seed=3).numpy())
    assert tool.trace == ()  # not seeded by the tool


# --------------------------------------------------------------------------
# check_equivalence with a Keras 3 rewrite
# --------------------------------------------------------------------------

@pytest.mark.parametrize("tf_function", [False, True], ids=["eager", "tf_function"])
def test_faithful_keras3_rewrite_of_a_slim_net_is_equivalent(tf_function):
    report = _check(KerasNet, tf_function=tf_function)
    assert report.passed, str(report)
    assert {s.name for s in report.steps} >= {
        "variables_once", "parity", "fixed_weights", "random/constant/inference",
        "random/constant/training", "gradients", "optimizer"}
    text = str(report)
    assert "gradients" in text and report.step("parity").data["tf1_variables"] == 8


def test_keras3_variable_paths_are_the_reports_names():
    report = _check(KerasNet, steps=["gradients"])
    assert report.passed
    leaves = {leaf.name for leaf in report.step("gradients").comparisons[-1].leaves}
    assert "gradients/net/bn/gamma" in leaves and "gradients/net/logits/kernel" in leaves


def test_keras3_batch_norm_momentum_default_is_caught():
    """Keras 3's BatchNormalization momentum defaults to 0.99; the TF1 net used 0.997."""
    report = _check(lambda: KerasNet(momentum=0.99), tf1=lambda x, t: slim_net(x, t, decay=0.997))
    assert not report.passed
    assert [s.name for s in report.failed_steps] == ["optimizer"]
    first = report.step("optimizer").first_divergence
    assert first.startswith("step_1/variables/net/bn/moving_"), first


def test_keras3_dropout_rate_slip_is_caught():
    report = _check(lambda: KerasNet(rate=0.4), steps=["random"])
    assert [s.name for s in report.failed_steps] == ["random/constant/training"]
    assert report.step("random/constant/inference").passed  # dropout is off there
