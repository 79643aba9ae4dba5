"""How each registered step runs (see :mod:`equivtool.steps`).

Each function takes the engine (its options, the shared pair, the comparison
helper) and returns a :class:`~equivtool.StepResult`, or raises
:class:`~equivtool.steps.SkipStep` with the reason it cannot run.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import TYPE_CHECKING, Mapping

import numpy as np

from equivtool.comparison import compare
from equivtool.report import StepResult
from equivtool._tree import dense_gradient, flatten_tensors
from equivtool._tf1_graph import depends_on
from equivtool.runners import TF1Side, TF2Side, fixed_value, variable_key
from equivtool.seeding import DeterministicRandomTestTool
from equivtool.steps import SkipStep, title
from equivtool.variables import VariableCreationError, VariableInfo, VariableSet, compare_variables

if TYPE_CHECKING:  # pragma: no cover
    from equivtool.equivalence import _Engine

_PREBUILT_NOTE = ("tf2_layer was built before the check, so its variables were given the TF1 graph's "
                  "initial values: initializers are not compared (pass a factory to compare them)")
_DISTRIBUTED_NOTE = ("under a distribution strategy: computed with training=False on both sides; "
                     "gradients are all-reduced across replicas")


def forward_pairs(tf1_out, tf1_reg, tf2_out, tf2_reg) -> list:
    """What a forward-pass step compares: the outputs and the total regularization loss
    (0 on a side without regularizers)."""
    return [("outputs", tf1_out, tf2_out),
            ("regularization_loss", np.float32(tf1_reg), np.float32(tf2_reg))]


def variables_once(e: "_Engine") -> StepResult:
    pair = e.pair
    notes = [f"includes building the shared TF1 graphs and TF2 layer ({pair.build_seconds:.1f}s)"]
    try:
        pair.tf2_second_call()
    except VariableCreationError as exc:
        return StepResult("variables_once", title("variables_once"), "failed", 0.0,
                          message=str(exc), notes=notes)
    which = "distributed inference" if pair.distributed else "training=True"
    return StepResult("variables_once", title("variables_once"), "passed", 0.0,
                      message=f"the second call ({which}) created no variable", notes=notes,
                      data={"variables": len(pair.layer.variables)})


def parity(e: "_Engine") -> StepResult:
    pair = e.pair
    renamer = e.options.renamer
    pair.tf2_inference()
    expected = VariableSet.from_variables(pair.tf1.variables, "tf1")
    trainable = pair.tf1.trainable_keys
    expected = VariableSet(tuple(
        VariableInfo(v.name, v.shape, v.dtype, variable_key(v.name, renamer) in trainable)
        for v in expected), "tf1")
    actual = VariableSet.from_variables(pair.layer.variables, "tf2")
    result = compare_variables(expected, actual, rename=renamer)
    status = "passed" if result.ok else "failed"
    return StepResult("parity", title("parity"), status, 0.0,
                      message="" if result.ok else str(result),
                      data={"tf1_variables": len(expected), "tf2_variables": len(actual),
                            "trainable": len(expected.trainable),
                            "trainable_parameters": expected.num_trainable_parameters})


def random_constant(e: "_Engine", mode: str, training: bool) -> StepResult:
    name = f"random/{mode}/{'training' if training else 'inference'}"
    pair = e.pair
    if training:
        tf1_out, tf1_reg, _, _ = pair.tf1_training()
        tf2_out, tf2_reg, _, _ = pair.tf2_training()
    else:
        tf1_out, tf1_reg, _, _ = pair.tf1_inference()
        tf2_out, tf2_reg, _, _ = pair.tf2_inference()
    result = e.compare_step(name, forward_pairs(tf1_out, tf1_reg, tf2_out, tf2_reg),
                            notes=[_PREBUILT_NOTE] if pair.prebuilt else [])
    # The training pass lives in a graph of its own (so its names match a
    # standalone build); localization fetches its ops there.
    forward, side = (pair.training, pair.tf1_train) if training else (pair.inference, pair.tf1)
    result = judge_loop_random(result, forward.loop_random_ops, forward_leaf_tensors(result, forward))
    return e.localized(result, side, forward.outputs, lambda: _localization_call(e, pair, training),
                       state=pair.preserved)


def gradients(e: "_Engine") -> StepResult:
    pair = e.pair
    tf1_loss, tf1_grads, tf2_loss, tf2_grads = pair.gradients()
    tf1_dense = {key: dense_gradient(value) for key, value in tf1_grads.items()}
    tf1_grads = {key: dense for key, (dense, _) in tf1_dense.items()}
    missing = sorted(set(tf1_grads) ^ set(tf2_grads))
    notes = [f"loss: TF1 {float(tf1_loss):.9g}, TF2 {float(tf2_loss):.9g}"]
    notes += sparse_note([k for k, (_, sparse) in tf1_dense.items() if sparse], pair.tf2.sparse_gradients)
    if missing:
        notes.append("gradients present on one side only: " + ", ".join(missing[:10]))
    tf1_ordered = {k: tf1_grads[k] for k in pair.tf1.keys if k in tf1_grads}
    if pair.distributed:
        notes.append(_DISTRIBUTED_NOTE)
    result = e.compare_step("gradients",
                            [("loss", np.float32(tf1_loss), np.float32(tf2_loss)),
                             ("gradients", tf1_ordered, tf2_grads)],
                            notes=notes, data={"variables": len(tf1_grads)})
    forward = pair.inference if pair.distributed else pair.training
    tensors = {"loss": forward.loss}
    tensors.update({f"gradients/{key}": g for key, g in (forward.gradients or {}).items()})
    return judge_loop_random(result, forward.loop_random_ops, tensors)


def fixed_weights(e: "_Engine") -> StepResult:
    pair = e.pair
    with pair.preserved():
        values = {key: fixed_value(key, v.shape, v.dtype.base_dtype)
                  for key, v in zip(pair.tf1.keys, pair.tf1.variables)}
        pair.tf1.assign_variables(values)
        pair.tf2.assign_variables(values)
        unassigned = [k for k in pair.tf2.keys() if k not in values]
        outputs = pair.inference_now()
        notes = [f"TF2 variables without a TF1 counterpart kept their values: {unassigned[:5]}"] if unassigned else []
        result = e.compare_step("fixed_weights", forward_pairs(*outputs), notes=notes)
        return e.localized(result, pair.tf1, pair.inference.outputs, lambda: _localization_call(e, pair, False))


def optimizer(e: "_Engine") -> StepResult:
    o = e.options
    if o.optimizers is None:
        raise SkipStep("no optimizers given: pass optimizers=(make_tf1_optimizer, make_tf2_optimizer)")
    make_tf1, make_tf2 = o.optimizers
    pair = e.pair
    training = not pair.distributed
    pair.gradients()  # both sides have had the same calls (batch-norm statistics included)
    with pair.preserved():
        tf1_training = pair.tf1.build_training(make_tf1, training)
        tf2_optimizer = pair.tf2.make_optimizer(make_tf2)
        comparisons, failed_at, losses = [], None, []
        tf2_keys = set(pair.tf2.keys())
        for step in range(o.train_steps):
            # Every step sees each random op's first draw on both sides: a
            # new TF1 session, and a new op per eager call (or per trace).
            tf1_loss = pair.tf1.train_step(tf1_training)
            with pair.tf2_tool.scope():
                tf2_loss = pair.tf2.train_step(o.inputs, tf2_optimizer, training=training)
            losses.append([float(tf1_loss), float(tf2_loss)])
            tf1_vars = {k: v for k, v in pair.tf1.read_variables().items() if k in tf2_keys}
            spec = o.tolerances.get("optimizer", step)
            comparison = compare({"loss": np.float32(tf1_loss), "variables": tf1_vars},
                                 {"loss": np.float32(tf2_loss), "variables": pair.tf2.read_variables()},
                                 spec, name=f"step_{step + 1}")
            comparisons.append(comparison)
            if not comparison.ok and failed_at is None:
                failed_at = step + 1
    notes = [f"{o.train_steps} steps of {type(tf1_training.optimizer).__name__} (TF1) vs "
             f"{type(tf2_optimizer).__name__} (TF2)"]
    gradient_pass = pair.training or pair.inference
    gradient_of = gradient_pass.gradients or {}
    notes += sparse_note([k for k, g in gradient_of.items() if type(g).__name__ == "IndexedSlices"],
                         pair.tf2.sparse_gradients, applied=True)
    if pair.distributed:
        notes.append(_DISTRIBUTED_NOTE)
    if failed_at is not None:
        notes.append(f"first step that exceeds tolerance: {failed_at}")
    result = StepResult.from_comparisons("optimizer", title("optimizer"), comparisons, notes=notes,
                                         data={"steps": o.train_steps, "first_failing_step": failed_at,
                                               "losses": losses})
    # A variable's update is explained by the loops when its gradient (in the
    # shared pair's training pass, with that pass's loops) is.
    tensors = {}
    for step in range(o.train_steps):
        tensors[f"step_{step + 1}/loss"] = tf1_training.loss
        tensors.update({f"step_{step + 1}/variables/{key}": gradient_of.get(key) for key in tf2_keys})
    return judge_loop_random(result, {**tf1_training.loop_random_ops, **gradient_pass.loop_random_ops}, tensors)


def checkpoint(e: "_Engine") -> StepResult:
    pair = e.pair
    with pair.preserved() as saved, tempfile.TemporaryDirectory(prefix="equivtool-ckpt-") as workdir:
        given = e.options.checkpoint
        path = given if isinstance(given, (str, os.PathLike)) else None
        notes = []
        if path is None:
            # The checkpoint holds fixed values, so that loading it visibly
            # changes both sides' (random) variables.
            values = {key: fixed_value("ckpt/" + key, v.shape, v.dtype.base_dtype)
                      for key, v in zip(pair.tf1.keys, pair.tf1.variables)}
            pair.tf1.assign_variables(values)
            path = pair.tf1.save_checkpoint(os.path.join(workdir, "model.ckpt"))
            pair.restore(saved)
            notes.append("checkpoint written by the TF1 side with tf.compat.v1.train.Saver")
        pair.tf1.restore_checkpoint(path)
        loaded, absent = pair.tf2.load_checkpoint(path, pair.tf1.checkpoint_names())
        if absent:
            notes.append(f"{len(absent)} TF2 variables not in the checkpoint: {absent[:5]}")
        tf1_out, _, tf2_out, _ = pair.inference_now()
        result = e.compare_step("checkpoint", [("outputs", tf1_out, tf2_out)], notes=notes,
                                data={"loaded_variables": loaded, "missing": len(absent)})
        return e.localized(result, pair.tf1, pair.inference.outputs, lambda: _localization_call(e, pair, False))


def random_fresh(e: "_Engine", mode: str, training: bool) -> StepResult:
    name = f"random/{mode}/{'training' if training else 'inference'}"
    o = e.options
    if o.strategy is not None:
        raise SkipStep("not run under a distribution strategy: replica functions run on other "
                       "threads, outside the random tool's scope, so num_random_ops counts differ; "
                       "the constant-mode steps cover the distributed layer")
    tf1_tool = DeterministicRandomTestTool(seed=o.seed, mode=mode)
    tf1 = TF1Side(o.tf1_fn, o.inputs, renamer=o.renamer, loss_fn=o.loss_fn,
                  disable_arithmetic_optimization=o.disable_arithmetic_optimization,
                  random_tool=tf1_tool)
    try:
        forward = tf1.forward(training=training)
        tf1_out, tf1_reg = tf1.run((forward.outputs, forward.regularization), update_ops=forward.update_ops)
    finally:
        if not o.localize:  # localization fetches from this graph after the TF2 pass
            tf1.close()
    try:
        tf2_tool = DeterministicRandomTestTool(seed=o.seed, mode=mode)
        notes = list(_eager_notes(e))
        with tf2_tool.scope():
            layer = e.new_layer()
            tf2 = TF2Side(layer, renamer=o.renamer, loss_fn=o.loss_fn, use_tf_function=False)
            tf2_out, tf2_reg, _, _ = tf2.forward(o.inputs, training=training)
        result = e.compare_step(name, forward_pairs(tf1_out, tf1_reg, tf2_out, tf2_reg), notes=notes)
        result = judge_loop_random(result, forward.loop_random_ops, forward_leaf_tensors(result, forward))

        def fresh_call():  # the same first call of a fresh layer under a fresh tool
            from equivtool.localize._capture import call_layer
            with DeterministicRandomTestTool(seed=o.seed, mode=mode).scope():
                return call_layer(e.new_layer(), o.inputs, training, False)
        return e.localized(result, tf1, forward.outputs, fresh_call)
    finally:
        tf1.close()


def forward_leaf_tensors(result: StepResult, forward) -> dict:
    """``{leaf name: TF1 tensor}`` for a forward-pass step's comparisons, matched
    by position (the comparison walks the TF1 structure in order); a part whose
    leaf count differs (keys on one side only) is left out."""
    from equivtool.equivalence import _split_outputs
    parts = [flatten_tensors(part) for _, part, _ in _split_outputs(forward.outputs, forward.outputs)]
    parts.append([forward.regularization])
    tensors = {}
    for comparison, part in zip(result.comparisons, parts):
        if len(comparison.leaves) == len(part):
            tensors.update({leaf.name: tensor for leaf, tensor in zip(comparison.leaves, part)})
    return tensors


def judge_loop_random(result: StepResult, loops: Mapping, tensors: Mapping) -> StepResult:
    """A failed step is "not comparable" when the TF1 pass draws random numbers
    inside a while loop and every failing leaf is computed from such a loop.

    In a TF1 session a random op inside ``tf.while_loop`` (``DropoutWrapper``
    under ``dynamic_rnn``) is one stateful op that draws a new value at every
    iteration; run eagerly, every iteration creates a new op, which the random
    tool seeds afresh, so the two sides' draws cannot be aligned. A failing
    leaf that does not depend on such a loop is a real difference: the step
    stays failed, with a note.
    """
    if result.status != "failed" or not loops:
        return result
    failing = [leaf.name for comparison in result.comparisons for leaf in comparison.failures]
    unexplained = [name for name in failing if not depends_on(tensors.get(name), loops)]
    described = "; ".join(f"{loop}: {', '.join(found[:3])}" for loop, found in list(loops.items())[:3])
    if unexplained:
        note = (f"the TF1 pass draws random numbers inside while loops ({described}), but these failing "
                f"leaves do not depend on them: {unexplained[:5]}")
        return dataclasses.replace(result, notes=result.notes + (note,))
    message = ("not comparable: the TF1 pass draws random numbers inside a while loop (one stateful op "
               "drawing anew at every iteration, while eagerly each iteration creates a new op), so the "
               f"two sides' draws cannot be aligned; every failing leaf ({len(failing)}) depends on it. "
               f"Loops: {described}. The inference steps compare the same layers without those draws.")
    return dataclasses.replace(result, status="skipped", message=message,
                               data={**dict(result.data), "not_comparable": "random ops inside while loops",
                                     "failed_leaves": failing[:20]})


def sparse_note(tf1_keys, tf2_keys, applied: bool = False) -> list:
    """A note naming the variables whose gradients were sparse (tf.IndexedSlices)."""
    keys = sorted(set(tf1_keys) | set(tf2_keys))
    if not keys:
        return []
    how = ("applied sparsely by both optimizers; the updated variables are compared" if applied
           else "scattered into dense arrays and compared densely")
    sides = ("on both sides" if set(tf1_keys) == set(tf2_keys)
             else f"TF1: {sorted(tf1_keys)[:5]}, TF2: {sorted(tf2_keys)[:5]}")
    return [f"sparse gradients (tf.IndexedSlices, {sides}) for {len(keys)} variable(s) {keys[:5]}: {how}"]


def _localization_call(e: "_Engine", pair, training: bool):
    """One more TF2 forward pass of the pair's layer for localization (with
    ``tf_function=True`` a new trace, which the op taps see being built)."""
    from equivtool.localize._capture import call_layer
    with pair.tf2_tool.scope():
        return call_layer(pair.layer, e.options.inputs, training, e.options.tf_function)


def _eager_notes(e: "_Engine") -> tuple:
    if not e.options.tf_function:
        return ()
    return ("called eagerly: tf.function traces a variable-creating call twice, and "
            "num_random_ops counts the random ops of both traces",)


def notes_on_error(e: "_Engine", step) -> tuple:
    """The notes a step's result keeps when the step raises (they hold either way)."""
    if step.runner() is random_fresh:
        return _eager_notes(e)
    return ()
