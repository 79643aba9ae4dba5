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
from equivtool.equivalence import _check_inputs
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
    (lambda: tf.ones([2, 3]), ("inputs: a TensorFlow EagerTensor", "inputs.numpy()")),
    (lambda: [X, tf.Variable(X)], ("inputs[1]: a TensorFlow ResourceVariable", "inputs[1].numpy()")),
    (lambda: {"a": {"b": tf.constant(X)}}, ("inputs['a']['b']: a TensorFlow EagerTensor",)),
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
    (CHECK[:3], "equivtool check", "the following arguments are required: --input-shape"),
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
