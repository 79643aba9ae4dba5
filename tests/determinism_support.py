"""Shared helpers and fixtures of the equivtool.determinism tests (test_determinism_*.py)."""

from __future__ import annotations

import inspect
import sys

import equivtool  # noqa: F401  (must come before tensorflow)

import pytest
import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.framework import config as tf_config

from equivtool import DeterminismReport


def _line_of(marker: str, module: str = "") -> int:
    """The line number of the line containing ``marker`` in the calling module (or ``module``)."""
    caller = module or sys._getframe(1).f_globals["__name__"]
    lines = inspect.getsource(sys.modules[caller]).splitlines()
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

