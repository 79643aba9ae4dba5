"""``resume`` with ``tf1_python``: training resumed from a TF1 checkpoint, its TF1 side in TensorFlow 1.15.

The model is ``tests/tf1_python_model.py:dense_model`` (contrib's
fully_connected, layer_norm and dropout there, the same code on tf-slim in a
shim layer here; the example's batch norm left out, see its docstring). The checkpoint, with the optimizer's slots, is
written here by the in-process TF1 graph after a few steps of the TF1
optimizer; the old interpreter restores it with its slots and trains on,
while the TF2 side converts it and trains on here. Needs
``$EQUIVTOOL_TF1_PYTHON`` (skipped with the reason without it).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from equivtool import check_equivalence
from equivtool.engine.sides import old_python

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "contrib_tf1")
sys.path[:0] = [HERE, EXAMPLE]
import contrib_tf1_model as model  # noqa: E402
import tf1_python_model as helpers  # noqa: E402
from test_tf1_interpreter import temp_root  # noqa: E402,F401 (a fixture: TMPDIR for one test alone)
from test_tf1_python_side import INPUTS, tf1_python  # noqa: E402,F401 (the interpreter's fixture)

STEPS = 3


def _keras(name: str, learning_rate: float):
    import tensorflow as tf
    if name == "sgd":
        return lambda: tf.keras.optimizers.SGD(learning_rate)
    return lambda: tf.keras.optimizers.Adam(learning_rate, epsilon=1e-8)


#: per optimizer: the TF1 factory's name (there), the same factory here, the TF2 optimizer
OPTIMIZERS = {"sgd": ("contrib_tf1_model:sgd", model.sgd, 0.1), "adam": ("tf1_python_model:adam", helpers.adam, 0.01)}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    """Per optimizer, a TF1 checkpoint of the model and the optimizer's slots after two steps."""
    import tensorflow as tf
    v1 = tf.compat.v1
    found = {}
    for name, (_, make, _) in OPTIMIZERS.items():
        graph = tf.Graph()
        with graph.as_default():
            v1.set_random_seed(7)
            outputs = helpers.dense_model(v1.placeholder_with_default(INPUTS, INPUTS.shape), True)
            train = make().minimize(tf.reduce_mean(tf.square(outputs)))
            with v1.Session(graph=graph) as session:
                session.run(v1.global_variables_initializer())
                for _ in range(2):
                    session.run(train)
                folder = tmp_path_factory.mktemp(name)
                found[name] = v1.train.Saver().save(session, os.path.join(str(folder), "model.ckpt"))
    return found


def _resume(tf1_python, checkpoint, optimizer: str, learning_rate=None, **kwargs):
    there, _, rate = OPTIMIZERS[optimizer]
    return check_equivalence("tf1_python_model:dense_model", helpers.DenseShim, INPUTS, tf1_python=tf1_python,
                             tf1_path=[HERE, EXAMPLE], steps=["resume"], checkpoint=checkpoint,
                             train_steps=STEPS, optimizers=(there, _keras(optimizer, learning_rate or rate)),
                             **kwargs)


def _leaves(step) -> dict:
    return {leaf.name: leaf for comparison in step.comparisons for leaf in comparison.leaves}


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_training_resumed_there_is_equivalent(tf1_python, checkpoints, temp_root, optimizer):
    report = _resume(tf1_python, checkpoints[optimizer], optimizer)
    step = report.step("resume")
    assert step.status == "passed" and report.passed, str(report)
    assert report.meta["old_ran_under"].startswith("TensorFlow 1.15.0")
    leaves = _leaves(step)
    variables = {f"step_{s}/variables/small/{v}" for s in range(1, STEPS + 1)
                 for v in ("fc1/weights", "fc1/biases", "LayerNorm/beta", "LayerNorm/gamma",
                           "logits/weights", "logits/biases")}
    assert variables <= set(leaves) and {f"step_{s}/loss" for s in range(1, STEPS + 1)} <= set(leaves)
    if optimizer == "adam":  # the slots and beta powers restored there, after every step
        assert {"step_3/slots/small/fc1/weights/Adam", "step_3/slots/small/logits/biases/Adam_1",
                "step_3/optimizer/beta1_power", "step_3/optimizer/beta2_power"} <= set(leaves)
        assert "Adam" in step.notes[0] and any("iterations=2" in note for note in step.notes)
    assert all(leaf.values_compared and leaf.compared > 0 for leaf in leaves.values())
    assert "noise_floor" in step.data and len(step.data["losses"]) == STEPS
    assert list(temp_root.glob("equivtool-*")) == []  # the program's folder is gone


def test_a_wrong_learning_rate_in_the_tf2_optimizer_is_not_equivalent(tf1_python, checkpoints):
    report = _resume(tf1_python, checkpoints["adam"], "adam", learning_rate=0.011)
    step = report.step("resume")
    assert step.status == "failed" and not report.passed, str(report)
    assert "NOT EQUIVALENT" in str(report.verdict)
    assert step.data["first_failing_step"] == 1


def test_a_checkpoint_without_the_optimizers_slots_is_named(tf1_python, checkpoints):
    """Restoring Adam's training from an SGD checkpoint: the slots it lacks are named, nothing passes."""
    report = _resume(tf1_python, checkpoints["sgd"], "adam")
    step = report.step("resume")
    assert step.status == "error" and not report.passed
    assert "lacks" in step.message and "Adam" in step.message and "beta1_power" in step.message, step.message


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_in_process_and_old_interpreter_resume_agree_within_the_floor(tf1_python, checkpoints, optimizer):
    import tensorflow as tf
    there = _resume(tf1_python, checkpoints[optimizer], optimizer)
    _, make, rate = OPTIMIZERS[optimizer]
    here = check_equivalence(helpers.dense_model, helpers.DenseShim, INPUTS, steps=["resume"],
                             checkpoint=checkpoints[optimizer], train_steps=STEPS,
                             optimizers=(make, _keras(optimizer, rate)))
    a, b = there.step("resume"), here.step("resume")
    assert (a.status, b.status) == ("passed", "passed"), (str(there), str(here))
    assert set(_leaves(a)) == set(_leaves(b))
    # the TF2 side ran here both times, from the same conversion: the same losses
    assert [tf2 for _, tf2 in a.data["losses"]] == [tf2 for _, tf2 in b.data["losses"]]
    # the TF1 sides differ by kernel rounding only: per leaf and step, the two TF1-vs-TF2
    # differences are apart by no more than the floor's multiple of the larger floor
    multiple = a.data["noise_floor"]["multiple"]
    compared = 0
    for rows_there, rows_here in zip(a.data["noise_floor"]["steps"], b.data["noise_floor"]["steps"]):
        for name, (diff_there, floor_there) in rows_there.items():
            diff_here, floor_here = rows_here[name]
            assert abs(diff_there - diff_here) <= multiple * max(floor_there, floor_here, 1e-7), name
            compared += 1
    assert compared == len(_leaves(a))
    del tf


def test_resume_is_no_longer_refused_there():
    from equivtool.engine.registry import get_step
    step = get_step("resume")
    assert old_python.OldTF1Side.step_side(step) is None  # the step's own, which hands its TF1 side over
    np.testing.assert_equal(sorted(old_python.STEP_SIDES)[-2:], ["resume", "variables_once"])


def test_training_resumed_there_is_equivalent_with_the_tf2_side_in_tf_function(tf1_python, checkpoints):
    report = _resume(tf1_python, checkpoints["adam"], "adam", tf_function=True)
    step = report.step("resume")
    assert step.status == "passed" and report.passed, str(report)
    assert "step_3/slots/small/fc1/weights/Adam_1" in _leaves(step)


def test_with_workers_the_interpreter_resumes_with_the_same_results(tf1_python, checkpoints):
    one = _resume(tf1_python, checkpoints["adam"], "adam")
    two = _resume(tf1_python, checkpoints["adam"], "adam", workers=2)
    a, b = one.step("resume"), two.step("resume")
    assert (a.status, b.status) == ("passed", "passed"), str(two)
    assert two.meta["worker_jobs"][0]["steps"] == ["resume"]
    assert {name: leaf.max_abs for name, leaf in _leaves(a).items()} == \
        {name: leaf.max_abs for name, leaf in _leaves(b).items()}
