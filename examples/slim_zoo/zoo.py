"""Every network in ``tf_slim.nets`` (tf-slim 1.1.0), wrapped by :func:`equivtool.slim_shim`.

Each entry builds the network at the smallest input it accepts, with 10
classes, batch 1, and its published arg scope. ``run(name)`` checks one
network with every default step plus one SGD optimizer step.

tf-slim 1.1.0's nets are alexnet_v2, inception_v1/v2/v3, overfeat,
resnet_v1/v2 and vgg_a/16/19. cifarnet, i3d and pix2pix live in TensorFlow's
research ``models`` repository, not in the tf_slim wheel, so they are not here.

Smallest inputs: vgg, alexnet_v2 and overfeat turn their fully-connected
layers into ``VALID`` convolutions of fixed size (tf-slim 1.1.0 has no
``fc_conv_padding`` argument), so the input must reach fc6 with at least the
kernel's size: 224 px (vgg, 7x7), 195 px (alexnet_v2, 5x5), 231 px
(overfeat, 6x6). inception_v1's final 7x7 average pool is fixed too (224
px); inception_v2 shrinks its final pool to fit (32 px), inception_v3 needs
107 px (its auxiliary head pools 5x5 over Mixed_6e), the resnets 32 px.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Mapping

import equivtool
import numpy as np
import tensorflow as tf
from tf_slim.nets import alexnet, inception, overfeat, resnet_v1, resnet_v2, vgg

from equivtool.comparison import Tolerance

__all__ = ["ZOO", "ZooNet", "run"]


@dataclasses.dataclass(frozen=True)
class ZooNet:
    name: str
    fn: Callable
    arg_scope: Callable[[], Mapping]
    size: int
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Per-step tolerances where a deep network's float32 noise exceeds the
    # guide's defaults (rtol=1e-6, atol=1e-5); the zoo table states the
    # measured error that justifies each.
    step_tolerances: Mapping[str, Tolerance] = dataclasses.field(default_factory=dict)

    def shim(self):
        return equivtool.slim_shim(self.fn, self.arg_scope(), num_classes=10, **self.kwargs)

    def inputs(self, batch: int = 1) -> np.ndarray:
        rng = np.random.RandomState(0)
        return rng.uniform(-1.0, 1.0, (batch, self.size, self.size, 3)).astype(np.float32)


ZOO = {net.name: net for net in (
    ZooNet("alexnet_v2", alexnet.alexnet_v2, alexnet.alexnet_v2_arg_scope, 195),
    # Under graph_rewrites="as_written" (issue 27) inception_v1's gradients (1.8e-5 with the
    # remapper on) and inception_v2's inference end points (1.5e-4) agree bit for bit: those
    # tolerances were fusion artifacts and are gone.
    ZooNet("inception_v1", inception.inception_v1, inception.inception_v1_arg_scope, 224),
    ZooNet("inception_v2", inception.inception_v2, inception.inception_v2_arg_scope, 32),
    # measured (AMD EPYC, AVX-512): eager gradients off by up to 4.2e-5 on the stem (the TF2 tape
    # sums the gradient in another order than tf.gradients); 0 under tf.function. The noise floor
    # does not apply: one gradient computation, not a drift over training steps (RESULTS.md, "The
    # zoo's training steps against the noise floor").
    ZooNet("inception_v3", inception.inception_v3, inception.inception_v3_arg_scope, 107,
           step_tolerances={"gradients": Tolerance(atol=1e-4)}),
    ZooNet("overfeat", overfeat.overfeat, overfeat.overfeat_arg_scope, 231),
    ZooNet("resnet_v1_50", resnet_v1.resnet_v1_50, resnet_v1.resnet_arg_scope, 32),
    # After the SGD step block3's batch-norm moving variances differ by up to 4.5e-5 (v1) and
    # 5.8e-5 (v2), over the guide's atol. TF1 against itself, with every variable one ULP away,
    # differs there by 3.4e-4 to 0.12: the optimizer step's measured noise floor passes them as
    # consistent with rounding (difference / floor at most 0.04), so no tolerance is stated
    # (it was atol=2e-4, "cause not found"; benchmarks/RESULTS.md, "Noise floor").
    ZooNet("resnet_v1_101", resnet_v1.resnet_v1_101, resnet_v1.resnet_arg_scope, 32),
    ZooNet("resnet_v2_50", resnet_v2.resnet_v2_50, resnet_v2.resnet_arg_scope, 32),
    ZooNet("resnet_v2_101", resnet_v2.resnet_v2_101, resnet_v2.resnet_arg_scope, 32),
    ZooNet("vgg_a", vgg.vgg_a, vgg.vgg_arg_scope, 224),
    ZooNet("vgg_16", vgg.vgg_16, vgg.vgg_arg_scope, 224),
    ZooNet("vgg_19", vgg.vgg_19, vgg.vgg_arg_scope, 224),
)}


def run(name: str, *, tf_function: bool = False, batch: int = 1, default_tolerances: bool = False,
        **kwargs) -> equivtool.EquivalenceReport:
    """Check one zoo network: every default step plus one SGD optimizer step
    (``default_tolerances``: the guide's tolerances only, to measure)."""
    net = ZOO[name]
    shim = net.shim()
    return equivtool.check_equivalence(
        shim.tf1_fn, net.shim, net.inputs(batch),
        optimizers=(lambda: tf.compat.v1.train.GradientDescentOptimizer(0.01),
                    lambda: tf.keras.optimizers.SGD(0.01)),
        train_steps=1, tf_function=tf_function,
        step_tolerances=None if default_tolerances else dict(net.step_tolerances) or None,
        meta={"model": name}, **kwargs)


def _floor_of_largest(step) -> str:
    """`` (floor F)``: a training step's noise floor at the leaf with the largest
    difference (equivtool.engine.noise_floor); empty without one."""
    rows = [pair for found in step.data.get("noise_floor", {}).get("steps", ()) for pair in found.values()
            if pair[0] is not None]
    if not rows:
        return ""
    _, floor = max(rows, key=lambda pair: pair[0])
    return " (floor n/a)" if floor is None else f" (floor {floor:.1e})"


def _row(name: str, tf_function: bool, report: equivtool.EquivalenceReport, seconds: float) -> str:
    """A RESULTS.md row: time and largest absolute error of each step (and a
    training step's noise floor at that leaf)."""
    cells = []
    for step in report.steps:
        errors = [leaf.max_abs for leaf in step.leaves if leaf.max_abs is not None]
        error = f" · {max(errors):.1e}" if errors else ""
        if errors and max(errors) == 0:
            error = " · 0"
        error += _floor_of_largest(step)
        mark = "" if step.status == "passed" else f" **{step.status.upper()}**"
        cells.append(f"{step.name} {step.seconds:.0f}s{error}{mark}")
    mode = "tf.function" if tf_function else "eager"
    return f"| {name} | {mode} | {seconds:.0f}s | {report.verdict()} | " + " | ".join(cells) + " |"


def main(argv=None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="python -m examples.slim_zoo.zoo",
                                     description="check tf_slim.nets networks; print a RESULTS.md row each")
    parser.add_argument("names", nargs="*", metavar="NET", help=f"default: all of {', '.join(ZOO)}")
    parser.add_argument("--tf-function", action="store_true")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--default-tolerances", action="store_true",
                        help="the guide's tolerances only (rtol=1e-6, atol=1e-5), not the per-net ones")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in ZOO]
    if unknown:
        parser.error(f"NET: unknown {unknown}; expected names among {', '.join(ZOO)}")
    passed = True
    for name in args.names or list(ZOO):
        started = time.perf_counter()
        report = run(name, tf_function=args.tf_function, workers=args.workers,
                     default_tolerances=args.default_tolerances)
        print(_row(name, args.tf_function, report, time.perf_counter() - started), flush=True)
        passed = passed and report.passed
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
