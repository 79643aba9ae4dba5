"""Steps that prove the variables: ``variables_once`` (the TF2 layer creates
its variables once) and ``parity`` (names, shapes, dtypes and trainability match).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING


from equivtool.variables.mapping import MappingRenamer, native_rewrite_hint, renumbering_hint
from equivtool.report import StepResult
from equivtool.engine.sides.tf1_side import variable_key
from equivtool.engine.registry import title
from equivtool.variables.guards import second_call_message
from equivtool.variables.flavour import layer_variables, variable_name
from equivtool.variables import VariableCreationError, VariableInfo, VariableSet, compare_variables

if TYPE_CHECKING:  # pragma: no cover
    from equivtool.engine.run import Engine
from equivtool.engine.steps.common import SplitStep

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
    hint = None if result.ok else (renumbering_hint(list(result.extra), e.options.renamer)
                                   or native_rewrite_hint(list(result.missing), list(result.extra),
                                                          len(result.matched)))
    return StepResult("parity", title("parity"), status, 0.0,
                      message="" if result.ok else (f"{hint}\n" if hint else "") + str(result),
                      data={"tf1_variables": len(expected), "tf2_variables": len(actual),
                            "trainable": len(expected.trainable),
                            "trainable_parameters": expected.num_trainable_parameters,
                            "proves": {"variables": owed}})


parity = SplitStep(_parity_tf1, _parity_tf2, _parity_judge)
