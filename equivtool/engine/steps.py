"""How each registered step runs (see :mod:`equivtool.engine.registry`).

A step is three functions (:class:`SplitStep`): what the TF1 side computes,
what the TF2 side computes, and the judgement that compares them. The sides
are independent until their captures are judged (the one exception: the
``checkpoint`` step's TF2 side loads the file its TF1 side names), so with
``workers=2`` each side runs in a process of its own and only its picklable
capture (NumPy arrays, names, flags) comes back; with ``workers=1`` the same
functions run one after the other in this process.

A side function takes the engine (its options and the lazily built pair
halves) and the step's parameters and returns a dict; a key starting with
``_`` holds in-process objects (for localization) and never crosses a process.
A side raises :class:`~equivtool.engine.registry.SkipStep` with the reason it cannot run.
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import os
from typing import TYPE_CHECKING, Callable, Mapping

import numpy as np

from equivtool.checkpoints._align import tf1_aligned, tf2_aligned
from equivtool.checkpoints.mapping import MappingRenamer, renumbering_hint
from equivtool.report import StepResult
from equivtool._base.tree import dense_gradient, flatten_tensors
from equivtool.engine.sides.tf1_graph import depends_on
from equivtool.engine.sides.runners import TF1Side, fixed_value, primary_output_path, variable_key
from equivtool.engine.sides.tf2_layer import TF2Side
from equivtool.seeding import DeterministicRandomTestTool
from equivtool.engine import _bessel, _unaligned, noise_floor
from equivtool.engine.outputs import split_outputs
from equivtool.engine.registry import SkipStep, title
from equivtool.seeding._traced import TraceAlignment
from equivtool.variables._guards import second_call_message
from equivtool.variables._flavour import layer_variables, variable_dtype, variable_name
from equivtool.variables import VariableCreationError, VariableInfo, VariableSet, compare_variables

if TYPE_CHECKING:  # pragma: no cover
    from equivtool.engine.run import Engine

_PREBUILT_NOTE = ("tf2_layer was built before the check, so its variables were given the TF1 graph's "
                  "initial values: initializers are not compared (pass a factory to compare them)")
_DISTRIBUTED_NOTE = ("under a distribution strategy: computed with training=False on both sides; "
                     "gradients are all-reduced across replicas")


@dataclasses.dataclass(frozen=True)
class SplitStep:
    """A step as its two sides and their judgement.

    ``tf2(e, tf1_capture, **params)`` receives the TF1 side's capture when
    ``tf2_needs_tf1`` (else ``None``); ``judge(e, tf1, tf2, **params)`` returns
    the :class:`StepResult`.
    """

    tf1: Callable[..., dict]
    tf2: Callable[..., dict]
    judge: Callable[..., StepResult]
    tf2_needs_tf1: bool = False
    notes_on_error: Callable[..., tuple] | None = None

    def error_notes(self, e: "Engine") -> tuple:
        """The notes the step's result keeps when a side or the judgement raises
        (they hold either way)."""
        return self.notes_on_error(e) if self.notes_on_error is not None else ()

    def __call__(self, e: "Engine", **params) -> StepResult:
        """Both sides in this process, TF1 first (a side that raises ends the step)."""
        tf1 = self.tf1(e, **params)
        tf2 = self.tf2(e, tf1 if self.tf2_needs_tf1 else None, **params)
        return self.judge(e, tf1, tf2, **params)


# --------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------

def forward_pairs(tf1_out, tf1_reg, tf2_out, tf2_reg) -> list:
    """What a forward-pass step compares: the outputs and the total regularization loss
    (0 on a side without regularizers)."""
    return [("outputs", tf1_out, tf2_out),
            ("regularization_loss", np.float32(tf1_reg), np.float32(tf2_reg))]


def _loop_flags(loops: Mapping, tensors: Mapping) -> dict:
    """``{name: whether the tensor is computed from a random while loop}``; empty without loops."""
    if not loops:
        return {}
    return {name: depends_on(tensor, loops) for name, tensor in tensors.items()}


def _forward_capture(forward, outputs, regularization) -> dict:
    """A TF1 forward pass's capture: values, its random while loops, and per
    output leaf (in the order the comparison walks them) whether it depends on one."""
    parts = [flatten_tensors(part) for _, part, _ in split_outputs(forward.outputs, forward.outputs)]
    parts.append([forward.regularization])
    loops = dict(forward.loop_random_ops)
    flags = [[depends_on(t, loops) for t in part] for part in parts] if loops else []
    return {"outputs": outputs, "regularization": regularization, "loops": loops, "leaf_flags": flags}


def _leaf_flags(result: StepResult, flags: list) -> dict:
    """``{leaf name: flag}`` for a forward-pass step, matched by position (the
    comparison walks the TF1 structure in order); a part whose leaf count
    differs (keys on one side only) is left out."""
    named = {}
    for comparison, part in zip(result.comparisons, flags):
        if len(comparison.leaves) == len(part):
            named.update({leaf.name: flag for leaf, flag in zip(comparison.leaves, part)})
    return named


def judge_loop_random(result: StepResult, loops: Mapping, depends: Mapping) -> StepResult:
    """A failed step is "not comparable" when the TF1 pass draws random numbers
    inside a while loop and every failing leaf is computed from such a loop
    (``depends``: leaf name -> whether it is).

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
    unexplained = [name for name in failing if not depends.get(name, False)]
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


def _judge_forward(e: "Engine", name: str, tf1: dict, tf2: dict, notes=()) -> StepResult:
    """A forward pass's outputs and regularization loss; after a training-mode
    pass also every variable both sides hold (the pass updated the moving
    statistics: a different momentum or epsilon shows there, not in the outputs)."""
    pairs = forward_pairs(tf1["outputs"], tf1["regularization"], tf2["outputs"], tf2["regularization"])
    notes = list(notes)
    if "variables" in tf1 and "variables" in tf2:
        expected, actual, note = common_variables(tf1["variables"], tf2["variables"])
        pairs.append(("variables", expected, actual))
        notes += note
    result = e.compare_step(name, pairs, notes=notes)
    failing = {c.name for c in result.comparisons if not c.ok and c.failures}
    if failing == {"variables"}:
        result = dataclasses.replace(result, notes=result.notes + (
            "the outputs agree, but variables the training-mode pass updated differ: moving statistics "
            "(compare the batch-norm momentum/decay, epsilon and renorm settings of the two sides)",))
    unaligned = _unaligned.unaligned_note(result, e.options.aligned) if "variables" in failing else None
    if unaligned:  # rules alone: the failure's cause is named, the verdict stands
        result = dataclasses.replace(result, notes=result.notes + (unaligned,))
    if failing and tf1.get("moving_start") and tf2.get("moving_start"):  # the verdict stands; a cause is named
        result = dataclasses.replace(result, notes=result.notes + tuple(_bessel.bessel_notes(
            tf1["moving_start"], tf2["moving_start"], tf1["variables"], tf2["variables"], e.options.inputs)))
    return judge_loop_random(result, tf1["loops"], _leaf_flags(result, tf1["leaf_flags"]))


def common_variables(tf1_values: Mapping, tf2_values: Mapping) -> tuple:
    """``(tf1, tf2, notes)``: the values of the variables both sides hold (by key,
    in the TF1 order); a variable on one side only is the ``parity`` step's
    finding, named here in a note."""
    shared = [key for key in tf1_values if key in tf2_values]
    notes = []
    for side, own, other in (("TF1", tf1_values, tf2_values), ("TF2", tf2_values, tf1_values)):
        alone = [key for key in own if key not in other]
        if alone:
            notes.append(f"variables on the {side} side only, not compared here (see parity): {alone[:5]}"
                         + (f" (+{len(alone) - 5} more)" if len(alone) > 5 else ""))
    return ({key: tf1_values[key] for key in shared}, {key: tf2_values[key] for key in shared}, notes)


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


def _specs(keys, variables, renamer=None) -> dict:
    """``{key: (shape, dtype)}``; a declared transform's variable in its TF1 shape."""
    tf1_shape = renamer.tf1_shape if isinstance(renamer, MappingRenamer) else (lambda key, shape: shape)
    return {key: (tuple(int(d) for d in tf1_shape(key, tuple(v.shape))), variable_dtype(v).name)
            for key, v in zip(keys, variables)}


class _FixedValues(collections.abc.Mapping):
    """Each variable's fixed value, computed when the side asks for it (a side
    assigning a chunk at a time holds one chunk, not a second copy of the model)."""

    def __init__(self, keys, variables, prefix: str, renamer=None):
        # A declared transform (rename=VariableMapping): the value in the TF1
        # variable's shape; the side's assign_variables transforms it.
        tf1_shape = renamer.tf1_shape if isinstance(renamer, MappingRenamer) else (lambda key, shape: shape)
        self._specs = {key: (tf1_shape(key, tuple(v.shape)), variable_dtype(v)) for key, v in zip(keys, variables)}
        self._prefix = prefix

    def __getitem__(self, key: str) -> np.ndarray:
        shape, dtype = self._specs[key]
        return fixed_value(self._prefix + key, shape, dtype)

    def __contains__(self, key) -> bool:  # without computing the value
        return key in self._specs

    def __iter__(self):
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)


def _assign_fixed(side, keys, variables, prefix: str = "") -> None:
    side.assign_variables(_FixedValues(keys, variables, prefix, getattr(side, "renamer", None)))


def _tf2_keys_and_variables(half) -> tuple:
    half.inference_pass()  # built
    variables = layer_variables(half.layer)
    return [variable_key(variable_name(v), half.side.renamer) for v in variables], variables


# --------------------------------------------------------------------------
# variables_once and parity
# --------------------------------------------------------------------------

def _variables_once_tf1(e: "Engine") -> dict:
    return {"build_seconds": e.tf1_half.build_seconds}


def _variables_once_tf2(e: "Engine", _) -> dict:
    half = e.tf2_half
    try:
        half.gradient_pass()  # the layer's second call
    except VariableCreationError as exc:
        existing = [variable_name(v) for v in layer_variables(half.layer)]
        return {"created": second_call_message(str(exc), existing), "build_seconds": half.build_seconds}
    return {"created": None, "build_seconds": half.build_seconds, "variables": len(layer_variables(half.layer)),
            "distributed": half.distributed}


def _variables_once_judge(e: "Engine", tf1: dict, tf2: dict) -> StepResult:
    built = tf1["build_seconds"] + tf2["build_seconds"]
    notes = [f"includes building the shared TF1 graphs and TF2 layer ({built:.1f}s)"]
    if tf2["created"] is not None:
        return StepResult("variables_once", title("variables_once"), "failed", 0.0,
                          message=tf2["created"], notes=notes)
    which = "distributed inference" if tf2["distributed"] else "training=True"
    return StepResult("variables_once", title("variables_once"), "passed", 0.0,
                      message=f"the second call ({which}) created no variable", notes=notes,
                      data={"variables": tf2["variables"]})


variables_once = SplitStep(_variables_once_tf1, _variables_once_tf2, _variables_once_judge)


def _parity_tf1(e: "Engine") -> dict:
    half = e.tf1_half
    side = half.side
    found = VariableSet.from_variables(side.variables, "tf1")
    return {"variables": VariableSet(tuple(
        VariableInfo(v.name, v.shape, v.dtype, variable_key(v.name, side.renamer) in side.trainable_keys)
        for v in found), "tf1"),
        "keys": {key: key in side.trainable_keys for key in side.keys}}


def _parity_tf2(e: "Engine", _) -> dict:
    half = e.tf2_half
    half.inference_pass()
    variables = layer_variables(half.layer)
    trainable = {id(v) for v in half.layer.trainable_variables}
    found = VariableSet.from_variables(variables, "tf2")
    renamer = half.side.renamer
    if isinstance(renamer, MappingRenamer):  # a declared transform: compared in the TF1 layout
        found = VariableSet(tuple(dataclasses.replace(i, shape=renamer.tf1_shape(renamer(i.name), i.shape))
                                  for i in found), "tf2")
    return {"variables": found,
            "keys": {variable_key(variable_name(v), renamer): id(v) in trainable for v in variables}}


def _parity_judge(e: "Engine", tf1: dict, tf2: dict) -> StepResult:
    expected, actual = tf1["variables"], tf2["variables"]
    result = compare_variables(expected, actual, rename=e.options.renamer)
    status = "passed" if result.ok else "failed"
    # Every variable of either side is owed proof in the coverage ledger (trainable on either: a gradient).
    owed = {key: trainable or tf2["keys"].get(key, False) for key, trainable in tf1["keys"].items()}
    owed.update({key: trainable for key, trainable in tf2["keys"].items() if key not in owed})
    # A VariableMapping's names missed because Keras numbered the layer otherwise: said first.
    hint = None if result.ok else renumbering_hint(list(result.extra), e.options.renamer)
    return StepResult("parity", title("parity"), status, 0.0,
                      message="" if result.ok else (f"{hint}\n" if hint else "") + str(result),
                      data={"tf1_variables": len(expected), "tf2_variables": len(actual),
                            "trainable": len(expected.trainable),
                            "trainable_parameters": expected.num_trainable_parameters,
                            "proves": {"variables": owed}})


parity = SplitStep(_parity_tf1, _parity_tf2, _parity_judge)


# --------------------------------------------------------------------------
# Forward passes in constant mode, and fixed weights
# --------------------------------------------------------------------------

def _random_constant_tf1(e: "Engine", mode: str, training: bool) -> dict:
    half = e.tf1_half
    start = _bessel.moving_start(half) if training and not half.distributed else None
    outputs, regularization, _, _ = half.training_pass() if training else half.inference_pass()
    forward = half.training if training else half.inference
    capture = _forward_capture(forward, outputs, regularization)
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
    notes = ([_PREBUILT_NOTE] if tf2["prebuilt"] else []) + ([e.options.aligned] if e.options.aligned else [])
    result = _judge_forward(e, name, tf1, tf2, notes=notes)
    if not e.options.localize:
        return result
    # The training pass lives in a graph of its own (so its names match a
    # standalone build); localization fetches its ops there.
    tf1_half = e.tf1_half
    forward, side = ((tf1_half.training, tf1_half.train_side) if training
                     else (tf1_half.inference, tf1_half.side))
    return e.localized(result, side, forward.outputs, lambda: _localization_call(e, training),
                       state=lambda: _as_started(e, "training" if training else "inference"))


random_constant = SplitStep(_random_constant_tf1, _random_constant_tf2, _random_constant_judge)


def _fixed_weights_tf1(e: "Engine") -> dict:
    half = e.tf1_half
    side = half.side
    with half.preserved():
        _assign_fixed(side, side.keys, side.variables)
        outputs, regularization = half.inference_now()
    return {"outputs": outputs, "regularization": regularization, "loops": {}, "leaf_flags": [],
            "specs": _specs(side.keys, side.variables)}


def _fixed_weights_tf2(e: "Engine", _) -> dict:
    half = e.tf2_half
    keys, variables = _tf2_keys_and_variables(half)
    with half.preserved():
        _assign_fixed(half.side, keys, variables)
        outputs, regularization = half.inference_now()
    return {"outputs": outputs, "regularization": regularization,
            "specs": _specs(keys, variables, half.side.renamer)}


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
    if not e.options.localize:
        return result
    return e.localized(result, e.tf1_half.side, e.tf1_half.inference.outputs,
                       lambda: _localization_call(e, False), state=lambda: _fixed_state(e))


fixed_weights = SplitStep(_fixed_weights_tf1, _fixed_weights_tf2, _fixed_weights_judge)


@contextlib.contextmanager
def _both_preserved(e: "Engine"):
    with e.tf1_half.preserved(), e.tf2_half.preserved():
        yield


@contextlib.contextmanager
def _as_started(e: "Engine", key: str):
    """Both sides as they were when their pass ``key`` started (for localization),
    put back afterwards: earlier steps' training calls leak no moving statistics."""
    with e.tf1_half.as_started(key), e.tf2_half.as_started(key):
        yield


@contextlib.contextmanager
def _fixed_state(e: "Engine"):
    """Both sides with the fixed values (for localization), put back afterwards."""
    with _both_preserved(e):
        side = e.tf1_half.side
        _assign_fixed(side, side.keys, side.variables)
        _assign_fixed(e.tf2_half.side, *_tf2_keys_and_variables(e.tf2_half))
        yield


def _localization_call(e: "Engine", training: bool):
    """One more TF2 forward pass of the pair's layer for localization (with
    ``tf_function=True`` a new trace, which the op taps see being built)."""
    from equivtool.localize._capture import call_layer
    half = e.tf2_half
    with half.tool.scope():
        return call_layer(half.layer, e.options.inputs, training, e.options.tf_function,
                          e.options.graph_rewrites)


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
            "loops": dict(forward.loop_random_ops), "flags": _loop_flags(forward.loop_random_ops, tensors)}


def _gradients_tf2(e: "Engine", _) -> dict:
    half = e.tf2_half
    _, _, loss, gradients = half.gradient_pass()
    trainable = [variable_key(variable_name(v), half.side.renamer) for v in half.layer.trainable_variables]
    return {"loss": loss, "gradients": gradients, "trainable": trainable,
            "sparse": list(half.side.sparse_gradients)}


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
        notes.append(_DISTRIBUTED_NOTE)
    proves = {"no_gradient": neither, "trainable": both}
    result = e.compare_step("gradients",
                            [("loss", np.float32(tf1["loss"]), np.float32(tf2["loss"])),
                             ("gradients", tf1_grads, tf2_grads)],
                            notes=notes, data={"variables": len(tf1_grads), "loss_target": target,
                                               "proves": proves})
    if one_sided:  # the missing key fails the step already; the message says why first
        names = ", ".join(f"{key} (None on the {'TF2' if has == 'TF1' else 'TF1'} side)" for key, has in one_sided[:3])
        result = dataclasses.replace(result, message=f"gradient is None on one side only (disconnected from the "
                                     f"loss, or cut by tf.stop_gradient): {names}"
                                     + (f" (+{len(one_sided) - 3} more)" if len(one_sided) > 3 else "")
                                     + "; " + result.message)
    return judge_loop_random(result, tf1["loops"], tf1["flags"])


gradients = SplitStep(_gradients_tf1, _gradients_tf2, _gradients_judge)


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
            "floor_run": floor_run,
            "sparse": [k for k, g in gradient_of.items() if type(g).__name__ == "IndexedSlices"],
            "loops": loops, "flags": _loop_flags(loops, tensors)}


def _optimizer_tf2(e: "Engine", _) -> dict:
    _, make_tf2 = _optimizers(e)
    o, half = e.options, e.tf2_half
    half.gradient_pass()
    losses, values = [], []
    with half.preserved():
        optimizer = half.side.make_optimizer(make_tf2)
        for _ in range(o.train_steps):
            with half.tool.scope():
                losses.append(half.side.train_step(o.inputs, optimizer, training=not half.distributed))
            values.append(half.side.read_variables())
    return {"losses": losses, "variables": values, "optimizer": type(optimizer).__name__,
            "sparse": list(half.side.sparse_gradients)}


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
    if tf1.get("floor_run") is not None and comparable:
        floor = noise_floor.judge_runs(
            comparisons,
            [_optimizer_expected(*pair) for pair in zip(tf1["losses"], tf1["variables"], tf2["variables"])],
            [_optimizer_expected(loss, values, theirs)
             for (loss, values), theirs in zip(tf1["floor_run"], tf2["variables"])],
            o.noise_floor_multiple, o.seed)
        comparisons = list(floor.comparisons)
        notes += floor.notes
    failed_at = next((step + 1 for step, comparison in enumerate(comparisons) if not comparison.ok), None)
    notes += sparse_note(tf1["sparse"], tf2["sparse"], applied=True)
    if o.strategy is not None:
        notes.append(_DISTRIBUTED_NOTE)
    if failed_at is not None:
        notes.append(f"first step that exceeds tolerance: {failed_at}")
    losses = [[float(a), float(b)] for a, b in zip(tf1["losses"], tf2["losses"])]
    compared = [key for key in (tf1["variables"] or [{}])[0] if key in (tf2["variables"] or [{}])[0]]
    data = {"steps": o.train_steps, "first_failing_step": failed_at, "losses": losses,
            "proves": {"values": compared}}
    if floor is not None:
        data["noise_floor"] = floor.data
    result = StepResult.from_comparisons("optimizer", title("optimizer"), comparisons, notes=notes, data=data)
    return judge_loop_random(result, tf1["loops"], tf1["flags"])


optimizer = SplitStep(_optimizer_tf1, _optimizer_tf2, _optimizer_judge)


# --------------------------------------------------------------------------
# Checkpoint
# --------------------------------------------------------------------------

def _checkpoint_tf1(e: "Engine") -> dict:
    half = e.tf1_half
    side = half.side
    given = e.options.checkpoint
    path = given if isinstance(given, (str, os.PathLike)) else None
    with half.preserved() as saved:
        if path is None:
            # The checkpoint holds fixed values, so that loading it visibly
            # changes both sides' (random) variables.
            _assign_fixed(side, side.keys, side.variables, prefix="ckpt/")
            path = side.save_checkpoint(os.path.join(e.workdir(), "model.ckpt"))
            side.assign_variables(saved)
        side.restore_checkpoint(path)
        outputs, _ = half.inference_now()
    return {"outputs": outputs, "path": os.fspath(path), "names": side.checkpoint_names(),
            "written": given is True}


def _checkpoint_tf2(e: "Engine", tf1: dict) -> dict:
    half = e.tf2_half
    with half.preserved():
        loaded, absent = half.side.load_checkpoint(tf1["path"], tf1["names"])
        outputs, _ = half.inference_now()
    return {"outputs": outputs, "loaded": loaded, "absent": absent}


def _checkpoint_judge(e: "Engine", tf1: dict, tf2: dict) -> StepResult:
    notes = ["checkpoint written by the TF1 side with tf.compat.v1.train.Saver"] if tf1["written"] else []
    if tf2["absent"]:
        notes.append(f"{len(tf2['absent'])} TF2 variables not in the checkpoint: {tf2['absent'][:5]}")
    result = e.compare_step("checkpoint", [("outputs", tf1["outputs"], tf2["outputs"])], notes=notes,
                            data={"loaded_variables": tf2["loaded"], "missing": len(tf2["absent"])})
    if not e.options.localize:
        return result
    return e.localized(result, e.tf1_half.side, e.tf1_half.inference.outputs,
                       lambda: _localization_call(e, False), state=lambda: _checkpoint_state(e, tf1))


@contextlib.contextmanager
def _checkpoint_state(e: "Engine", tf1: dict):
    with _both_preserved(e):
        e.tf1_half.side.restore_checkpoint(tf1["path"])
        e.tf2_half.side.load_checkpoint(tf1["path"], tf1["names"])
        yield


checkpoint = SplitStep(_checkpoint_tf1, _checkpoint_tf2, _checkpoint_judge, tf2_needs_tf1=True)


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
    keep = False
    try:
        with tf1_aligned(o, tf1):
            forward = tf1.forward(training=training)
        outputs, regularization = tf1.run((forward.outputs, forward.regularization),
                                          update_ops=forward.update_ops)
        capture = _forward_capture(forward, outputs, regularization)
        if training:
            capture["variables"] = tf1.read_variables()
        if o.localize:  # localization fetches from this graph after the TF2 pass
            capture["_local"] = (tf1, forward)
            keep = True
        return capture
    finally:
        if not keep:
            tf1.close()


def _random_fresh_tf2(e: "Engine", _, mode: str, training: bool) -> dict:
    _refuse_strategy(e)
    o = e.options
    tool = DeterministicRandomTestTool(seed=o.seed, mode=mode)
    with tool.scope(), tf2_aligned(o):
        layer = e.new_layer()
        # Under tf.function every trace gets the first trace's seeds, which
        # follow program order as the TF1 graph's do (equivtool.seeding._traced).
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
        result = _judge_forward(e, name, tf1, tf2, notes=(o.aligned,) if o.aligned else ())
        if local is None:
            return result
        side, forward = local

        def fresh_call():  # the same first call of a fresh layer under a fresh tool
            # Eagerly, also under tf_function=True: a variable-creating tf.function is
            # traced twice and the op taps would see the ops of both traces (the
            # report header's "execution" says so).
            from equivtool.localize._capture import call_layer
            with DeterministicRandomTestTool(seed=o.seed, mode=mode).scope(), tf2_aligned(o):
                return call_layer(e.new_layer(), o.inputs, training, False)
        return e.localized(result, side, forward.outputs, fresh_call)
    finally:
        if local is not None:
            local[0].close()


random_fresh = SplitStep(_random_fresh_tf1, _random_fresh_tf2, _random_fresh_judge)
