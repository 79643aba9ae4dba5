"""The zoo's smaller nets with their TF1 side as it ran: TensorFlow 1.15's ``tf.contrib.slim.nets`` (issue 37).

Why: the zoo table (RESULTS.md) checks every ``tf_slim.nets`` net with the
TF1 side run through ``tf.compat.v1`` inside TensorFlow 2. A migration must
match the net as it ran, in TensorFlow 1.15, whose kernels are not 2.x's.
This script checks alexnet_v2, inception_v1 and resnet_v1_50 (the zoo's
smallest input, batch 1, every default step plus one SGD step) twice against
the zoo's TF2 rewrite (``zoo.ZOO[name].shim``): with the TF1 side in the old
interpreter (``tf1_python``, the net named ``"contrib_nets:NAME"``, built from
``tf.contrib.slim.nets`` there) and in-process (the same function, built from
``tf_slim.nets`` here). Per net and step it prints a row:

    net | step | verdict (old) | verdict (in-process) | largest difference (leaf), old |
    largest difference (leaf), in-process | old / in-process | seconds old | seconds in-process

With ``--kernel-floor`` each net is checked once, with the TF1 side in the
old interpreter and ``kernel_floor=True`` (equivtool.engine.kernel_floor),
and a row per step says the verdict, the largest difference, that leaf's
kernel floor, their ratio, the largest ratio over the step's leaves and the
seconds (:data:`KERNEL_HEADER`).

Both runs use the guide's tolerances (the zoo states none for these nets).
Printed first: the machine line (CPU model, AVX-512/AMX flags, cores,
versions here) and what the old side ran under; the load average before and
after each net. Not a test. One net per process keeps memory down:

    EQUIVTOOL_TF1_PYTHON=~/.cache/equivtool/tf1-env-1.15/bin/python \\
        PYTHONPATH=$PWD .venv/bin/python benchmarks/zoo_tf1_python.py resnet_v1_50 [--header]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZOO_DIR = os.path.join(ROOT, "examples", "slim_zoo")
sys.path[:0] = [ROOT, ZOO_DIR]

import equivtool  # noqa: E402,F401 (before TensorFlow: the environment fix)
from benchmarks.zoo_floor import load, machine_line  # noqa: E402

NETS = ("alexnet_v2", "inception_v1", "resnet_v1_50")
HEADER = ("| net | step | verdict, TF 1.15 | verdict, in-process | largest difference (leaf), TF 1.15 "
          "| largest difference (leaf), in-process | TF 1.15 / in-process | seconds, TF 1.15 | seconds, in-process |"
          "\n|---|---|---|---|---|---|---:|---:|---:|")


KERNEL_HEADER = ("| net | step | verdict | largest difference (leaf) | its kernel floor | difference / floor "
                 "| largest difference / floor (leaf) | seconds |\n|---|---|---|---|---:|---:|---|---:|")


def largest(step) -> tuple:
    """``(max abs difference, leaf)`` over the step's compared leaves; ``(nan, "")`` when none."""
    found = [(leaf.max_abs, leaf.name) for leaf in step.leaves
             if leaf.values_compared and not math.isnan(leaf.max_abs)]
    return max(found) if found else (math.nan, "")


def _number(x: float) -> str:
    return "n/a" if math.isnan(x) else "0" if x == 0 else f"{x:.1e}"


def _ratio(a: float, b: float) -> str:
    if math.isnan(a) or math.isnan(b):
        return "n/a"
    if b == 0:
        return "1" if a == 0 else "inf (in-process 0)"
    return f"{a / b:.3g}"


def _cell(difference: tuple) -> str:
    value, leaf = difference
    return f"{_number(value)} (`{leaf}`)" if leaf and value else _number(value)


def rows(name: str, old, here) -> list:
    """One markdown row per step of ``old`` (the report with the TF1 side in TF 1.15)."""
    lines = []
    for step in old.steps:
        mine = here.step(step.name)
        a, b = largest(step), largest(mine)
        lines.append(f"| {name} | {step.name} | {step.status} | {mine.status} | {_cell(a)} | {_cell(b)} | "
                     f"{_ratio(a[0], b[0])} | {step.seconds:.1f} | {mine.seconds:.1f} |")
    return lines


def floors(step) -> dict:
    """``{leaf: (difference, floor)}`` of the step's kernel floor (the last step's value
    where the step compares several; where the step passed on its routed kinks,
    equivtool.engine.kinks, the routed values' floors); empty without one."""
    found = {}
    judged = (step.data.get("kink_floor") or {}).get("routed") if step.status == "passed" else None
    for row in (judged or step.data.get("kernel_floor") or {}).get("steps", []):
        for leaf, (difference, floor) in row.items():
            found[leaf] = (math.nan if difference is None else difference, math.nan if floor is None else floor)
    return found


def kernel_rows(name: str, report) -> list:
    """One markdown row per step of ``report`` (checked with ``kernel_floor=True``)."""
    lines = []
    for step in report.steps:
        value, leaf = largest(step)
        by_leaf = floors(step)
        floor = by_leaf.get(leaf, (math.nan, math.nan))[1]
        ratios = [(d / f, name_) for name_, (d, f) in by_leaf.items() if f and math.isfinite(f) and math.isfinite(d)]
        worst = max(ratios) if ratios else (math.nan, "")
        lines.append(f"| {name} | {step.name} | {step.status} | {_cell((value, leaf))} | {_number(floor)} | "
                     f"{_ratio_of(value, floor)} | {_ratio_of(worst[0], 1.0)}"
                     + (f" (`{worst[1]}`)" if worst[1] else "") + f" | {step.seconds:.1f} |")
    return lines


def _ratio_of(a: float, b: float) -> str:
    if math.isnan(a) or math.isnan(b) or b == 0:
        return "n/a"
    return f"{a / b:.3g}"


def check(name: str, tf1_python: str | None, kernel_floor: bool = False):
    """The zoo's check of ``name`` (every default step, one SGD step), the TF1 side in
    ``tf1_python`` (None: in-process), with the kernel floor when asked;
    ``(report, seconds)``."""
    import tensorflow as tf
    import contrib_nets
    from examples.slim_zoo.zoo import ZOO
    net = ZOO[name]
    tf2 = lambda: tf.keras.optimizers.SGD(0.01)  # noqa: E731
    if tf1_python:
        arguments = dict(tf1_fn=f"contrib_nets:{name}", optimizers=("contrib_nets:sgd", tf2),
                         tf1_python=tf1_python, tf1_path=[ZOO_DIR], kernel_floor=kernel_floor)
    else:
        arguments = dict(tf1_fn=getattr(contrib_nets, name), optimizers=(contrib_nets.sgd, tf2))
    started = time.perf_counter()
    report = equivtool.check_equivalence(tf2_layer=net.shim, inputs=net.inputs(1), train_steps=1,
                                         meta={"model": name}, **arguments)
    return report, time.perf_counter() - started


def add_tf1_python(parser: argparse.ArgumentParser) -> None:
    """``--tf1-python`` (default ``$EQUIVTOOL_TF1_PYTHON``); also benchmarks/old_side_timing.py's."""
    parser.add_argument("--tf1-python", default=os.environ.get("EQUIVTOOL_TF1_PYTHON"),
                        help="the TensorFlow 1.15 interpreter (default: $EQUIVTOOL_TF1_PYTHON)")


def check_arguments(parser: argparse.ArgumentParser, args, known, metavar: str) -> None:
    """The names among ``known`` and an interpreter given, or the parser's one-line error."""
    unknown = [name for name in args.names if name not in known]
    if unknown:
        parser.error(f"{metavar}: unknown {unknown}; expected names among {', '.join(known)}")
    require_tf1_python(parser, args)


def require_tf1_python(parser: argparse.ArgumentParser, args) -> None:
    """An interpreter given (``--tf1-python`` or ``$EQUIVTOOL_TF1_PYTHON``), or the parser's one-line error."""
    if not args.tf1_python:
        parser.error("--tf1-python: expected the path of a TensorFlow 1.15 interpreter "
                     "(or set EQUIVTOOL_TF1_PYTHON; make one with: equivtool tf1-env DIR)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/zoo_tf1_python.py", description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", metavar="NET", help=f"default: all of {', '.join(NETS)}")
    add_tf1_python(parser)
    parser.add_argument("--header", action="store_true", help="print the machine line and the table header")
    parser.add_argument("--kernel-floor", action="store_true",
                        help="check once, the TF1 side there with kernel_floor=True (no in-process run)")
    args = parser.parse_args(argv)
    check_arguments(parser, args, NETS, "NET")
    if args.header:
        print(f"machine: {machine_line()}", flush=True)
        print(KERNEL_HEADER if args.kernel_floor else HEADER, flush=True)
    if args.kernel_floor:
        return kernel_main(args.names or list(NETS), args.tf1_python)
    passed = True
    for name in args.names or list(NETS):
        print(f"# {name}: load average at start {load()}", flush=True)
        old, old_seconds = check(name, args.tf1_python)
        here, here_seconds = check(name, None)
        print(f"# old side ran under: {old.meta.get('old_ran_under')}", flush=True)
        print("\n".join(rows(name, old, here)), flush=True)
        print(f"# {name}: verdict TF 1.15 {old.verdict}; in-process {here.verdict}; "
              f"{old_seconds:.0f} s and {here_seconds:.0f} s; load average at end {load()}", flush=True)
        for step in old.steps:
            if step.status != "passed":
                print(f"#   {step.name}: {step.message}", flush=True)
                print("\n".join(f"#     note: {note}" for note in step.notes), flush=True)
        passed = passed and old.passed
    return 0 if passed else 1


def kernel_main(names: list, tf1_python: str) -> int:
    """``--kernel-floor``: each net checked once with the kernel floor, its rows printed."""
    passed = True
    for name in names:
        print(f"# {name}: load average at start {load()}", flush=True)
        report, seconds = check(name, tf1_python, kernel_floor=True)
        print(f"# old side ran under: {report.meta.get('old_ran_under')}", flush=True)
        print("\n".join(kernel_rows(name, report)), flush=True)
        print(f"# {name}: verdict {report.verdict}; {seconds:.0f} s; load average at end {load()}", flush=True)
        for step in report.steps:
            if step.status != "passed" or step.data.get("kernel_floor"):
                print(f"#   {step.name}: {step.status}: {step.message}", flush=True)
                print("\n".join(f"#     note: {note}" for note in step.notes), flush=True)
        passed = passed and report.passed
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
