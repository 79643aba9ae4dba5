"""equivtool.determinism's audit loop: state captured and restored, endpoints, arguments."""

from __future__ import annotations

import random

import equivtool  # noqa: F401  (must come before tensorflow)

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.framework import op_callbacks

from equivtool import audit_determinism
from determinism_support import no_global_seed, op_determinism  # noqa: F401  (fixtures)


# ---------------------------------------------------------------------------
# The MNIST convnet
# ---------------------------------------------------------------------------


def _equivtool_xent():
    """equivtool's op when its library is built, else None."""
    import equivtool.ops

    try:
        if equivtool.ops.op_status().get("built"):
            return equivtool.ops.sparse_softmax_cross_entropy_with_logits
    except Exception:  # noqa: BLE001 - a broken build counts as not built
        return None
    return None


def test_mnist_convnet_train_step_is_bitwise_reproducible(no_global_seed, op_determinism):
    from examples.mnist_convnet.keras_model import make_model, synthetic_batch

    xent = _equivtool_xent() or tf.nn.sparse_softmax_cross_entropy_with_logits
    tf.random.set_seed(1234)
    model = make_model()
    optimizer = tf.keras.optimizers.SGD(0.05, momentum=0.9)
    images, labels = synthetic_batch(16, seed=0)

    @tf.function
    def train_step():
        with tf.GradientTape() as tape:
            logits = model(images, training=True)  # dropout on: seeds matter
            loss = tf.reduce_mean(xent(labels=labels, logits=logits))
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return {"loss": loss, "logits": logits}

    report = audit_determinism(train_step, runs=3, gpu_available=True)
    assert report.passed, str(report)
    names = report.leaf_names
    assert "variables/mnist_convnet/conv1/kernel" in names
    assert {"variables/SGD/m/mnist_convnet/conv1/kernel", "variables/iteration"} <= set(names)  # optimizer state
    if xent is not tf.nn.sparse_softmax_cross_entropy_with_logits:  # equivtool's op was used
        graph_ops = {op.type for op in train_step.get_concrete_function().graph.get_operations()}
        assert "SparseSoftmaxCrossEntropyWithLogits" not in graph_ops


# ---------------------------------------------------------------------------
# State: variables and seeds end as they started
# ---------------------------------------------------------------------------


def test_variables_and_random_state_end_as_they_started(no_global_seed):
    w = tf.Variable([1.0, -0.0, 3.0])
    tf.random.set_seed(5)
    tf.random.uniform([1])
    ctx = context.context()
    seed_before, counter_before = ctx._seed, ctx._rng.getstate()
    np_before, py_before = np.random.get_state()[1].copy(), random.getstate()

    def step():
        w.assign_add(tf.random.uniform([3]) + np.random.rand() + random.random())
        return w.read_value()

    audit_determinism(step, runs=3)
    np.testing.assert_array_equal(w.numpy(), np.array([1.0, -0.0, 3.0], np.float32))
    assert np.signbit(w.numpy()[1])
    assert ctx._seed == seed_before and ctx._rng.getstate() == counter_before
    np.testing.assert_array_equal(np.random.get_state()[1], np_before)
    assert random.getstate() == py_before


def test_variables_are_restored_when_fn_raises_mid_run(no_global_seed):
    w = tf.Variable([1.0, 2.0])
    calls = []

    def step():
        calls.append(1)
        w.assign([7.0, 8.0])
        if len(calls) == 2:
            raise RuntimeError("boom in run 2")
        return w.read_value()

    with pytest.raises(RuntimeError, match="boom in run 2"):
        audit_determinism(step, runs=3)
    np.testing.assert_array_equal(w.numpy(), [1.0, 2.0])
    assert not op_callbacks.should_invoke_op_callbacks()


def test_variables_are_restored_when_fn_raises_in_the_first_run():
    w = tf.Variable([1.0, 2.0])

    def step():
        w.assign([7.0, 8.0])
        raise ValueError("boom in run 1")

    with pytest.raises(ValueError, match="boom in run 1"):
        audit_determinism(step)
    np.testing.assert_array_equal(w.numpy(), [1.0, 2.0])
    assert not op_callbacks.should_invoke_op_callbacks()


def test_explicit_variables_are_the_ones_restored():
    w, other = tf.Variable(1.0), tf.Variable(10.0)

    def step():
        w.assign_add(1.0)
        other.assign_add(1.0)
        return {"w": w.read_value(), "other": other.read_value()}

    report = audit_determinism(step, runs=2, variables=[w])
    np.testing.assert_array_equal(w.numpy(), 1.0)
    assert other.numpy() == 12.0  # not restored: it was not given
    assert [d.name for d in report.differing] == ["outputs/other"]


def test_optimizer_slots_created_in_the_first_run_are_reset():
    dense = tf.keras.layers.Dense(2, kernel_initializer="ones")
    dense.build((None, 3))
    optimizer = tf.keras.optimizers.Adam(0.1)
    x = tf.constant([[1.0, 2.0, 3.0]])

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(dense(x) ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, dense.trainable_variables), dense.trainable_variables))
        return loss

    report = audit_determinism(step, runs=3)
    assert report.passed, str(report)
    assert any("created during run 1" in n for n in report.notes)
    slots = [v for v in optimizer.variables if "/m/" in v.name or "/v/" in v.name]
    assert len(slots) == 4 and not any(v.numpy().any() for v in slots)  # back at their initial zeros
    assert optimizer.iterations.numpy() == 0


# ---------------------------------------------------------------------------
# Comparison details
# ---------------------------------------------------------------------------


def test_first_differing_endpoint_follows_forward_order(no_global_seed):
    x = tf.constant([1.0, 2.0])

    def forward():
        a = x * 2.0
        b = a + tf.random.uniform([2])  # differs
        c = b * 3.0  # differs downstream
        return {"end_points": {"a": a, "b": b, "c": c}, "logits": c}

    report = audit_determinism(forward, runs=2, endpoints="end_points")
    assert report.first_differing_endpoint == "b"
    assert "First differing endpoint (forward order): b" in str(report)


def test_endpoints_callable_is_read_after_each_run(no_global_seed):
    captured = {}

    def forward():
        captured["stem"] = tf.constant([1.0])
        captured["head"] = tf.random.uniform([1])
        return tf.reduce_sum(captured["head"])

    report = audit_determinism(forward, runs=2, endpoints=lambda: dict(captured))
    assert report.first_differing_endpoint == "head"


def test_endpoints_key_missing_from_fn_result_is_an_error():
    with pytest.raises(ValueError, match="endpoints='end_points'"):
        audit_determinism(lambda: {"logits": tf.constant(1.0)}, runs=2, endpoints="end_points")



@pytest.mark.parametrize("runs", [1, 0, 2.0, True])
def test_runs_below_two_are_rejected(runs):
    with pytest.raises(ValueError, match="runs must be an int >= 2"):
        audit_determinism(lambda: None, runs=runs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(datasets=3), "datasets must be None, a dict"),
    (dict(datasets=[tf.data.Dataset.range(3), "not a dataset"]), r"datasets\[1\] is a str"),
    (dict(datasets={"train": np.zeros(3)}), "train is a ndarray"),
    (dict(session="sess"), "session must be None or the tf.compat.v1.Session"),
    (dict(session=tf.Graph()), "got Graph"),
])
def test_wrong_datasets_or_session_is_refused_before_any_run(kwargs, message):
    calls = []
    with pytest.raises(TypeError, match=message):
        audit_determinism(lambda: calls.append(1), runs=2, **kwargs)
    assert calls == []  # refused before fn ran


def test_datasets_and_iterators_of_the_right_type_are_accepted():
    dataset = tf.data.Dataset.range(4)
    report = audit_determinism(lambda: tf.constant(1.0), runs=2,
                               datasets={"d": dataset, "it": iter(dataset)})
    assert report.reproducible

