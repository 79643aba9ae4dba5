"""The measured noise floor of multi-step training (equivtool.engine.noise_floor).

NumPy-only tests of the perturbation and the judgement first (what may and may
not be widened), then the ``resume`` and ``optimizer`` steps: a faithful native
rewrite with batch norm in training mode passes for 5 steps with the floor
shown, planted faults still fail, the extra run is one TF1 run and leaves every
variable as it found it.
"""

import json
import math

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

from options_support import equivalence_arguments

import equivtool
from equivtool.comparison import Comparison, Tolerance, compare
from equivtool.engine import noise_floor
from equivtool.engine.steps import training as training_steps
from equivtool.engine.options import Options
from equivtool.engine.run import Engine
from equivtool.engine.sides.tf1_side import TF1Side
from equivtool.report import StepResult
from tests import checkpoint_models as cm
from tests.test_checkpoints_resume import ADAM, adam_ckpt, mapping  # noqa: F401 (the resume tests' fixtures)

WRONG_LR = (ADAM[0], lambda: tf.keras.optimizers.Adam(0.0101, epsilon=1e-8))  # 1% off


# -- the perturbation --------------------------------------------------------------

def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in units in the last place between same-sign float32 values."""
    return np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64))


def test_every_float_element_moves_one_ulp_in_a_seeded_direction():
    values = {"w": np.random.RandomState(0).normal(size=(50, 40)).astype(np.float32),
              "step": np.int64(7), "mask": np.array([True, False])}
    moved = dict(noise_floor.Perturbed(values, seed=3))
    assert np.all(_ulps(values["w"], moved["w"]) == 1)
    up = moved["w"] > values["w"]
    assert 0.4 < up.mean() < 0.6  # both directions, about half each
    np.testing.assert_array_equal(moved["w"], noise_floor.Perturbed(values, seed=3)["w"])  # seeded
    assert not np.array_equal(moved["w"], noise_floor.Perturbed(values, seed=4)["w"])
    assert moved["step"] == 7 and moved["mask"].tolist() == [True, False]  # not floats: unchanged
    assert moved["w"].dtype == np.float32


def test_zeros_and_non_finite_values_stay_and_other_float_types_move():
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0], np.float32)
    moved = noise_floor.Perturbed({"v": special}, seed=0)["v"]
    np.testing.assert_array_equal(moved[:5], special[:5])
    assert moved[5] != 1.0
    for dtype in (np.float16, np.float64, ml_dtypes.bfloat16):
        value = np.full(64, 1.5, dtype)
        moved = noise_floor.Perturbed({"v": value}, seed=0)["v"]
        up, down = (np.nextafter(value, np.full(64, bound, dtype)) for bound in (np.inf, -np.inf))
        assert moved.dtype == value.dtype
        assert np.all((moved == up) | (moved == down)) and np.any(moved == up) and np.any(moved == down)


def test_a_multiple_below_one_or_not_a_number_is_refused_naming_the_argument():
    for bad in (0.5, math.inf, math.nan):
        with pytest.raises(ValueError, match="noise_floor_multiple: expected a finite number >= 1"):
            noise_floor.check_multiple(bad)
    for bad in (True, "10"):
        with pytest.raises(TypeError, match="noise_floor_multiple: expected a number >= 1"):
            noise_floor.check_multiple(bad)
    with pytest.raises(TypeError, match="noise_floor: expected True or False"):
        equivtool.check_equivalence(cm.slim_net, cm.NativeNet, cm.images(), noise_floor="yes")
    with pytest.raises(ValueError, match="noise_floor_multiple"):
        equivtool.check_equivalence(cm.slim_net, cm.NativeNet, cm.images(), noise_floor_multiple=0.1)


# -- the judgement -----------------------------------------------------------------

EXPECTED = {"loss": np.float32(1.0), "w": np.array([1.0, 2.0, 3.0], np.float32)}


def _step(actual: dict, tol=Tolerance()) -> Comparison:
    return compare(EXPECTED, actual, tol, name="step_1")


def _judged(comparison: Comparison, floor: dict, multiple: float = 10.0):
    judged = noise_floor.judge([comparison], [floor], multiple, seed=42)
    return judged, StepResult.from_comparisons("optimizer", "optimizer", judged.comparisons, notes=judged.notes,
                                               data={"noise_floor": judged.data})


def test_a_difference_within_the_multiple_of_its_floor_passes_with_both_numbers_shown():
    off = {"loss": np.float32(1.0), "w": np.array([1.0, 2.0, 3.0003], np.float32)}  # 3e-4 > atol 1e-5
    comparison = _step(off)
    assert comparison.status == "failed"
    judged, result = _judged(comparison, {"step_1/loss": 1e-7, "step_1/w": 1e-4})
    assert result.status == "passed", str(result)
    leaf = judged.comparisons[0].leaf("step_1/w")
    assert "consistent with rounding: max abs diff 0.0003 is within 10 x the noise floor 0.0001" in leaf.note
    assert judged.data["consistent_with_rounding"] == ["step_1/w"]
    assert judged.data["steps"][0]["step_1/w"] == [pytest.approx(3e-4, rel=1e-3), 1e-4]
    assert any("above tolerance but consistent with rounding (1): step_1/w" in note for note in judged.notes)


def test_a_difference_beyond_the_multiple_of_its_floor_still_fails_and_is_named():
    comparison = _step({"loss": np.float32(1.0), "w": np.array([1.0, 2.0, 3.003], np.float32)})
    judged, result = _judged(comparison, {"step_1/loss": 1e-7, "step_1/w": 1e-4})
    assert result.status == "failed"
    assert any("beyond tolerance and beyond 10 x the noise floor (1): step_1/w (diff 0.003, floor 0.0001)"
               in note for note in judged.notes)


@pytest.mark.parametrize("floor", [0.0, math.nan, None], ids=["zero", "unmeasured", "absent"])
def test_a_floor_of_zero_or_none_widens_nothing_whatever_the_multiple(floor):
    comparison = _step({"loss": np.float32(1.0), "w": np.array([1.0, 2.0, 3.0003], np.float32)})
    floors = {"step_1/loss": 0.0} if floor is None else {"step_1/loss": 0.0, "step_1/w": floor}
    judged, result = _judged(comparison, floors, multiple=1e30)
    assert result.status == "failed"
    assert judged.comparisons == (comparison,)
    assert judged.data["consistent_with_rounding"] == []


def test_the_floor_cannot_pass_a_step_that_compared_nothing():
    nothing = Comparison(leaves=(), name="step_1")
    _, result = _judged(nothing, {})
    assert result.status == "inconclusive"
    # NaN against NaN, a missing key and a shape mismatch: nothing a floor can speak for
    empty = compare({"w": np.array([np.nan], np.float32)}, {"w": np.array([np.nan], np.float32)}, name="step_1")
    _, result = _judged(empty, {"step_1/w": 1.0}, multiple=1e30)
    assert result.status == "inconclusive"
    for actual in ({"loss": np.float32(1.0)}, {"loss": np.float32(1.0), "w": np.zeros(4, np.float32)},
                   {"loss": np.float32(1.0), "w": np.array([1.0, np.nan, 3.0], np.float32)}):
        comparison = _step(actual)
        _, result = _judged(comparison, {"step_1/loss": 1.0, "step_1/w": 1e9}, multiple=1e30)
        assert result.status == "failed", actual


def test_leaves_within_tolerance_are_left_as_they_were():
    comparison = _step({"loss": np.float32(1.0), "w": np.array([1.0, 2.0, 3.000001], np.float32)})
    judged, result = _judged(comparison, {"step_1/loss": 0.0, "step_1/w": 1e-3})
    assert judged.comparisons == (comparison,) and result.status == "passed"


def test_measure_names_leaves_as_the_comparison_does():
    again = {"loss": np.float32(1.0), "w": np.array([1.0, 2.0000002, 3.0], np.float32)}
    floors = noise_floor.measure(EXPECTED, again, "step_1")
    assert floors == {"step_1/loss": 0.0, "step_1/w": pytest.approx(2.4e-7, rel=0.1)}
    assert set(floors) == {leaf.name for leaf in _step(again).leaves}


# -- the TF1 side's perturbed run ------------------------------------------------------

def _small_side() -> TF1Side:
    side = TF1Side(cm.slim_net, cm.images(), renamer=lambda name: name, loss_fn=None)
    side.build_training(ADAM[0], True)
    return side


def test_the_perturbed_run_moves_every_float_variable_and_puts_everything_back_on_error():
    side = _small_side()
    try:
        start = side.global_state()
        assert any("Adam" in name for name in start) and "net/bn1/moving_variance" in start
        with pytest.raises(RuntimeError, match="planted"):
            with side.perturbed(start, seed=1):
                inside = side.global_state()
                moved = [name for name in start if not np.array_equal(start[name], inside[name])]
                nonzero = [name for name, value in start.items()
                           if np.issubdtype(np.asarray(value).dtype, np.floating) and np.any(value != 0)]
                assert sorted(moved) == sorted(nonzero)  # slots and moving statistics too
                raise RuntimeError("planted")
        after = side.global_state()
        assert all(np.array_equal(start[name], after[name]) for name in start)
    finally:
        side.close()


def _engine(**kwargs) -> Engine:
    arguments = equivalence_arguments(**{"steps": ["optimizer"], "modes": ("constant",), "optimizers": ADAM,
                                         "train_steps": 2, **kwargs})
    return Engine(Options.build(cm.slim_net, cm.NativeNet, cm.images(), **arguments))


@pytest.mark.parametrize("floor", [True, False], ids=["floor", "no_floor"])
def test_the_optimizer_step_runs_tf1_once_more_at_most_and_restores_every_variable(floor, monkeypatch):
    engine = _engine(noise_floor=floor)
    calls = []
    original = TF1Side.train_step
    monkeypatch.setattr(TF1Side, "train_step", lambda self, training: calls.append(1) or original(self, training))
    try:
        half = engine.tf1_half
        half.gradient_pass()  # what the step does first (it updates the moving statistics)
        before = half.side.global_state()
        tf1 = training_steps._optimizer_tf1(engine)
        after = half.side.global_state()
        assert set(before) <= set(after)
        for name in before:
            np.testing.assert_array_equal(after[name], before[name], err_msg=name)
        slots = [name for name in after if name.endswith(("/Adam", "/Adam_1"))]
        assert slots and all(name not in before for name in slots)
        if floor:  # the perturbed run puts the slots back at their start (zeros); without it they stay trained
            assert all(not np.any(after[name]) for name in slots)
        assert len(calls) == (4 if floor else 2)
        assert (tf1["floor_run"] is None) is (not floor)
        if floor:
            assert len(tf1["floor_run"]) == 2
            assert tf1["floor_run"][0][0] != tf1["losses"][0]  # the loss saw the perturbed start
    finally:
        engine.close()


# -- the resume step, end to end -------------------------------------------------------

def _resume(layer, optimizers, mapping, path, **kwargs):
    report = equivtool.check_equivalence(cm.slim_net, layer, cm.images(), rename=mapping, checkpoint=path,
                                         optimizers=optimizers, steps=["resume"], train_steps=5, **kwargs)
    _resume.report = report  # the last report, for the tests that read its JSON and text
    return report.step("resume")


def test_a_faithful_rewrite_with_batch_norm_training_resumed_five_steps_passes_with_the_floor_shown(
        adam_ckpt, mapping):
    result = _resume(cm.NativeNet, ADAM, mapping, adam_ckpt)
    assert result.status == "passed", str(result)
    floor = result.data["noise_floor"]
    assert len(floor["steps"]) == 5 and floor["multiple"] == 10.0 and floor["largest_floor"] > 0
    row = floor["steps"][4]
    assert "step_5/variables/net/bn1/moving_variance" in row and "step_5/slots/net/bn1/gamma/Adam_1" in row
    difference, level = row["step_5/variables/net/bn1/moving_variance"]
    assert level > 0 and difference is not None
    assert any(note.startswith("noise floor: TF1 run again from the same start") for note in result.notes)
    as_json = next(s for s in json.loads(_resume.report.to_json())["steps"] if s["name"] == "resume")
    assert as_json["data"]["noise_floor"]["steps"][4]["step_5/variables/net/bn1/moving_variance"] == [
        difference, level]
    off = _resume(cm.NativeNet, ADAM, mapping, adam_ckpt, noise_floor=False)
    assert "noise_floor" not in off.data and not any("noise floor" in note for note in off.notes)


@pytest.mark.parametrize("layer, optimizers, first", [
    (cm.NativeNet, WRONG_LR, "step_1/variables/net/conv1/weights"),
    (lambda: cm.NativeNet(epsilon=1e-5), ADAM, "step_1/loss"),
], ids=["learning_rate", "bn_epsilon"])
def test_planted_faults_still_fail_with_the_floor_on(adam_ckpt, mapping, layer, optimizers, first):
    result = _resume(layer, optimizers, mapping, adam_ckpt, noise_floor_multiple=100.0)
    assert result.status == "failed", str(result)
    assert result.comparisons[0].first_failure.name == first
    assert any(note.startswith("beyond tolerance and beyond 100 x the noise floor") for note in result.notes)
    assert not result.data["noise_floor"]["consistent_with_rounding"]


def test_with_a_tolerance_too_tight_for_rounding_the_floor_passes_exactly_what_it_measured(adam_ckpt, mapping):
    # Nothing but rounding differs; at atol=rtol=0 every differing leaf fails
    # without the floor, and with it exactly those within 10x their floor pass.
    exact = {"resume": Tolerance.exact()}
    without = _resume(cm.NativeNet, ADAM, mapping, adam_ckpt, step_tolerances=exact, noise_floor=False)
    failing = {leaf.name for leaf in without.leaves if leaf.failed}
    assert failing, "planted: exact tolerance must fail some leaf"
    result = _resume(cm.NativeNet, ADAM, mapping, adam_ckpt, step_tolerances=exact)
    rows = {name: pair for step in result.data["noise_floor"]["steps"] for name, pair in step.items()}
    passed = {leaf.name for leaf in result.leaves if leaf.failed is False and leaf.name in failing}
    assert passed == set(result.data["noise_floor"]["consistent_with_rounding"]) and passed
    for name in failing:
        difference, level = rows[name]
        assert (name in passed) == (level is not None and 0 < level and difference <= 10 * level), name


def test_the_docs_example_runs():
    import pathlib
    text = (pathlib.Path(__file__).parent.parent / "docs" / "noise-floor.md").read_text()
    blocks = text.split("```python\n")[1:]
    assert len(blocks) == 1
    names = {"__name__": "__main__"}
    exec(blocks[0].split("```")[0], names)  # noqa: S102 - the documentation's own example, self-contained
    assert names["report"].passed and 0 < names["level"] and names["difference"] is not None
