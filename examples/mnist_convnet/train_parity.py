"""Train the MNIST convnet a few steps on both sides of a migration and prove every step equal.

    python -m examples.mnist_convnet.train_parity

The TF1 graph (:func:`~examples.mnist_convnet.tf1_model.tf1_forward`) and the
TF2 shim layer (:func:`~examples.mnist_convnet.keras_model.make_model`) start
from the same random weights (``DeterministicRandomTestTool``), train for a
few steps on one synthetic batch, and ``check_equivalence`` compares the
per-step loss, the gradients and every weight after every step. It does so
twice: ``tf.compat.v1.train.GradientDescentOptimizer`` against
``tf.keras.optimizers.SGD``, then ``tf.compat.v1.train.AdamOptimizer`` against
``tf.keras.optimizers.Adam`` with the same epsilon (their defaults differ:
1e-8 and 1e-7).

The loss is the batch mean of equivtool's deterministic cross-entropy op,
``equivtool.ops.sparse_softmax_cross_entropy_with_logits``.

How the labels reach the loss: ``inputs`` is a dict ``{"images", "labels"}``.
The engine feeds the same structure to both sides (placeholders of that
structure in the TF1 graph, tensors to the TF2 layer), so both sides take the
batch and return ``{"logits", "loss"}``, computing the loss with the same
:func:`mean_cross_entropy`; ``loss_fn`` just picks ``outputs["loss"]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import equivtool  # noqa: F401  (must come before tensorflow)
import equivtool.ops

import tensorflow as tf

from .keras_model import make_model
from .tf1_model import synthetic_batch, tf1_forward

__all__ = ["MnistConvNetWithLoss", "TrainingParity", "main", "mean_cross_entropy", "run",
           "tf1_forward_with_loss"]

BATCH_SIZE = 32
TRAIN_STEPS = 4
STEPS = ("variables_once", "parity", "random", "gradients", "optimizer")
XENT_OP = "EquivtoolSparseXent"           # the op type the loss must put in the TF1 graph
XENT_GRAD_OP = "EquivtoolSparseXentGrad"  # ... and its gradient kernel, added by tf.gradients

ADAM_EPSILON = 1e-7
OPTIMIZERS = {
    "SGD": (lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
            lambda: tf.keras.optimizers.SGD(0.1)),
    "Adam": (lambda: tf.compat.v1.train.AdamOptimizer(1e-3, epsilon=ADAM_EPSILON),
             lambda: tf.keras.optimizers.Adam(1e-3, epsilon=ADAM_EPSILON)),
}


# -- the model with its loss, on each side -------------------------------------

def mean_cross_entropy(labels, logits):
    """Batch mean of equivtool's deterministic sparse softmax cross-entropy."""
    return tf.reduce_mean(
        equivtool.ops.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


def tf1_forward_with_loss(batch, training):
    """TF1 side: builds the convnet and its loss in the current graph."""
    logits = tf1_forward(batch["images"], training)
    return {"logits": logits, "loss": mean_cross_entropy(batch["labels"], logits)}


class MnistConvNetWithLoss(tf.keras.layers.Layer):
    """TF2 side: the migrated convnet (``make_model()``), unchanged, plus the same loss."""

    def __init__(self, name: str | None = None):
        super().__init__(name=name)
        self.convnet = make_model()

    def call(self, batch, training=None):
        logits = self.convnet(batch["images"], training=training)
        return {"logits": logits, "loss": mean_cross_entropy(batch["labels"], logits)}


# -- the check ------------------------------------------------------------------

def _loss(outputs, regularization_loss):
    """``loss_fn`` for the engine: the model computes its loss itself."""
    loss = outputs["loss"]
    if regularization_loss is not None:  # 0 here: the convnet has no regularizer
        loss = loss + regularization_loss
    return loss


@dataclass(frozen=True)
class TrainingParity:
    """One equivalence report per optimizer, the per-step losses, the TF1 graphs' op types."""

    reports: dict        # optimizer name -> equivtool.EquivalenceReport
    losses: dict         # optimizer name -> TF2 loss at each step (before its update)
    tf1_op_types: frozenset

    @property
    def used_xent_op(self) -> bool:
        return {XENT_OP, XENT_GRAD_OP} <= self.tf1_op_types

    @property
    def passed(self) -> bool:
        return all(report.passed for report in self.reports.values()) and self.used_xent_op

    def __str__(self) -> str:
        lines = []
        for name, report in self.reports.items():
            losses = self.losses[name]
            if losses:
                loss_line = "per-step loss: " + ", ".join(f"{x:.6f}" for x in losses)
            else:
                optimizer = report.step("optimizer")
                loss_line = (f"per-step loss: none, the optimizer step {optimizer.status}: "
                             f"{optimizer.message}")
            lines += [f"== {name} ==", str(report), loss_line, ""]
        lines.append(f"TF1 graphs contain {XENT_OP}: {XENT_OP in self.tf1_op_types}, "
                     f"{XENT_GRAD_OP}: {XENT_GRAD_OP in self.tf1_op_types}")
        lines.append("PASSED" if self.passed else "FAILED")
        return "\n".join(lines)


def run(batch_size: int = BATCH_SIZE, train_steps: int = TRAIN_STEPS, seed: int = 0,
        progress=None) -> TrainingParity:
    """Run the check with each optimizer pair and return the results."""
    images, labels = synthetic_batch(batch_size, seed)
    batch = {"images": images, "labels": labels}

    tf1_graphs = {}  # every graph the engine builds, to show which ops it ran

    def tf1_fn(batch, training):
        graph = tf.compat.v1.get_default_graph()
        tf1_graphs[id(graph)] = graph
        return tf1_forward_with_loss(batch, training)

    reports, losses = {}, {}
    for name, optimizers in OPTIMIZERS.items():
        reports[name] = equivtool.check_equivalence(
            tf1_fn, MnistConvNetWithLoss, batch,
            steps=STEPS, optimizers=optimizers, train_steps=train_steps, loss_fn=_loss,
            progress=progress,
            meta={"model": "MNIST convnet (TF1 graph vs TF2 shim)", "optimizer": name,
                  "loss": "mean of equivtool.ops.sparse_softmax_cross_entropy_with_logits",
                  "batch_size": batch_size})
        # per step: [TF1 loss, TF2 loss], both before that step's update. A step
        # that errored or was skipped has none: its status and message say why.
        optimizer = reports[name].step("optimizer")
        losses[name] = [tf2 for _, tf2 in optimizer.data.get("losses", ())]
    op_types = frozenset(op.type for graph in tf1_graphs.values() for op in graph.get_operations())
    return TrainingParity(reports, losses, op_types)


def main(argv=None) -> int:
    from equivtool.cli.progress import print_progress

    parser = argparse.ArgumentParser(prog="python -m examples.mnist_convnet.train_parity",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE, help=f"default {BATCH_SIZE}")
    parser.add_argument("--train-steps", type=int, default=TRAIN_STEPS, help=f"default {TRAIN_STEPS}")
    args = parser.parse_args(argv)
    print(f"MNIST convnet training parity: batch {args.batch_size}, {args.train_steps} steps, "
          f"optimizers {', '.join(OPTIMIZERS)}", flush=True)
    start = time.perf_counter()
    result = run(batch_size=args.batch_size, train_steps=args.train_steps,
                 progress=print_progress(start))
    print()
    print(result)
    print(f"Total time: {time.perf_counter() - start:.1f} s")
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
