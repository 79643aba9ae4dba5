"""The kink floor (:mod:`equivtool.engine.kinks`): a ``gradients`` step that fails
only because elements lie on opposite sides of a ReLU's 0 or a max-pool tie in
TensorFlow 1.15 and here passes when the TF1 gradients, routed as the TF2 side's
forward values route them, agree within their own kernel floor and every such
element is within its op's forward kernel floor of the kink.

The flip detection and its judgement run on NumPy alone (hypothesis where a rule
must hold for every input); the TF2 tap under TensorFlow 2; the routed gradients
in the TF1 interpreter (``$EQUIVTOOL_TF1_PYTHON``, skipped with the reason
without it), on ``kink_model``: a net whose ReLU input holds exact zeros, to
which the TF2 rewrite adds a planted ``nudge``.
"""

from __future__ import annotations

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
from equivtool.engine import kinks

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE]
import kink_model  # noqa: E402
from test_tf1_python_side import tf1_python  # noqa: E402,F401 (a fixture: the interpreter, or a skip)

RELU = {"name": "r", "type": "Relu", "attrs": {}, "unroutable": ""}
POOL = {"name": "p", "type": "MaxPool", "unroutable": "",
        "attrs": {"ksize": [1, 2, 2, 1], "strides": [1, 2, 2, 1], "padding": "VALID", "data_format": "NHWC"}}
FLOATS = hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, max_side=6),
                    elements=st.floats(-100, 100, width=32))


# --------------------------------------------------------------------------
# flips (NumPy)
# --------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(FLOATS, st.sampled_from(["Relu", "Relu6", "LeakyRelu"]))
def test_the_same_values_on_both_sides_flip_nothing(x, kind):
    assert kinks.flipped({**RELU, "type": kind}, x, x.copy()).size == 0


@settings(max_examples=60, deadline=None)
@given(FLOATS)
def test_every_sign_change_is_a_flip_whose_gap_bounds_both_sides_distance_to_zero(x1):
    x2 = -x1
    gaps = kinks.flipped(RELU, x1, x2)
    assert gaps.size == int(np.count_nonzero(x1 != 0))  # a nonzero value and its negation: one side each
    np.testing.assert_array_equal(np.sort(gaps), np.sort(2 * np.abs(x1[x1 != 0]).astype(np.float64)))


def test_relu6_flips_at_six_as_well_as_at_zero():
    x1 = np.array([5.999, 1.0, -0.5, 3.0], np.float32)
    x2 = np.array([6.001, 1.0, 0.5, 3.0], np.float32)
    np.testing.assert_allclose(kinks.flipped({**RELU, "type": "Relu6"}, x1, x2), [0.002, 1.0], rtol=1e-3)


def test_a_non_finite_value_is_a_flip_with_no_finite_gap():
    gaps = kinks.flipped(RELU, np.array([np.nan, 1.0], np.float32), np.array([np.nan, 1.0], np.float32))
    assert gaps.size == 1 and math.isnan(gaps[0])


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 2), st.integers(2, 7), st.integers(2, 7), st.integers(1, 3), st.integers(1, 3),
       st.integers(1, 3), st.sampled_from(["SAME", "VALID"]), st.integers(0, 2 ** 31 - 1))
def test_the_windows_are_tensorflows_max_pool_windows(n, h, w, k, s, c, padding, seed):
    import tensorflow as tf
    if padding == "VALID" and (k > h or k > w):
        return
    x = np.random.RandomState(seed).standard_normal((n, h, w, c)).astype(np.float32)
    attrs = {"ksize": [1, k, k, 1], "strides": [1, s, s, 1], "padding": padding, "data_format": "NHWC"}
    expected = tf.nn.max_pool2d(x, k, s, padding).numpy()
    np.testing.assert_array_equal(kinks._windows(x, attrs).max(axis=-1), expected)
    assert kinks.flipped({**POOL, "attrs": attrs}, x, x.copy()).size == 0


def test_a_swapped_window_maximum_is_a_flip_with_each_sides_gap():
    x1 = np.zeros((1, 2, 2, 1), np.float32)
    x1[0, 0, 0, 0], x1[0, 1, 1, 0] = 1.0, 0.9999
    x2 = x1.copy()
    x2[0, 1, 1, 0] = 1.0001  # the other element is the maximum here
    gaps = kinks.flipped(POOL, x1, x2)
    np.testing.assert_allclose(gaps, [1e-4], rtol=1e-2)


def test_a_pool_over_the_batch_or_channels_is_not_routed_and_says_so():
    attrs = {**POOL["attrs"], "ksize": [1, 2, 2, 2]}
    found = kinks.flips([{**POOL, "attrs": attrs}], [np.ones((1, 2, 2, 2))], [np.ones((1, 2, 2, 2))],
                        [np.ones((1, 2, 2, 2))], 10.0)
    assert len(found) == 1 and not found[0].explained and "only spatial windows" in found[0].why


# --------------------------------------------------------------------------
# the judgement of flips (NumPy)
# --------------------------------------------------------------------------

def _one(x1, x1p, x2, spec=RELU, multiple=10.0):
    [flip] = kinks.flips([spec], [np.asarray(x1, np.float32)], [np.asarray(x1p, np.float32)],
                         [np.asarray(x2, np.float32)], multiple)
    return flip


def test_a_flip_within_the_multiple_of_its_forward_floor_is_explained_and_one_beyond_is_not():
    assert _one([1e-6, 1.0], [1e-6, 1.0 + 1e-6], [-1e-6, 1.0]).explained  # gap 2e-6 <= 10 x 1e-6
    beyond = _one([1e-4, 1.0], [1e-4, 1.0 + 1e-6], [-1e-4, 1.0])  # gap 2e-4 > 10 x 1e-6
    assert not beyond.explained and "beyond 10 x its forward kernel floor" in beyond.why


def test_a_flip_where_the_rounding_moved_nothing_is_never_explained():
    flip = _one([1e-30, 1.0], [1e-30, 1.0], [-1e-30, 1.0])  # forward floor 0
    assert not flip.explained and "forward kernel floor of 0" in flip.why


def test_a_flip_at_an_op_whose_gradient_cannot_be_routed_is_never_explained():
    flip = _one([1e-9, 1.0], [1e-9, 1.0 + 1e-6], [-1e-9, 1.0], spec={**RELU, "unroutable": "in a v1 control-flow context"})
    assert not flip.explained and "cannot be routed" in flip.why


def test_an_op_without_a_flip_is_not_listed():
    assert kinks.flips([RELU], [np.array([1.0, -1.0])], [np.array([1.0, -1.0])], [np.array([2.0, -2.0])], 10.0) == []


# --------------------------------------------------------------------------
# when kinks are routed, and the TF2 tap
# --------------------------------------------------------------------------

def _options(**kwargs):
    base = dict(tf1_python=sys.executable, kernel_floor=True, tf_function=False, strategy=None)
    return types.SimpleNamespace(**{**base, **kwargs})


@pytest.mark.parametrize("change, routed", [({}, True), ({"kernel_floor": False}, False),
                                            ({"tf_function": True}, True), ({"tf1_python": None}, False),
                                            ({"strategy": object()}, False)])
def test_kinks_are_routed_only_with_the_kernel_floor_the_old_interpreter_and_no_strategy(change, routed):
    assert kinks.wanted(_options(**change)) is routed


def test_the_tap_keeps_each_kinks_input_in_order_and_changes_no_number():
    import tensorflow as tf
    from equivtool.engine.sides.tf2_side import run_tapped
    x = tf.constant(np.random.RandomState(0).standard_normal((1, 4, 4, 2)).astype(np.float32))
    w = tf.Variable(np.random.RandomState(1).standard_normal((3, 3, 2, 2)).astype(np.float32))

    def grads():
        with tf.GradientTape() as tape:
            h = tf.nn.relu(tf.nn.conv2d(x, w, 1, "SAME"))
            h = tf.nn.max_pool2d(h, 2, 2, "VALID")
            loss = tf.reduce_sum(tf.nn.relu6(h - 0.5) ** 2)
        return tape.gradient(loss, w).numpy()
    bare = grads()
    tap = kinks.KinkTap()
    tapped = run_tapped(tap, grads)
    assert tapped.tobytes() == bare.tobytes()
    found = tap.capture()
    assert found["types"] == ["Relu", "MaxPool", "Relu6"]
    assert [np.shape(v) for v in found["inputs"]] == [(1, 4, 4, 2), (1, 4, 4, 2), (1, 2, 2, 2)]


def _traced_grads(tap=None):
    import tensorflow as tf
    from equivtool.engine.sides.tf2_side import run_tapped
    x = tf.constant(np.random.RandomState(0).standard_normal((1, 4, 4, 2)).astype(np.float32))
    w = tf.Variable(np.random.RandomState(1).standard_normal((3, 3, 2, 2)).astype(np.float32))

    @tf.function
    def grads():
        with tf.GradientTape() as tape:
            h = tf.nn.max_pool2d(tf.nn.relu(tf.nn.conv2d(x, w, 1, "SAME")), 2, 2, "VALID")
            loss = tf.reduce_sum(tf.nn.relu6(h - 0.5) ** 2)
        return tape.gradient(loss, w), h
    found = grads() if tap is None else run_tapped(tap, grads)
    return [t.numpy() for t in found]


def test_under_tf_function_the_tap_keeps_each_kinks_input_as_the_function_runs_and_changes_no_number():
    bare, pooled = _traced_grads()
    tap = kinks.KinkTap()
    tapped, _ = _traced_grads(tap)
    assert tapped.tobytes() == bare.tobytes()
    found = tap.capture()
    assert found["types"] == ["Relu", "MaxPool", "Relu6"]
    np.testing.assert_array_equal(found["inputs"][2], pooled - 0.5)  # the value the op ran on


def test_under_tf_function_without_sinks_the_tap_keeps_nothing_and_says_why():
    tap = kinks.KinkTap(sinks=False)
    _traced_grads(tap)
    assert "tensorflow_default" in tap.capture()["error"]
    assert kinks.tap(types.SimpleNamespace(graph_rewrites="tensorflow_default")).sinks is False


def test_a_traced_function_that_never_runs_its_sinks_keeps_nothing():
    import tensorflow as tf
    from equivtool.engine.sides.tf2_side import run_tapped
    tap = kinks.KinkTap()
    run_tapped(tap, lambda: tf.function(lambda t: tf.nn.relu(t)).get_concrete_function(tf.constant([1.0])))
    assert "ran 0 of its 1 kink sinks" in tap.capture()["error"]


def test_misaligned_kinks_are_not_routed_and_say_why():
    specs = [{"name": "a/Relu", "type": "Relu", "shape": [2], "unroutable": ""}]
    assert "2 ReLU" not in kinks._aligned(specs, {"types": ["Relu"], "inputs": [np.zeros(2)]})
    assert kinks._aligned(specs, {"types": ["Relu"], "inputs": [np.zeros(2)]}) == ""
    assert "ran 2" in kinks._aligned(specs, {"types": ["Relu", "Relu"], "inputs": [np.zeros(2)] * 2})
    assert "do not align" in kinks._aligned(specs, {"types": ["MaxPool"], "inputs": [np.zeros(2)]})
    assert "do not align" in kinks._aligned(specs, {"types": ["Relu"], "inputs": [np.zeros(3)]})


# --------------------------------------------------------------------------
# the routed gradients in TensorFlow 1.15
# --------------------------------------------------------------------------

_PROGRAM_CHECK = r"""
import sys, numpy as np
sys.path.insert(0, sys.argv[1])
import _old_side_program as P
import tensorflow as tf
registry = sys.modules[tf.Graph.__module__]._gradient_registry._registry
stock = dict((kind, registry[kind]["type"]) for kind in P.KINK_TYPES)
g = tf.Graph()
with g.as_default():
    x = tf.placeholder(tf.float32, [2, 8, 8, 3])
    w = tf.Variable(np.random.RandomState(0).randn(3, 3, 3, 4).astype(np.float32))
    h = tf.nn.relu(tf.nn.conv2d(x, w, [1, 1, 1, 1], "SAME"))
    h = tf.nn.max_pool(h, [1, 3, 3, 1], [1, 2, 2, 1], "SAME")
    h = tf.nn.relu6(h) + tf.nn.leaky_relu(h - 1.0, 0.2)
    loss = tf.reduce_mean(tf.square(h))
    [grad] = tf.gradients(loss, [w])
    found, routed = P.routed_gradients(loss, [w], [(op, P.unroutable(op)) for op in P.kink_ops(g.get_operations(), loss)])
    assert [op.type for op, _, _ in found] == ["Relu", "MaxPool", "Relu6", "LeakyRelu"], found
    assert all(registry[kind]["type"] is stock[kind] for kind in stock), "the registry was not put back"
    try:
        P.routed_gradients(loss, [w, "not a tensor"], [])
    except Exception:
        pass
    assert all(registry[kind]["type"] is stock[kind] for kind in stock), "not put back after an error"
    session = tf.Session()
    session.run(tf.global_variables_initializer())
    xv = np.random.RandomState(1).randn(2, 8, 8, 3).astype(np.float32)
    inputs = session.run([op.inputs[0] for op, _, _ in found], {x: xv})
    feed = {x: xv}
    feed.update(dict((s, v) for (_, s, _), v in zip(found, inputs)))
    a, b = session.run([grad, routed[w.name]], feed)
    assert a.tobytes() == b.tobytes(), "routed by its own values, the gradient is not the stock one"
    feed[found[0][1]] = -inputs[0]
    c = session.run(routed[w.name], feed)
    assert np.abs(a - c).max() > 1e-3, "routed by other values, nothing changed"
print("ok")
"""


def test_in_tensorflow_1_15_routed_by_its_own_values_the_gradient_is_the_stock_one_bit_for_bit(tf1_python):
    from equivtool.engine.sides import _old_side_program
    folder = os.path.dirname(_old_side_program.__file__)
    env = {k: v for k, v in os.environ.items() if k != "TF2_BEHAVIOR"}
    done = subprocess.run([tf1_python, "-c", _PROGRAM_CHECK, folder], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


INPUTS = np.random.RandomState(0).standard_normal((2, kink_model.SIZE, kink_model.SIZE, 3)).astype(np.float32)


def _check(tf1_python, nudge=0.0, scale=1.0, **kwargs):
    return check_equivalence("kink_model:kinked", lambda: kink_model.KinkShim(nudge, scale), INPUTS,
                             tf1_python=tf1_python, tf1_path=[HERE], steps=["gradients"], **kwargs)


@pytest.mark.parametrize("workers", [1, 2])
def test_gradients_that_part_only_at_kinks_within_rounding_pass_with_the_kernel_floor(tf1_python, workers):
    without = _check(tf1_python, 1e-30, workers=workers)
    assert without.step("gradients").status == "failed", str(without)  # the flipped zeros fail as computed
    found = _check(tf1_python, 1e-30, kernel_floor=True, workers=workers)
    step = found.step("gradients")
    assert step.status == "passed" and found.passed, str(found)
    data = step.data["kink_floor"]
    assert data["flipped_ops"] == 1 and data["flipped_elements"] > 0 and data["kink_ops"] == 3
    [[op, kind, count, gap, floor, explained]] = data["flips"]
    assert kind == "Relu" and explained and 0 < gap <= 10 * floor
    assert any(note.startswith("kink floor: ") and "agrees within tolerance" in note for note in step.notes)


def test_a_planted_shift_at_a_kink_is_not_explained_by_the_kernel_floor(tf1_python):
    found = _check(tf1_python, 1e-2, kernel_floor=True)
    step = found.step("gradients")
    assert step.status == "failed" and not found.passed, str(found)
    assert any("not explained by kernel rounding" in note for note in step.notes)
    assert not step.data["kink_floor"]["flips"][0][-1]


def test_a_slip_elsewhere_is_not_absorbed_when_kinks_are_routed(tf1_python):
    found = _check(tf1_python, 1e-30, 1.01, kernel_floor=True)
    step = found.step("gradients")
    assert step.status == "failed" and not found.passed, str(found)
    assert any("routed alike the values still differ" in note for note in step.notes)


def test_without_a_flip_the_kink_floor_changes_nothing(tf1_python):
    found = _check(tf1_python, 0.0, 1.01, kernel_floor=True)
    step = found.step("gradients")
    assert step.status == "failed", str(found)
    assert any("none of the 3 ReLU/max-pool ops" in note for note in step.notes)
    assert step.data["kink_floor"]["flipped_elements"] == 0


def _train(tf1_python, nudge=0.0, scale=1.0, **kwargs):
    import tensorflow as tf
    return check_equivalence("kink_model:kinked", lambda: kink_model.KinkShim(nudge, scale), INPUTS,
                             tf1_python=tf1_python, tf1_path=[HERE], steps=["optimizer"], train_steps=2,
                             optimizers=("kink_model:sgd", lambda: tf.keras.optimizers.SGD(0.1)), **kwargs)


def test_optimizer_steps_that_part_only_at_kinks_within_rounding_pass_with_the_kernel_floor(tf1_python):
    without = _train(tf1_python, 1e-30)
    assert without.step("optimizer").status == "failed", str(without)
    found = _train(tf1_python, 1e-30, kernel_floor=True, workers=2)
    step = found.step("optimizer")
    assert step.status == "passed" and found.passed, str(found)
    data = step.data["kink_floor"]
    assert data["flipped_elements_per_step"] == [72, 72] and all(flip[-1] for flip in data["flips"])
    assert [flip[0] for flip in data["flips"]] == ["step 1: kinked_1/Relu", "step 2: kinked_1/Relu"]
    assert any(note.startswith("kink floor: ") and "agrees within tolerance" in note for note in step.notes)


@pytest.mark.parametrize("nudge, scale, says", [(1e-2, 1.0, "not explained by kernel rounding"),
                                                (1e-30, 1.01, "not explained by kernel rounding")],
                         ids=["shift_at_the_kink", "scaled_logits"])
def test_planted_slips_stay_not_equivalent_in_the_optimizer_step_with_kinks_routed(tf1_python, nudge, scale, says):
    found = _train(tf1_python, nudge, scale, kernel_floor=True)
    step = found.step("optimizer")
    assert step.status == "failed" and not found.passed, str(found)
    assert any(says in note for note in step.notes), step.notes


def test_under_tf_function_the_kinks_are_routed_as_eagerly(tf1_python):
    found = _check(tf1_python, 1e-30, kernel_floor=True, tf_function=True)
    step = found.step("gradients")
    assert step.status == "passed" and found.passed, str(found)
    assert step.data["kink_floor"]["flipped_elements"] == 72
