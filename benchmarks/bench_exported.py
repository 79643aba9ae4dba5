"""Benchmark: ``equivtool compare`` of two exported models against loading and running both by hand.

Exports Inception-ResNet-v2 (``examples/exported/export.py``: the tf-slim model
as a TF1 SavedModel, its shim as a TF2 SavedModel), then times, each in a fresh
process (TensorFlow imported before the clock starts) and in rotating order:

* ``by_hand``: what one would write: load the TF1 SavedModel in a session and
  run its signature once, ``tf.saved_model.load`` the TF2 one and call its
  signature once, on the same input;
* ``compare``: ``equivtool.compare_models(tf1, tf2)``;
* ``localize``: ``equivtool.compare_models(tf1, tf2, localize=True)``, every
  node output compared;
* ``tf1_alone`` and ``tf2_alone``: each model loaded and run once on its own,
  the memory baseline ("the larger model's own run").

Time ratios are medians of the rounds against ``by_hand`` (targets: compare <=
1.3x, localize <= 3x); peak RSS ratios are against the larger of ``tf1_alone``
and ``tf2_alone`` (target: localize <= 1.5x).

    python benchmarks/bench_exported.py [--image-size 299] [--rounds 3] [--models DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("by_hand", "compare", "localize", "tf1_alone", "tf2_alone")


def child(mode: str, tf1: str, tf2: str, size: int) -> None:
    import equivtool
    import numpy as np
    import tensorflow as tf
    images = np.random.RandomState(0).uniform(-1, 1, (1, size, size, 3)).astype(np.float32)
    start = time.perf_counter()
    if mode in ("by_hand", "tf1_alone", "tf2_alone"):
        old = new = {"logits": None, "predictions": None}
        if mode != "tf2_alone":
            graph = tf.Graph()
            with tf.compat.v1.Session(graph=graph) as session:
                meta = tf.compat.v1.saved_model.load(session, ["serve"], tf1)
                sig = meta.signature_def["serving_default"]
                fetches = {k: v.name for k, v in sig.outputs.items()}
                old = session.run(fetches, {sig.inputs["images"].name: images})
        if mode != "tf1_alone":
            new = tf.saved_model.load(tf2).signatures["serving_default"](images=tf.constant(images))
        assert set(old) == set(new)
    else:
        report = equivtool.compare_models(tf1, tf2, inputs={"images": images}, localize=mode == "localize")
        assert report.passed, str(report)
        if mode == "localize":
            found = report.steps[0].data["localization"]
            print(json.dumps({"compared": found.compared}), file=sys.stderr)
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def run_child(mode, tf1, tf2, size) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO}
    done = subprocess.run([sys.executable, __file__, "--child", mode, tf1, tf2, str(size)], capture_output=True,
                          text=True, env=env, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for line in done.stderr.splitlines():
        if line.startswith('{"compared"'):
            result.update(json.loads(line))
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-size", type=int, default=299)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default=None, metavar="DIR",
                        help="reuse DIR/tf1 and DIR/tf2 exported at --image-size (the export is slow)")
    parser.add_argument("--child", nargs=4, default=None, metavar=("MODE", "TF1", "TF2", "SIZE"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], args.child[2], int(args.child[3]))
        return 0
    sys.path.insert(0, REPO)
    import equivtool  # noqa: F401 - before TensorFlow
    from examples.exported.export import export_inception_resnet_v2
    with tempfile.TemporaryDirectory(prefix="equivtool-bench-exported-") as root:
        t0 = time.perf_counter()
        if args.models:  # an earlier export (export_inception_resnet_v2(DIR, size, num_classes=1001))
            tf1, tf2 = os.path.join(args.models, "tf1"), os.path.join(args.models, "tf2")
        else:
            tf1, tf2 = export_inception_resnet_v2(root, args.image_size, num_classes=1001)
        export_s = time.perf_counter() - t0
        runs = {m: [] for m in MODES}
        for r in range(args.rounds):
            order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
            for mode in order:
                runs[mode].append(run_child(mode, tf1, tf2, args.image_size))
    med = {m: statistics.median(x["seconds"] for x in runs[m]) for m in MODES}
    rss = {m: max(x["maxrss_mib"] for x in runs[m]) for m in MODES}
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    from bench_parity import machine, versions  # one description of the machine
    print(f"machine: {machine()} (at the end; shared with other jobs)")
    print(f"versions: {versions()}; Python {platform.python_version()}")
    print(f"Inception-ResNet-v2 at {args.image_size} px, batch 1, {args.rounds} rounds "
          + (f"(models from {args.models})" if args.models else f"(export took {export_s:.0f} s)"))
    compared = runs["localize"][0].get("compared")
    larger = max(rss["tf1_alone"], rss["tf2_alone"])
    print("| mode | median s | time to by_hand | peak RSS MiB | RSS to the larger model's own run |")
    print("|---|---:|---:|---:|---:|")
    for m in MODES:
        print(f"| {m} | {med[m]:.2f} | {med[m] / med['by_hand']:.2f}x | {rss[m]:.0f} | {rss[m] / larger:.2f}x |")
    print(f"localize compared {compared} node outputs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
