"""Steps that prove training: ``gradients`` (every trainable variable's gradient
of the default or given loss) and ``optimizer`` (losses and updated variables
after optimizer steps, judged against the measured noise floor).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Mapping

import numpy as np

from equivtool.report import StepResult
from equivtool._base.tree import dense_gradient
from equivtool.engine.sides.tf1_side import primary_output_path, variable_key
from equivtool.engine.sides.tf2_side import run_tapped
from equivtool.engine import _bessel, _sparse_squares, kernel_floor, kinks, noise_floor
from equivtool.engine.registry import SkipStep, title
from equivtool.variables.flavour import variable_name

if TYPE_CHECKING:  # pragma: no cover
    from equivtool.engine.run import Engine
from equivtool.engine.steps.common import (SplitStep, DISTRIBUTED_NOTE, loop_flags, judge_loop_random,
                                           sparse_note)

# --------------------------------------------------------------------------
# Gradients and optimizer steps
# --------------------------------------------------------------------------

def _gradients_tf1(e: "Engine") -> dict:
    half = e.tf1_half
    _, _, loss, gradients = half.gradient_pass()
    dense = {key: dense_gradient(value) for key, value in gradients.items()}
    forward = half.gradient_forward()
    tensors = {"loss": forward.loss}
    tensors.update({f"gradients/{key}": g for key, g in (forward.gradients or {}).items()})
    trainable = [k for k in half.side.keys if k in half.side.trainable_keys]
    return {"loss": loss, "gradients": {k: dense[k][0] for k in half.side.keys if k in dense},
            "trainable": trainable, "loss_target": _loss_target(e, forward.outputs),
            "sparse": [k for k, (_, sparse) in dense.items() if sparse],
            "loops": dict(forward.loop_random_ops), "flags": loop_flags(forward.loop_random_ops, tensors)}


def _gradients_tf2(e: "Engine", _) -> dict:
    half = e.tf2_half
    _, _, loss, gradients = half.gradient_pass()
    trainable = [variable_key(variable_name(v), half.side.renamer) for v in half.layer.trainable_variables]
    found = {"loss": loss, "gradients": gradients, "trainable": trainable,
             "sparse": list(half.side.sparse_gradients)}
    if half.kinks is not None:  # the training call's kink inputs (engine.kinks)
        found["kinks"] = half.kinks
    return found


def _loss_target(e: "Engine", outputs) -> str | None:
    """Which output the default loss was built from (None with the user's ``loss_fn``)."""
    return None if e.options.loss_fn is not None else "outputs" + primary_output_path(outputs)


def gradient_coverage(tf1: dict, tf2: dict) -> tuple:
    """``(both, one_sided, neither)``: the variables trainable on both sides, those
    whose gradient is None (disconnected from the loss, or cut by
    ``tf.stop_gradient``) on one side only, as ``[(key, side that has one)]``, and
    those with None on both sides."""
    theirs = set(tf2["trainable"])
    both = [key for key in tf1["trainable"] if key in theirs]
    one_sided, neither = [], []
    for key in both:
        has = (key in tf1["gradients"], key in tf2["gradients"])
        if has == (False, False):
            neither.append(key)
        elif has[0] != has[1]:
            one_sided.append((key, "TF1" if has[0] else "TF2"))
    return both, one_sided, neither


def _gradients_judge(e: "Engine", tf1: dict, tf2: dict) -> StepResult:
    tf1_grads, tf2_grads = tf1["gradients"], tf2["gradients"]
    both, one_sided, neither = gradient_coverage(tf1, tf2)
    flagged = {key for key, _ in one_sided}
    missing = sorted(k for k in set(tf1_grads) ^ set(tf2_grads) if k not in flagged)
    target = tf1.get("loss_target")
    notes = [f"loss: TF1 {float(tf1['loss']):.9g}, TF2 {float(tf2['loss']):.9g}"
             + (f" (default loss: mean of squares of {target}, plus the regularization loss)" if target else "")]
    notes += sparse_note(tf1["sparse"], tf2["sparse"])
    if neither:
        notes.append(f"no gradient on either side for {len(neither)} trainable variable(s): {neither[:10]}; "
                     "they agree, but the loss does not reach them"
                     + (f" (the default loss is built from {target} alone: pass loss_fn to reach them)"
                        if target else " (pass a loss_fn that does)"))
    if missing:
        notes.append("gradients present on one side only: " + ", ".join(missing[:10]))
    if e.options.strategy is not None:
        notes.append(DISTRIBUTED_NOTE)
    proves = {"no_gradient": neither, "trainable": both}
    result = e.compare_step("gradients",
                            [("loss", np.float32(tf1["loss"]), np.float32(tf2["loss"])),
                             ("gradients", tf1_grads, tf2_grads)],
                            notes=notes, data={"variables": len(tf1_grads), "loss_target": target,
                                               "proves": proves})
    if e.options.kernel_floor:  # the TF1 run with rounding injected at every op (engine.kernel_floor)
        result = kernel_floor.judge_pairs(e, result, tf1, lambda run: [
            ("loss", np.float32(tf1["loss"]), np.float32(run["loss"])), ("gradients", tf1_grads, run["gradients"])])
        result = kinks.judge_gradients(e, result, tf1, tf2)  # where it failed: judged again at its kinks
    if one_sided:  # the missing key fails the step already; the message says why first
        names = ", ".join(f"{key} (None on the {'TF2' if has == 'TF1' else 'TF1'} side)" for key, has in one_sided[:3])
        result = dataclasses.replace(result, message=f"gradient is None on one side only (disconnected from the "
                                     f"loss, or cut by tf.stop_gradient): {names}"
                                     + (f" (+{len(one_sided) - 3} more)" if len(one_sided) > 3 else "")
                                     + "; " + result.message)
    return judge_loop_random(result, tf1["loops"], tf1["flags"])


def _where_failed(route, judge):
    """``route`` (the kinks' second TF1 half) run only where ``judge`` fails the step
    without it: a step that passes needs no routed run."""
    def after(e: "Engine", tf1: dict, tf2: dict) -> dict:
        return route(e, tf1, tf2) if judge(e, tf1, tf2).status == "failed" else tf1
    return after


gradients = SplitStep(_gradients_tf1, _gradients_tf2, _gradients_judge,
                      tf1_after=_where_failed(kinks.route_gradients, _gradients_judge), wants_after=kinks.routed_on)


def _optimizers(e: "Engine") -> tuple:
    if e.options.optimizers is None:
        raise SkipStep("no optimizers given: pass optimizers=(make_tf1_optimizer, make_tf2_optimizer)")
    return e.options.optimizers


def _optimizer_tf1(e: "Engine") -> dict:
    make_tf1, _ = _optimizers(e)
    o, half = e.options, e.tf1_half
    half.gradient_pass()  # both sides have had the same calls (batch-norm statistics included)
    losses, values = [], []
    with half.preserved():
        training = half.side.build_training(make_tf1, not half.distributed)
        moving = half.side.read_variables(wanted=_bessel.is_moving_variance)
        start = half.side.global_state() if o.noise_floor else None
        for _ in range(o.train_steps):
            # Every step sees each random op's first draw on both sides: a
            # new TF1 session, and a new op per eager call (or per trace).
            losses.append(half.side.train_step(training))
            values.append(half.side.read_variables())
        floor_run = None
        if start is not None:  # the same steps from the same start, 1 ULP away (engine.noise_floor)
            with half.side.perturbed(start, o.seed):
                floor_run = [(half.side.train_step(training), half.side.read_variables())
                             for _ in range(o.train_steps)]
    forward = half.gradient_forward()
    gradient_of = forward.gradients or {}
    # A variable's update is explained by the loops when its gradient (in the
    # pair's gradient pass, with that pass's loops) is.
    loops = {**training.loop_random_ops, **forward.loop_random_ops}
    tensors = {}
    for step in range(o.train_steps):
        tensors[f"step_{step + 1}/loss"] = training.loss
        tensors.update({f"step_{step + 1}/variables/{key}": g for key, g in gradient_of.items()})
    return {"losses": losses, "variables": values, "optimizer": type(training.optimizer).__name__,
            "floor_run": floor_run, "moving_start": moving,
            "sparse": [k for k, g in gradient_of.items() if type(g).__name__ == "IndexedSlices"],
            "loops": loops, "flags": loop_flags(loops, tensors)}


def _optimizer_tf2(e: "Engine", _) -> dict:
    _, make_tf2 = _optimizers(e)
    o, half = e.options, e.tf2_half
    half.gradient_pass()
    losses, values = [], []
    with half.preserved():
        optimizer = half.side.make_optimizer(make_tf2)
        squares = _sparse_squares.squaring_kind(optimizer)
        if squares and not o.want_gradients and not half.distributed:  # the rows a sparse gradient repeats
            sparse = half.side.sparse_gradients  # (as the gradients step left them: its note's input)
            with half.tool.scope():
                half.side.forward(o.inputs, training=False, with_gradients=True)
            half.side.sparse_gradients = sparse
        moving = half.side.read_variables(wanted=_bessel.is_moving_variance)
        taps = []  # per step, its kinks' inputs (engine.kinks)
        for _ in range(o.train_steps):
            with half.tool.scope():
                if half.kink_tap is not None:
                    taps.append(half.kink_tap())
                    losses.append(run_tapped(taps[-1], half.side.train_step, o.inputs, optimizer,
                                             training=not half.distributed))
                else:
                    losses.append(half.side.train_step(o.inputs, optimizer, training=not half.distributed))
            values.append(half.side.read_variables())
    found = {"losses": losses, "variables": values, "optimizer": type(optimizer).__name__,
             "sparse": list(half.side.sparse_gradients), "repeated": dict(half.side.repeated_rows),
             "squares": squares, "moving_start": moving}
    if taps:
        found["kinks"] = [tap.capture() for tap in taps]
    return found


def _optimizer_expected(loss, values: Mapping, tf2_values: Mapping) -> dict:
    return {"loss": np.float32(loss), "variables": {k: v for k, v in values.items() if k in tf2_values}}


def _optimizer_judge(e: "Engine", tf1: dict, tf2: dict) -> StepResult:
    o = e.options
    comparisons = []
    for step, (tf1_loss, tf1_values, tf2_loss, tf2_values) in enumerate(
            zip(tf1["losses"], tf1["variables"], tf2["losses"], tf2["variables"])):
        comparison = e.compare("optimizer", _optimizer_expected(tf1_loss, tf1_values, tf2_values),
                               {"loss": np.float32(tf2_loss), "variables": tf2_values},
                               name=f"step_{step + 1}", index=step)
        comparisons.append(comparison)
    notes = [f"{o.train_steps} steps of {tf1['optimizer']} (TF1) vs {tf2['optimizer']} (TF2)"]
    floor = None
    # Draws that cannot be aligned (random ops in a TF1 while loop) make the step not
    # comparable; no floor may turn that difference into "consistent with rounding".
    raw = StepResult.from_comparisons("optimizer", title("optimizer"), comparisons)
    comparable = judge_loop_random(raw, tf1["loops"], tf1["flags"]).status != "skipped"
    if e.options.kernel_floor and comparable and kernel_floor.measured(tf1):
        expected = [_optimizer_expected(*p) for p in zip(tf1["losses"], tf1["variables"], tf2["variables"])]
        run = tf1[kernel_floor.KEY]["run"]
        floor, kernel_notes = kernel_floor.judge_optimizer(
            e, comparisons, expected,
            None if tf1.get("floor_run") is None else
            [_optimizer_expected(loss, values, theirs) for (loss, values), theirs in zip(tf1["floor_run"], tf2["variables"])],
            [_optimizer_expected(*p) for p in zip(run["losses"], run["variables"], tf2["variables"])], tf1)
        comparisons = list(floor.comparisons)
        notes += list(floor.notes) + kernel_notes
    elif tf1.get("floor_run") is not None and comparable:
        floor = noise_floor.judge_runs(
            comparisons,
            [_optimizer_expected(*pair) for pair in zip(tf1["losses"], tf1["variables"], tf2["variables"])],
            [_optimizer_expected(loss, values, theirs)
             for (loss, values), theirs in zip(tf1["floor_run"], tf2["variables"])],
            o.noise_floor_multiple, o.seed)
        comparisons = list(floor.comparisons)
        notes += floor.notes
    if e.options.kernel_floor and not (comparable and kernel_floor.measured(tf1)):
        notes += kernel_floor.unmeasured_note(tf1) or ["kernel floor: not applied (the step's draws cannot be "
                                                       "aligned)"]
    failed_at = next((step + 1 for step, comparison in enumerate(comparisons) if not comparison.ok), None)
    notes += sparse_note(tf1["sparse"], tf2["sparse"], applied=True)
    if o.strategy is not None:
        notes.append(DISTRIBUTED_NOTE)
    if failed_at is not None:
        notes.append(f"first step that exceeds tolerance: {failed_at}")
        notes += _sparse_squares.sparse_square_notes(
            comparisons, [_optimizer_expected(*p) for p in zip(tf1["losses"], tf1["variables"], tf2["variables"])],
            [{"loss": np.float32(loss), "variables": values} for loss, values in zip(tf2["losses"], tf2["variables"])],
            tf2.get("repeated") or {}, tf2.get("squares"), tf1["optimizer"])
        notes += _bessel.first_step_notes(tf1.get("moving_start"), tf2.get("moving_start"), tf1["variables"],
                                          tf2["variables"], o.inputs, after_one_update=o.strategy is None)
    losses = [[float(a), float(b)] for a, b in zip(tf1["losses"], tf2["losses"])]
    compared = [key for key in (tf1["variables"] or [{}])[0] if key in (tf2["variables"] or [{}])[0]]
    data = {"steps": o.train_steps, "first_failing_step": failed_at, "losses": losses,
            "proves": {"values": compared}}
    if floor is not None and e.options.kernel_floor and kernel_floor.measured(tf1):
        data["kernel_floor"] = {**floor.data, "ops": tf1[kernel_floor.KEY]["ops"]}
    elif floor is not None:
        data["noise_floor"] = floor.data
    result = StepResult.from_comparisons("optimizer", title("optimizer"), comparisons, notes=notes, data=data)
    if comparable:  # where it failed: judged again with its kinks routed (engine.kinks)
        result = kinks.judge_optimizer(e, result, tf1, tf2, _optimizer_expected)
    return judge_loop_random(result, tf1["loops"], tf1["flags"])


optimizer = SplitStep(_optimizer_tf1, _optimizer_tf2, _optimizer_judge,
                      tf1_after=_where_failed(kinks.route_optimizer, _optimizer_judge), wants_after=kinks.routed_on)
