"""Tests for equivtool.determinism: the reproducibility audit."""

from __future__ import annotations

import inspect
import json
import os
import random
import sys
import textwrap
import time

import equivtool  # noqa: F401  (must come before tensorflow)

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.framework import config as tf_config
from tensorflow.python.framework import op_callbacks

from equivtool import DeterminismReport, audit_determinism
from equivtool.cli import audit_main


def _line_of(marker: str) -> int:
    """The line number in this file of the line containing ``marker`` (not this call)."""
    lines = inspect.getsource(sys.modules[__name__]).splitlines()
    hits = [i + 1 for i, line in enumerate(lines) if marker in line and "_line_of(" not in line]
    assert len(hits) == 1, hits
    return hits[0]


def _causes(report: DeterminismReport, kind: str):
    return [c for c in report.causes if c.kind == kind]


@pytest.fixture
def no_global_seed():
    """No TensorFlow global seed during the test; the seed state before it comes back after."""
    ctx = context.context()
    saved_seed, saved_rng = ctx._seed, getattr(ctx, "_rng", None)
    context.set_global_seed(None)
    yield
    context.set_global_seed(saved_seed)
    if saved_rng is not None:
        ctx._rng = saved_rng


@pytest.fixture
def op_determinism():
    """tf.config.experimental.enable_op_determinism() for one test, then put back."""
    was_enabled = tf_config.is_op_determinism_enabled()
    tf.config.experimental.enable_op_determinism()
    yield
    if not was_enabled:
        tf_config.disable_op_determinism()


def _noisy_step(w):
    def step():
        noise = tf.random.uniform([4])  # MARK: unseeded op
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(w - noise))
        w.assign_sub(0.1 * tape.gradient(loss, w))
        return {"loss": loss}
    return step


# ---------------------------------------------------------------------------
# Unseeded random ops
# ---------------------------------------------------------------------------


def test_unseeded_random_op_in_eager_step_is_reported_with_its_source_line(no_global_seed):
    w = tf.Variable(tf.ones([4]))
    report = audit_determinism(_noisy_step(w), runs=3)
    assert not report.reproducible and not report.passed
    assert {d.name for d in report.differing} == {"outputs/loss", "variables/Variable"}
    (cause,) = _causes(report, "unseeded_random_op")
    assert cause.subject == "RandomUniform"
    assert cause.location.startswith(f"{__file__}:{_line_of('MARK: unseeded op')} ")


def test_unseeded_random_op_in_tf_function_step_is_reported_with_its_source_line(no_global_seed):
    w = tf.Variable(tf.ones([4]))
    report = audit_determinism(tf.function(_noisy_step(w)), runs=2)
    assert not report.reproducible
    (cause,) = _causes(report, "unseeded_random_op")
    assert cause.location.startswith(f"{__file__}:{_line_of('MARK: unseeded op')} ")


def test_unseeded_random_op_in_fresh_tf1_graph_is_reported(no_global_seed):
    def tf1_step():
        with tf.Graph().as_default() as graph:
            x = tf.compat.v1.random_normal([3])  # MARK: tf1 unseeded
            with tf.compat.v1.Session(graph=graph) as session:
                return session.run(x)

    report = audit_determinism(tf1_step, runs=2)
    assert not report.reproducible
    (cause,) = _causes(report, "unseeded_random_op")
    assert cause.subject == "RandomStandardNormal"
    assert cause.location.startswith(f"{__file__}:{_line_of('MARK: tf1 unseeded')} ")


def test_op_seed_makes_the_noisy_step_reproducible(no_global_seed):
    w = tf.Variable(tf.ones([4]))

    def step():
        w.assign_sub(0.1 * tf.random.uniform([4], seed=7))
        return w.read_value()

    report = audit_determinism(step, runs=3)
    assert report.passed, str(report)


def test_global_seed_found_at_start_makes_unseeded_ops_reproducible(no_global_seed):
    tf.random.set_seed(3)
    tf.random.uniform([1])  # advance the op-seed counter: runs restart from here
    w = tf.Variable(tf.ones([4]))
    report = audit_determinism(tf.function(_noisy_step(w)), runs=3)
    assert report.passed, str(report)


def test_seed_argument_sets_the_global_seed_for_every_run(no_global_seed):
    w = tf.Variable(tf.ones([4]))
    report = audit_determinism(_noisy_step(w), runs=2, seed=11)
    assert report.passed, str(report)
    assert report.meta["seed"] == 11


def test_random_op_in_a_reused_session_is_reported_as_session_state(no_global_seed):
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(1)
        v = tf.compat.v1.get_variable("v", [3], initializer=tf.compat.v1.zeros_initializer())
        update = v.assign_add(tf.random.uniform([3]))  # MARK: session op
        session = tf.compat.v1.Session(graph=graph)
        session.run(tf.compat.v1.global_variables_initializer())
    try:
        report = audit_determinism(lambda: session.run(update), runs=2)
        assert not report.reproducible
        (cause,) = _causes(report, "random_op_state_in_session")
        assert cause.location.startswith(f"{__file__}:{_line_of('MARK: session op')} ")
        np.testing.assert_array_equal(session.run(v), np.zeros(3, np.float32))
    finally:
        session.close()


# ---------------------------------------------------------------------------
# tf.data
# ---------------------------------------------------------------------------


def _jittery(x):
    """Costs 0-4 ms of wall time, decided by the OS (not by any seed the audit resets)."""
    def slow(value):
        time.sleep(os.urandom(1)[0] / 255.0 * 0.004)
        return value
    return tf.py_function(slow, [x], tf.float32)


def _dataset_step(deterministic):
    ds = (tf.data.Dataset.range(1, 25).map(lambda i: tf.cast(i, tf.float32) / 8.0)
          .map(_jittery, num_parallel_calls=4, deterministic=deterministic))
    w = tf.Variable(0.5)

    def train_step():  # one SGD update per element: any reordering changes w
        for x in ds:
            with tf.GradientTape() as tape:
                loss = tf.square(x * w - 1.0)
            w.assign_sub(0.05 * tape.gradient(loss, w))
        return {"loss": loss}
    return train_step, w


def test_nondeterministic_parallel_map_is_reported_as_the_culprit():
    step, w = _dataset_step(deterministic=False)
    report = audit_determinism(step, runs=3)
    assert not report.reproducible, "the unordered map produced the same order three times"
    assert "variables/Variable" in {d.name for d in report.differing}
    (cause,) = _causes(report, "nondeterministic_dataset")
    assert cause.subject == "ds: map"
    assert "deterministic=False" in cause.message
    assert w.numpy() == np.float32(0.5)


def test_deterministic_parallel_map_is_reproducible():
    step, _ = _dataset_step(deterministic=True)
    report = audit_determinism(step, runs=3)
    assert report.passed, str(report)


def test_options_deterministic_false_is_reported():
    options = tf.data.Options()
    options.deterministic = False
    ds = tf.data.Dataset.range(8).map(lambda i: i * 2, num_parallel_calls=2).with_options(options)
    report = audit_determinism(lambda: tf.stack(list(ds)), runs=2, datasets={"pipeline": ds})
    (cause,) = _causes(report, "nondeterministic_dataset")
    assert "Options.deterministic is False" in cause.message
    assert not report.passed


def test_dataset_built_inside_fn_is_reported_with_its_source_line():
    def step():
        ds = tf.data.Dataset.range(8).map(
            lambda i: i + 1, num_parallel_calls=2, deterministic=False)  # MARK: inner map
        return tf.stack(list(ds))

    report = audit_determinism(step, runs=2)
    (cause,) = _causes(report, "nondeterministic_dataset")
    line = _line_of("MARK: inner map")
    assert cause.location.split(" in ")[0] in (f"{__file__}:{line - 1}", f"{__file__}:{line}")


def test_reshuffling_dataset_and_shared_iterator_are_reported():
    shuffled = tf.data.Dataset.range(16).shuffle(16, seed=1)
    iterator = iter(tf.data.Dataset.range(100))
    report = audit_determinism(lambda: (tf.stack(list(shuffled)), next(iterator)), runs=2)
    assert not report.reproducible
    assert _causes(report, "reshuffling_dataset")[0].subject == "shuffled: shuffle"
    assert _causes(report, "dataset_iterator")[0].subject == "iterator"


# ---------------------------------------------------------------------------
# GPU ops
# ---------------------------------------------------------------------------


@tf.function
def _xent_loss():
    logits = tf.constant([[1.0, 2.0, 0.5], [0.1, 0.2, 3.0]])
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=[1, 2], logits=logits))


@pytest.mark.parametrize("gpu, determinism, reported", [
    (True, False, True), (True, True, False), (False, False, False)])
def test_tf_xent_is_reported_only_on_a_gpu_with_op_determinism_disabled(gpu, determinism, reported):
    report = audit_determinism(_xent_loss, runs=2, gpu_available=gpu, op_determinism=determinism)
    causes = _causes(report, "gpu_nondeterministic_op")
    assert bool(causes) is reported
    if reported:
        assert [c.subject for c in causes] == ["SparseSoftmaxCrossEntropyWithLogits"]
        assert "equivtool.ops.deterministic_xent()" in causes[0].hint
        assert causes[0].location.startswith(__file__)


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


def test_signed_zero_is_a_bitwise_difference():
    values = iter([0.0, -0.0])
    report = audit_determinism(lambda: np.float32(next(values)), runs=2)
    assert not report.reproducible
    (diff,) = report.differing
    assert diff.mismatched == 1 and diff.max_abs == 0.0
    assert "different bits" in diff.worst.note


def test_report_text_and_json_name_differences_and_causes(no_global_seed):
    w = tf.Variable(tf.ones([4]))
    report = audit_determinism(_noisy_step(w), runs=2)
    text = str(report)
    assert "NOT REPRODUCIBLE" in text and "unseeded_random_op" in text and "variables/Variable" in text
    data = json.loads(report.to_json())
    assert data["reproducible"] is False and data["passed"] is False
    assert data["causes"][0]["kind"] == "unseeded_random_op"
    assert [d["name"] for d in data["differing"]] == ["outputs/loss", "variables/Variable"]
    with pytest.raises(AssertionError, match="NOT REPRODUCIBLE"):
        report.raise_for_failure()


@pytest.mark.parametrize("runs", [1, 0, 2.0, True])
def test_runs_below_two_are_rejected(runs):
    with pytest.raises(ValueError, match="runs must be an int >= 2"):
        audit_determinism(lambda: None, runs=runs)


# ---------------------------------------------------------------------------
# audit_main (the CLI's `equivtool audit MODULE:FN --runs N`)
# ---------------------------------------------------------------------------


_TARGET_MODULE = textwrap.dedent('''
    import equivtool
    import tensorflow as tf

    w = tf.Variable([1.0, 2.0])

    @tf.function
    def reproducible():
        w.assign_add(tf.random.uniform([2], seed=3))
        return {"w": w.read_value()}

    def noisy():
        w.assign_add(tf.random.uniform([2]))
        return w.read_value()

    not_callable = 3
''')


@pytest.fixture
def target_module(tmp_path, monkeypatch):
    name = "equivtool_audit_target"
    (tmp_path / f"{name}.py").write_text(_TARGET_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_audit_main_returns_0_for_a_reproducible_target_and_writes_reports(target_module, tmp_path, capsys):
    json_path, html_path = tmp_path / "audit.json", tmp_path / "audit.html"
    assert audit_main(f"{target_module}:reproducible", 2, json_path=json_path, html_path=html_path) == 0
    assert "REPRODUCIBLE" in capsys.readouterr().out
    assert json.loads(json_path.read_text())["passed"] is True
    assert "<html" in html_path.read_text()


def test_audit_main_returns_1_for_a_non_reproducible_target(target_module, no_global_seed, capsys):
    assert audit_main(f"{target_module}:noisy", 2) == 1
    assert "unseeded_random_op" in capsys.readouterr().out


@pytest.mark.parametrize("target, message", [
    ("no_such_module_xyz:fn", "cannot import module"),
    ("{mod}:missing", "has no attribute 'missing'"),
    ("{mod}:not_callable", "expected a callable"),
    ("{mod}", "expected MODULE:NAME"),
])
def test_audit_main_bad_target_raises_value_error(target_module, target, message):
    with pytest.raises(ValueError, match=message):
        audit_main(target.format(mod=target_module), 2)
