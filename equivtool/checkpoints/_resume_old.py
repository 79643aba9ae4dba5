"""The ``resume`` step's TF1 side in the TensorFlow 1.x interpreter (``tf1_python``).

:mod:`equivtool.checkpoints._resume` runs the TF1 side in-process; with
``tf1_python`` it hands it here, and the old-side program
(:mod:`equivtool.engine.sides.old_python`) does the same work as it ran: a
fresh graph with the training pass and the TF1 optimizer (named
``"module:function"``, imported there), every variable restored from the
checkpoint there (the optimizer's slots and beta powers too; one the checkpoint
lacks is named), then ``train_steps`` steps, each in a new session. The
noise floor's run starts from the restored state one ULP away (computed here,
sent there). The capture is the in-process one's, key for key, so the TF2 side
(the conversion and the resumed layer, here) and the judgement are shared.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from equivtool.engine.sides.old_python import OldTF1Side

if TYPE_CHECKING:  # pragma: no cover
    from equivtool.engine.run import Engine


def resume_tf1(e: "Engine", make_tf1: str, path: str) -> dict:
    """``{"losses", "captures", "optimizer", "floor_run"}`` as ``_resume._resume_tf1``
    returns them, computed in the TF1 interpreter from the checkpoint at ``path``."""
    o = e.options
    side = OldTF1Side(e, "constant")
    try:
        training = side.build_training(make_tf1, True)
        side.restore_training(training, path)
        start = side.global_state() if o.noise_floor else None
        steps = [side.resume_step(training) for _ in range(o.train_steps)]
        floor_run = None
        if start is not None:  # the same steps from the same start, 1 ULP away (engine.noise_floor)
            with side.perturbed(start, o.seed):
                floor_run = [side.resume_step(training) for _ in range(o.train_steps)]
        return {"losses": [loss for loss, _ in steps], "captures": [capture for _, capture in steps],
                "optimizer": training["optimizer"], "floor_run": floor_run}
    finally:
        side.close()
