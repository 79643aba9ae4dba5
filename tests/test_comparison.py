"""equivtool.comparison (and equivtool.compare): one property per test; references written in NumPy here."""

from __future__ import annotations

import collections
import json
import math
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from equivtool._base.render import json_safe as _json_safe
from equivtool.comparison import Comparison, LeafComparison, Tolerance, compare, resolve_tolerance

ROOT = Path(__file__).resolve().parents[1]


def _leaf(expected, actual, tol=None, **kwargs) -> LeafComparison:
    comparison = compare(expected, actual, tol, **kwargs)
    assert len(comparison.leaves) == 1
    return comparison.leaves[0]


# -- Tolerance ---------------------------------------------------------------


def test_tolerance_defaults_are_the_migration_guide_values():
    assert Tolerance() == Tolerance(rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("argument", ["rtol", "atol"])
@pytest.mark.parametrize("value", [-1e-3, math.nan, math.inf])
def test_tolerance_rejects_bad_value_naming_the_argument(argument, value):
    with pytest.raises(ValueError, match=argument):
        Tolerance(**{argument: value})


@pytest.mark.parametrize("argument", ["rtol", "atol"])
def test_tolerance_rejects_non_number_naming_the_argument(argument):
    with pytest.raises(TypeError, match=argument):
        Tolerance(**{argument: "1e-5"})


def test_tolerance_stores_ints_and_numpy_scalars_as_float():
    tol = Tolerance(rtol=0, atol=np.float32(0.5))
    assert type(tol.rtol) is float and type(tol.atol) is float and tol.atol == 0.5


def test_tolerance_close_uses_expected_in_the_relative_term():
    tol = Tolerance(rtol=0.1, atol=0.0)
    assert not tol.close(10.0, 11.05)  # 1.05 > 0.1 * 10
    assert tol.close(11.05, 10.0)  # 1.05 <= 0.1 * 11.05


def test_tolerance_close_matches_numpy_isclose_on_finite_values():
    rng = np.random.default_rng(0)
    e = rng.normal(size=1000)
    a = e + rng.normal(scale=1e-5, size=1000)
    tol = Tolerance(rtol=1e-6, atol=1e-5)
    np.testing.assert_array_equal(tol.close(e, a), np.isclose(a, e, rtol=1e-6, atol=1e-5))


def test_tolerance_close_treats_same_nan_and_same_infinity_as_equal():
    e = np.array([np.nan, np.inf, -np.inf, np.inf, np.nan, 1.0])
    a = np.array([np.nan, np.inf, -np.inf, -np.inf, 1.0, np.inf])
    np.testing.assert_array_equal(Tolerance(rtol=1.0, atol=1.0).close(e, a), [1, 1, 1, 0, 0, 0])


def test_tolerance_close_does_not_let_huge_rtol_accept_infinity_against_a_number():
    # inf <= atol + rtol * inf would be True arithmetically.
    assert not Tolerance(rtol=1.0).close(np.inf, 1.0)


def test_tolerance_exact_accepts_only_equal_values():
    tol = Tolerance.exact()
    assert tol.is_exact and str(tol) == "exact"
    np.testing.assert_array_equal(tol.close([1.0, 1.0], [1.0, np.nextafter(1.0, 2.0)]), [True, False])


def test_tolerance_close_compares_integers_exactly():
    big = np.array([2**62], dtype=np.int64)
    assert not Tolerance(rtol=1.0, atol=1.0).close(big, big + 1)[0]


# -- resolve_tolerance ---------------------------------------------------------


def test_resolve_tolerance_none_gives_defaults():
    assert resolve_tolerance(None, "logits") == Tolerance()


def test_resolve_tolerance_single_tolerance_applies_everywhere():
    tol = Tolerance(atol=1e-3)
    assert resolve_tolerance(tol, "end_points/Mixed_5b") is tol


def test_resolve_tolerance_precedence_exact_then_longest_pattern_then_default():
    exact, prefix, pattern, default = (Tolerance(atol=x) for x in (1.0, 2.0, 3.0, 4.0))
    spec = {"*": default, "end_points": prefix, "end_points/Mixed_*": pattern, "end_points/Mixed_5b": exact}
    assert resolve_tolerance(spec, "end_points/Mixed_5b") is exact
    assert resolve_tolerance(spec, "end_points/Mixed_6a") is pattern
    assert resolve_tolerance(spec, "end_points/Conv2d_1a") is prefix
    assert resolve_tolerance(spec, "logits") is default


def test_resolve_tolerance_prefix_matches_whole_path_components_only():
    spec = {"end": Tolerance(atol=1.0)}
    assert resolve_tolerance(spec, "end_points/x") == Tolerance()
    assert resolve_tolerance(spec, "end/x") == Tolerance(atol=1.0)


def test_resolve_tolerance_without_default_key_falls_back_to_tolerance():
    assert resolve_tolerance({"logits": Tolerance(atol=1.0)}, "loss") == Tolerance()


def test_resolve_tolerance_rejects_non_tolerance_value_naming_the_key():
    with pytest.raises(TypeError, match="'logits'"):
        resolve_tolerance({"logits": 1e-3}, "logits")


# -- compare: values -------------------------------------------------------------


def test_equal_arrays_pass():
    x = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    leaf = _leaf(x, x.copy())
    assert leaf.ok and leaf.mismatched == 0 and leaf.max_abs == 0.0 and leaf.first_mismatch is None


def test_difference_within_tolerance_passes_and_reports_max_abs():
    x = np.ones((2, 2))
    leaf = _leaf(x, x + 5e-6)
    assert leaf.ok
    assert leaf.max_abs == pytest.approx(5e-6)


def test_single_perturbed_element_is_counted_at_its_index_with_max_abs_and_rel():
    expected = np.full((4, 5, 6), 2.0, dtype=np.float32)
    actual = expected.copy()
    actual[1, 2, 3] = 2.5
    leaf = _leaf(expected, actual)
    assert not leaf.ok
    assert leaf.mismatched == 1 and leaf.size == 120
    assert leaf.fraction == pytest.approx(1 / 120)
    assert leaf.first_mismatch == (1, 2, 3)
    assert (leaf.first_expected, leaf.first_actual) == (2.0, 2.5)
    assert leaf.max_abs == pytest.approx(0.5)
    assert leaf.max_rel == pytest.approx(0.25)


def test_first_mismatch_is_the_first_in_c_order():
    expected = np.zeros((3, 3))
    actual = expected.copy()
    actual[2, 0] = actual[0, 2] = 1.0
    assert _leaf(expected, actual).first_mismatch == (0, 2)


def test_leaf_text_reads_like_assert_allclose_with_name_and_index():
    expected = np.zeros((2, 2), dtype=np.float32)
    actual = expected.copy()
    actual[1, 0] = 0.5
    text = str(compare({"logits": expected}, {"logits": actual}).leaves[0])
    assert "'logits'" in text
    assert "Mismatched elements: 1 / 4 (25%)" in text
    assert "Max absolute difference: 0.5" in text
    assert "Max relative difference: inf" in text
    assert "First mismatch at (1, 0)" in text
    assert "shape (2, 2), dtype float32" in text


def test_max_rel_leaves_out_zero_expected_when_other_positions_differ():
    leaf = _leaf(np.array([0.0, 2.0]), np.array([1e-3, 3.0]))
    assert leaf.max_rel == pytest.approx(0.5)


def test_max_rel_is_inf_when_only_zero_expected_positions_differ():
    assert _leaf(np.array([0.0, 2.0]), np.array([1.0, 2.0])).max_rel == math.inf


def test_nan_at_the_same_place_is_equal():
    x = np.array([1.0, np.nan, 3.0])
    leaf = _leaf(x, x.copy())
    assert leaf.ok and leaf.nan_mismatch == 0 and leaf.max_abs == 0.0


def test_nan_on_one_side_is_reported_and_errors_stay_finite():
    leaf = _leaf(np.array([1.0, 2.0, 3.0]), np.array([1.0, np.nan, 3.5]))
    assert not leaf.ok
    assert leaf.nan_mismatch == 1 and leaf.mismatched == 2
    assert leaf.first_mismatch == (1,) and math.isnan(leaf.first_actual)
    assert leaf.max_abs == pytest.approx(0.5)  # over positions finite on both sides
    assert "NaN on one side only: 1" in str(leaf)


def test_same_infinities_are_equal():
    x = np.array([np.inf, -np.inf, 1.0])
    assert _leaf(x, x.copy()).ok


def test_opposite_or_one_sided_infinity_is_reported():
    leaf = _leaf(np.array([np.inf, 1.0, 2.0]), np.array([-np.inf, np.inf, 2.0]), Tolerance(rtol=1.0, atol=1.0))
    assert not leaf.ok
    assert leaf.inf_mismatch == 2 and leaf.nan_mismatch == 0
    assert leaf.first_mismatch == (0,)
    assert leaf.max_abs == 0.0


def test_zero_dim_infinity_against_a_number_is_reported():
    leaf = _leaf(np.inf, 1.0)
    assert not leaf.ok and leaf.inf_mismatch == 1 and leaf.first_mismatch == ()


def test_all_nonfinite_positions_give_zero_errors_not_nan_and_are_inconclusive():
    leaf = _leaf(np.array([np.nan, np.inf]), np.array([np.nan, np.inf]))
    assert leaf.max_abs == 0.0 and leaf.max_rel == 0.0
    assert leaf.status == "inconclusive" and not leaf.ok and leaf.compared == 0
    assert "1 NaN, 1 inf" in leaf.inconclusive_reason


# -- three outcomes: passed, failed, inconclusive ---------------------------------------


@pytest.mark.parametrize("expected, actual, reason", [
    (np.zeros((0, 4), np.float32), np.zeros((0, 4), np.float32), "zero-size"),
    (np.zeros((0,), np.int32), np.zeros((0,), np.int32), "zero-size"),
    (np.full((2, 3), np.nan, np.float32), np.full((2, 3), np.nan, np.float32), "6 NaN, 0 inf"),
    (np.full((2,), np.inf), np.full((2,), np.inf), "0 NaN, 2 inf"),
    (np.array([-np.inf, np.nan]), np.array([-np.inf, np.nan]), "non-finite on both sides (1 NaN, 1 inf)"),
    (None, None, "None on both sides"),
])
def test_a_leaf_that_compared_nothing_is_inconclusive_not_passed(expected, actual, reason):
    c = compare({"y": expected}, {"y": actual})
    leaf = c.leaf("y")
    assert leaf.status == "inconclusive" and not leaf.ok and not leaf.failed
    assert reason in leaf.inconclusive_reason
    assert c.status == "inconclusive" and not c.ok and c.failures == ()
    assert "INCONCLUSIVE" in str(c) and reason in str(c)
    with pytest.raises(AssertionError, match="INCONCLUSIVE"):
        c.raise_for_failure()


def test_one_inconclusive_leaf_makes_the_comparison_inconclusive_even_when_others_passed():
    c = compare({"loss": np.float32(0.0), "grad": np.full([3], np.nan, np.float32)},
                {"loss": np.float32(0.0), "grad": np.full([3], np.nan, np.float32)})
    assert c.leaf("loss").status == "passed"
    assert c.status == "inconclusive" and not c.ok


def test_a_failure_wins_over_an_inconclusive_leaf():
    c = compare({"a": np.zeros([0]), "b": np.ones([2])}, {"a": np.zeros([0]), "b": np.zeros([2])})
    assert c.status == "failed" and c.first_failure.name == "b"


def test_finite_elements_beside_matching_nan_are_compared_and_counted():
    e = np.array([[1.0, np.nan], [2.0, 3.0]])
    leaf = compare(e, e.copy()).leaves[0]
    assert leaf.status == "passed" and leaf.compared == 3 and leaf.size == 4
    assert "3 / 4 compared" in str(leaf)
    assert leaf.to_dict()["compared"] == 3 and leaf.to_dict()["status"] == "passed"


def test_allow_nonfinite_opts_a_leaf_out_of_inconclusive():
    mask = np.array([[0.0, -np.inf], [-np.inf, 0.0]], np.float32)
    all_inf = np.full([2], -np.inf, np.float32)
    tol = {"mask": Tolerance(allow_nonfinite=True), "inf": Tolerance(allow_nonfinite=True)}
    c = compare({"mask": mask, "inf": all_inf}, {"mask": mask.copy(), "inf": all_inf.copy()}, tol)
    assert c.status == "passed"
    assert c.leaf("mask").compared == 4 and c.leaf("inf").compared == 2
    # the opt-out never hides a difference, and never passes a leaf with no element
    flipped = compare({"mask": mask}, {"mask": -mask}, tol)
    assert flipped.status == "failed"
    empty = compare({"mask": np.zeros([0])}, {"mask": np.zeros([0])}, tol)
    assert empty.status == "inconclusive"
    assert "non-finite allowed" in str(Tolerance(allow_nonfinite=True))


def test_an_empty_comparison_is_inconclusive():
    c = compare({}, {})
    assert c.status == "inconclusive" and not c.ok and "no leaf" in c.summary()


def test_inconclusive_survives_a_json_round_trip():
    c = compare({"y": np.zeros([0])}, {"y": np.zeros([0])})
    back = Comparison.from_dict(json.loads(json.dumps(_json_safe(c.to_dict()))))
    assert back.status == "inconclusive" and back.leaves[0].inconclusive_reason
    tol = Tolerance(allow_nonfinite=True)
    leaf = compare(np.array([np.inf]), np.array([np.inf]), tol).leaves[0]
    assert LeafComparison.from_dict(leaf.to_dict()).tolerance == tol


def test_shape_mismatch_with_different_sizes_is_reported_not_raised():
    leaf = _leaf(np.zeros((2, 3)), np.zeros((2, 4)))
    assert not leaf.ok and leaf.shape_mismatch and not leaf.values_compared
    assert (leaf.expected_shape, leaf.actual_shape) == ((2, 3), (2, 4))
    assert "(2, 3)" in str(leaf) and "(2, 4)" in str(leaf)


def test_shape_mismatch_with_same_size_fails_but_still_compares_values():
    leaf = _leaf(np.arange(6.0).reshape(1, 6), np.arange(6.0))
    assert not leaf.ok and leaf.shape_mismatch
    assert leaf.values_compared and leaf.mismatched == 0 and leaf.max_abs == 0.0
    assert "reshaped" in leaf.note


def test_dtype_mismatch_is_reported_and_fails_by_default():
    leaf = _leaf(np.ones(3, np.float32), np.ones(3, np.float64))
    assert leaf.dtype_mismatch and not leaf.ok
    assert leaf.mismatched == 0  # values were compared after promotion
    assert "float32 vs float64" in leaf.note


def test_dtype_mismatch_passes_with_check_dtype_false_when_values_are_close():
    leaf = _leaf(np.ones(3, np.float32), np.ones(3, np.float64), check_dtype=False)
    assert leaf.dtype_mismatch and leaf.ok


def test_python_scalars_are_weakly_typed():
    assert _leaf(1.0, np.float32(1.0)).ok


def test_scalar_and_zero_dim_arrays_compare_with_empty_index():
    leaf = _leaf(np.array(1.0), np.array(2.0))
    assert not leaf.ok and leaf.first_mismatch == () and leaf.expected_shape == ()
    assert leaf.max_abs == 1.0


def test_empty_arrays_are_inconclusive_with_zero_size():
    leaf = _leaf(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32))
    assert leaf.status == "inconclusive" and not leaf.ok
    assert leaf.size == 0 and leaf.compared == 0 and leaf.fraction == 0.0 and leaf.max_abs == 0.0


def test_integers_are_compared_exactly_whatever_the_tolerance():
    leaf = _leaf(np.array([1, 2, 3]), np.array([1, 2, 4]), Tolerance(rtol=1.0, atol=10.0))
    assert not leaf.ok and leaf.first_mismatch == (2,)
    assert leaf.tolerance.is_exact and leaf.max_abs == 1.0


def test_large_int64_difference_of_one_is_detected():
    x = np.array([2**62 + 1], dtype=np.int64)
    assert not _leaf(x, x - 1).ok


def test_bool_arrays_are_compared_exactly():
    leaf = _leaf(np.array([True, False]), np.array([True, True]))
    assert not leaf.ok and leaf.mismatched == 1 and leaf.first_mismatch == (1,)


def test_string_arrays_are_compared_exactly_without_numeric_errors():
    leaf = _leaf(np.array([b"a", b"b"]), np.array([b"a", b"c"]))
    assert not leaf.ok and leaf.first_actual == "c" and math.isnan(leaf.max_abs)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16], ids=["bfloat16", "float16"])
def test_low_precision_floats_are_upcast_for_error_math(dtype):
    expected = np.array([1.0, 2.0, 3.0], dtype=dtype)
    actual = np.array([1.0, 2.0, 3.5], dtype=dtype)
    leaf = _leaf(expected, actual)
    assert leaf.expected_dtype == np.dtype(dtype).name
    assert leaf.mismatched == 1 and leaf.first_mismatch == (2,)
    assert leaf.max_abs == pytest.approx(0.5)
    assert isinstance(leaf.first_actual, float) and leaf.first_actual == 3.5


def test_bfloat16_against_float32_is_a_dtype_mismatch_with_values_compared():
    leaf = _leaf(np.ones(2, ml_dtypes.bfloat16), np.ones(2, np.float32))
    assert leaf.dtype_mismatch and leaf.values_compared and leaf.mismatched == 0


def test_large_array_is_compared_vectorised():
    expected = np.random.default_rng(1).random((1000, 1000), dtype=np.float32)
    actual = expected.copy()
    actual[999, 998] += 1.0
    leaf = _leaf(expected, actual)
    assert leaf.mismatched == 1 and leaf.first_mismatch == (999, 998)


# -- compare: structure --------------------------------------------------------


def test_leaves_are_named_by_path_with_name_prefix():
    expected = {"end_points": {"Mixed_5b": np.zeros(2)}, "logits": [np.zeros(1), 1.0]}
    names = [leaf.name for leaf in compare(expected, expected, name="out").leaves]
    assert names == ["out/end_points/Mixed_5b", "out/logits/0", "out/logits/1"]


def test_bare_array_leaf_is_named_value_or_name():
    assert compare(1.0, 1.0).leaves[0].name == "value"
    assert compare(1.0, 1.0, name="loss").leaves[0].name == "loss"


def test_dict_insertion_order_is_kept_and_first_failure_is_first_in_forward_order():
    expected = {"c": np.zeros(2), "a": np.zeros(2), "b": np.zeros(2)}
    actual = {"b": np.ones(2), "a": np.ones(2), "c": np.zeros(2)}
    comparison = compare(expected, actual)
    assert [leaf.name for leaf in comparison.leaves] == ["c", "a", "b"]
    assert comparison.first_failure.name == "a"
    assert [leaf.name for leaf in comparison.failures] == ["a", "b"]
    assert not comparison.ok


def test_missing_key_in_actual_is_a_failing_leaf():
    comparison = compare({"a": 1.0, "b": 2.0}, {"a": 1.0})
    leaf = comparison.leaf("b")
    assert not leaf.ok and leaf.missing_in_actual and not leaf.values_compared
    assert "not in actual" in leaf.note


def test_extra_key_in_actual_is_a_failing_leaf_after_expected_keys():
    comparison = compare({"a": 1.0}, {"z": 3.0, "a": 1.0})
    assert [leaf.name for leaf in comparison.leaves] == ["a", "z"]
    assert comparison.leaf("z").missing_in_expected and not comparison.ok


def test_sequence_length_difference_compares_common_items_and_reports_the_rest():
    comparison = compare([1.0, 2.0, 3.0], [1.0, 2.5])
    assert [leaf.ok for leaf in comparison.leaves] == [True, False, False]
    assert comparison.leaves[2].missing_in_actual


def test_container_against_array_is_a_structure_leaf():
    leaf = _leaf({"a": 1.0}, np.zeros(3))
    assert leaf.structure_mismatch and not leaf.ok and "dict" in leaf.note


def test_list_and_tuple_are_interchangeable():
    assert compare([np.zeros(2), 1], (np.zeros(2), 1)).ok


def test_namedtuple_leaves_are_named_by_field():
    Out = collections.namedtuple("Out", ["logits", "loss"])
    comparison = compare(Out(np.zeros(2), 1.0), Out(np.zeros(2), 2.0))
    assert [leaf.name for leaf in comparison.leaves] == ["logits", "loss"]
    assert comparison.first_failure.name == "loss"


def test_namedtuples_with_different_fields_are_a_structure_leaf():
    A = collections.namedtuple("A", ["x"])
    B = collections.namedtuple("B", ["y"])
    leaf = _leaf(A(1.0), B(1.0))
    assert leaf.structure_mismatch and not leaf.ok


def test_none_on_both_sides_is_inconclusive_and_on_one_side_fails():
    assert compare({"aux": None}, {"aux": None}).status == "inconclusive"
    assert compare({"aux": None}, {"aux": np.zeros(1)}).leaves[0].structure_mismatch


def test_per_key_tolerance_override_by_exact_name():
    expected = {"logits": np.zeros(2), "probs": np.zeros(2)}
    actual = {"logits": np.full(2, 1e-3), "probs": np.full(2, 1e-3)}
    comparison = compare(expected, actual, {"logits": Tolerance(atol=1e-2)})
    assert comparison.leaf("logits").ok and not comparison.leaf("probs").ok
    assert comparison.leaf("logits").tolerance == Tolerance(atol=1e-2)


def test_per_key_tolerance_override_by_pattern_and_default():
    expected = {"end_points": {"Mixed_5b": np.zeros(2), "Conv": np.zeros(2)}, "logits": np.zeros(2)}
    actual = {"end_points": {"Mixed_5b": np.full(2, 1e-3), "Conv": np.full(2, 1e-3)}, "logits": np.full(2, 0.5)}
    spec = {"*/Mixed_*": Tolerance(atol=1e-2), "*": Tolerance(atol=1.0), "end_points/Conv": Tolerance.exact()}
    comparison = compare(expected, actual, spec)
    assert comparison.leaf("end_points/Mixed_5b").ok
    assert not comparison.leaf("end_points/Conv").ok
    assert comparison.leaf("logits").ok


def test_tolerance_keys_match_paths_with_or_without_the_name_prefix():
    spec = {"logits": Tolerance(atol=1.0), "out/loss": Tolerance(atol=1.0)}
    comparison = compare({"logits": 0.0, "loss": 0.0}, {"logits": 0.5, "loss": 0.5}, spec, name="out")
    assert comparison.ok and comparison.unmatched_tolerance_keys == ()


def test_tolerance_keys_that_apply_to_no_leaf_are_listed_and_warned_about():
    comparison = compare({"logits": 0.0}, {"logits": 0.0}, {"logit": Tolerance(atol=1.0)})
    assert comparison.unmatched_tolerance_keys == ("logit",)
    assert "'logit'" in str(comparison)


def test_invalid_tolerance_spec_type_is_rejected():
    with pytest.raises(TypeError, match="tol"):
        compare(1.0, 1.0, 1e-5)


# -- Comparison --------------------------------------------------------------------


def test_comparison_max_abs_is_the_largest_over_leaves():
    comparison = compare({"a": 0.0, "b": 0.0}, {"a": 1e-7, "b": 3e-6})
    assert comparison.ok and comparison.max_abs == pytest.approx(3e-6)


def test_comparison_text_has_summary_and_failing_leaves_only():
    comparison = compare({"ok": 1.0, "bad": 1.0}, {"ok": 1.0, "bad": 2.0}, name="outputs")
    text = str(comparison)
    assert "1 of 2 leaves differ" in text and "first divergence: 'outputs/bad'" in text
    assert "'outputs/bad': NOT close" in text and "'outputs/ok'" not in text


def test_comparison_text_limits_the_number_of_failing_leaves():
    comparison = compare({str(i): 0.0 for i in range(15)}, {str(i): 1.0 for i in range(15)})
    assert "... and 5 more failing leaves" in comparison.format(max_failures=10)


def test_comparison_raise_for_failure_raises_with_text_and_returns_self_on_pass():
    good = compare(1.0, 1.0)
    assert good.raise_for_failure() is good
    with pytest.raises(AssertionError, match="Mismatched elements"):
        compare(1.0, 2.0).raise_for_failure()


def test_comparison_to_dict_round_trips():
    comparison = compare({"a": np.array([1.0, np.nan]), "b": [1, 2]}, {"a": np.array([1.5, 1.0]), "b": [1]}, name="x")
    rebuilt = Comparison.from_dict(comparison.to_dict())
    assert [leaf.name for leaf in rebuilt.leaves] == [leaf.name for leaf in comparison.leaves]
    assert rebuilt.leaves[0].first_mismatch == (0,) and rebuilt.first_failure.name == "x/a"
    assert rebuilt.ok == comparison.ok


def test_comparison_is_frozen():
    comparison = compare(1.0, 1.0)
    with pytest.raises(AttributeError):
        comparison.leaves = ()


def test_importing_compare_and_report_does_not_import_tensorflow():
    code = (
        "import sys, equivtool.comparison, equivtool.report, equivtool; "
        "equivtool.comparison.compare(1.0, 1.0); "
        "assert equivtool.Tolerance is equivtool.comparison.Tolerance; "
        "assert equivtool.EquivalenceReport is equivtool.report.EquivalenceReport; "
        "print('tensorflow' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_public_compare_is_the_function_even_after_its_module_is_imported():
    import equivtool
    import equivtool.comparison  # noqa: F401  (a submodule import must not shadow the function)
    assert callable(equivtool.compare)
    assert equivtool.compare(1.0, 1.0).ok


# -- tolerance that explains itself ------------------------------------------------------


def _planted(n=1000, seed=0):
    rng = np.random.default_rng(seed)
    expected = rng.normal(size=n).astype(np.float32)
    noise = (rng.normal(size=n) * 1e-5).astype(np.float32)
    return expected, expected + noise


@pytest.mark.parametrize("rtol, atol", [(1e-6, 1e-5), (0.0, 1e-7), (1e-3, 0.0)])
def test_the_suggested_tolerances_pass_and_are_the_smallest(rtol, atol):
    expected, actual = _planted()
    leaf = compare(expected, actual, Tolerance(rtol=rtol, atol=atol)).leaves[0]
    assert leaf.failed and leaf.advice is not None
    adv = leaf.advice
    assert compare(expected, actual, Tolerance(rtol=rtol, atol=adv.needed_atol)).ok
    assert not compare(expected, actual, Tolerance(rtol=rtol, atol=adv.needed_atol * (1 - 1e-6))).ok
    assert compare(expected, actual, Tolerance(rtol=adv.needed_rtol, atol=atol)).ok
    assert not compare(expected, actual, Tolerance(rtol=adv.needed_rtol * (1 - 1e-6), atol=atol)).ok


def test_error_quantiles_match_numpy():
    expected, actual = _planted()
    adv = compare(expected, actual).leaves[0].advice
    diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    assert adv.median == pytest.approx(np.median(diff))
    assert adv.p99 == pytest.approx(np.quantile(diff, 0.99))
    assert adv.max == pytest.approx(diff.max())


def _up(x, n, dtype):
    """``x`` moved ``n`` representable values towards +inf in ``dtype`` (np.nextafter; for bfloat16,
    which np.nextafter does not know, one step of its 7-bit mantissa at a time)."""
    x = np.array(x, dtype)
    for _ in range(n):
        if dtype == ml_dtypes.bfloat16:
            x = np.array(float(x) + 2.0 ** (np.floor(np.log2(abs(float(x)))) - 7), dtype)
        else:
            x = np.nextafter(x, dtype(np.inf))
    return x


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, ml_dtypes.bfloat16])
@pytest.mark.parametrize("steps", [1, 7])
def test_largest_ulp_distance_counts_representable_values(dtype, steps):
    expected = np.array([0.75, 1.0, 3.0], dtype)
    actual = expected.copy()
    actual[0] = _up(expected[0], steps, dtype)
    actual[2] = _up(expected[2], 2, dtype)
    leaf = compare(expected, actual, Tolerance.exact()).leaves[0]
    assert leaf.advice.max_ulp == max(steps, 2) and leaf.advice.ulp_dtype == np.dtype(dtype).name


def test_ulp_distance_across_zero_counts_both_signs():
    from equivtool.comparison._advice import ulp_distance
    tiny = np.array([np.nextafter(np.float32(0), np.float32(1))])
    assert ulp_distance(-tiny, tiny)[0] == 2
    assert ulp_distance(np.array([0.0], np.float32), -tiny)[0] == 1
    assert ulp_distance(np.array([0.0], np.float32), np.array([-0.0], np.float32))[0] == 0  # equal values
    big = np.array([np.finfo(np.float64).max])
    assert ulp_distance(-big, big)[0] > 9e18  # across zero, far apart: no int64 overflow


def test_no_tolerance_passes_a_nan_on_one_side_and_the_text_says_so():
    leaf = compare(np.array([1.0, 2.0]), np.array([np.nan, 2.5])).leaves[0]
    assert math.isinf(leaf.advice.needed_atol) and math.isinf(leaf.advice.needed_rtol)
    assert "No tolerance passes it: NaN or infinity on one side only" in str(leaf)


def test_advice_is_in_text_json_and_html_and_only_for_differing_values(tmp_path):
    from equivtool.report import EquivalenceReport, StepResult
    expected, actual = _planted()
    c = compare({"logits": expected, "same": expected}, {"logits": actual, "same": expected.copy()},
                name="outputs")
    assert c.leaf("outputs/same").advice is None
    assert str(c.leaf("outputs/logits").advice).startswith("passes with atol >= ")
    text = str(c)
    assert "Would pass with atol >= " in text and "largest distance" in text and " ULP (float32)" in text
    data = json.loads(json.dumps(_json_safe(c.to_dict())))
    advice = data["leaves"][0]["advice"]
    assert set(advice) >= {"needed_atol", "needed_rtol", "median", "p99", "max", "max_ulp"}
    back = Comparison.from_dict(data).leaf("outputs/logits").advice
    assert back == c.leaf("outputs/logits").advice
    report = EquivalenceReport([StepResult.from_comparisons("fixed_weights", "Fixed weights", c)])
    page = open(report.to_html(tmp_path / "r.html"), encoding="utf-8").read()
    assert "would pass with / errors" in page and "Would pass with atol &gt;= " in page
