"""A check with the TF1 side in TensorFlow 1.15 against the same check with ``workers=2`` in-process (issue 37).

Why: the old interpreter is the TF1 worker (``tf1_python``: each step's TF1
side is sent to it from a thread while the TF2 side runs here), so a check
with it should cost about what ``workers=2`` in-process costs, where a worker
process holds the TF1 side: the goal is at most 1.2x. This script runs the
same check both ways, side by side in one process (interleaved, ``--repeat``
times), and prints per check the seconds of each, their ratio, and where the
old interpreter's time went: its start (starting TensorFlow 1.15 and
``tf.contrib``), the requests by kind, the seconds each interpreter was busy
(with ``workers=3`` a second one runs the steps with models of their own), and
the ``.npz`` files that crossed (a value both ends hold crosses as a reference,
in no file). ``--header`` also names the checkout and its commit, so that two
checkouts timed side by side say which is which.

Checks (the inputs, steps and optimizers of each are the same both ways):

* ``contrib``: the contrib example (examples/contrib_tf1: contrib's
  fully_connected, layer_norm and dropout there; the same code on tf-slim
  here), every default step plus 3 SGD steps and a checkpoint;
* ``resnet_v1_50``: the zoo's net at 32 px, batch 1 (``contrib_nets``:
  ``tf.contrib.slim.nets`` there, ``tf_slim.nets`` here), every default step
  plus one SGD step.

Printed first: the machine line (CPU model, AVX-512/AMX flags, cores,
versions) and the load average; the load again after each run. Not a test.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/old_side_timing.py [contrib] [resnet_v1_50] \\
        [--tf1-python PATH] [--repeat N] [--workers-3] [--step-by-step] [--workers-1] [--header]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZOO_DIR = os.path.join(ROOT, "examples", "slim_zoo")
CONTRIB_DIR = os.path.join(ROOT, "examples", "contrib_tf1")
sys.path[:0] = [ROOT, ZOO_DIR, CONTRIB_DIR]

import equivtool  # noqa: E402,F401 (before TensorFlow: the environment fix)
from benchmarks.zoo_floor import load, machine_line  # noqa: E402
from benchmarks.zoo_tf1_python import add_tf1_python, check_arguments  # noqa: E402

CHECKS = ("contrib", "resnet_v1_50")
GOAL = 1.2


def arguments(name: str, old: bool) -> dict:
    """``check_equivalence``'s arguments for check ``name``: with the TF1 side named for
    the old interpreter (``old``), or as the same function imported here."""
    import tensorflow as tf
    if name == "contrib":
        import contrib_tf1_model as model
        inputs = __import__("numpy").random.RandomState(3).standard_normal((4, model.FEATURES)).astype("float32")
        tf1 = ("contrib_tf1_model:model", "contrib_tf1_model:sgd") if old else (model.model, model.sgd)
        return dict(tf1_fn=tf1[0], tf2_layer=lambda: model.Shim(), inputs=inputs, checkpoint=True,
                    optimizers=(tf1[1], lambda: tf.keras.optimizers.SGD(0.1)),
                    steps=None, train_steps=3, **(dict(tf1_path=[CONTRIB_DIR]) if old else {}))
    import contrib_nets
    from examples.slim_zoo.zoo import ZOO
    net = ZOO[name]
    tf1 = (f"contrib_nets:{name}", "contrib_nets:sgd") if old else (getattr(contrib_nets, name), contrib_nets.sgd)
    return dict(tf1_fn=tf1[0], tf2_layer=net.shim, inputs=net.inputs(1), train_steps=1,
                optimizers=(tf1[1], lambda: tf.keras.optimizers.SGD(0.01)),
                **(dict(tf1_path=[ZOO_DIR]) if old else {}))


@contextlib.contextmanager
def request_clock(times: dict, files: list):
    """Time every request to the old interpreter by kind (``times``) and note the size of
    every ``.npz`` that crossed (``files``); the class's methods put back on every exit."""
    from equivtool.engine.sides import old_python
    program = old_python.OldProgram
    original_request, original_send, original_receive = program._request, program.send, program.receive

    def _request(self, op, fields, timeout):
        started = time.perf_counter()
        try:
            return original_request(self, op, fields, timeout)
        finally:
            times[op].append(time.perf_counter() - started)
            # per interpreter (with workers=2 a second one runs the steps with models of their own)
            times[f"(busy: interpreter {self.folder.rsplit('-', 1)[-1]})"].append(time.perf_counter() - started)

    def send(self, name, arrays):
        found = original_send(self, name, arrays)
        files.append(("sent", os.path.getsize(os.path.join(self.folder, found))))
        return found

    def receive(self, answer):
        if answer.get("file") is not None:  # none: every value was held at both ends already
            files.append(("received", os.path.getsize(os.path.join(self.folder, answer["file"]))))
        started = time.perf_counter()
        try:
            return original_receive(self, answer)
        finally:
            times["(reading .npz here)"].append(time.perf_counter() - started)

    program._request, program.send, program.receive = _request, send, receive
    try:
        yield
    finally:
        program._request, program.send, program.receive = original_request, original_send, original_receive


def run_once(name: str, how: str, tf1_python: str) -> tuple:
    """One check: ``how`` is ``old`` (TF1 side in tf1_python, workers=2), ``old/1`` (workers=1),
    ``old/step-by-step`` (workers=2, both sides meeting at every step: the schedule before the
    TF1 thread ran ahead), ``old/3`` (workers=3: the steps with models of their own in a second
    interpreter) or ``in-process`` (workers=2). Returns ``(seconds, report, times, files)``."""
    from equivtool.engine import old_workers
    old = how.startswith("old")
    workers = {"old/1": 1, "old/3": 3}.get(how, 2)
    extra = dict(tf1_python=tf1_python) if old else {}
    times, files = collections.defaultdict(list), []
    schedule = old_workers.run_parallel
    if how == "old/step-by-step":
        old_workers.run_parallel = lambda engine, workers: old_workers._run_step_by_step(engine)
    started = time.perf_counter()
    with request_clock(times, files) if old else contextlib.nullcontext():
        try:
                report = equivtool.check_equivalence(workers=workers, meta={"model": name}, **arguments(name, old),
                                                 **extra)
        finally:
            old_workers.run_parallel = schedule
    return time.perf_counter() - started, report, times, files


def _commit() -> str:
    """The checkout's commit (with "+ changes" when its tracked files differ), so that two runs
    of two checkouts side by side say which is which."""
    import subprocess
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "no git checkout"
    return head + (" + changes" if dirty else "")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/old_side_timing.py", description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", metavar="CHECK", help=f"default: {', '.join(CHECKS)}")
    add_tf1_python(parser)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each way, interleaved (default 1)")
    parser.add_argument("--workers-1", action="store_true", help="also time the old interpreter with workers=1")
    parser.add_argument("--workers-3", action="store_true",
                        help="also time the old interpreter with workers=3 (a second interpreter for the steps "
                             "with models of their own)")
    parser.add_argument("--step-by-step", action="store_true",
                        help="also time the old interpreter with both sides meeting at every step")
    parser.add_argument("--header", action="store_true", help="print the machine line")
    args = parser.parse_args(argv)
    check_arguments(parser, args, CHECKS, "CHECK")
    if args.repeat < 1:
        parser.error(f"--repeat: expected an int >= 1, got {args.repeat}")
    if args.header:
        print(f"machine: {machine_line()}; load average at start {load()}", flush=True)
        print(f"equivtool: {ROOT} at {_commit()}", flush=True)
    ways = ["old", "in-process"] + (["old/1"] if args.workers_1 else []) + (
        ["old/step-by-step"] if args.step_by_step else []) + (["old/3"] if args.workers_3 else [])
    within = True
    for name in args.names or list(CHECKS):
        seconds = collections.defaultdict(list)
        for attempt in range(args.repeat):
            for how in ways if attempt % 2 == 0 else list(reversed(ways)):
                took, report, times, files = run_once(name, how, args.tf1_python)
                seconds[how].append(took)
                print(f"# {name} {how}: {took:.1f} s, {report.verdict}; load average {load()}", flush=True)
                if how.startswith("old"):
                    print(f"#   ran under: {report.meta.get('old_ran_under')}", flush=True)
                    spent = sorted(((sum(v), op, len(v)) for op, v in times.items()), reverse=True)
                    print("#   requests: " + ", ".join(f"{op} {total:.2f} s ({count})" for total, op, count in spent
                                                    if not op.startswith("(busy")), flush=True)
                    print("#   " + ", ".join(f"{op[1:-1]} {total:.1f} s ({count} requests)"
                                             for total, op, count in spent if op.startswith("(busy")), flush=True)
                    sent = sum(size for way, size in files if way == "sent")
                    received = sum(size for way, size in files if way == "received")
                    print(f"#   .npz: {len(files)} files, {sent / 1e6:.2f} MB sent, {received / 1e6:.2f} MB received",
                          flush=True)
                print("#   steps: " + ", ".join(f"{s.name} {s.seconds:.1f}" for s in report.steps), flush=True)
        best = {how: min(values) for how, values in seconds.items()}
        ratio = best["old"] / best["in-process"]
        within = within and ratio <= GOAL
        extra = "".join(f" | {how} {min(seconds[how]):.1f}" for how in ("old/1", "old/step-by-step", "old/3")
                        if how in seconds)
        print(f"| {name} | {best['old']:.1f} | {best['in-process']:.1f} | {ratio:.2f}x "
              f"({'within' if ratio <= GOAL else 'over'} {GOAL}x){extra} | {load()} |", flush=True)
    return 0 if within else 1


if __name__ == "__main__":
    raise SystemExit(main())
