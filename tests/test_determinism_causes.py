"""equivtool.determinism's op recorder and cause rules: random ops, datasets, GPU ops."""

from __future__ import annotations

import os
import time

import equivtool  # noqa: F401  (must come before tensorflow)

import numpy as np
import pytest
import tensorflow as tf

from equivtool import audit_determinism
import determinism_support
from determinism_support import _causes, _line_of, _noisy_step, no_global_seed, op_determinism  # noqa: F401  (fixtures)


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
    assert cause.location.startswith(f"{determinism_support.__file__}:"
                                     f"{_line_of('MARK: unseeded op', 'determinism_support')} ")


def test_unseeded_random_op_in_tf_function_step_is_reported_with_its_source_line(no_global_seed):
    w = tf.Variable(tf.ones([4]))
    report = audit_determinism(tf.function(_noisy_step(w)), runs=2)
    assert not report.reproducible
    (cause,) = _causes(report, "unseeded_random_op")
    assert cause.location.startswith(f"{determinism_support.__file__}:"
                                     f"{_line_of('MARK: unseeded op', 'determinism_support')} ")


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
    """Costs 0-30 ms of wall time, decided by the OS (not by any seed the audit resets): far
    longer than the consumer's step even on a loaded machine, so an unordered map hands
    elements out as they finish (with 0-4 ms, a slow consumer found every element ready
    and got them in order three times under a load average of 6)."""
    def slow(value):
        time.sleep(os.urandom(1)[0] / 255.0 * 0.030)
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


