"""benchmarks/zoo_floor.py: the zoo's noise-floor table (issue 33).

The benchmark itself is not a test (it runs every zoo net); these tests check
the parts whose failure would make its figures wrong: a row counts the leaves
that the floor accepted and the ones it did not, a step with no floor
measured says so instead of showing numbers, and the ``resume`` variant's
TF1 checkpoint is written, resumed from and removed, also when it fails.
"""

import os
import tempfile

import numpy as np
import pytest
import tensorflow as tf

from benchmarks import zoo_floor
from equivtool.comparison import Tolerance, compare
from equivtool.engine import noise_floor
from equivtool.report import StepResult
from examples.slim_zoo.zoo import ZooNet
from tests.test_zoo import tiny_arg_scope, tiny_net

GUIDE = Tolerance(rtol=1e-6, atol=1e-5)


def _step(tf1: dict, tf2: dict, tf1_again: dict) -> StepResult:
    """An optimizer-like step judged against the floor that ``tf1_again`` (TF1 run again) measures."""
    comparison = compare(tf1, tf2, GUIDE, name="step_1")
    floor = noise_floor.judge_runs([comparison], [tf1], [tf1_again], noise_floor.DEFAULT_MULTIPLE, 42)
    return StepResult.from_comparisons("optimizer", "Optimizer steps", floor.comparisons,
                                       notes=floor.notes, data={"noise_floor": floor.data})


def _cells(row: str) -> list:
    return [cell.strip() for cell in row.strip("|").split("|")]


BASE = {"a": np.float32([1.0, 2.0]), "b": np.float32([3.0])}


def test_a_row_counts_the_leaves_the_floor_accepts_and_their_largest_ratio():
    tf2 = {"a": BASE["a"] + np.float32([4e-5, 0.0]), "b": BASE["b"]}        # over atol
    again = {"a": BASE["a"] + np.float32([1e-3, 0.0]), "b": BASE["b"] + 2e-6}  # TF1 moves further
    step = _step(BASE, tf2, again)
    assert step.status == "passed"
    cells = _cells(zoo_floor.row("net", False, step, 12.0))
    assert cells[:4] == ["net", "eager", "optimizer", "passed"]
    assert cells[4].startswith("4.0e-05 (`step_1/a`)") and cells[5] == "1.0e-03" and cells[6] == "1.0e-03"
    assert cells[7] == "1" and float(cells[8]) == pytest.approx(0.04, rel=0.01) and cells[9:] == ["0", "12"]
    assert any("step_1/a: difference 4.0e-05, floor 1.0e-03 (consistent with rounding)" in line
               for line in zoo_floor.details(step))


def test_a_difference_beyond_the_floor_is_counted_as_failing():
    tf2 = {"a": BASE["a"] + np.float32([4e-5, 0.0]), "b": BASE["b"]}
    again = {"a": BASE["a"] + np.float32([1e-6, 0.0]), "b": BASE["b"]}      # planted: floor 40x too small
    step = _step(BASE, tf2, again)
    assert step.status == "failed"
    cells = _cells(zoo_floor.row("net", True, step, 1.0))
    assert cells[1:4] == ["tf.function", "optimizer", "failed"]
    assert cells[7:10] == ["0", "-", "1"]
    assert any("(FAILED)" in line for line in zoo_floor.details(step))


def test_a_floor_of_zero_accepts_nothing_and_is_listed():
    tf2 = {"a": BASE["a"] + np.float32([4e-5, 0.0]), "b": BASE["b"]}
    step = _step(BASE, tf2, BASE)  # TF1 reproduced itself exactly
    assert step.status == "failed"
    assert _cells(zoo_floor.row("net", False, step, 1.0))[5:10] == ["0", "0", "0", "-", "1"]
    assert any("floor 0 at 2 (of which 1 differ from TF2: step_1/a)" in line for line in zoo_floor.details(step))


def test_a_step_where_every_leaf_is_bit_identical_names_no_leaf():
    step = _step(BASE, BASE, {"a": BASE["a"] + np.float32([1e-6, 0.0]), "b": BASE["b"]})
    # the floor: 1e-6 rounded to 8 ULPs of 1.0
    assert _cells(zoo_floor.row("net", False, step, 1.0))[4:8] == ["0 (every leaf)", "-", "9.5e-07", "0"]


def test_a_step_without_a_floor_says_so_and_shows_no_floor_numbers():
    comparison = compare(BASE, BASE, GUIDE, name="step_1")
    step = StepResult.from_comparisons("optimizer", "Optimizer steps", [comparison])
    cells = _cells(zoo_floor.row("net", False, step, 1.0))
    assert cells[3].endswith("(no floor measured)")
    assert cells[4:8] == ["0 (every leaf)", "-", "n/a", "0"]
    assert any("no noise floor data" in line for line in zoo_floor.details(step))


TINY = ZooNet("tiny", tiny_net, tiny_arg_scope, 8)


def _left_behind(folder) -> list:
    return [name for name in os.listdir(folder) if name.startswith("zoo-floor-")]


def test_resume_runs_from_a_tf1_checkpoint_it_writes_and_removes(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    report = zoo_floor.check_resume(TINY, tf_function=False, tf1_steps=2, train_steps=2)
    step = report.step("resume")
    assert step.status == "passed", str(report)
    assert any("converted: 4 model variables, 4 slots, iterations=2" in note for note in step.notes)
    assert len(step.data["noise_floor"]["steps"]) == 2
    assert _left_behind(tmp_path) == []


def test_the_resume_checkpoint_folder_is_removed_when_the_run_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def broken(*args, **kwargs):
        assert _left_behind(tmp_path), "the checkpoint folder should exist while the run goes on"
        raise RuntimeError("planted")

    monkeypatch.setattr("equivtool.check_equivalence", broken)
    with pytest.raises(RuntimeError, match="planted"):
        zoo_floor.check_resume(TINY, tf_function=False, tf1_steps=1, train_steps=1)
    assert _left_behind(tmp_path) == []


def aux_net(inputs, num_classes=10, is_training=True, scope="aux", aux_name="AuxLogits"):
    """tiny_net with an auxiliary head that only its own loss term reaches (as inception_v3's)."""
    logits, end_points = tiny_net(inputs, num_classes, is_training, scope=scope)
    import tf_slim as slim
    with tf.compat.v1.variable_scope(scope, reuse=tf.compat.v1.AUTO_REUSE):
        end_points[aux_name] = slim.fully_connected(slim.flatten(inputs), num_classes, activation_fn=None,
                                                    scope=aux_name)
    return logits, end_points


def test_an_auxiliary_head_gets_its_slots_in_the_tf1_checkpoint_and_resumes(tmp_path):
    net = ZooNet("aux", aux_net, tiny_arg_scope, 8)
    path = zoo_floor.write_tf1_checkpoint(net, 1, str(tmp_path / "model"))
    stored = {name for name, _ in tf.train.list_variables(path)}
    assert {"aux/AuxLogits/biases/Momentum", "aux/AuxLogits/weights/Momentum"} <= stored
    report = zoo_floor.check_resume(net, tf_function=False, tf1_steps=1, train_steps=1)
    assert report.step("resume").status == "passed", str(report)


def test_an_auxiliary_head_not_in_the_loss_has_no_slot_and_does_not_resume(tmp_path):
    net = ZooNet("aux", aux_net, tiny_arg_scope, 8, kwargs={"aux_name": "Side"})  # planted: not "AuxLogits"
    path = zoo_floor.write_tf1_checkpoint(net, 1, str(tmp_path / "model"))
    assert "aux/Side/biases/Momentum" not in {name for name, _ in tf.train.list_variables(path)}
    step = zoo_floor.check_resume(net, tf_function=False, tf1_steps=1, train_steps=1).step("resume")
    assert step.status == "error" and "optimizer state does not convert" in step.message


@pytest.mark.parametrize("argv, message", [
    (["nonet"], "NET: unknown ['nonet']"),
    (["inception_v2", "--step", "resume", "--train-steps", "0"], "--train-steps: expected ints >= 1"),
    (["inception_v2", "--step", "resume", "--tf1-steps", "0"], "--tf1-steps, --train-steps: expected ints >= 1"),
])
def test_bad_arguments_are_refused_before_any_net_runs(argv, message, capsys, monkeypatch):
    monkeypatch.setattr("examples.slim_zoo.zoo.run", lambda *a, **k: pytest.fail("a net ran"))
    monkeypatch.setattr(zoo_floor, "check_resume", lambda *a, **k: pytest.fail("a net ran"))
    with pytest.raises(SystemExit) as exit_:
        zoo_floor.main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err
