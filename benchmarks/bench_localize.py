"""What localization costs: one failing step of Inception-ResNet-v2, with and without ``localize=True``.

The TF2 side has one planted fault (the residual scale of the third block17
repeat is 0.25 instead of 0.10), so the ``fixed_weights`` step fails. Two
variants run the same ``check_equivalence(..., steps=["fixed_weights"])`` on
the same input (``RandomState(0).uniform(-1, 1)``), each in its own
subprocess so that each peak RSS is its own:

``plain``      the step without localization;
``localized``  the same step with ``localize=True``: every op's output of the
               TF1 graph and of the eager TF2 call captured, aligned and
               compared in order until the first divergence.

The step's time includes building the TF1 graph and the TF2 layer (the step
builds them when it is the only step selected); ``localized`` must also name
``.../Repeat_1/block17_3/mul`` as the first divergent op. Printed: the machine
(CPU, cores, load average before and after each run), the versions, each run's
step time and process peak RSS, and the ratios localized / plain (targets:
time <= 3, peak RSS <= 1.5). Not a test. Usage:

    nice .venv/bin/python benchmarks/bench_localize.py [--image-size 299] [--batch-size 1]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from bench_parity import machine, versions  # noqa: E402  (one description of the machine)

RESULT_TAG = "BENCH_LOCALIZE_RESULT "
NUM_CLASSES = 1000
EXPECTED_OP = "InceptionResnetV2/InceptionResnetV2/Repeat_1/block17_3/mul"


def _faulty_shim_factory(kwargs):
    import tensorflow as tf
    from examples.inception_resnet_v2 import keras_shim, tf1_model

    original = tf1_model.block17

    def block17(net, scale=1.0, activation_fn=tf.nn.relu, scope=None, reuse=None):
        if scope == "block17_3":
            scale = 0.25
        return original(net, scale=scale, activation_fn=activation_fn, scope=scope, reuse=reuse)
    block17.__name__ = "block17"

    class Faulty(keras_shim.InceptionResnetV2):
        def call(self, inputs, training=None):
            tf1_model.block17 = block17
            try:
                return super().call(inputs, training=training)
            finally:
                tf1_model.block17 = original

    return lambda: Faulty(NUM_CLASSES, **kwargs)


def run(variant: str, image_size: int, batch_size: int) -> dict:
    import numpy as np

    import equivtool
    from examples.inception_resnet_v2 import parity
    from examples.inception_resnet_v2.keras_shim import tf1_forward

    kwargs = parity.model_kwargs()
    images = np.random.RandomState(0).uniform(-1, 1, (batch_size, image_size, image_size, 3)).astype(np.float32)
    start = time.perf_counter()
    report = equivtool.check_equivalence(functools.partial(tf1_forward, num_classes=NUM_CLASSES, **kwargs),
                                         _faulty_shim_factory(kwargs), images, steps=["fixed_weights"],
                                         localize=variant == "localized")
    seconds = time.perf_counter() - start
    step = report.step("fixed_weights")
    if step.status != "failed":
        raise AssertionError(f"the planted fault was not detected: {step.status}")
    result = {"seconds": seconds, "step_seconds": step.seconds}
    if variant == "localized":
        found = step.data["localization"]
        if found.tf1_op != EXPECTED_OP:
            raise AssertionError(f"localized to {found.tf1_op!r}, expected {EXPECTED_OP!r}:\n{found}")
        result.update(localization_seconds=found.seconds, compared=found.compared, tf1_ops=found.tf1_ops,
                      op=found.tf1_op)
    return result


def child(variant: str, image_size: int, batch_size: int) -> None:
    sys.path.insert(0, ROOT)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import equivtool  # noqa: F401
    import tensorflow as tf
    tf.get_logger().setLevel("ERROR")
    result = run(variant, image_size, batch_size)
    result.update(variant=variant, peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
    print(RESULT_TAG + json.dumps(result), flush=True)


def run_variant(variant: str, image_size: int, batch_size: int) -> dict:
    load_before = os.getloadavg()[0]
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", variant,
                           "--image-size", str(image_size), "--batch-size", str(batch_size)],
                          capture_output=True, text=True, cwd=ROOT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_TAG)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
        raise SystemExit(f"{variant} failed (exit {proc.returncode})")
    result = json.loads(lines[-1][len(RESULT_TAG):])
    result.update(load_before=load_before, load_after=os.getloadavg()[0])
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image-size", type=int, default=299)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--child", choices=("plain", "localized"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.image_size, args.batch_size)
        return 0
    print(f"machine: {machine()}")
    print(f"versions: {versions()}")
    print(f"Inception-ResNet-v2, {args.image_size}x{args.image_size}, batch {args.batch_size}, {NUM_CLASSES} "
          "classes; step fixed_weights with a planted fault (block17_3 residual scale)", flush=True)
    runs = {}
    for variant in ("plain", "localized"):
        r = runs[variant] = run_variant(variant, args.image_size, args.batch_size)
        extra = (f"  localization {r['localization_seconds']:.1f} s, {r['compared']} of {r['tf1_ops']} ops "
                 f"compared, first divergent op {r['op']}") if variant == "localized" else ""
        print(f"{variant:<10} check {r['seconds']:7.1f} s  step {r['step_seconds']:7.1f} s  peak RSS "
              f"{r['peak_rss_mb']:7.0f} MB  load {r['load_before']:.2f}/{r['load_after']:.2f}{extra}", flush=True)
    time_ratio = runs["localized"]["seconds"] / runs["plain"]["seconds"]
    rss_ratio = runs["localized"]["peak_rss_mb"] / runs["plain"]["peak_rss_mb"]
    print(f"ratio localized/plain, time:     {time_ratio:.2f}  (target <= 3: {'met' if time_ratio <= 3 else 'MISSED'})")
    print(f"ratio localized/plain, peak RSS: {rss_ratio:.2f}  (target <= 1.5: "
          f"{'met' if rss_ratio <= 1.5 else 'MISSED'})")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
