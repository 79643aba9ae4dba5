"""The zoo's training steps against the measured noise floor (issue 33): one markdown row per net.

Why: the ``optimizer`` and ``resume`` steps judge a leaf that exceeds its
tolerance against a floor measured in the same run (TF1 run again from a
start one ULP away; docs/noise-floor.md). This script shows, for every net
of ``examples/slim_zoo/zoo.py``, how far TF2 is from TF1 after the step and
how far TF1 is from itself, with the guide's tolerances only
(``default_tolerances=True``: ``rtol=1e-6, atol=1e-5``, no per-net ones), so
that RESULTS.md can say which leaves the floor accepts and by what margin.

Each net runs ``zoo.run(name, steps=[step], default_tolerances=True)``: the
smallest input the net accepts, batch 1, one SGD step (``GradientDescentOptimizer(0.01)``
against ``SGD(0.01)``). Printed: a machine line (CPU model and its AVX-512 /
AMX flags, cores, load average, versions), then per net a row:

    model | TF2 side | step | verdict | largest difference (leaf) | its floor | largest floor |
    over tolerance, consistent with rounding | largest difference / floor among them |
    over tolerance and beyond the floor | seconds

and, as ``#`` lines, the leaves over the tolerance with both numbers.

``--step resume``: the zoo has no TF1 checkpoints, and ``resume`` needs one
written by TF1 training with its optimizer (slots included). This script
writes it: the net's TF1 function (its shim's ``tf1_fn``) trained
``--tf1-steps`` steps with ``MomentumOptimizer(0.01, 0.9)`` from a seeded
initialisation, saved with ``tf.compat.v1.train.Saver`` into a temporary
folder (removed on every exit, SIGTERM included); then ``check_equivalence(...,
checkpoint=path, optimizers=(MomentumOptimizer(0.01, 0.9), SGD(0.01, momentum=0.9)),
steps=["resume"], train_steps=--train-steps)``. Not a test. Usage (the load
of the machine sets the times; one net per process keeps memory down):

    PYTHONPATH=$PWD .venv/bin/python benchmarks/zoo_floor.py resnet_v1_50 [--tf-function] [--header]
    PYTHONPATH=$PWD .venv/bin/python benchmarks/zoo_floor.py resnet_v1_50 --step resume [--train-steps 3]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MOMENTUM = 0.9
LEARNING_RATE = 0.01
AUX_WEIGHT = 0.4


def machine_line() -> str:
    """CPU model, its AVX-512 and AMX flags, cores, load average, versions."""
    cpu, flags = platform.processor() or platform.machine(), []
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
        cpu = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
        found = next(line.split(":", 1)[1].split() for line in lines if line.startswith("flags"))
        flags = sorted(flag for flag in set(found) if flag.startswith(("avx512", "amx")))
    except (OSError, StopIteration):
        pass
    import numpy as np
    import tensorflow as tf
    shown = ", ".join(flags) if flags else "no AVX-512, no AMX"
    return (f"{cpu} ({shown}); {os.cpu_count()} cores; Python {platform.python_version()}, "
            f"TensorFlow {tf.__version__}, NumPy {np.__version__}")


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _number(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return "0" if x == 0 else f"{x:.1e}"


def summarize(step) -> dict:
    """What a row says about one training step's result (its ``noise_floor`` data and leaves)."""
    floor = step.data.get("noise_floor") or {}
    pairs = {name: pair for found in floor.get("steps", ()) for name, pair in found.items()}
    differences = [(leaf.max_abs, leaf.name) for leaf in step.leaves
                   if leaf.values_compared and not math.isnan(leaf.max_abs)]
    largest, leaf = max(differences) if differences else (math.nan, "")
    if largest == 0:
        leaf = ""  # every leaf is bit-identical: no one leaf to name
    rounding = list(floor.get("consistent_with_rounding", ()))
    ratios = [pairs[name][0] / pairs[name][1] for name in rounding
              if name in pairs and pairs[name][0] is not None and pairs[name][1]]
    failed = [leaf.name for leaf in step.leaves if leaf.failed]
    return {"status": step.status, "largest": largest, "leaf": leaf,
            "floor_there": pairs.get(leaf, [None, None])[1], "largest_floor": floor.get("largest_floor"),
            "rounding": rounding, "ratio": max(ratios) if ratios else None, "failed": failed,
            "pairs": pairs, "measured": bool(floor)}


def row(name: str, tf_function: bool, step, seconds: float) -> str:
    s = summarize(step)
    leaf = f" (`{s['leaf']}`)" if s["leaf"] else " (every leaf)" if s["largest"] == 0 else ""
    ratio = "-" if s["ratio"] is None else f"{s['ratio']:.3g}"
    cells = [name, "tf.function" if tf_function else "eager", step.name,
             s["status"] if s["measured"] else f"{s['status']} (no floor measured)",
             f"{_number(s['largest'])}{leaf}", _number(s["floor_there"]) if s["leaf"] else "-",
             _number(s["largest_floor"]),
             str(len(s["rounding"])), ratio, str(len(s["failed"])), f"{seconds:.0f}"]
    return "| " + " | ".join(cells) + " |"


def details(step, tolerance_atol: float = 1e-5) -> list:
    """``#`` lines: every leaf over the guide's atol, with its difference and floor."""
    s = summarize(step)
    lines = []
    for name, (difference, level) in sorted(s["pairs"].items()):
        if difference is not None and difference > tolerance_atol:
            verdict = ("consistent with rounding" if name in s["rounding"]
                       else "FAILED" if name in s["failed"] else "within rtol")
            lines.append(f"#   {name}: difference {_number(difference)}, floor {_number(level)} ({verdict})")
    if not s["pairs"]:
        lines.append(f"#   no noise floor data; message: {step.message!r}")
        return lines
    ratios = sorted(((d / f, name, d, f) for name, (d, f) in s["pairs"].items() if d is not None and f),
                    reverse=True)
    zero = [name for name, (d, f) in s["pairs"].items() if f == 0]
    differs_at_zero = [name for name in zero if s["pairs"][name][0]]
    widest = max(((f, name, d) for name, (d, f) in s["pairs"].items() if f is not None), default=None)
    if widest is not None:
        lines.append(f"#   largest floor: {_number(widest[0])} at {widest[1]} (difference {_number(widest[2])})")
    for ratio, name, d, f in ratios[:3]:
        lines.append(f"#   largest difference / floor: {ratio:.3g} at {name} (difference {_number(d)}, "
                     f"floor {_number(f)})")
    lines.append(f"#   leaves: {len(s['pairs'])}; floor 0 at {len(zero)} (of which {len(differs_at_zero)} differ "
                 f"from TF2: {', '.join(differs_at_zero[:5])})")
    return lines


HEADER = ("| model | TF2 side | step | verdict (guide's tolerances + floor) | largest difference (leaf) | its floor "
          "| largest floor | over tolerance, consistent with rounding | largest difference / floor among them "
          "| over tolerance, beyond the floor | seconds |\n|---|---|---|---|---|---|---|---:|---:|---:|---:|")


def write_tf1_checkpoint(net, steps: int, prefix: str) -> str:
    """Train ``net``'s TF1 function ``steps`` Momentum steps (mean square of the
    logits plus the regularization losses) and save every variable, slots and
    global step included; returns the checkpoint path.

    An auxiliary head (inception_v3's ``AuxLogits``) is in the loss with weight
    0.4, as Inception is trained: without it, the head's batch-norm offsets and
    biases get no gradient in TF1, so TF1's Momentum makes no slot for them,
    and ``convert_checkpoint`` refuses a checkpoint that lacks a slot the TF2
    optimizer has ("optimizer state does not convert (3 problems ...)")."""
    import tensorflow as tf
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(0)
        logits, end_points = net.shim().tf1_fn(tf.constant(net.inputs()), True)
        loss = tf.reduce_mean(tf.square(logits))
        if "AuxLogits" in end_points:  # trained as Inception is; see the docstring
            loss += AUX_WEIGHT * tf.reduce_mean(tf.square(end_points["AuxLogits"]))
        loss += tf.add_n(
            v1.get_collection(v1.GraphKeys.REGULARIZATION_LOSSES) or [tf.constant(0.0)])
        with tf.control_dependencies(v1.get_collection(v1.GraphKeys.UPDATE_OPS)):
            train = v1.train.MomentumOptimizer(LEARNING_RATE, MOMENTUM).minimize(
                loss, global_step=v1.train.get_or_create_global_step())
        with v1.Session(graph=graph) as session:
            session.run(v1.global_variables_initializer())
            for _ in range(steps):
                session.run(train)
            return v1.train.Saver().save(session, prefix)


def check_resume(net, tf_function: bool, tf1_steps: int, train_steps: int):
    """The ``resume`` step of zoo net ``net`` (a ``ZooNet``) from a TF1 checkpoint written here, in a
    temporary folder removed on every exit."""
    import tempfile
    import equivtool
    import tensorflow as tf
    from equivtool.engine.signals import sigterm_unwinds
    optimizers = (lambda: tf.compat.v1.train.MomentumOptimizer(LEARNING_RATE, MOMENTUM),
                  lambda: tf.keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM))
    with sigterm_unwinds(), tempfile.TemporaryDirectory(prefix="zoo-floor-") as folder:
        path = write_tf1_checkpoint(net, tf1_steps, os.path.join(folder, "model"))
        report = equivtool.check_equivalence(
            net.shim().tf1_fn, net.shim, net.inputs(), checkpoint=path, optimizers=optimizers,
            steps=["resume"], train_steps=train_steps, tf_function=tf_function, meta={"model": net.name})
    return report


def main(argv=None) -> int:
    from examples.slim_zoo.zoo import ZOO, run
    parser = argparse.ArgumentParser(prog="benchmarks/zoo_floor.py", description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", metavar="NET", help=f"default: all of {', '.join(ZOO)}")
    parser.add_argument("--tf-function", action="store_true", help="call the TF2 side inside tf.function")
    parser.add_argument("--header", action="store_true", help="print the machine line and the table header")
    parser.add_argument("--step", choices=("optimizer", "resume"), default="optimizer",
                        help="optimizer: the zoo's one SGD step; resume: Momentum resumed from a TF1 checkpoint")
    parser.add_argument("--tf1-steps", type=int, default=2, help="resume: TF1 Momentum steps before the checkpoint")
    parser.add_argument("--train-steps", type=int, default=3, help="resume: steps resumed on both sides")
    args = parser.parse_args(argv)
    if args.tf1_steps < 1 or args.train_steps < 1:
        parser.error(f"--tf1-steps, --train-steps: expected ints >= 1, got {args.tf1_steps}, {args.train_steps}")
    unknown = [name for name in args.names if name not in ZOO]
    if unknown:
        parser.error(f"NET: unknown {unknown}; expected names among {', '.join(ZOO)}")
    if args.header:
        print(f"machine: {machine_line()}; load average at start {load()}", flush=True)
        print(HEADER, flush=True)
    passed = True
    for name in args.names or list(ZOO):
        started = time.perf_counter()
        if args.step == "resume":
            report = check_resume(ZOO[name], args.tf_function, args.tf1_steps, args.train_steps)
        else:
            report = run(name, tf_function=args.tf_function, default_tolerances=True, steps=["optimizer"])
        step = report.step(args.step)
        print(row(name, args.tf_function, step, time.perf_counter() - started), flush=True)
        print("\n".join(details(step)), flush=True)
        print(f"# load average after {name}: {load()}", flush=True)
        if step.status != "passed":
            print("\n".join(f"#   note: {note}" for note in step.notes), flush=True)
        passed = passed and step.status == "passed"
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
