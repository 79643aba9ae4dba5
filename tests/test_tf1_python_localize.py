"""Localization with the TF1 side in a real TensorFlow 1.15 interpreter
(``check_equivalence(..., tf1_python=PATH, localize=True)``).

The old-side program describes the pass's ops as JSON and fetches tensors by
name; :mod:`equivtool.engine.sides.old_graph` reads that description as the
graph localization walks. The end-to-end tests need ``$EQUIVTOOL_TF1_PYTHON``
(and skip with the reason without it): the example's three planted slips
(examples/contrib_tf1/contrib_tf1_model.py: a layer-norm epsilon, the LSTM's
forget bias, batch norm's decay) are each localized to the op where they
happen, and the faithful rewrite to nothing. The adapter and the program's
choice of what is not compared are tested here without TensorFlow 1.15.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from equivtool import check_equivalence
from equivtool.engine.sides import old_graph
from equivtool.localize.alignment import tf1_forward_ops

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "contrib_tf1")
sys.path[:0] = [HERE, EXAMPLE]
import contrib_tf1_model as model  # noqa: E402
from test_tf1_python_side import tf1_python  # noqa: E402,F401 (a fixture: the interpreter, or a skip with the reason)

INPUTS = np.random.RandomState(3).standard_normal((4, model.FEATURES)).astype(np.float32)


def _localized(tf1_python, slip: dict, steps, **kwargs) -> dict:
    report = check_equivalence("contrib_tf1_model:model", lambda: model.Shim(**slip), INPUTS, tf1_python=tf1_python,
                               tf1_path=[EXAMPLE], steps=steps, modes=["constant"], **kwargs)
    return {step.name: (step.status, step.data.get("localization")) for step in report.steps}


# --------------------------------------------------------------------------
# end to end, in TensorFlow 1.15
# --------------------------------------------------------------------------

@pytest.mark.parametrize("slip, step, tf1_op, tf2_type", [
    ({"epsilon": 1e-3}, "fixed_weights", "small/LayerNorm/batchnorm/add", "AddV2"),   # the epsilon added
    ({"forget_bias": 0.0}, "fixed_weights", "small/rnn/lstm/add", "AddV2"),           # the forget gate's bias
    # the decay: where it is applied, in the moving mean's update (UPDATE_OPS, run with the training pass)
    ({"decay": 0.99}, "random/constant/training", "small/BatchNorm/AssignMovingAvg/mul", "Mul"),
])
def test_each_planted_slip_is_localized_to_its_op(tf1_python, slip, step, tf1_op, tf2_type):
    found = _localized(tf1_python, slip, ["fixed_weights", "random"], localize=True)
    status, localization = found[step]
    assert status == "failed"
    assert localization.status == "diverged", str(localization)
    assert (localization.tf1_op, localization.tf1_type, localization.tf2_type) == (tf1_op, tf2_type, tf2_type)
    assert localization.tf1_source.startswith(os.path.join(EXAMPLE, "contrib_tf1_model.py:"))  # the user's line there
    assert localization.compared >= 1


def test_the_forget_bias_is_localized_under_tf_function_too(tf1_python):
    found = _localized(tf1_python, {"forget_bias": 0.0}, ["fixed_weights"], localize=True, tf_function=True)
    status, localization = found["fixed_weights"]
    assert status == "failed" and localization.status == "diverged"
    assert (localization.tf1_op, localization.tf2_op) == ("small/rnn/lstm/add", "rnn/lstm/add")  # by name


def test_the_faithful_rewrite_localizes_nothing_and_compares_every_op(tf1_python):
    found = _localized(tf1_python, {}, ["fixed_weights", "random"], localize="all")
    assert set(found) == {"fixed_weights", "random/constant/inference", "random/constant/training"}
    for name, (status, localization) in found.items():
        assert status == "passed", name
        # never "inconclusive": ops were aligned and compared (the LSTM's, the moving averages' in training)
        assert localization.status == "no_divergence", (name, str(localization))
        assert localization.compared >= 40, (name, str(localization))
        # TensorFlow 2's dropout draws after its multiply, 1.15's before: that draw stays
        # unaligned (both sides', the forward steps prove the draws); every other op is aligned
        assert set(localization.unaligned_tf1) <= {"small/dropout/dropout_1/random_uniform/RandomUniform "
                                                   "(RandomUniform)"}, (name, str(localization))


def test_the_cli_offers_the_localized_rerun_in_the_tf1_interpreter():
    import types
    from equivtool.cli.check import localize_command
    from equivtool.report import EquivalenceReport, StepResult
    args = types.SimpleNamespace(localize=False, tf1_fn="m:tf1", tf2_factory="m:tf2", input_shape="4,6", seed=42,
                                 tf_function=False, graph_rewrites="as_written", tf1_python="/env/bin/python",
                                 tf1_path=["models", "more"])
    command = localize_command(args, EquivalenceReport((StepResult("fixed_weights", "t", "failed", 0.0),)))
    assert command.endswith("--tf1-python /env/bin/python --tf1-path models --tf1-path more --localize")


# --------------------------------------------------------------------------
# the adapter: a described pass read as a graph (no TensorFlow 1.15 needed)
# --------------------------------------------------------------------------

def _op(name, op_type, inputs=(), dtype="float32", shape=(2,), fetchable=True, loop=False):
    return {"name": name, "type": op_type, "inputs": list(inputs), "outputs": [{"dtype": dtype, "shape": list(shape)}],
            "fetchable": [fetchable], "loop": loop, "frame": ["/user/model.py", 7, "net"]}


DESCRIPTION = {
    "ops": [_op("net/x", "Placeholder"), _op("net/w", "VariableV2"), _op("net/w/read", "Identity", ["net/w:0"]),
            _op("net/mul", "Mul", ["net/x:0", "net/w/read:0"]),
            _op("net/draw", "RandomUniform", fetchable=False),           # not compared (the program said so)
            _op("net/loop/add", "AddV2", ["net/mul:0"], loop=True),        # inside a v1 while loop
            _op("net/out", "AddV2", ["net/mul:0", "net/loop/add:0"]),
            _op("net/AssignMovingAvg/mul", "Mul", ["net/mul:0"]),
            {**_op("net/AssignMovingAvg", "AssignSub", ["net/w:0", "net/AssignMovingAvg/mul:0"], fetchable=False)}],
    "outputs": ["net/out:0"], "updates": ["net/AssignMovingAvg"], "random": False}


def test_a_described_pass_gives_localization_its_ops_in_order():
    graph = old_graph.OldGraph(DESCRIPTION)
    ops, in_loops, _ = tf1_forward_ops(graph, graph.roots())
    assert [op.name for op in ops] == ["net/mul", "net/out", "net/AssignMovingAvg/mul"]
    assert in_loops == 1
    mul = ops[0].op
    assert mul.outputs[0].shape == tf.TensorShape([2]) and mul.outputs[0].dtype == tf.float32
    assert [(f.filename, f.lineno, f.name) for f in mul.traceback] == [("/user/model.py", 7, "net")]
    # without the updates, the moving average's ops are not the pass's
    ops, _, _ = tf1_forward_ops(graph, graph.outputs)
    assert [op.name for op in ops] == ["net/mul", "net/out"]


def test_a_described_pass_is_fetched_by_tensor_name():
    asked = []

    def fetch(names):
        asked.append(names)
        return {name: np.full(2, i, np.float32) for i, name in enumerate(names)}
    run = old_graph.op_runner(fetch)
    graph = old_graph.OldGraph(DESCRIPTION)
    out, mul = graph.outputs[0], graph.get_operations()[3].outputs[0]
    values = run([out, mul])
    assert asked == [["net/out:0", "net/mul:0"]]
    np.testing.assert_array_equal(values[1], [1, 1])


def test_a_description_without_its_outputs_is_refused():
    broken = {**DESCRIPTION, "outputs": ["net/missing:0"]}
    with pytest.raises(ValueError, match=r"describe: the pass's outputs \['net/missing:0'\] are not among"):
        old_graph.OldGraph(broken)


def test_a_pass_with_nothing_fetchable_is_inconclusive_never_passed():
    from equivtool.localize.forward import localize_forward
    nothing = {**DESCRIPTION, "ops": [{**op, "fetchable": [False] * len(op["fetchable"])}
                                      for op in DESCRIPTION["ops"]]}
    graph = old_graph.OldGraph(nothing)

    def never(tensors):
        raise AssertionError("nothing should be fetched")
    found = localize_forward(graph, graph.roots(), never, lambda tap: None)
    assert found.status == "inconclusive" and found.compared == 0


# --------------------------------------------------------------------------
# what the program leaves uncompared (its graph walk, run here on a v1 graph)
# --------------------------------------------------------------------------

def test_the_program_leaves_variable_reads_and_draw_arithmetic_uncompared():
    from equivtool.engine.sides import _old_side_program as program
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="x")
        w = tf.compat.v1.get_variable("w", [3, 3], use_resource=False)
        draw = tf.compat.v1.random_uniform([2, 3], 2.0, 5.0, name="draw")  # draw * 3 + 2
        out = tf.identity(tf.matmul(x, w) * draw, name="out")
    wanted = program.ancestors([out.op])
    found = {op.name for op in program.not_compared(graph, wanted)}
    assert found == {"w/read", "draw/sub", "draw/mul", "draw"}  # the read, and the draw's own arithmetic
    assert {"draw/RandomUniform", "MatMul", "mul", "out"} <= {op.name for op in wanted} - found  # compared
