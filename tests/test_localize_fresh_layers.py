"""Localization in the steps that build a fresh TF2 layer (``num_random_ops``) and in
training passes, in process: it never names the wrong op.

Found with the contrib example (an LSTM cell and a batch norm, in TensorFlow 2's
in-process TF1 side): a fresh layer creates its variables inside the tapped call,
and the LSTM kernel's initializer ops (created under ``rnn/lstm/kernel``, not an
``Initializer`` scope) were aligned with the TF1 kernel's read, so even the
faithful rewrite was reported "diverged" at ``small/rnn/lstm/kernel/Read/Identity``
and the forget-bias slip was blamed there too. And batch norm's moving averages
were not compared, so a decay slip failed the step with "no divergence"; comparing
them needs the TF1 re-run to start from the statistics the step started from.
"""

from __future__ import annotations

import functools
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from equivtool import check_equivalence
from equivtool.localize.alignment import tf1_forward_ops, writes_a_variable
from equivtool.localize.tap import making_initial_value

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "contrib_tf1")
sys.path.insert(0, EXAMPLE)
import contrib_tf1_model as model  # noqa: E402

INPUTS = np.random.RandomState(0).uniform(-1, 1, (4, model.FEATURES)).astype(np.float32)
STEPS = ("random/constant/training", "random/num_random_ops/inference", "random/num_random_ops/training")


def _localized(localize=True, **slip) -> dict:
    report = check_equivalence(model.model, functools.partial(model.Shim, **slip), INPUTS, steps=["random"],
                               localize=localize)
    found = {}
    for name in STEPS:
        step = report.step(name)
        loc = step.data.get("localization")
        found[name] = (step.status, None if loc is None else (loc.status, loc.tf1_op))
    return found


def test_the_faithful_rewrite_localizes_nothing_in_any_random_step():
    for name, (status, (where, op)) in _localized(localize="all").items():
        assert status == "passed" and where == "no_divergence", (name, where, op)


def test_a_forget_bias_slip_is_named_at_the_lstm_s_add_in_fresh_layers_too():
    found = _localized(forget_bias=0.0)
    for name in STEPS:
        assert found[name] == ("failed", ("diverged", "small/rnn/lstm/add")), name


def test_a_batch_norm_decay_slip_is_named_where_the_decay_is_applied():
    found = _localized(decay=0.99)
    assert found["random/num_random_ops/inference"] == ("passed", None)
    for name in ("random/constant/training", "random/num_random_ops/training"):
        assert found[name] == ("failed", ("diverged", "small/BatchNorm/AssignMovingAvg/mul")), name


def test_an_initial_value_s_ops_are_known_by_the_frame_they_run_under():
    creating = [("/x/site-packages/tensorflow/python/ops/resource_variable_ops.py", 1, "_init_from_args"),
                ("/x/site-packages/keras/src/initializers/random_initializers.py", 2, "__call__")]
    assert making_initial_value(creating)
    assert not making_initial_value([("/x/resource_variable_ops.py", 1, "value"), ("/u/model.py", 3, "call")])
    assert not making_initial_value([])


def test_update_ops_inputs_are_compared_and_the_writes_never_fetched():
    graph = tf.Graph()
    with graph.as_default():
        v1 = tf.compat.v1
        x = v1.placeholder(tf.float32, [3])
        moving = v1.Variable(tf.zeros([3]), use_resource=False, name="moving")  # a ref variable: its write has an output
        out = tf.nn.relu(x, name="out")
        delta = tf.multiply(moving - x, 0.1, name="delta")
        update = v1.assign_sub(moving, delta, name="update")
        v1.add_to_collection(v1.GraphKeys.UPDATE_OPS, update)
    ops, _, _ = tf1_forward_ops(graph, out)
    names = [op.name for op in ops]
    assert "out" in names and "delta" in names and "sub" in names
    assert "update" not in names and all(not writes_a_variable(op.type) for op in ops)
    assert writes_a_variable("AssignSub") and writes_a_variable("ResourceApplyAdam") and not writes_a_variable("Sub")
