"""What a hostile or careless user gets: inputs refused by type before any work,
tolerance keys that match nothing named (or refused), CLI usage errors as one
line, report write errors that name the user's path."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import tensorflow as tf

import equivtool
from equivtool import cli
from equivtool.comparison import compare
from equivtool.engine.options import _check_inputs
from equivtool.report import EquivalenceReport, StepResult
from interrupt_models import Dense, tf1_dense

TESTS = os.path.dirname(os.path.abspath(__file__))
X = np.random.RandomState(0).rand(2, 3).astype(np.float32)


def _never_built(inputs, training):
    raise AssertionError("a step ran before the inputs were checked")


# --------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------

@pytest.mark.parametrize("inputs, fragments", [
    ([[1., 2., 3.], [4., 5., 6.]], ("inputs: a list of Python numbers", "np.asarray(inputs, dtype=np.float32)")),
    ((1., 2., 3.), ("inputs: a tuple of Python numbers", "np.asarray(inputs")),
    ({"x": X, "mask": [1, 0]}, ("inputs['mask']: a list of Python numbers", "np.asarray(inputs['mask']")),
    ({"x": X, "scale": 0.5}, ("inputs['scale']: a Python float (0.5)", "np.float32(0.5)")),
    (lambda: tf.ones([2, 3]), ("inputs: a tensor (EagerTensor)", "inputs.numpy()")),
    (lambda: [X, tf.Variable(X)], ("inputs[1]: a tensor (ResourceVariable)", "inputs[1].numpy()")),
    (lambda: {"a": {"b": tf.constant(X)}}, ("inputs['a']['b']: a tensor (EagerTensor)",)),
])
def test_inputs_of_the_wrong_type_are_refused_before_any_work(inputs, fragments):
    inputs = inputs() if callable(inputs) else inputs
    with pytest.raises(TypeError) as raised:
        equivtool.check_equivalence(_never_built, Dense, inputs)
    for fragment in fragments:
        assert fragment in str(raised.value)


def test_arrays_and_numpy_scalars_in_a_structure_are_accepted():
    assert _check_inputs({"x": X, "scale": np.float32(0.5), "ids": [np.arange(3), (np.int64(2),)]}) == {}
    assert _check_inputs(X) == {}


# --------------------------------------------------------------------------
# report files
# --------------------------------------------------------------------------

def _report() -> EquivalenceReport:
    step = StepResult.from_comparisons("fixed_weights", "Fixed weights", compare(np.arange(3.), np.arange(3.)))
    return EquivalenceReport((step,), {})


def _where(path) -> str:
    return os.path.dirname(os.path.abspath(path))


@pytest.mark.parametrize("write", ["to_json", "to_html"])
@pytest.mark.parametrize("target, error, reason", [
    ("missing/r.out", FileNotFoundError, "does not exist"),
    (".", IsADirectoryError, "is a directory"),
])
def test_a_report_that_cannot_be_written_names_the_users_path(write, target, error, reason, tmp_path):
    if write == "to_html":
        pytest.importorskip("matplotlib")
    path = str(tmp_path / target)
    with pytest.raises(error) as raised:
        getattr(_report(), write)(path)
    assert f"cannot write {path!r}: " in str(raised.value) and reason in str(raised.value)
    assert ".equivtool-" not in str(raised.value) and raised.value.errno is not None
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".equivtool-")] == []


def test_a_report_under_proc_names_the_path():
    with pytest.raises(OSError) as raised:
        _report().to_json("/proc/x")
    assert "cannot write '/proc/x': " in str(raised.value) and ".equivtool-" not in str(raised.value)


# --------------------------------------------------------------------------
# the command line
# --------------------------------------------------------------------------

CHECK = ["check", "interrupt_models:tf1_dense", "interrupt_models:Dense", "--input-shape", "2,3"]


@pytest.mark.parametrize("args, prog, fragment", [
    (CHECK + ["--workers", "abc"], "equivtool check", "argument --workers: invalid int value: 'abc'"),
    (CHECK[:2], "equivtool check", "the following arguments are required: MODULE:TF2_FACTORY"),
    (CHECK + ["--no-such-option"], "equivtool", "unrecognized arguments: --no-such-option"),
    (["frobnicate"], "equivtool", "invalid choice: 'frobnicate'"),
])
def test_argparse_errors_are_one_line_pointing_to_help(args, prog, fragment, capsys):
    assert cli.main(args) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == captured.err.strip().splitlines()[0]  # one line
    assert captured.err.startswith(f"{prog}: error: ") and fragment in captured.err
    assert captured.err.rstrip().endswith(f"(see {prog} --help)")
    assert "usage:" not in captured.err and captured.out == ""


@pytest.mark.parametrize("factory, parameter", [("dense_of", "units"), ("NeedsUnits", "units")])
def test_a_factory_that_needs_arguments_exits_two_before_any_work(factory, parameter, capsys, monkeypatch):
    monkeypatch.chdir(TESTS)
    assert cli.main(["check", "interrupt_models:tf1_dense", f"interrupt_models:{factory}",
                     "--input-shape", "2,3"]) == 2
    captured = capsys.readouterr()
    assert f"parameter {parameter!r} has no default" in captured.err and "TF2_FACTORY" in captured.err
    assert len(captured.err.strip().splitlines()) == 1
    assert "equivtool check" not in captured.out  # the run never started


# --------------------------------------------------------------------------
# tolerance keys that match no leaf
# --------------------------------------------------------------------------

def _ours(caught) -> list:
    return [str(w.message) for w in caught if "tolerance keys matched no leaf" in str(w.message)]


def test_a_tolerance_key_that_matches_no_leaf_is_named_in_a_warning_and_the_report():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = equivtool.check_equivalence(
            tf1_dense, Dense, X, steps=["fixed_weights"],
            tolerance={"nosuchleaf": equivtool.Tolerance(atol=1e-4)},
            step_tolerances={"fixed_weights": {"outputs": equivtool.Tolerance(), "nosuch*": equivtool.Tolerance()}})
    assert report.passed, str(report)
    assert report.meta["unmatched_tolerance_keys"] == ["step_tolerances['fixed_weights']['nosuch*']"]
    assert len(_ours(caught)) == 1 and "step_tolerances['fixed_weights']['nosuch*']" in _ours(caught)[0]
    text = str(report)
    assert "Warning: tolerance keys matched no leaf" in text and "['nosuch*']" in text
    # 'nosuchleaf' was in `tolerance`, which fixed_weights did not use: no comparison got it.
    assert "nosuchleaf" not in text


def test_a_key_matched_in_any_comparison_of_its_step_is_not_reported():
    """'outputs' matches the outputs comparison but not regularization_loss: it is used."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = equivtool.check_equivalence(tf1_dense, Dense, X, steps=["fixed_weights"],
                                             tolerance={"outputs": equivtool.Tolerance(atol=1e-4)})
    assert report.passed, str(report)
    assert "unmatched_tolerance_keys" not in report.meta and not _ours(caught)
    assert "Warning: tolerance keys" not in str(report)


def test_strict_tolerances_makes_an_unmatched_key_an_error_holding_the_report():
    with pytest.raises(equivtool.UnmatchedToleranceKeys) as raised:
        equivtool.check_equivalence(tf1_dense, Dense, X, steps=["fixed_weights"], strict_tolerances=True,
                                    tolerance={"output": equivtool.Tolerance(atol=1e-4)})
    assert "tolerance['output']" in str(raised.value) and isinstance(raised.value, ValueError)
    assert raised.value.report.step("fixed_weights").passed


def test_strict_tolerances_must_be_a_bool():
    with pytest.raises(TypeError, match=r"strict_tolerances: expected True or False, got 'yes'"):
        equivtool.check_equivalence(_never_built, Dense, X, strict_tolerances="yes")


def test_strict_tolerances_on_the_cli_reaches_the_check(capsys, monkeypatch):
    seen = {}

    def check_equivalence(*args, **kwargs):
        seen.update(kwargs)
        raise equivtool.UnmatchedToleranceKeys("strict_tolerances: tolerance keys matched no leaf: x", None)

    monkeypatch.chdir(TESTS)
    monkeypatch.setattr(equivtool, "check_equivalence", check_equivalence)
    assert cli.main(CHECK + ["--strict-tolerances"]) == 2
    assert seen["strict_tolerances"] is True
    assert "tolerance keys matched no leaf" in capsys.readouterr().err
