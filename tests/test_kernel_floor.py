"""The kernel floor (``check_equivalence(..., tf1_python=PATH, kernel_floor=True)``,
:mod:`equivtool.engine.kernel_floor`): the TF1 side run again in the TF1
interpreter with one ULP of rounding injected at every compute op.

The injection itself (the old-side program's ``ulp_step`` and ``perturb_ops``)
is checked here under TensorFlow 2's graph mode with hypothesis, and in
TensorFlow 1.15 where the interpreter exists; the judgement's edge cases
need no TensorFlow 1.15; the verdicts run the old side
(``$EQUIVTOOL_TF1_PYTHON``, skipped with the reason without it).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from equivtool import check_equivalence
from equivtool.comparison import Tolerance, compare
from equivtool.engine import kernel_floor, noise_floor
from equivtool.engine.sides import _old_side_program as program
from equivtool.engine.sides import old_python

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "contrib_tf1")
sys.path[:0] = [HERE, EXAMPLE]
import contrib_tf1_model as contrib  # noqa: E402
import kernel_floor_model as deep  # noqa: E402
from test_tf1_interpreter import temp_root  # noqa: E402,F401 (a fixture: TMPDIR for one test alone)
from test_tf1_python_side import tf1_python  # noqa: E402,F401 (a fixture: the interpreter, or a skip)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How many representable float32 values lie between a and b (0 where equal)."""
    def ordered(x):
        bits = x.astype(np.float32).view(np.int32).astype(np.int64)
        return np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)
    return np.abs(ordered(a) - ordered(b))


# --------------------------------------------------------------------------
# (a) the injection: exactly one ULP per float output, nothing else touched
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ulp_graph():
    import tensorflow as tf
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, None)
        even, odd = program.ulp_step(x, 0), program.ulp_step(x, 1)
    session = tf.compat.v1.Session(graph=graph)
    yield lambda value: session.run((even, odd), {x: value})
    session.close()


normal = st.floats(width=32, allow_nan=False, allow_infinity=False,
                   min_value=-2.0 ** 100, max_value=2.0 ** 100).filter(lambda v: v == 0 or abs(v) >= 1.2e-38)


@settings(max_examples=40, deadline=None)
@given(value=hnp.arrays(np.float32, st.integers(1, 40), elements=normal | st.sampled_from(
    [0.0, -0.0, np.inf, -np.inf, np.nan])))
def test_every_nonzero_finite_element_moves_by_exactly_one_ulp(ulp_graph, value):
    even, odd = ulp_graph(value)
    moving = (value != 0) & np.isfinite(value)
    for moved in (even, odd):
        assert (ulp_distance(moved, value)[moving] == 1).all()
        kept = ~moving
        assert np.array_equal(moved[kept], value[kept], equal_nan=True)  # zeros, inf and NaN as they were
    # the direction is the element's own lowest mantissa bit, flipped by the op's index
    up = even[moving] > value[moving]
    assert np.array_equal(up, (value[moving].view(np.int32) & 1) == 1)
    assert np.array_equal(odd[moving] > value[moving], ~up)


TF1_PROPERTY = r'''
import json, sys
import numpy as np
import tensorflow as tf
sys.path.insert(0, sys.argv[1])
import _old_side_program as program
graph = tf.Graph()
with graph.as_default():
    x = tf.placeholder(tf.float32, [3, 4], name="x")
    w = tf.Variable(np.arange(12, dtype=np.float32).reshape(4, 3) / 7, name="w")      # a ref variable
    counter = tf.Variable(5, name="counter")
    product = tf.matmul(x, w, name="product")                                         # compute: perturbed
    total = tf.reduce_sum(tf.nn.relu(product) * 1.5, name="total")
    size = tf.size(product, name="size")                                              # int: untouched
    mean = tf.divide(total, tf.cast(size, tf.float32), name="mean")
    update = tf.assign_add(w, w * 0.25, name="update")                                # ref output: skipped
    bump = tf.assign_add(counter, size, name="bump")
    loop = tf.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v * 1.1), [0, total], name="loop")
    before = len(graph.get_operations())
    ops = graph.get_operations()
    moved, counts = program.perturb_ops(ops)
    init = tf.global_variables_initializer()
pairs = sorted(moved.items(), key=lambda item: item[0].name)
with tf.Session(graph=graph) as session:
    session.run(init)
    feed = {x: np.random.RandomState(0).standard_normal((3, 4)).astype(np.float32)}
    values = session.run([[t for t, _ in pairs], [p for _, p in pairs], size, loop], feed)
    w_before = session.run(w)
    session.run([update, bump], feed)
    w_after, count = session.run([w, counter])
print(json.dumps({
    "names": [t.name for t, _ in pairs],
    "tensors": [[np.asarray(a).tolist(), np.asarray(b).tolist()] for a, b in zip(values[0], values[1])],
    "size": int(values[2]), "counts": counts, "count": int(count),
    "w_step": np.abs(w_after - w_before * 1.25).max().item(),
    "loop_ops_moved": [t.name for t, _ in pairs if t.op._get_control_flow_context() is not None],
    "state_moved": [t.name for t, _ in pairs if t.op.type in ("VariableV2", "Identity", "Const", "Placeholder")],
}))
'''


@pytest.mark.parametrize("behaviour", ["v1", "as_the_old_side_starts"])
def test_in_tensorflow_1_15_each_perturbed_output_is_one_ulp_and_state_ints_and_loops_are_left(
        tf1_python, behaviour):
    from equivtool._platform.tf1_python import clean_env
    env = clean_env()  # as the old side is started: TF2_BEHAVIOR (set by TensorFlow 2 here) goes along
    if behaviour == "v1":  # ref variables and v1 while loops
        env.pop("TF2_BEHAVIOR", None)
    found = subprocess.run([tf1_python, "-c", TF1_PROPERTY, os.path.dirname(old_python.PROGRAM)],
                           capture_output=True, text=True, timeout=300, env=env)
    assert found.returncode == 0, found.stderr[-3000:]
    answer = json.loads(found.stdout.strip().splitlines()[-1])
    names = answer["names"]
    assert "product:0" in names and "total:0" in names and "mean:0" in names
    for name, (value, moved) in zip(names, answer["tensors"]):
        value, moved = np.asarray(value, np.float32), np.asarray(moved, np.float32)
        moving = (value != 0) & np.isfinite(value)
        assert moving.any(), name
        assert (ulp_distance(moved, value)[moving] == 1).all(), name
        assert np.array_equal(moved[~moving], value[~moving]), name
    assert answer["size"] == 9 and answer["count"] == 14  # the int op and its consumers: as written
    assert answer["loop_ops_moved"] == [] and answer["state_moved"] == []
    skipped = answer["counts"]["skipped"]
    assert sum(n for reason, n in skipped.items() if reason.startswith("control flow")) > 0, skipped
    assert skipped["state (variable, its read, constant or placeholder)"] > 0
    if behaviour == "v1":
        assert skipped["ref-typed output (a variable's update)"] == 2  # the two assign_adds
    assert skipped["exact in every version (moves or selects values)"] >= 1  # the relu
    assert "mul_1:0" in names  # the update's input (w * 0.25) is perturbed, the variable only through it
    assert answer["w_step"] < 1e-5
    assert "Cast:0" not in names  # an int cast to float is exact
    assert answer["counts"]["perturbed_outputs"] == len(names)


# --------------------------------------------------------------------------
# (d) the judgement: nothing compared never passes; floor 0 or NaN widens nothing
# --------------------------------------------------------------------------

def _failed(tf1, tf2, name="outputs"):
    return compare(tf1, tf2, Tolerance(rtol=1e-6, atol=1e-5), name=name)


def test_a_leaf_within_the_multiple_of_its_kernel_floor_passes_and_one_beyond_fails():
    reference = {"a": np.float32([1.0, 2.0]), "b": np.float32([1.0, 2.0])}
    tf2 = {"a": np.float32([1.0, 2.001]), "b": np.float32([1.0, 2.5])}
    comparison = _failed(reference, tf2)
    assert not comparison.ok
    floors = noise_floor.measure(reference, {"a": np.float32([1.0, 2.0002]), "b": np.float32([1.0, 2.0002])},
                                 "outputs")
    judged = noise_floor.judge([comparison], [floors], 10.0, None, kernel_floor.KERNEL)
    leaves = {leaf.name: leaf for leaf in judged.comparisons[0].leaves}
    assert leaves["outputs/a"].ok and "consistent with kernel rounding" in leaves["outputs/a"].note
    assert not leaves["outputs/b"].ok  # 0.5 against a floor of 2e-4: a real fault stays one
    assert judged.notes[0].startswith("kernel floor: TF1 run again in the TF1 interpreter with one ULP")
    assert "(seed" not in judged.notes[0]


@pytest.mark.parametrize("floor", [0.0, math.nan])
def test_a_kernel_floor_of_zero_or_nan_widens_nothing(floor):
    comparison = _failed({"a": np.float32([1.0])}, {"a": np.float32([1.001])})
    judged = noise_floor.judge([comparison], [{"outputs/a": floor}], 10.0, None, kernel_floor.KERNEL)
    assert not judged.comparisons[0].ok


def test_nothing_compared_is_never_turned_into_a_pass():
    from equivtool.report import StepResult
    empty = compare({}, {}, Tolerance(), name="outputs")
    judged = noise_floor.judge([empty], [{}], 10.0, None, kernel_floor.KERNEL)
    assert StepResult.from_comparisons("s", "s", judged.comparisons).status == "inconclusive"


def test_the_optimizer_takes_the_larger_floor_per_leaf_and_says_which():
    e = types.SimpleNamespace(options=types.SimpleNamespace(noise_floor_multiple=10.0, seed=42))
    reference = {"loss": np.float32(1.0), "variables": {"w": np.float32([1.0]), "v": np.float32([1.0])}}
    tf2 = {"loss": np.float32(1.0), "variables": {"w": np.float32([1.004]), "v": np.float32([1.004])}}
    comparison = _failed(reference, tf2, "step_1")
    noise = {"loss": np.float32(1.0), "variables": {"w": np.float32([1.0005]), "v": np.float32([1.0])}}
    kernel = {"loss": np.float32(1.0), "variables": {"w": np.float32([1.0]), "v": np.float32([1.0001])}}
    judged, notes = kernel_floor.judge_optimizer(e, [comparison], [reference], [noise], [kernel],
                                                 {kernel_floor.KEY: {"ops": {"perturbed_ops": 3}}})
    leaves = {leaf.name: leaf for leaf in judged.comparisons[0].leaves}
    assert leaves["step_1/variables/w"].ok  # within 10 x the noise floor 5e-4
    assert not leaves["step_1/variables/v"].ok  # beyond 10 x the kernel floor 1e-4
    assert notes[0].startswith("floor per leaf: the kernel floor for 1 leaf-steps, the noise floor for 1")
    assert "3 ops perturbed" in notes[1]


# --------------------------------------------------------------------------
# (e) only with the TF1 interpreter
# --------------------------------------------------------------------------

def test_in_process_the_kernel_floor_is_refused_in_one_line_before_any_work():
    def tf1_fn(inputs, training):
        raise AssertionError("built: the argument was not checked first")
    with pytest.raises(ValueError, match=r"^kernel_floor: needs tf1_python \(both sides run in this "
                                         r"TensorFlow and share its kernels"):
        check_equivalence(tf1_fn, lambda: None, np.ones((1, 2), np.float32), kernel_floor=True)
    with pytest.raises(TypeError, match="kernel_floor: expected True or False"):
        check_equivalence(tf1_fn, lambda: None, np.ones((1, 2), np.float32), kernel_floor="yes")


def test_the_cli_refuses_kernel_floor_without_tf1_python(capsys):
    from equivtool.cli import main
    code = main(["check", "kernel_floor_model:deep_bn", "kernel_floor_model:DeepShim",
                 "--input-shape", "1,2,2,3", "--kernel-floor"])
    assert code == 2 and "kernel_floor: needs tf1_python" in capsys.readouterr().err


# --------------------------------------------------------------------------
# verdicts with the TF1 side in TensorFlow 1.15
# --------------------------------------------------------------------------

DEEP_INPUTS = np.random.RandomState(0).standard_normal((1, deep.SIZE, deep.SIZE, 3)).astype(np.float32)
CONTRIB_INPUTS = np.random.RandomState(3).standard_normal((4, contrib.FEATURES)).astype(np.float32)


def _deep(tf1_python, shim=None, **kwargs):
    return check_equivalence("kernel_floor_model:deep_bn", lambda: deep.DeepShim(**(shim or {})),
                             DEEP_INPUTS, tf1_python=tf1_python, tf1_path=[HERE], **kwargs)


def test_a_faithful_model_that_misses_the_tolerance_only_by_kernel_rounding_passes_with_the_floor(
        tf1_python, temp_root):
    without = _deep(tf1_python, steps=["gradients"])
    assert without.step("gradients").status == "failed", str(without)  # it does fail without the floor
    found = _deep(tf1_python, steps=["gradients"], kernel_floor=True)
    step = found.step("gradients")
    assert step.status == "passed" and found.passed, str(found)
    data = step.data["kernel_floor"]
    assert data["consistent_with_rounding"] and data["largest_floor"] > 0
    assert data["ops"]["perturbed_ops"] > 0 and data["ops"]["skipped"]
    assert any(note.startswith("kernel floor: ") and "ops perturbed" in note for note in step.notes)
    assert list(temp_root.glob("equivtool-*")) == []  # one interpreter for both runs, its folder gone


def test_a_planted_batch_norm_decay_is_not_absorbed_by_the_kernel_floor(tf1_python):
    found = _deep(tf1_python, steps=["random"], modes=["constant"], kernel_floor=True, shim={"decay": 0.5})
    assert not found.passed and found.step("random/constant/training").status == "failed", str(found)


@pytest.mark.parametrize("slip", [{"epsilon": 1e-3}, {"forget_bias": 0.0}, {"decay": 0.5}],
                         ids=["layer_norm_epsilon", "lstm_forget_bias", "batch_norm_decay"])
def test_the_contrib_examples_planted_slips_stay_not_equivalent_with_the_kernel_floor(tf1_python, slip):
    found = check_equivalence("contrib_tf1_model:model", lambda: contrib.Shim(**slip), CONTRIB_INPUTS,
                              tf1_python=tf1_python, tf1_path=[HERE, EXAMPLE], kernel_floor=True,
                              steps=["fixed_weights", "random"], modes=["constant"])
    assert not found.passed, str(found)
    failed = [step for step in found.steps if step.status == "failed"]
    assert failed and all("kernel_floor" in step.data for step in failed)
    assert any("beyond 10 x the kernel floor" in note for step in failed for note in step.notes)


def test_with_every_output_filtered_out_nothing_passes(tf1_python):
    found = _deep(tf1_python, steps=["fixed_weights"], outputs=["!*"], kernel_floor=True)
    assert found.step("fixed_weights").status != "passed" and not found.passed, str(found)


@pytest.mark.parametrize("learning_rate, status", [(0.1, "passed"), (0.11, "failed")])
def test_the_optimizer_step_judges_against_the_larger_floor_and_a_wrong_learning_rate_still_fails(
        tf1_python, learning_rate, status):
    import tensorflow as tf
    found = check_equivalence("contrib_tf1_model:model", lambda: contrib.Shim(), CONTRIB_INPUTS,
                              tf1_python=tf1_python, tf1_path=[HERE, EXAMPLE], kernel_floor=True,
                              steps=["optimizer"], optimizers=("contrib_tf1_model:sgd",
                                                               lambda: tf.keras.optimizers.SGD(learning_rate)))
    [step] = found.steps
    assert step.status == status, str(found)
    data = step.data["kernel_floor"]
    assert data["largest_floor"] > 0 and data["ops"]["perturbed_ops"] > 0
    assert any(note.startswith("floor per leaf: the kernel floor for ") for note in step.notes)
    assert "noise_floor" not in step.data  # one judgement, against the larger floor per leaf
