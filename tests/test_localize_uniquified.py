"""Issue 23, item 6: eager localization aligns uniquified scopes (``x_2`` against
``x``) by structure, not by suffix number, and shows the TF2 op under the scope
the TF1 graph gave that instance."""

import functools
import types

import numpy as np
import tensorflow as tf

import equivtool
from published_models import shim_of
from equivtool.localize.alignment import TF1Op
from equivtool.localize.lockstep import Lockstep, Record


def _op(index, name, op_type="Conv2D"):
    return TF1Op(index, types.SimpleNamespace(name=name, type=op_type), [0], name)


def test_shifted_suffixes_align_in_structural_order():
    ops = [_op(0, "x/conv/Conv2D"), _op(1, "x_1/conv/Conv2D"), _op(2, "x_2/conv/Conv2D")]
    lockstep = Lockstep(ops, run_tf1=None, tolerance=None, budget_bytes=1 << 20)
    # eagerly the instances were numbered from 1 (x_1, x_2, x_3): the k-th aligns with the k-th
    for expected, scope in zip(ops, ("x_1/conv", "x_2/conv", "x_3/conv")):
        record = Record(f"{scope}/Conv2D", scope, "Conv2D", [np.zeros(1)], [])
        found = lockstep.align(record)
        assert found is expected, (scope, found.name if found else None)
        found.matched = True
        lockstep.cursor = found.index


def blocks(x, training, fault=False):
    with tf.compat.v1.variable_scope("net"):
        for i in range(3):
            with tf.compat.v1.variable_scope(None, default_name="block"):
                x = tf.compat.v1.layers.dense(x, 4, name="dense")
                x = tf.nn.leaky_relu(x, alpha=0.3 if (fault and i == 2) else 0.2)
    return x


BlocksShim = shim_of(blocks)


def test_eager_localization_names_the_third_block_on_both_sides():
    x = np.random.default_rng(0).normal(size=(2, 4)).astype(np.float32) * 3
    report = equivtool.check_equivalence(blocks, functools.partial(BlocksShim, fault=True), x,
                                         steps=["fixed_weights"], localize=True)
    loc = report.step("fixed_weights").data["localization"]
    assert loc.tf1_op == "net/block_2/LeakyRelu"
    assert loc.tf2_op.startswith("block_2/LeakyRelu (eager name block/LeakyRelu"), loc.tf2_op
