"""``tf.IndexedSlices`` outputs of ``tf1_fn`` cross from the TensorFlow 1.15 interpreter.

They cross as their components (``values``, ``indices``, ``dense_shape`` where
known) and are held as the in-process TF1 side holds a session's
``IndexedSlicesValue``, so the leaf (``<path>/dense``: the dense value they
denote), its note and the verdict are those of the in-process check
(tests/test_indexed_slices.py). The models are tests/tf1_python_model.py's
``slices``, ``empty_slices`` and ``embedding_gradient`` (the same code in both
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
from test_indexed_slices import _embedding_layer, _layer, fault_line, verdict_word  # noqa: E402
from test_tf1_python_side import tf1_python  # noqa: E402,F401 (the fixture: skips without the interpreter)

X = np.array([[0.2, 0.7, 0.9], [0.6, 0.1, 0.8]], np.float32)
LEAF = "end_points/slices/dense"


def _pair(tf1_python, fault="", **kwargs) -> tuple:
    """(there, here): fixed_weights with the TF1 side in TF 1.15, then in process."""
    name = "empty_slices" if fault == "empty" else "slices"
    there = check_equivalence(f"tf1_python_model:{name}", _layer(fault), X, steps=["fixed_weights"],
                              tf1_python=tf1_python, tf1_path=[HERE, EXAMPLE], **kwargs)
    here = check_equivalence(getattr(helpers, name), _layer(fault), X, steps=["fixed_weights"], **kwargs)
    return there, here


def _leaf(report):
    return report.step("fixed_weights").comparisons[0].leaf(LEAF)


@pytest.mark.parametrize("fault, verdict", [("", "EQUIVALENT"), ("value", "NOT EQUIVALENT"),
                                            ("index", "NOT EQUIVALENT"), ("split", "EQUIVALENT"),
                                            ("split_wrong", "NOT EQUIVALENT"), ("no_shape", "EQUIVALENT"),
                                            ("empty", "INCONCLUSIVE")])
def test_an_indexed_slices_output_is_judged_as_in_process(tf1_python, fault, verdict):
    there, here = _pair(tf1_python, fault)
    assert verdict_word(there) == verdict_word(here) == verdict, str(there) + str(here)
    assert there.meta["old_ran_under"].startswith("TensorFlow 1.15")
    leaf, local = _leaf(there), _leaf(here)
    assert [lf.name for lf in there.step("fixed_weights").comparisons[0]] == \
        [lf.name for lf in here.step("fixed_weights").comparisons[0]]
    # the same leaf: shapes, counts, the note (index sets, dtypes, the first differing row)
    assert (leaf.status, leaf.compared, leaf.size, leaf.first_mismatch, leaf.note) == \
        (local.status, local.compared, local.size, local.first_mismatch, local.note)
    if verdict == "EQUIVALENT":
        assert leaf.compared == 15, str(there)
    if verdict == "NOT EQUIVALENT":
        assert there.step("fixed_weights").first_divergence == LEAF and "first differing row: index" in leaf.note


def test_localization_of_a_wrong_slice_value_is_as_in_process(tf1_python):
    there, here = _pair(tf1_python, "value", localize=True)
    found = [report.step("fixed_weights").data.get("localization") for report in (there, here)]
    assert all(f is not None and f.status == "diverged" for f in found), str(there)
    assert found[0].tf2_source.endswith(fault_line()) and found[0].tf1_op == found[1].tf1_op


def test_an_unknown_dense_shape_crosses_as_unknown(tf1_python):
    """The TF1 side leaves dense_shape unknown; the TF2 side gives it: EQUIVALENT, as in process."""
    there = check_equivalence("tf1_python_model:slices_without_shape", _layer(), X, steps=["fixed_weights"],
                              tf1_python=tf1_python, tf1_path=[HERE, EXAMPLE])
    assert there.passed, str(there)
    assert "expected 2 entries at 2 rows {1, 3}, indices int64, values float32, dense_shape unknown" in \
        _leaf(there).note


def test_a_model_returning_an_embedding_gradient_passes_every_default_step(tf1_python):
    report = check_equivalence("tf1_python_model:embedding_gradient", _embedding_layer(), X,
                               tf1_python=tf1_python, tf1_path=[HERE, EXAMPLE])
    assert report.passed, str(report)
    leaf = report.step("fixed_weights").comparisons[0].leaf("end_points/table_gradient/dense")
    assert leaf.compared == 15 and "repeated {3} (summed)" in leaf.note, leaf.note


def test_the_kernel_floor_perturbs_a_pass_with_composite_outputs(tf1_python):
    """The floor's run rebuilds the pass's outputs from their perturbed components
    (sparse, ragged and IndexedSlices alike): before, it took a component for the
    composite and the floor was "not measured"."""
    report = check_equivalence("tf1_python_model:all_composites", _all_composites_layer(), X,
                               steps=["fixed_weights"], kernel_floor=True,
                               tf1_python=tf1_python, tf1_path=[HERE, EXAMPLE])
    assert report.passed, str(report)
    notes = " ".join(report.step("fixed_weights").notes)
    assert "largest floor" in notes and "not measured" not in notes, notes


def _all_composites_layer():
    import tensorflow as tf

    class All(tf.keras.layers.Layer):
        def call(self, x, training=None):
            return helpers.all_composites(x, training)
    return All


def test_a_random_loop_flag_of_any_component_is_the_slices_leafs_flag():
    """Runs without the interpreter: the program flags each component it fetches
    (values, indices) for random while loops; the leaf the comparison walks is one,
    so it depends on a loop when any of its components does."""
    from equivtool.engine.sides.old_python import OldForward, _leaf_flags

    slices = {"slices": [["values", "leaf"], ["indices", "leaf"], ["dense_shape", "leaf"]]}
    structure = {"dict": [["dense", "leaf"], ["slices", slices]]}
    flags = [False, False, True, False, False]  # dense, values, indices, dense_shape, then the regularization
    forward = OldForward(0, structure, [], [], {"loop": ["op"]}, flags, False, {})
    assert _leaf_flags(forward, None) == [[False, True], [False]]
    forward.leaf_flags = [True, False, False, False, False]
    assert _leaf_flags(forward, None) == [[True, False], [False]]
