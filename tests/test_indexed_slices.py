"""Outputs that are ``tf.IndexedSlices``: compared by the dense value they denote.

A model may return an ``IndexedSlices`` (the gradient of an embedding lookup, or
one its code builds). Two correct programs may list its rows in another order,
split a row into entries of a repeated index that sum, or leave ``dense_shape``
unknown; the leaf ``<path>/dense`` is the tensor they denote, and its note names
the index sets, dtypes and the first differing row (equivtool.comparison._slices).
First the NumPy rules (``SlicesArrays``, ``compare``), then in-process checks of
tests/tf1_python_model.py's ``slices`` and ``embedding_gradient`` against the same
code in a TF2 layer, eager and in ``tf.function``.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from equivtool import check_equivalence
from equivtool._base.slices import SlicesArrays, slices_arrays
from equivtool._base.tree import dense_gradient, expand_composites, to_numpy
from equivtool.comparison import Tolerance, compare

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "contrib_tf1")
sys.path[:0] = [HERE, EXAMPLE]
import tf1_python_model as helpers  # noqa: E402

X = np.array([[0.2, 0.7, 0.9], [0.6, 0.1, 0.8]], np.float32)
ROWS = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)


def _slices(values, indices, shape=(4, 2), index_dtype=np.int64) -> SlicesArrays:
    return SlicesArrays(np.asarray(values, np.float32), np.asarray(indices, index_dtype),
                        None if shape is None else np.asarray(shape, np.int64))


def verdict_word(report) -> str:
    """EQUIVALENT, NOT EQUIVALENT or INCONCLUSIVE, from the verdict line."""
    return report.verdict.split(" (")[0].split(": ", 1)[1]


def _leaf(expected, actual, **kwargs):
    [leaf] = compare({"s": expected}, {"s": actual}, **kwargs).leaves
    return leaf


# -- the dense value -----------------------------------------------------------

def test_dense_sums_repeated_indices_and_infers_rows_without_dense_shape():
    summed = _slices([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], [2, 0, 2]).dense()
    np.testing.assert_array_equal(summed, [[3, 4], [0, 0], [6, 8], [0, 0]])
    no_shape = _slices(ROWS, [2, 0], shape=None)
    assert no_shape.dense().shape == (3, 2) and no_shape.dense(5).shape == (5, 2)


@pytest.mark.parametrize("slices, problem", [
    (_slices(ROWS, [0, 4]), "index 4 is outside dense_shape [4, 2]"),
    (_slices(ROWS, [0, -1], shape=None), "index -1 is negative"),
    (_slices(ROWS, [0]), "do not index the rows"),
    (_slices(ROWS, [0, 1], shape=(4, 3)), "do not fit dense_shape [4, 3]"),
])
def test_components_that_denote_no_tensor_fail_the_leaf_naming_why(slices, problem):
    assert problem in slices.problem()
    leaf = _leaf(_slices(ROWS, [0, 1]), slices)
    assert leaf.failed and not leaf.values_compared and problem in leaf.note
    assert leaf.name == "s/dense"


def test_session_and_eager_values_become_slices_arrays_and_gradients_still_densify():
    import tensorflow as tf

    eager = tf.IndexedSlices(tf.constant(ROWS), tf.constant([3, 1]), tf.constant([4, 2]))
    kept = to_numpy({"g": eager}, keep_slices=True)["g"]
    assert isinstance(kept, SlicesArrays) and kept.indices.tolist() == [3, 1]
    np.testing.assert_array_equal(to_numpy({"g": eager})["g"], kept.dense())  # the audit's dense form
    with tf.Graph().as_default():
        graph_slices = tf.IndexedSlices(tf.constant(ROWS), tf.constant([3, 1], tf.int64))
        with tf.compat.v1.Session() as session:
            value = session.run(graph_slices)
    assert type(value).__name__ == "IndexedSlicesValue" and value.dense_shape is None
    held = expand_composites([value])[0]
    assert isinstance(held, SlicesArrays) and held.dense_shape is None
    # a gradient fetched as SlicesArrays is scattered as before (the gradients step)
    np.testing.assert_array_equal(dense_gradient(held, (4, 2))[0], kept.dense())
    crossed = slices_arrays({"values": ROWS, "indices": np.array([3, 1])})  # from the TF1 interpreter
    np.testing.assert_array_equal(crossed.dense(4), kept.dense())


# -- the judgement -------------------------------------------------------------

def test_equal_dense_values_pass_whatever_the_order_and_repetition_of_indices():
    expected = _slices(ROWS, [3, 1])
    split = _slices([[3.0, 4.0], [0.5, 0.5], [0.5, 1.5]], [1, 3, 3], index_dtype=np.int32)
    leaf = _leaf(expected, split)
    assert leaf.status == "passed" and leaf.compared == 8 and leaf.size == 8, str(leaf)
    assert "expected 2 entries at 2 rows {1, 3}, indices int64" in leaf.note
    assert "actual 3 entries at 2 rows {1, 3}, indices int32" in leaf.note and "repeated {3}" in leaf.note


def test_a_wrong_value_fails_naming_its_row():
    leaf = _leaf(_slices(ROWS, [3, 1]), _slices([[1.0, 2.0], [3.0, 4.5]], [3, 1]))
    assert leaf.failed and leaf.mismatched == 1 and leaf.first_mismatch == (1, 1), str(leaf)
    assert "first differing row: index 1 (expected 1 entry, actual 1 entry for it)" in leaf.note


def test_a_wrong_index_fails_naming_the_row_and_the_index_sets():
    leaf = _leaf(_slices(ROWS, [3, 1]), _slices(ROWS, [3, 2]))
    assert leaf.failed and leaf.first_mismatch[0] == 1, str(leaf)
    assert "index 1 (expected 1 entry, actual 0 entries for it)" in leaf.note
    assert "rows in expected only {1}" in leaf.note and "rows in actual only {2}" in leaf.note


def test_repeated_indices_that_sum_differently_fail_naming_the_row():
    leaf = _leaf(_slices(ROWS, [3, 1]), _slices([[3.0, 4.0], [0.5, 0.5], [0.5, 2.5]], [1, 3, 3]))
    assert leaf.failed and leaf.first_mismatch[0] == 3, str(leaf)
    assert "index 3 (expected 1 entry, actual 2 entries for it)" in leaf.note


def test_an_unknown_dense_shape_takes_the_other_sides_rows():
    leaf = _leaf(_slices(ROWS, [2, 1]), _slices(ROWS, [2, 1], shape=None))
    assert leaf.status == "passed" and leaf.expected_shape == leaf.actual_shape == (4, 2), str(leaf)
    # neither known: the rows either side reaches, so a listed row of zeros is no difference
    zeros = _slices([[1.0, 2.0], [3.0, 4.0], [0.0, 0.0]], [2, 1, 5], shape=None)
    assert _leaf(_slices(ROWS, [2, 1], shape=None), zeros).status == "passed"
    # an index beyond the other side's dense_shape is a difference (the shapes differ)
    beyond = _leaf(_slices(ROWS, [2, 1]), _slices(ROWS, [2, 6], shape=None))
    assert beyond.failed and beyond.shape_mismatch, str(beyond)


def test_dense_shapes_and_value_dtypes_must_match_index_dtypes_need_not():
    assert _leaf(_slices(ROWS, [2, 1]), _slices(ROWS, [2, 1], shape=(5, 2))).shape_mismatch
    halves = SlicesArrays(ROWS.astype(np.float16), np.array([2, 1]), np.array([4, 2]))
    assert _leaf(_slices(ROWS, [2, 1]), halves).dtype_mismatch
    assert _leaf(_slices(ROWS, [2, 1]), _slices(ROWS, [2, 1], index_dtype=np.int32)).status == "passed"


def test_slices_against_a_dense_array_compare_the_dense_value():
    dense = _slices(ROWS, [3, 1]).dense()
    assert _leaf(_slices(ROWS, [3, 1], shape=None), dense).status == "passed"
    wrong = dense.copy()
    wrong[3, 0] = 9.0
    leaf = _leaf(_slices(ROWS, [3, 1]), wrong)
    assert leaf.failed and "index 3 (expected 1 entry, actual a dense row for it)" in leaf.note
    assert "on the expected side only" in leaf.note
    assert _leaf(_slices(ROWS, [3, 1]), {"values": ROWS}).structure_mismatch


def test_empty_slices_on_both_sides_are_inconclusive_not_a_pass():
    empty = _slices(np.zeros((0, 2)), [])
    leaf = _leaf(empty, _slices(np.zeros((0, 2)), []))
    assert leaf.status == "inconclusive" and "no entry on both sides" in leaf.inconclusive_reason
    assert compare({"s": empty}, {"s": empty}).status == "inconclusive"
    no_shape = _leaf(_slices(np.zeros((0, 2)), [], shape=None), _slices(np.zeros((0, 2)), [], shape=None))
    assert no_shape.status == "inconclusive"
    # one side empty, the other not: a difference
    assert _leaf(empty, _slices(ROWS, [3, 1])).failed


def test_tolerance_keys_for_the_output_cover_its_dense_leaf():
    loose = {"s": Tolerance(rtol=0.0, atol=1.0)}
    assert _leaf(_slices(ROWS, [3, 1]), _slices([[1.0, 2.0], [3.0, 4.5]], [3, 1]), tol=loose).ok


# -- whole checks, in process ----------------------------------------------------

def _layer(fault=""):
    import tensorflow as tf

    class Slices(tf.keras.layers.Layer):
        def call(self, x, training=None):
            return helpers.slices_outputs(x, fault)
    return Slices


def _fixed(fault="", **kwargs):
    """fixed_weights of the slices model, the fault planted in the TF2 side (both sides: "empty")."""
    tf1_fn = helpers.empty_slices if fault == "empty" else helpers.slices
    return check_equivalence(tf1_fn, _layer(fault), X, steps=["fixed_weights"], **kwargs)


@pytest.mark.parametrize("tf_function", [False, True], ids=["eager", "tf_function"])
def test_an_indexed_slices_output_is_equivalent_and_really_compared(tf_function):
    report = _fixed(tf_function=tf_function)
    assert verdict_word(report) == "EQUIVALENT" and report.passed, str(report)
    leaf = report.step("fixed_weights").comparisons[0].leaf("end_points/slices/dense")
    assert leaf.compared == 15 and leaf.max_abs == 0.0 and "tf.IndexedSlices on both sides" in leaf.note


@pytest.mark.parametrize("fault, verdict, row", [
    ("value", "NOT EQUIVALENT", "index 1 (expected 1 entry, actual 1 entry"),
    ("index", "NOT EQUIVALENT", "index 1 (expected 1 entry, actual 0 entries"),
    ("split", "EQUIVALENT", None),
    ("split_wrong", "NOT EQUIVALENT", "index 3 (expected 1 entry, actual 2 entries"),
    ("no_shape", "EQUIVALENT", None),
    ("empty", "INCONCLUSIVE", None),
])
def test_planted_faults_in_an_indexed_slices_output(fault, verdict, row):
    report = _fixed(fault)
    assert verdict_word(report) == verdict, str(report)
    leaf = report.step("fixed_weights").comparisons[0].leaf("end_points/slices/dense")
    if row:
        assert report.step("fixed_weights").first_divergence == "end_points/slices/dense"
        assert f"first differing row: {row}" in leaf.note, leaf.note
    if fault == "empty":
        assert leaf.status == "inconclusive" and report.step("fixed_weights").status == "inconclusive"


def _embedding_layer():
    import tensorflow as tf

    class Embedding(tf.keras.layers.Layer):
        @tf.compat.v1.keras.utils.track_tf1_style_variables
        def call(self, x, training=None):
            return helpers.embedding_gradient(x, training)
    return Embedding


@pytest.mark.parametrize("tf_function", [False, True], ids=["eager", "tf_function"])
def test_a_model_returning_an_embedding_gradient_passes_every_default_step(tf_function):
    report = check_equivalence(helpers.embedding_gradient, _embedding_layer(), X, tf_function=tf_function)
    assert verdict_word(report) == "EQUIVALENT" and report.passed, str(report)
    leaf = report.step("fixed_weights").comparisons[0].leaf("end_points/table_gradient/dense")
    assert leaf.compared == 15 and "repeated {3} (summed)" in leaf.note, leaf.note


def fault_line(marker: str = "values = values + tf.constant") -> str:
    """``tf1_python_model.py:<line> in slices_outputs``: where the planted "value" fault is."""
    with open(helpers.__file__) as source:
        line = next(i for i, text in enumerate(source, 1) if marker in text)
    return f"tf1_python_model.py:{line} in slices_outputs"


def test_localization_of_a_wrong_slice_value_finds_the_planted_op():
    report = _fixed("value", localize=True)
    localization = report.step("fixed_weights").data.get("localization")
    assert localization is not None and localization.status == "diverged", str(report)
    assert localization.tf2_source.endswith(fault_line()), localization.tf2_source



@pytest.mark.parametrize("patterns, kept", [(["end_points/slices/dense"], True), (["end_points/slices"], True),
                                            (["end_points/dense"], False), (["!end_points/slices"], False),
                                            (["!end_points/slices/dense"], False), (["!end_points/dense"], True)])
def test_outputs_patterns_select_an_indexed_slices_by_either_name(patterns, kept):
    from equivtool.engine import output_filter

    value = {"dense": X, "slices": _slices(ROWS, [3, 1])}
    expected, _ = output_filter.select(value, value, "end_points", patterns)
    assert ("slices" in expected) == kept
    names = output_filter.leaf_names(value, "end_points")
    assert "end_points/slices/dense" in names and output_filter.unmatched_note(names, patterns) is None


def test_an_indexed_slices_output_crosses_from_worker_processes_as_in_process():
    """With workers=2 the sides run in other processes: the captures (SlicesArrays
    among them) cross by pickle, and the verdict and the named row are the same."""
    report = _fixed("split_wrong", workers=2)
    assert verdict_word(report) == "NOT EQUIVALENT", str(report)
    leaf = report.step("fixed_weights").comparisons[0].leaf("end_points/slices/dense")
    assert "first differing row: index 3 (expected 1 entry, actual 2 entries" in leaf.note, leaf.note
