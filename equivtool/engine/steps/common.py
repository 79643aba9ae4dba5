"""What every step shares: :class:`SplitStep` (a step as its two sides and their
judgement), forward captures and their judgement, fixed values, and the state a
localization re-run starts from.
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
from typing import TYPE_CHECKING, Callable, Mapping

import numpy as np

from equivtool.variables.mapping import MappingRenamer
from equivtool.report import StepResult
from equivtool._base.tree import flatten_tensors
from equivtool.engine.sides.tf1_graph_reading import depends_on
from equivtool.engine.sides.tf2_side import call_layer
from equivtool.engine.sides.tf1_side import fixed_value, variable_key
from equivtool.engine import _bessel, _unaligned
from equivtool.engine.outputs import split_outputs
from equivtool.variables.flavour import layer_variables, variable_dtype, variable_name

if TYPE_CHECKING:  # pragma: no cover
    from equivtool.engine.run import Engine

PREBUILT_NOTE = ("tf2_layer was built before the check, so its variables were given the TF1 graph's "
                  "initial values: initializers are not compared (pass a factory to compare them)")
DISTRIBUTED_NOTE = ("under a distribution strategy: computed with training=False on both sides; "
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
    #: ``tf1_after(e, tf1, tf2) -> tf1``: the TF1 side's second half, which needs the TF2
    #: capture: run on the TF1 side's lane after the TF2 side, before the next step's TF1
    #: side and the judgement, where ``wants_after(e)`` (:func:`equivtool.engine.run.run_after`).
    tf1_after: Callable[..., dict] | None = None
    wants_after: Callable[..., bool] | None = None

    def __post_init__(self):
        if self.tf1_after is not None and self.tf2_needs_tf1:
            raise ValueError("tf1_after: a step whose TF2 side waits for the TF1 capture cannot have one")

    def after_wanted(self, e: "Engine") -> bool:
        """Whether the TF1 side's second half runs for this engine."""
        return self.tf1_after is not None and (self.wants_after is None or bool(self.wants_after(e)))

    def error_notes(self, e: "Engine") -> tuple:
        """The notes the step's result keeps when a side or the judgement raises
        (they hold either way)."""
        return self.notes_on_error(e) if self.notes_on_error is not None else ()

    def __call__(self, e: "Engine", **params) -> StepResult:
        """Both sides in this process, TF1 first (a side that raises ends the step)."""
        tf1 = self.tf1(e, **params)
        tf2 = self.tf2(e, tf1 if self.tf2_needs_tf1 else None, **params)
        if self.after_wanted(e):
            tf1 = self.tf1_after(e, tf1, tf2)
        return self.judge(e, tf1, tf2, **params)


# --------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------

def forward_pairs(tf1_out, tf1_reg, tf2_out, tf2_reg) -> list:
    """What a forward-pass step compares: the outputs and the total regularization loss
    (0 on a side without regularizers)."""
    return [("outputs", tf1_out, tf2_out),
            ("regularization_loss", np.float32(tf1_reg), np.float32(tf2_reg))]


def loop_flags(loops: Mapping, tensors: Mapping) -> dict:
    """``{name: whether the tensor is computed from a random while loop}``; empty without loops."""
    if not loops:
        return {}
    return {name: depends_on(tensor, loops) for name, tensor in tensors.items()}


def forward_capture(forward, outputs, regularization) -> dict:
    """A TF1 forward pass's capture: values, its random while loops, and per
    output leaf (in the order the comparison walks them) whether it depends on one."""
    parts = [flatten_tensors(part) for _, part, _ in split_outputs(forward.outputs, forward.outputs)]
    parts.append([forward.regularization])
    loops = dict(forward.loop_random_ops)
    flags = [[depends_on(t, loops) for t in part] for part in parts] if loops else []
    return {"outputs": outputs, "regularization": regularization, "loops": loops, "leaf_flags": flags}


def fresh_pass_capture(side, forward, training: bool, localize: bool, run_pass) -> dict:
    """A ``num_random_ops`` TF1 pass on a side of its own (in process or in the
    TF1 interpreter): ``run_pass()`` runs it and returns its capture; a training
    pass adds the variables after it. With ``localize`` the side is put back to
    the values the pass started from (moving statistics too) and kept in
    ``capture["_local"]``: the judge's localization re-runs it from there, then
    closes it."""
    start = side.read_variables() if localize else None
    capture = run_pass()
    if training:
        capture["variables"] = side.read_variables()
    if start is not None:
        side.assign_variables(start)
        capture["_local"] = (side, forward)
    return capture


def leaf_flags(result: StepResult, flags: list) -> dict:
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


def judge_forward(e: "Engine", name: str, tf1: dict, tf2: dict, notes=()) -> StepResult:
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
    if e.options.kernel_floor:  # the TF1 run with rounding injected at every op (engine.kernel_floor)
        from equivtool.engine import kernel_floor
        result = kernel_floor.judge_pairs(e, result, tf1, lambda run: _forward_floor_pairs(tf1, run))
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
    return judge_loop_random(result, tf1["loops"], leaf_flags(result, tf1["leaf_flags"]))


def _forward_floor_pairs(tf1: dict, run: dict) -> list:
    """judge_forward's pairs with the kernel-floor run in the TF2 side's place."""
    pairs = forward_pairs(tf1["outputs"], tf1["regularization"], run["outputs"], run["regularization"])
    if "variables" in tf1 and "variables" in run:
        pairs.append(("variables",) + common_variables(tf1["variables"], run["variables"])[:2])
    return pairs


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


def specs(keys, variables, renamer=None) -> dict:
    """``{key: (shape, dtype)}``; a declared transform's variable in its TF1 shape."""
    tf1_shape = renamer.tf1_shape if isinstance(renamer, MappingRenamer) else (lambda key, shape: shape)
    return {key: (tuple(int(d) for d in tf1_shape(key, tuple(v.shape))), variable_dtype(v).name)
            for key, v in zip(keys, variables)}


class FixedValues(collections.abc.Mapping):
    """Each variable's fixed value, computed when the side asks for it (a side
    assigning a chunk at a time holds one chunk, not a second copy of the model)."""

    #: every value is a new array, made on access for the side that asked and
    #: held by no one else: a TF2 side may hand it to TensorFlow uncopied
    fresh_arrays = True

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


def assign_fixed(side, keys, variables, prefix: str = "") -> None:
    side.assign_variables(FixedValues(keys, variables, prefix, getattr(side, "renamer", None)))


def tf2_keys_and_variables(half) -> tuple:
    half.inference_pass()  # built
    variables = layer_variables(half.layer)
    return [variable_key(variable_name(v), half.side.renamer) for v in variables], variables



@contextlib.contextmanager
def both_preserved(e: "Engine"):
    with e.tf1_half.preserved(), e.tf2_half.preserved():
        yield


@contextlib.contextmanager
def as_started(e: "Engine", key: str):
    """Both sides as they were when their pass ``key`` started (for localization),
    put back afterwards: earlier steps' training calls leak no moving statistics."""
    with e.tf1_half.as_started(key), e.tf2_half.as_started(key):
        yield


@contextlib.contextmanager
def fixed_state(e: "Engine"):
    """Both sides with the fixed values (for localization), put back afterwards."""
    with both_preserved(e):
        side = e.tf1_half.side
        assign_fixed(side, side.keys, side.variables)
        assign_fixed(e.tf2_half.side, *tf2_keys_and_variables(e.tf2_half))
        yield


def localization_call(e: "Engine", training: bool, tap):
    """One more TF2 forward pass of the pair's layer for localization (with
    ``tf_function=True`` a new trace, which the op taps see being built)."""
    half = e.tf2_half
    with half.tool.scope():
        return call_layer(half.layer, e.options.inputs, training, e.options.tf_function,
                          e.options.graph_rewrites, tap=tap)
