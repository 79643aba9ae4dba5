"""Prove the Inception-ResNet-v2 shim equivalent to its TF1 slim graph, step by step.

    python -m examples.inception_resnet_v2.parity            # 299 x 299, batch 1, 1000 classes
    python -m examples.inception_resnet_v2.parity --image-size 107 --html report.html

This is what ``equivtool demo`` (the README's first command) runs. It exits 0
only when every step passes.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import equivtool  # noqa: F401  (must come before tensorflow)
import numpy as np

from equivtool.cli.progress import print_progress, write_reports

MIN_IMAGE_SIZE = 107
DEFAULT_STEPS = equivtool.DEFAULT_STEPS  # the library's default selection (equivtool.engine.registry)


# The two sides overlap on two cores; more workers help only with more cores.
DEFAULT_WORKERS = 2 if (os.cpu_count() or 1) >= 2 else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="equivtool demo", description=__doc__.split("\n\n")[0],
                                     epilog="equivtool demo --exported [--help]: the same model exported as a TF1 "
                                            "and a TF2 SavedModel and compared (equivtool compare), and a "
                                            "planted fault localized")
    parser.add_argument("--image-size", type=int, default=299, help="image height and width (default 299)")
    parser.add_argument("--batch-size", type=int, default=1, help="images per batch (default 1)")
    parser.add_argument("--num-classes", type=int, default=1000, help="classes (default 1000)")
    parser.add_argument("--steps", default=",".join(DEFAULT_STEPS),
                        help=f"comma-separated steps among {', '.join(equivtool.STEPS)}")
    parser.add_argument("--modes", default=",".join(equivtool.MODES),
                        help=f"comma-separated random-tool modes among {', '.join(equivtool.MODES)}")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                        help="processes running the TF1 and TF2 sides (default: 2 with 2 or more CPUs, "
                             "else 1; 1 runs everything in this process)")
    parser.add_argument("--html", default="equivtool-report.html", help="where to write the HTML report")
    parser.add_argument("--json", default=None, help="also write the report as JSON here")
    return parser


def model_kwargs() -> dict:
    # The configuration whose published figures the model tests check.
    return {"batch_norm_scale": True, "create_aux_logits": True}


def run(image_size=299, batch_size=1, num_classes=1000, steps=DEFAULT_STEPS,
        modes=equivtool.MODES, progress=None, workers=1):
    """Run the check and return the report."""
    # 107 px is the smallest input whose 17x17-stage map (5x5 here) still fits
    # the aux head's 5x5 average pool.
    for name, value, low in (("image_size", image_size, MIN_IMAGE_SIZE), ("batch_size", batch_size, 1),
                             ("num_classes", num_classes, 2)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{name}: expected an int >= {low}, got {value!r}")
    from .keras_shim import make_shim, tf1_forward  # TensorFlow: after main() has started the workers

    images = np.random.RandomState(0).uniform(-1, 1, (batch_size, image_size, image_size, 3)).astype(np.float32)
    kwargs = model_kwargs()
    return equivtool.check_equivalence(
        functools.partial(tf1_forward, num_classes=num_classes, **kwargs),
        functools.partial(make_shim, num_classes, **kwargs),
        images, steps=steps, modes=modes, progress=progress, workers=workers,
        meta={"model": "Inception-ResNet-v2 (tf-slim, TF1) vs shim layer (TF2)",
              "image_size": image_size, "batch_size": batch_size, "num_classes": num_classes})


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.workers >= 2:  # they import TensorFlow while this process does and builds the model
        equivtool.start_workers(args.workers - 1)
    steps = tuple(s for s in args.steps.split(",") if s)
    modes = tuple(m for m in args.modes.split(",") if m)
    print(f"Inception-ResNet-v2 equivalence: {args.image_size}x{args.image_size}, batch "
          f"{args.batch_size}, {args.num_classes} classes; steps: {', '.join(steps)}", flush=True)
    start = time.perf_counter()
    try:
        report = run(args.image_size, args.batch_size, args.num_classes, steps, modes,
                     progress=print_progress(start), workers=args.workers)
    except (TypeError, ValueError) as exc:
        print(f"equivtool demo: error: {exc}", file=sys.stderr)
        return 2
    print()
    print(report)
    write_reports(report, args.json, args.html)
    print(f"Total time: {time.perf_counter() - start:.1f} s")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
