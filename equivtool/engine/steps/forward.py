"""Steps that prove the forward pass: ``fixed_weights`` (the same weights give
the same outputs) and the random tool's steps in both modes (``random_constant``:
one graph and one layer for every mode; ``random_fresh``: a fresh graph and a
fresh layer per comparison, for ``num_random_ops``). In training mode each also
compares every variable afterwards, so moving statistics are proven.
"""

from __future__ import annotations

from typing import TYPE_CHECKING


from equivtool.engine.align import tf1_aligned, tf2_aligned
from equivtool.engine import _bessel
from equivtool.report import StepResult
from equivtool.engine.sides.tf1_side import TF1Side
from equivtool.engine.sides.tf2_side import TF2Side, call_layer
from equivtool.seeding import DeterministicRandomTestTool
from equivtool.engine.registry import SkipStep, title
from equivtool.seeding.traced import TraceAlignment

if TYPE_CHECKING:  # pragma: no cover
    from equivtool.engine.run import Engine
from equivtool.engine.steps.common import (SplitStep, PREBUILT_NOTE, FixedValues, as_started, assign_fixed,
                                           fixed_state, forward_capture, fresh_pass_capture, judge_forward,
                                           localization_call, specs, tf2_keys_and_variables, forward_pairs)

# --------------------------------------------------------------------------
# Forward passes in constant mode, and fixed weights
# --------------------------------------------------------------------------

def _random_constant_tf1(e: "Engine", mode: str, training: bool) -> dict:
    half = e.tf1_half
    start = _bessel.moving_start(half) if training and not half.distributed else None
    outputs, regularization, _, _ = half.training_pass() if training else half.inference_pass()
    forward = half.training if training else half.inference
    capture = forward_capture(forward, outputs, regularization)
    if training:  # after the pair's one training call: moving statistics included
        capture["variables"] = half.side.read_variables()
        capture["moving_start"] = start
    return capture


def _random_constant_tf2(e: "Engine", _, mode: str, training: bool) -> dict:
    half = e.tf2_half
    start = _bessel.moving_start(half) if training and not half.distributed else None
    outputs, regularization, _, _ = half.training_pass() if training else half.inference_pass()
    capture = {"outputs": outputs, "regularization": regularization, "prebuilt": half.prebuilt}
    if training:
        capture["variables"] = half.side.read_variables()
        capture["moving_start"] = start
    return capture


def _random_constant_judge(e: "Engine", tf1: dict, tf2: dict, mode: str, training: bool) -> StepResult:
    name = f"random/{mode}/{'training' if training else 'inference'}"
    notes = ([PREBUILT_NOTE] if tf2["prebuilt"] else []) + ([e.options.aligned] if e.options.aligned else [])
    result = judge_forward(e, name, tf1, tf2, notes=notes)
    if not e.options.localize:
        return result
    # The training pass lives in a graph of its own (so its names match a
    # standalone build); localization fetches its ops there.
    tf1_half = e.tf1_half
    forward, side = ((tf1_half.training, tf1_half.train_side) if training
                     else (tf1_half.inference, tf1_half.side))
    return e.localized(result, side, forward.outputs, lambda tap: localization_call(e, training, tap),
                       state=lambda: as_started(e, "training" if training else "inference"))


random_constant = SplitStep(_random_constant_tf1, _random_constant_tf2, _random_constant_judge)


def _fixed_weights_tf1(e: "Engine") -> dict:
    half = e.tf1_half
    side = half.side
    # The fixed values fed to the variables' reads: no 223 MB kept and put back for
    # Inception-ResNet-v2 (a graph that uses a variable otherwise gets them assigned).
    found = half.inference_on(FixedValues(side.keys, side.variables, "", side.renamer))
    if found is None:
        with half.preserved():
            assign_fixed(side, side.keys, side.variables)
            found = half.inference_now()
    outputs, regularization = found
    return {"outputs": outputs, "regularization": regularization, "loops": {}, "leaf_flags": [],
            "specs": specs(side.keys, side.variables)}


def _fixed_weights_tf2(e: "Engine", _) -> dict:
    half = e.tf2_half
    keys, variables = tf2_keys_and_variables(half)
    with half.preserved():
        assign_fixed(half.side, keys, variables)
        outputs, regularization = half.inference_now()
    return {"outputs": outputs, "regularization": regularization,
            "specs": specs(keys, variables, half.side.renamer)}


def _fixed_weights_judge(e: "Engine", tf1: dict, tf2: dict) -> StepResult:
    tf1_specs, tf2_specs = tf1["specs"], tf2["specs"]
    clashes = [f"{key}: TF1 {list(tf1_specs[key][0])} {tf1_specs[key][1]}, "
               f"TF2 {list(tf2_specs[key][0])} {tf2_specs[key][1]}"
               for key in tf1_specs if key in tf2_specs and tf1_specs[key] != tf2_specs[key]]
    if clashes:
        return StepResult("fixed_weights", title("fixed_weights"), "failed", 0.0,
                          message=f"{len(clashes)} variable(s) differ in shape or dtype between the sides, so "
                                  f"they cannot hold the same fixed values: {'; '.join(clashes[:3])}")
    notes = []
    for side, own, other in (("TF2", tf2_specs, tf1_specs), ("TF1", tf1_specs, tf2_specs)):
        alone = [key for key in own if key not in other]
        if alone:
            notes.append(f"{side} variables without a counterpart on the other side (given fixed values of "
                         f"their own): {alone[:5]}")
    result = e.compare_step("fixed_weights", forward_pairs(tf1["outputs"], tf1["regularization"],
                                                           tf2["outputs"], tf2["regularization"]), notes=notes)
    if e.options.kernel_floor:  # the TF1 run with rounding injected at every op (engine.kernel_floor)
        from equivtool.engine import kernel_floor
        result = kernel_floor.judge_pairs(e, result, tf1, lambda run: forward_pairs(
            tf1["outputs"], tf1["regularization"], run["outputs"], run["regularization"]))
    if not e.options.localize:
        return result
    return e.localized(result, e.tf1_half.side, e.tf1_half.inference.outputs,
                       lambda tap: localization_call(e, False, tap), state=lambda: fixed_state(e))


fixed_weights = SplitStep(_fixed_weights_tf1, _fixed_weights_tf2, _fixed_weights_judge)

# --------------------------------------------------------------------------
# num_random_ops: a fresh graph and a fresh layer per comparison
# --------------------------------------------------------------------------

def _refuse_strategy(e: "Engine") -> None:
    if e.options.strategy is not None:
        raise SkipStep("not run under a distribution strategy: replica functions run on other "
                       "threads, outside the random tool's scope, so num_random_ops counts differ; "
                       "the constant-mode steps cover the distributed layer")


def _random_fresh_tf1(e: "Engine", mode: str, training: bool) -> dict:
    _refuse_strategy(e)
    o = e.options
    tf1 = TF1Side(o.tf1_fn, o.inputs, renamer=o.renamer, loss_fn=o.loss_fn,
                  graph_rewrites=o.graph_rewrites,
                  random_tool=DeterministicRandomTestTool(seed=o.seed, mode=mode))
    capture = {}
    try:
        with tf1_aligned(o, tf1):
            forward = tf1.forward(training=training)

        def run_pass() -> dict:
            outputs, regularization = tf1.run((forward.outputs, forward.regularization),
                                              update_ops=forward.update_ops)
            return forward_capture(forward, outputs, regularization)
        capture = fresh_pass_capture(tf1, forward, training, bool(o.localize), run_pass)
        return capture
    finally:
        if "_local" not in capture:
            tf1.close()


def _random_fresh_tf2(e: "Engine", _, mode: str, training: bool) -> dict:
    _refuse_strategy(e)
    o = e.options
    tool = DeterministicRandomTestTool(seed=o.seed, mode=mode)
    with tool.scope(), tf2_aligned(o):
        layer = e.new_layer()
        # Under tf.function every trace gets the first trace's seeds, which
        # follow program order as the TF1 graph's do (equivtool.seeding.traced).
        tf2 = TF2Side(layer, renamer=o.renamer, loss_fn=o.loss_fn, use_tf_function=o.tf_function,
                      graph_rewrites=o.graph_rewrites, trace_scope=TraceAlignment(tool).trace)
        outputs, regularization, _, _ = tf2.forward(o.inputs, training=training)
    capture = {"outputs": outputs, "regularization": regularization}
    if training:
        capture["variables"] = tf2.read_variables()
    return capture


def _random_fresh_judge(e: "Engine", tf1: dict, tf2: dict, mode: str, training: bool) -> StepResult:
    name = f"random/{mode}/{'training' if training else 'inference'}"
    o = e.options
    local = tf1.get("_local")
    try:
        result = judge_forward(e, name, tf1, tf2, notes=(o.aligned,) if o.aligned else ())
        if local is None:
            return result
        side, forward = local

        def fresh_call(tap):  # the same first call of a fresh layer under a fresh tool
            # Eagerly, also under tf_function=True: a variable-creating tf.function is
            # traced twice and the op taps would see the ops of both traces (the
            # report header's "execution" says so).
            with DeterministicRandomTestTool(seed=o.seed, mode=mode).scope(), tf2_aligned(o):
                return call_layer(e.new_layer(), o.inputs, training, False, tap=tap)
        return e.localized(result, side, forward.outputs, fresh_call)
    finally:
        if local is not None:
            local[0].close()


random_fresh = SplitStep(_random_fresh_tf1, _random_fresh_tf2, _random_fresh_judge)
