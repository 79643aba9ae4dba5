"""The ``checkpoint`` step: a TF1 name-based checkpoint loaded into both sides.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING


from equivtool.report import StepResult

if TYPE_CHECKING:  # pragma: no cover
    from equivtool.engine.run import Engine
from equivtool.engine.steps.common import (SplitStep, assign_fixed, both_preserved, localization_call)

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
            assign_fixed(side, side.keys, side.variables, prefix="ckpt/")
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
                       lambda tap: localization_call(e, False, tap), state=lambda: _checkpoint_state(e, tf1))


@contextlib.contextmanager
def _checkpoint_state(e: "Engine", tf1: dict):
    with both_preserved(e):
        e.tf1_half.side.restore_checkpoint(tf1["path"])
        e.tf2_half.side.load_checkpoint(tf1["path"], tf1["names"])
        yield


checkpoint = SplitStep(_checkpoint_tf1, _checkpoint_tf2, _checkpoint_judge, tf2_needs_tf1=True)
