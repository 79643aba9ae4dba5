"""A tf.contrib model, unchanged, in TensorFlow 1.15, against its TF2 rewrite; then a planted slip.

    equivtool demo --tf1-python PATH [--html report.html]
    python -m examples.contrib_tf1.parity --tf1-python PATH   (the same)

``contrib_tf1_model.model`` is written with ``tf.contrib.layers``
(fully_connected, batch_norm, layer_norm, dropout) and ``tf.contrib.rnn`` (an
LSTM cell unrolled with static_rnn). ``check_equivalence(tf1_python=PATH)``
imports it in the TensorFlow 1.15 interpreter at PATH (``equivtool tf1-env
DIR`` makes one; default ``$EQUIVTOOL_TF1_PYTHON``) and runs its TF1 side
there, as it ran, while the TF2 rewrite (the same code on tf-slim in a shim
layer) runs here: every default step plus optimizer steps and a checkpoint,
with both sides at once (``workers=2``). Then the rewrite's layer norm is
written out with epsilon 1e-3 instead of contrib's 1e-12, and the check says
NOT EQUIVALENT and localizes it to the layer norm's add of epsilon in the
TensorFlow 1.15 graph. Exit status 0 when both verdicts are the expected ones.
"""

from __future__ import annotations

import argparse
import os
import sys

import equivtool  # noqa: F401 - before TensorFlow
import numpy as np
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="equivtool demo --tf1-python",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--tf1-python", default=os.environ.get("EQUIVTOOL_TF1_PYTHON"), metavar="PATH",
                        help="a TensorFlow 1.15 interpreter (equivtool tf1-env DIR); default $EQUIVTOOL_TF1_PYTHON")
    parser.add_argument("--html", default=None, help="write the faithful rewrite's HTML report here")
    args = parser.parse_args(argv)
    if not args.tf1_python:
        parser.error("--tf1-python: expected the path of a TensorFlow 1.15 interpreter "
                     "(make one with: equivtool tf1-env DIR)")
    sys.path.insert(0, HERE)
    import contrib_tf1_model as model
    inputs = np.random.RandomState(0).standard_normal((4, model.FEATURES)).astype(np.float32)

    def check(epsilon):
        return equivtool.check_equivalence(
            "contrib_tf1_model:model", lambda: model.Shim(epsilon=epsilon), inputs, tf1_python=args.tf1_python,
            tf1_path=[HERE], optimizers=("contrib_tf1_model:sgd", lambda: tf.keras.optimizers.SGD(0.1)),
            checkpoint=True, workers=2, localize=epsilon is not None)  # localization runs in one process

    faithful = check(None)
    print(faithful)
    if args.html:
        faithful.to_html(args.html)
    print("\nThe rewrite with a planted slip: its layer norm's epsilon 1e-3 (contrib's is 1e-12)\n")
    slipped = check(1e-3)
    print(slipped.verdict)
    steps = {step.name: step for step in slipped.steps}
    localization = steps["fixed_weights"].data.get("localization")
    if localization is not None:  # where the numbers part, found in the TF1 interpreter's graph
        print(f"first divergent op: {localization.tf1_op} (TF 1.15) / {localization.tf2_op} (TF2), "
              f"created at {localization.tf1_source}")
    return 0 if faithful.passed and not slipped.passed else 1


if __name__ == "__main__":
    sys.exit(main())
