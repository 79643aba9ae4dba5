"""The ``resume`` step: training resumed from a TF1 checkpoint, on both sides.

``check_equivalence(..., checkpoint=tf1_ckpt, optimizers=(make_tf1, make_tf2),
train_steps=K)``:

* TF1 side: a fresh graph with the training pass and ``make_tf1().minimize``;
  every variable it has, the optimizer's slots and beta powers included, is
  restored from the checkpoint (one it lacks is named); then K steps.
* TF2 side: :func:`~equivtool.checkpoints.convert.convert` writes the TF2
  checkpoint (model and ``make_tf2()``'s slots) from the same file; a fresh
  layer and optimizer read it back with ``tf.train.Checkpoint``; then K steps.
* After each step: the loss, every variable, every slot (under its TF1
  checkpoint name: ``net/conv1/weights/Adam_1``) and Adam's beta powers
  (tf-keras: ``beta ** (iterations + 1)``) are compared. A slot the TF2 side
  did not convert is missing or wrong by name.

Each step starts every random op at its first draw on both sides (a new TF1
session, a new eager call or trace), as in the ``optimizer`` step.

With ``tf1_python`` the TF1 side runs in that interpreter, as it ran
(:mod:`equivtool.checkpoints._resume_old`), with the same capture; the TF2 side
and the judgement are this module's.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np

from equivtool.engine import _bessel, _sparse_squares, noise_floor
from equivtool.engine.steps.common import SplitStep
from equivtool._platform.tf_internals import save_slice_info
from equivtool.checkpoints.convert import checkpoint_path, convert
from equivtool.variables.mapping import fresh_layer_numbering, tf1_value
from equivtool.comparison import compare
from equivtool.report import StepResult
from equivtool.variables import slots as _slots
from equivtool.variables.flavour import variable_name
from equivtool.engine.sides.tf1_side import TF1Side, variable_key
from equivtool.engine.sides.tf2_side import TF2Side, call_layer
from equivtool.seeding import DeterministicRandomTestTool
from equivtool.engine.registry import SkipStep, title

_SLOT_TRANSFORMS = {"copy": lambda value, lr: value, "times_minus_lr": lambda value, lr: -lr * value}


def _needs(e) -> tuple:
    o = e.options
    if o.optimizers is None or not isinstance(o.checkpoint, (str, os.PathLike)):
        raise SkipStep("resume needs checkpoint=<a TF1 checkpoint path> and optimizers=(make_tf1, make_tf2)")
    if o.strategy is not None:
        raise SkipStep("not run under a distribution strategy: it compares single-device training")
    return o.optimizers


def _full_values(variables, values, renamer) -> dict:
    """``{key: value}``, a partitioned variable's parts stitched into one array
    under its full name (as the checkpoint stores it)."""
    out = {}
    for variable, value in zip(variables, values):
        info = save_slice_info(variable)
        if info is None:
            out[variable_key(variable.name, renamer)] = value
            continue
        key = renamer(info.full_name)
        full = out.setdefault(key, np.zeros(info.full_shape, value.dtype))
        full[tuple(slice(o, o + n) for o, n in zip(info.var_offset, info.var_shape))] = value
    return out


def _resume_tf1(e) -> dict:
    make_tf1, _ = _needs(e)
    o = e.options
    path = checkpoint_path(o.checkpoint, "checkpoint")
    if o.tf1_python is not None:  # the TF1 side as it ran, in that interpreter
        from equivtool.checkpoints._resume_old import resume_tf1
        return resume_tf1(e, make_tf1, path)
    side = TF1Side(o.tf1_fn, o.inputs, renamer=o.renamer, loss_fn=o.loss_fn,
                   graph_rewrites=o.graph_rewrites,
                   random_tool=DeterministicRandomTestTool(seed=o.seed, mode="constant"))
    try:
        training = side.build_training(make_tf1, True)
        optimizer = training.optimizer
        slots, non_slot = side.restore_training(path, optimizer)

        def train_step() -> tuple:
            loss = side.train_step(training)
            model_values, slot_values, non_slot_values = side.fetch(
                (side.variables, [s for _, s in slots], non_slot))
            slot_keys = [(v, s.op.name.rsplit("/", 1)[-1]) for v, s in slots]
            by_slot = {}
            for (variable, suffix), value in zip(slot_keys, slot_values):
                by_slot.setdefault(suffix, ([], []))
                by_slot[suffix][0].append(variable)
                by_slot[suffix][1].append(value)
            slot_capture = {}
            for suffix, (variables, values) in by_slot.items():
                for key, value in _full_values(variables, values, o.renamer).items():
                    slot_capture[f"{key}/{suffix}"] = value
            return loss, {"variables": _full_values(side.variables, model_values, o.renamer),
                          "slots": slot_capture,
                          "optimizer": {v.op.name: np.float32(x) for v, x in zip(non_slot, non_slot_values)}}

        moving = _bessel.moving_of(_full_values(side.variables, side.fetch(side.variables), o.renamer))
        start = side.global_state() if o.noise_floor else None
        steps = [train_step() for _ in range(o.train_steps)]
        floor_run = None
        if start is not None:  # the same steps from the same start, 1 ULP away (engine.noise_floor)
            with side.perturbed(start, o.seed):
                floor_run = [train_step() for _ in range(o.train_steps)]
        return {"losses": [loss for loss, _ in steps], "captures": [capture for _, capture in steps],
                "optimizer": type(optimizer).__name__,
                "floor_run": floor_run, "moving_start": moving}
    finally:
        side.close()


def _resume_tf2(e, _) -> dict:
    _, make_tf2 = _needs(e)
    o = e.options
    target = os.path.join(e.workdir(), "converted", "model")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tool = DeterministicRandomTestTool(seed=o.seed, mode="constant")
    writer = None
    if e.factory is not None:
        with tool.scope(), fresh_layer_numbering() if o.aligned else contextlib.nullcontext():
            writer = e.factory()
            call_layer(writer, o.inputs, False, False)  # built, as the converted layer is
    with tool.scope():
        side = TF2Side(e.new_layer(), renamer=o.renamer, loss_fn=o.loss_fn, use_tf_function=o.tf_function,
                       graph_rewrites=o.graph_rewrites)
        side.forward(o.inputs, training=False)
    conversion, _, _ = convert(o.checkpoint, None, o.inputs, target, rename=o.renamer, optimizer=make_tf2,
                               overwrite=True, layer=writer or side.layer, slot_layout=o.slot_layout)
    optimizer = side.make_optimizer(make_tf2)
    side.restore_checkpoint(conversion.path, optimizer)
    lr = float(optimizer.get_config()["learning_rate"]) if any(
        how != "copy" for _, _, how in conversion.slots) else None
    # A converted slot is "<slot>/<writer's variable name>"; the resumed layer's
    # names may differ (Keras numbers fresh layers), so both go through rename.
    sources = {}
    for tf2_name, source, how in conversion.slots:
        keras_slot = tf2_name.split("/", 1)[0]
        sources[(keras_slot, source.rpartition("/")[0])] = (source, how)
    squares = _sparse_squares.squaring_kind(optimizer)
    if squares:
        with tool.scope():  # the rows a sparse gradient holds more than once (no variable changes)
            side.forward(o.inputs, training=False, with_gradients=True)
    held = _slots.slot_variables(optimizer, side.layer.trainable_variables, tuple(sorted({s for s, _ in sources})))
    losses, captures, moving = [], [], _bessel.moving_of(side.read_variables())
    for _ in range(o.train_steps):
        with tool.scope():
            losses.append(side.train_step(o.inputs, optimizer, training=True))
        slot_capture = {}
        for keras_slot, variable, slot in held:
            model_name = o.renamer(variable_name(variable))
            entry = sources.get((keras_slot, model_name))
            if entry is not None:  # in the TF1 layout (a declared transform's inverse)
                slot_capture[entry[0]] = (tf1_value(o.renamer, model_name, slot.numpy()), entry[1])
        captures.append({"variables": side.read_variables(), "slots": slot_capture,
                         "iterations": int(optimizer.iterations.numpy()),
                         "betas": (float(getattr(optimizer, "beta_1", 0) or 0),
                                   float(getattr(optimizer, "beta_2", 0) or 0))})
    return {"losses": losses, "captures": captures, "optimizer": type(optimizer).__name__, "lr": lr,
            "repeated": dict(side.repeated_rows), "squares": squares,
            "moving_start": moving,
            "conversion": str(conversion), "mapped": len(conversion.model), "converted": len(conversion.slots),
            "iterations": conversion.iterations, "notes": list(conversion.notes)}


def _resume_expected(tf1_loss, tf1_capture: dict, tf2_capture: dict, lr) -> dict:
    """What a TF1 step's capture is compared as: a slot in tf-keras' form (Momentum: -lr * a), under its TF1 name."""
    expected_slots = {}
    for key, value in tf1_capture["slots"].items():
        converted = tf2_capture["slots"].get(key)
        how = converted[1] if converted is not None else "copy"
        expected_slots[key] = _SLOT_TRANSFORMS[how](value, lr)
    expected = {"loss": np.float32(tf1_loss), "variables": tf1_capture["variables"], "slots": expected_slots}
    if tf1_capture["optimizer"]:
        expected["optimizer"] = tf1_capture["optimizer"]
    return expected


def _resume_judge(e, tf1: dict, tf2: dict) -> StepResult:
    o = e.options
    comparisons, expected_steps, actual_steps = [], [], []
    for step, (tf1_loss, tf1_capture, tf2_loss, tf2_capture) in enumerate(
            zip(tf1["losses"], tf1["captures"], tf2["losses"], tf2["captures"])):
        expected = _resume_expected(tf1_loss, tf1_capture, tf2_capture, tf2["lr"])
        actual_slots = {key: tf2_capture["slots"][key][0] for key in tf1_capture["slots"]
                        if key in tf2_capture["slots"]}
        actual = {"loss": np.float32(tf2_loss), "variables": tf2_capture["variables"], "slots": actual_slots}
        if tf1_capture["optimizer"]:
            t = tf2_capture["iterations"] + 1
            beta_1, beta_2 = tf2_capture["betas"]
            actual["optimizer"] = {"beta1_power": np.float32(beta_1 ** t), "beta2_power": np.float32(beta_2 ** t)}
        comparison = compare(expected, actual, o.tolerances.get("resume", step), name=f"step_{step + 1}")
        comparisons.append(comparison)
        expected_steps.append(expected)
        actual_steps.append(actual)
    floor_notes, floor_data = [], {}
    if tf1.get("floor_run") is not None:
        floor = noise_floor.judge_runs(
            comparisons,
            [_resume_expected(loss, capture, theirs, tf2["lr"])
             for loss, capture, theirs in zip(tf1["losses"], tf1["captures"], tf2["captures"])],
            [_resume_expected(loss, capture, theirs, tf2["lr"])
             for (loss, capture), theirs in zip(tf1["floor_run"], tf2["captures"])],
            o.noise_floor_multiple, o.seed)
        comparisons, floor_notes, floor_data = list(floor.comparisons), list(floor.notes), {"noise_floor": floor.data}
    failed_at = next((step + 1 for step, comparison in enumerate(comparisons) if not comparison.ok), None)
    notes = [f"{o.train_steps} steps of {tf1['optimizer']} (TF1, restored with its slots) vs "
             f"{tf2['optimizer']} (TF2, from the converted checkpoint)",
             f"converted: {tf2['mapped']} model variables, {tf2['converted']} slots, "
             f"iterations={tf2['iterations']}"]
    notes += [f"conversion: {note}" for note in tf2["notes"]]
    notes += floor_notes
    if failed_at is not None:
        notes.append(f"first step that exceeds tolerance: {failed_at}")
        notes += _sparse_squares.sparse_square_notes(comparisons, expected_steps, actual_steps,
                                                     tf2.get("repeated") or {}, tf2.get("squares"), tf1["optimizer"])
        notes += _bessel.first_step_notes(tf1.get("moving_start"), tf2.get("moving_start"),
                                          [c["variables"] for c in tf1["captures"]],
                                          [c["variables"] for c in tf2["captures"]], o.inputs)
    losses = [[float(a), float(b)] for a, b in zip(tf1["losses"], tf2["losses"])]
    first = (tf1["captures"] or [{}])[0].get("variables", {}), (tf2["captures"] or [{}])[0].get("variables", {})
    return StepResult.from_comparisons("resume", title("resume"), comparisons, notes=notes,
                                       data={"steps": o.train_steps, "first_failing_step": failed_at,
                                             "losses": losses, "conversion": tf2["conversion"], **floor_data,
                                             "proves": {"values": [k for k in first[0] if k in first[1]]}})


resume = SplitStep(_resume_tf1, _resume_tf2, _resume_judge)
