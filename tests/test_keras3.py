"""Keras 3 (the ``keras`` package) as the TF2 side, next to tf-keras in one process.

A tf-slim conv net with batch norm and dropout, rewritten natively in Keras 3,
is EQUIVALENT (eager and under ``tf.function``); planted slips in the rewrite
(batch norm momentum, dropout rate) are NOT EQUIVALENT. The random tool draws
Keras 3's initializers and dropout as the TF1 graph does, and puts Keras 3's
functions back on every exit.
"""

import os
import re
import subprocess
import sys
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
from equivtool.variables.flavour import (  # noqa: E402
    is_keras3, layer_variables, variable_dtype, variable_name, variable_shape)

RENAME = {r"/weights$": "/kernel", r"/biases$": "/bias", r"conv1/BatchNorm/": "bn/"}
X = np.random.RandomState(0).randn(4, 5, 5, 2).astype("float32")


def slim_net(x, training, decay=0.99):
    with tf.compat.v1.variable_scope("net"):
        h = slim.conv2d(x, 3, [3, 3], scope="conv1")
        # fused=False: slim's fused batch norm updates the moving variance with
        # the Bessel-corrected batch variance, Keras 3's with the biased one.
        h = slim.batch_norm(h, decay=decay, epsilon=1e-3, scale=True, is_training=training,
                            fused=False, scope="conv1/BatchNorm")
        h = slim.dropout(h, 0.5, is_training=training, scope="drop")
        return slim.fully_connected(slim.flatten(h), 4, activation_fn=None, scope="logits")


class KerasNet(keras.Model):
    """The faithful Keras 3 rewrite of ``slim_net`` (``momentum``/``rate`` plant slips)."""

    def __init__(self, momentum=0.99, rate=0.5):
        super().__init__(name="net")
        self.conv = keras.layers.Conv2D(3, 3, padding="same", activation="relu", name="conv1")
        self.bn = keras.layers.BatchNormalization(momentum=momentum, epsilon=1e-3, name="bn")
        self.drop = keras.layers.Dropout(rate)
        self.flat = keras.layers.Flatten()
        self.fc = keras.layers.Dense(4, name="logits")

    def call(self, x, training=False):
        h = self.bn(self.conv(x), training=training)
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
    # the training-mode forward's variable comparison sees the moving statistics first
    assert [s.name for s in report.failed_steps] == ["random/constant/training", "optimizer"]
    first = report.step("random/constant/training").first_divergence
    assert first.startswith("variables/net/bn/moving_"), first
    first = report.step("optimizer").first_divergence
    assert first.startswith("step_1/variables/net/bn/moving_"), first
    assert report.step("random/constant/inference").passed  # inference never sees the momentum


def test_keras3_dropout_rate_slip_is_caught():
    report = _check(lambda: KerasNet(rate=0.4), steps=["random"])
    assert [s.name for s in report.failed_steps] == ["random/constant/training"]
    assert report.step("random/constant/inference").passed  # dropout is off there


# --------------------------------------------------------------------------
# TF1 checkpoints into a Keras 3 model and optimizer
# --------------------------------------------------------------------------

# convert_checkpoint's rules map each TF2 name to its TF1 checkpoint key (TF1 names pass unchanged).
TO_TF1 = {r"/kernel$": "/weights", r"/bias$": "/biases", r"^net/bn/": "net/conv1/BatchNorm/"}
ADAM = (lambda: tf.compat.v1.train.AdamOptimizer(0.01), lambda: keras.optimizers.Adam(0.01, epsilon=1e-8))
MOMENTUM = (lambda: tf.compat.v1.train.MomentumOptimizer(0.01, 0.9, use_nesterov=True),
            lambda: keras.optimizers.SGD(0.01, momentum=0.9, nesterov=True))


@pytest.fixture(scope="module")
def adam_ckpt(tmp_path_factory):
    from tests.checkpoint_models import train_tf1
    return train_tf1(slim_net, X, ADAM[0], 5, str(tmp_path_factory.mktemp("adam") / "model"))


def test_converted_checkpoint_restores_into_a_keras3_model_and_adam(adam_ckpt, tmp_path):
    prefix = equivtool.convert_checkpoint(adam_ckpt, KerasNet, X, str(tmp_path / "k3"), rename=TO_TF1,
                                          optimizer=ADAM[1])
    model, optimizer = KerasNet(), ADAM[1]()
    model(X)
    optimizer.build(model.trainable_variables)
    fresh_kernel = model.conv.kernel.numpy()
    tf.train.Checkpoint(model=model, optimizer=optimizer).restore(prefix).assert_existing_objects_matched()
    reader = tf.train.load_checkpoint(adam_ckpt)
    expected = reader.get_tensor("net/conv1/weights")
    assert not np.array_equal(fresh_kernel, expected)  # the restore is what makes them equal
    np.testing.assert_array_equal(model.conv.kernel.numpy(), expected)
    np.testing.assert_array_equal(model.bn.moving_variance.numpy(),
                                  reader.get_tensor("net/conv1/BatchNorm/moving_variance"))
    assert int(optimizer.iterations.numpy()) == 5
    slots = {v.name: v.numpy() for v in optimizer.variables}
    np.testing.assert_array_equal(slots["net_conv1_kernel_momentum"], reader.get_tensor("net/conv1/weights/Adam"))
    np.testing.assert_array_equal(slots["net_logits_bias_velocity"], reader.get_tensor("net/logits/biases/Adam_1"))


@pytest.mark.parametrize("tf1_optimizer, keras3_optimizer, slot, tf1_suffix", [
    (lambda: tf.compat.v1.train.RMSPropOptimizer(0.01, momentum=0.5),
     lambda: keras.optimizers.RMSprop(0.01, momentum=0.5), "velocity", "RMSProp"),
    (lambda: tf.compat.v1.train.AdagradOptimizer(0.01), lambda: keras.optimizers.Adagrad(0.01), "accumulator",
     "Adagrad"),
], ids=["rmsprop", "adagrad"])
def test_rmsprop_and_adagrad_slots_convert_into_keras3(tmp_path, tf1_optimizer, keras3_optimizer, slot, tf1_suffix):
    from tests.checkpoint_models import train_tf1
    path = train_tf1(slim_net, X, tf1_optimizer, 2, str(tmp_path / "model"))
    prefix = equivtool.convert_checkpoint(path, KerasNet, X, str(tmp_path / "k3"), rename=TO_TF1,
                                          optimizer=keras3_optimizer)
    model, optimizer = KerasNet(), keras3_optimizer()
    model(X)
    optimizer.build(model.trainable_variables)
    tf.train.Checkpoint(model=model, optimizer=optimizer).restore(prefix).assert_existing_objects_matched()
    restored = {v.name: v.numpy() for v in optimizer.variables}[f"net_logits_kernel_{slot}"]
    expected = tf.train.load_checkpoint(path).get_tensor(f"net/logits/weights/{tf1_suffix}")
    assert np.any(restored != 0) and np.any(restored != 0.1)  # trained, not a fresh slot
    np.testing.assert_array_equal(restored, expected)


def _resume(path, optimizers, **kwargs):
    report = check_equivalence(slim_net, KerasNet, X, rename=TO_TF1, checkpoint=path, optimizers=optimizers,
                               steps=["resume"], train_steps=2, **kwargs)
    return report, report.step("resume")


@pytest.mark.parametrize("tf_function", [False, True], ids=["eager", "tf_function"])
def test_keras3_adam_resumes_a_tf1_adam_run_identically(adam_ckpt, tf_function):
    report, result = _resume(adam_ckpt, ADAM, tf_function=tf_function)
    assert report.passed, str(report)
    names = {leaf.name for leaf in result.comparisons[0].leaves}
    assert {"step_1/slots/net/conv1/weights/Adam", "step_1/slots/net/logits/biases/Adam_1",
            "step_1/optimizer/beta1_power", "step_1/variables/net/conv1/BatchNorm/moving_variance"} <= names
    assert any("keras.optimizers.Adam" in note and "iterations=5" in result.data["conversion"]
               for note in result.notes)


def test_keras3_sgd_momentum_resumes_a_tf1_momentum_run_identically(tmp_path):
    from tests.checkpoint_models import train_tf1
    path = train_tf1(slim_net, X, MOMENTUM[0], 3, str(tmp_path / "model"))
    report, result = _resume(path, MOMENTUM)
    assert report.passed, str(report)
    assert "step_1/slots/net/conv1/weights/Momentum" in {leaf.name for leaf in result.comparisons[0].leaves}


def test_keras3_sgd_without_nesterov_is_caught_on_resume(tmp_path):
    """The TF1 run used Nesterov momentum; a Keras 3 SGD left at nesterov=False is a slip."""
    from tests.checkpoint_models import train_tf1
    path = train_tf1(slim_net, X, MOMENTUM[0], 3, str(tmp_path / "model"))
    report, result = _resume(path, (MOMENTUM[0], lambda: keras.optimizers.SGD(0.01, momentum=0.9)))
    assert not report.passed and result.status == "failed"
    assert result.first_divergence.startswith("step_1/variables/net/"), result.first_divergence


# --------------------------------------------------------------------------
# equivtool compare with a Keras 3 .keras file
# --------------------------------------------------------------------------

def _tf1_saved_model(folder, weights):
    """A TF1 SavedModel of features -> relu(dense) -> dense ``scores``, with ``weights``."""
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session() as session:
        features = tf.compat.v1.placeholder(tf.float32, (None, 6), name="features")
        hidden = tf.nn.relu(tf.compat.v1.layers.dense(features, 4, name="hidden"))
        scores = tf.compat.v1.layers.dense(hidden, 3, name="scores")
        session.run(tf.compat.v1.global_variables_initializer())
        for variable, value in zip(tf.compat.v1.global_variables(), weights):
            variable.load(value, session)
        tf.compat.v1.saved_model.simple_save(session, folder, {"features": features}, {"scores": scores})


def _keras3_file(path, weights):
    inputs = keras.Input((6,), name="features")
    hidden = keras.layers.Dense(4, activation="relu", name="hidden")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3, name="scores")(hidden))
    model.set_weights(weights)
    model.save(path)
    return path


@pytest.fixture(scope="module")
def weights():
    rng = np.random.RandomState(3)
    return [rng.randn(6, 4).astype("float32"), rng.randn(4).astype("float32"),
            rng.randn(4, 3).astype("float32"), rng.randn(3).astype("float32")]


def test_keras_file_version_tells_the_flavours_apart(tmp_path, weights):
    from equivtool.exported._sides import keras_file_version
    legacy = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(3)])
    legacy.save(str(tmp_path / "tf_keras.keras"))
    assert keras_file_version(_keras3_file(str(tmp_path / "k3.keras"), weights)).startswith("3.")
    assert keras_file_version(str(tmp_path / "tf_keras.keras")).startswith("2.")


def test_compare_a_tf1_saved_model_with_a_keras3_file(tmp_path, weights):
    _tf1_saved_model(str(tmp_path / "tf1"), weights)
    good = _keras3_file(str(tmp_path / "good.keras"), weights)
    planted = [w.copy() for w in weights]
    planted[3][1] += 0.5  # one output bias
    bad = _keras3_file(str(tmp_path / "bad.keras"), planted)
    report = equivtool.compare_models(str(tmp_path / "tf1"), good, input_shapes="features:4,6")
    assert report.passed, str(report)
    report = equivtool.compare_models(str(tmp_path / "tf1"), bad, input_shapes="features:4,6")
    assert not report.passed and report.step("outputs").first_divergence == "scores"


# --------------------------------------------------------------------------
# rename=map_variables(...): weights aligned on a Keras 3 side too
# --------------------------------------------------------------------------

def test_a_mapping_aligns_keras3_weights_by_path():
    mapping = map_variables(slim_net, KerasNet, X)
    assert dict(mapping.pairs)["net/conv1/BatchNorm/gamma"] == "net/bn/gamma"
    report = check_equivalence(slim_net, KerasNet, X, rename=mapping, modes=("constant",))
    assert report.passed, str(report)
    slip = check_equivalence(slim_net, lambda: KerasNet(rate=0.4), X, rename=mapping, modes=("constant",),
                             steps=["random"])
    assert [s.name for s in slip.failed_steps] == ["random/constant/training"]


def test_an_aligned_keras3_variable_takes_its_fixed_value():
    from types import SimpleNamespace

    from equivtool.engine.align import tf2_aligned
    from equivtool.engine.sides.tf1_side import fixed_value
    options = SimpleNamespace(aligned="rules", renamer=lambda name: name)
    with tf2_aligned(options):
        layer = keras.layers.Dense(4, name="dense")
        layer(np.ones((2, 3), "float32"))
    np.testing.assert_array_equal(layer.kernel.numpy(), fixed_value("dense/kernel", [3, 4], tf.float32))
    outside = keras.layers.Dense(4, name="dense")
    outside(np.ones((2, 3), "float32"))
    assert not np.array_equal(outside.kernel.numpy(), layer.kernel.numpy())


def _keras3_initialize():
    return _tfi.keras3_variable_class().__dict__["_initialize"]


def test_keras3_initialize_is_restored_after_an_exception_and_out_of_order_exits():
    from equivtool.engine.align import _keras3_assigned
    before = _keras3_initialize()
    with pytest.raises(KeyError):
        with _keras3_assigned(lambda v: None):
            assert _keras3_initialize() is not before
            raise KeyError("planted")
    assert _keras3_initialize() is before
    first, second = _keras3_assigned(lambda v: None), _keras3_assigned(lambda v: None)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # the outer one ends first
    assert _keras3_initialize() is not before  # the inner one is still open
    thread = threading.Thread(target=lambda: second.__exit__(None, None, None))
    thread.start()
    thread.join()  # and ends on another thread
    assert _keras3_initialize() is before


def test_the_docs_example_runs_and_is_equivalent(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "docs", "keras3.md")) as handle:
        example = re.findall(r"```python\n(.*?)```", handle.read(), re.S)[0]  # the page's first example
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=root)
    result = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Verdict: EQUIVALENT (7 passed)" in result.stdout, result.stdout


def _tf1_dense(x, training):
    return tf.compat.v1.layers.dense(x, 4, name="dense", kernel_initializer=tf.compat.v1.glorot_uniform_initializer())


def _keras3_dense():
    return keras.layers.Dense(4, name="dense")


def test_a_keras3_layer_checks_in_worker_processes_with_every_default_step():
    x = np.random.RandomState(1).randn(2, 3).astype("float32")
    report = check_equivalence(_tf1_dense, _keras3_dense, x, workers=2)
    assert report.passed and len(report.steps) == 8, str(report)
    assert report.meta.get("worker_jobs")  # it did run in workers
