"""The step registry: every list of steps and modes derives from it."""

import dataclasses
import inspect
import os
import subprocess
import sys

import pytest

import equivtool
from equivtool import equivalence, seeding
from equivtool.engine import registry as steps

ALL_NAMES = ("variables_once", "parity", "fixed_weights", "random/constant/inference",
             "random/constant/training", "random/num_random_ops/inference",
             "random/num_random_ops/training", "gradients", "optimizer", "checkpoint", "resume")


def test_public_lists_derive_from_the_registry():
    assert steps.STEPS == ("variables_once", "parity", "fixed_weights", "random", "gradients",
                           "optimizer", "checkpoint", "resume")
    assert steps.DEFAULT_STEPS == ("variables_once", "parity", "fixed_weights", "random", "gradients")
    assert steps.MODES == ("constant", "num_random_ops")
    assert steps.SUB_STEPS == ALL_NAMES
    # One definition each: the other names are the same objects.
    assert equivalence.STEPS is steps.STEPS and equivtool.STEPS is steps.STEPS
    assert equivalence.DEFAULT_STEPS is steps.DEFAULT_STEPS and equivtool.DEFAULT_STEPS is steps.DEFAULT_STEPS
    assert equivalence.MODES is steps.MODES and seeding.MODES is steps.MODES and equivtool.MODES is steps.MODES


def test_run_order_keeps_the_shared_pair_steps_first():
    order = [s.name for s in steps.run_order(steps.STEPS, steps.MODES)]
    assert order == ["variables_once", "parity", "fixed_weights", "random/constant/inference",
                     "random/constant/training", "gradients", "optimizer", "checkpoint", "resume",
                     "random/num_random_ops/inference", "random/num_random_ops/training"]
    shared = [s.shared for s in steps.run_order(steps.STEPS, steps.MODES)]
    assert shared == sorted(shared, reverse=True)  # no shared-pair step after the pair is freed


def test_selection_filters_by_step_and_mode():
    assert [s.name for s in steps.run_order(("random",), ("num_random_ops",))] == [
        "random/num_random_ops/inference", "random/num_random_ops/training"]
    assert [s.name for s in steps.run_order(("gradients", "parity"), ())] == ["parity", "gradients"]
    assert steps.run_order((), steps.MODES) == []


def test_report_order_is_the_registry_order():
    assert steps.report_order(reversed(ALL_NAMES)) == list(ALL_NAMES)
    assert steps.report_order(["checkpoint", "parity"]) == ["parity", "checkpoint"]


def test_default_selection_adds_the_steps_an_argument_enables():
    assert steps.select_steps(None) == steps.DEFAULT_STEPS
    assert steps.select_steps(None, ["checkpoint"]) == steps.DEFAULT_STEPS + ("checkpoint",)
    assert steps.select_steps(None, ["checkpoint", "optimizers"])[-2:] == ("optimizer", "checkpoint")
    assert steps.select_steps("parity") == ("parity",)


@pytest.mark.parametrize("call, argument", [
    (lambda: steps.select_steps(["nope"]), "steps"),
    (lambda: steps.select_steps(3), "steps"),
    (lambda: steps.select_modes(["sometimes"]), "modes"),
])
def test_bad_selections_name_the_argument_and_the_choices(call, argument):
    with pytest.raises((TypeError, ValueError), match=argument) as info:
        call()
    assert "variables_once" in str(info.value) or "constant" in str(info.value)


def test_every_step_resolves_to_a_function_taking_its_params():
    for step in steps.REGISTRY:
        fn = step.runner()
        assert callable(fn), step.name
        inspect.signature(fn).bind(object(), **dict(step.params))  # raises if a parameter is missing
        assert step.title and step.title == steps.title(step.name)


def test_steps_are_frozen_and_hashable():
    step = steps.get_step("random/constant/training")
    assert dict(step.params) == {"mode": "constant", "training": True}
    assert len(set(steps.REGISTRY)) == len(steps.REGISTRY)
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.title = "changed"


def test_unknown_step_name_is_a_key_error_naming_the_registry():
    with pytest.raises(KeyError, match="registered"):
        steps.get_step("nope")


def test_the_registry_imports_no_tensorflow():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import sys, equivtool.engine.registry as s; print(s.STEPS); "
            "sys.exit(1 if 'tensorflow' in sys.modules else 0)")
    env = dict(os.environ, PYTHONPATH=root)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "variables_once" in done.stdout
