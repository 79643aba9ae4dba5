"""Sparse and ragged outputs of ``tf1_fn`` cross from the TensorFlow 1.15 interpreter as their components.

In-process, a session's ``SparseTensorValue`` / ``RaggedTensorValue`` is compared
by its parts (``indices``, ``values``, ``dense_shape``; ``flat_values``,
``row_splits_0``); the old side sends the same components under the same names,
so the report's leaves and verdict are those of the in-process TF1 side. The
model is tests/tf1_python_model.py's ``composites`` (the same code in both
versions). Needs ``$EQUIVTOOL_TF1_PYTHON`` (skips with the reason without it).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from equivtool import check_equivalence

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "contrib_tf1")
sys.path[:0] = [HERE, EXAMPLE]
import tf1_python_model as helpers  # noqa: E402
from test_tf1_python_side import tf1_python  # noqa: E402,F401 (the fixture: skips without the interpreter)

X = np.array([[0.2, 0.7, 0.9], [0.6, 0.1, 0.8]], np.float32)
PARTS = ("dense", "ragged/flat_values", "ragged/row_splits_0", "sparse/indices", "sparse/values",
         "sparse/dense_shape")


def _layer(split=1, shift=0.0):
    import tensorflow as tf

    class Composites(tf.keras.layers.Layer):
        def call(self, x, training=None):
            return helpers.composite_outputs(x, split, shift)
    return Composites


def _leaves(report) -> dict:
    return {leaf.name: leaf for leaf in report.step("fixed_weights").leaves}


def _there(tf1_python, **kwargs):
    return check_equivalence("tf1_python_model:composites", _layer(**kwargs), X, steps=["fixed_weights"],
                             tf1_python=tf1_python, tf1_path=[HERE, EXAMPLE])


def test_sparse_and_ragged_outputs_are_compared_as_in_process(tf1_python):
    there = _there(tf1_python)
    here = check_equivalence(helpers.composites, _layer(), X, steps=["fixed_weights"])
    assert there.passed and here.passed, str(there) + str(here)
    assert there.verdict == here.verdict
    leaves = _leaves(there)
    assert sorted(leaves) == sorted(_leaves(here))  # the same leaf names both ways
    for name in PARTS:  # every component compared, not only named
        assert leaves[f"end_points/{name}"].compared > 0, sorted(leaves)
    assert there.meta["old_ran_under"].startswith("TensorFlow 1.15")


@pytest.mark.parametrize("fault, diverges", [(dict(split=2), "end_points/ragged/row_splits_0"),
                                             (dict(shift=0.5), "end_points/sparse/values")])
def test_a_wrong_row_split_or_sparse_value_is_not_equivalent(tf1_python, fault, diverges):
    there = _there(tf1_python, **fault)
    here = check_equivalence(helpers.composites, _layer(**fault), X, steps=["fixed_weights"])
    assert not there.passed and there.step("fixed_weights").status == "failed", str(there)
    assert there.step("fixed_weights").first_divergence == diverges
    assert here.step("fixed_weights").first_divergence == diverges  # as in-process
