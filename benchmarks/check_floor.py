"""A check's time against its floor: the bare passes its default steps need (issue 38).

Why: a check's cost should be predictable from the model's own cost. This
script times, in one run on one machine, for each model asked for:

- **the check**: ``check_equivalence(tf1_fn, make_layer, inputs, workers=2)``
  with the default steps (what ``equivtool demo`` runs), in a process of its
  own, imports excluded;
- **the pass floor** (issue 38's definition): the TF1 side built once, one
  graph holding an inference pass and a training pass (the second call
  reuses the first's variables) plus ``tf.gradients`` of the default loss,
  variables initialised, both passes and the gradients run once; and the TF2
  side: one layer, an inference call and a training call under a tape with
  its gradients. The sides run in two processes at the same time, as
  ``workers=2`` runs them; the floor is the longer of the two;
- **the plan floor**: the builds the default steps cannot share without
  changing numbers, run bare. The random tool numbers random ops in program
  order, so a ``num_random_ops`` training pass built after an inference pass
  in the same graph draws other dropout masks (RESULTS.md, "One graph per
  mode?"): that mode needs a graph per pass, and so does the constant-mode
  pair, whose passes the engine builds apart too. The ``fixed_weights`` step
  shares the constant-mode inference build but not its pass (other weights):
  one more inference run of that graph, one more inference call of that
  layer. The plan is four TF1 jobs (constant mode: inference graph, run twice;
  training graph with gradients; ``num_random_ops``: inference graph; training
  graph) and three TF2 jobs (the constant-mode layer's two inference calls and
  its training call with gradients, a layer per ``num_random_ops`` pass), each
  timed alone; the plan floor on two processes is the larger of the longest
  job and half their sum (the fixed values themselves, made and put in place,
  are left out: a floor errs low);
- the work: the check's CPU seconds (both processes) against the sum of the
  fast-build plan's jobs' CPU seconds. On 2 cores the plan floor's "half the
  sum" assumes two jobs at once run as fast as each alone, but a job alone
  already runs its ops on both cores; this ratio says how much more the check
  computes, whatever the scheduling (CPU time also counts TensorFlow's threads
  spinning while they wait for work, on both sides of the ratio);
- both floors again with their TF1 graphs built under the check's own
  graph-building shortcut (``equivtool._platform.graph_building``: the same
  graph, without the quadratic variable hashing of TF1-style layers' builds,
  which is most of a large net's build): the check builds that way, so these
  are the floors of its passes;
- **the side-by-side plan floor** (what the goal of 1.3x is judged against
  since session 12): the fast-build plan's passes, bare, run as the check runs
  them rather than added up. The plan floor above times each job alone in a
  process that has already run other jobs (warm kernels and caches) and
  assumes two jobs at once run as fast as each alone, which no layout reaches
  on 2 cores where a job alone already runs its ops on both. Here two fresh
  processes (imports done before the clock starts, nothing else run: as cold as
  the check's own processes) take the check's six jobs in the check's order
  (the constant-mode pair's TF1 half: its inference graph run twice and its
  training graph with gradients; its TF2 half: one layer, two inference calls
  and a training call under a tape; then each ``num_random_ops`` pass, TF1
  graphs before TF2 layers), each taking the next as soon as it is free. The
  check pays on top of it what a bare run does not: its worker's start
  (imports), the fixed values, the captures and the judging.

Printed: a machine line, then one markdown row per model with both floors
and the check's ratio to each. Usage (one model per run keeps memory down;
``irv2:SIZE`` or a zoo net's name)::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/check_floor.py irv2:299 [--header]
    PYTHONPATH=$PWD .venv/bin/python benchmarks/check_floor.py alexnet_v2 inception_v3 resnet_v1_50

Not a test: the load of the machine sets the times; the ratios are measured
side by side in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))

# One child's work: "check" (its worker started before this child's imports, as the
# commands start theirs) or "check_cold" (started inside the check), "tf1" or "tf1_fast"
# (the one-graph floor, built as the user's code builds it or with the check's
# graph-building shortcut), "tf2", or "plan" (the plan's jobs, one after another, each
# timed, the TF1 jobs both ways). It prints one JSON line.
_CHILD = r"""
import json, os, sys, time
sys.path[:0] = [{root!r}, {here!r}]
import equivtool
kind, model = sys.argv[1], sys.argv[2]
if kind == "check":
    equivtool.start_workers(1)
import numpy as np
import tensorflow as tf
import check_floor
tf1_fn, make_layer, inputs = check_floor.model(model)
if kind == "serve":
    check_floor.serve_jobs(tf1_fn, make_layer, inputs)
    sys.exit(0)
started, cpu = time.perf_counter(), check_floor.cpu_seconds()
if kind in ("check", "check_cold"):
    report = equivtool.check_equivalence(tf1_fn, make_layer, inputs, workers=2)
    result = {{"seconds": time.perf_counter() - started, "verdict": str(report.verdict),
              "cpu": check_floor.cpu_seconds() - cpu}}
elif kind in ("tf1", "tf1_fast"):
    result = {{"seconds": check_floor.tf1_one_graph(tf1_fn, inputs, fast=kind == "tf1_fast")}}
elif kind == "tf2":
    result = {{"seconds": check_floor.tf2_layer_jobs(make_layer, inputs, layers=1)[0]}}
else:
    fast_cpu, tf2_cpu = [], []
    result = {{"tf1": check_floor.tf1_plan(tf1_fn, inputs),
              "tf1_fast": check_floor.tf1_plan(tf1_fn, inputs, fast=True, cpu=fast_cpu),
              "tf2": check_floor.tf2_layer_jobs(make_layer, inputs, layers=3, cpu=tf2_cpu)}}
    result["cpu_fast"] = fast_cpu + tf2_cpu
print("RESULT " + json.dumps(result))
"""


def model(spec: str):
    """``(tf1_fn, make_layer, inputs)`` of ``irv2:SIZE`` or a zoo net."""
    import numpy as np

    if spec.startswith("irv2"):
        import functools

        from examples.inception_resnet_v2 import parity
        from examples.inception_resnet_v2.keras_shim import make_shim, tf1_forward

        size = int(spec.partition(":")[2] or 299)
        images = np.random.RandomState(0).uniform(-1, 1, (1, size, size, 3)).astype(np.float32)
        kwargs = parity.model_kwargs()
        return (functools.partial(tf1_forward, num_classes=1000, **kwargs),
                functools.partial(make_shim, 1000, **kwargs), images)
    from examples.slim_zoo import zoo

    net = zoo.ZOO[spec]
    return net.shim().tf1_fn, net.shim, net.inputs(1)


def _primary(outputs):
    from equivtool.engine.sides.tf1_side import primary_output

    return primary_output(outputs)


def _tf1_loss(tf, out):
    v1 = tf.compat.v1
    reg = v1.losses.get_regularization_losses()
    loss = tf.reduce_mean(tf.square(_primary(out)))
    return loss + (tf.add_n(reg) if reg else 0.0)


def cpu_seconds() -> float:
    """CPU seconds of this process (all its threads) and of its children it has waited for."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _tf1_run(tf1_fn, inputs, passes, fast: bool = False, cpu: list | None = None, runs: int = 1) -> float:
    """Seconds to build ``passes`` (``(training, gradients)`` pairs) in one graph, the
    later ones reusing the first's variables, initialise, and run each ``runs`` times; with
    ``fast``, built under the check's graph-building shortcut
    (``equivtool._platform.graph_building``: the same graph, built faster). Its CPU
    seconds are appended to ``cpu``, if given."""
    import contextlib

    import tensorflow as tf

    from equivtool._platform.graph_building import fast_graph_building

    v1 = tf.compat.v1
    started, cpu_started = time.perf_counter(), cpu_seconds()
    graph = tf.Graph()
    with graph.as_default(), (fast_graph_building() if fast else contextlib.nullcontext()):
        x = v1.placeholder(tf.as_dtype(inputs.dtype), inputs.shape)
        fetches = []
        for i, (training, gradients) in enumerate(passes):
            with v1.variable_scope(v1.get_variable_scope(), reuse=True if i else None):
                out = tf1_fn(x, training=training)
            wanted = [tf.nest.flatten(out)]
            if gradients:
                wanted.append([g for g in v1.gradients(_tf1_loss(tf, out), v1.trainable_variables())
                               if g is not None])
            fetches.append(wanted)
        init = v1.global_variables_initializer()
    with v1.Session(graph=graph) as session:
        session.run(init)
        for wanted in fetches:
            for _ in range(runs):
                session.run(wanted, {x: inputs})
    if cpu is not None:
        cpu.append(cpu_seconds() - cpu_started)
    return time.perf_counter() - started


def tf1_one_graph(tf1_fn, inputs, fast: bool = False) -> float:
    """The pass floor's TF1 side: one graph, both passes, gradients; seconds."""
    return _tf1_run(tf1_fn, inputs, [(False, False), (True, True)], fast)


#: The plan's TF1 graphs, by the check's job that builds them: ``((training, gradients), runs)``
#: each, a graph of its own (the constant-mode inference graph runs twice: its pass and the
#: fixed weights' pass).
TF1_JOBS = {"tf1_pair": (((False, False), 2), ((True, True), 1)),
            "tf1_nro_inference": (((False, False), 1),),
            "tf1_nro_training": (((True, False), 1),)}


def tf1_plan(tf1_fn, inputs, fast: bool = False, cpu: list | None = None) -> list:
    """The plan's four TF1 jobs, each a graph of its own, timed alone (seconds; CPU
    seconds appended to ``cpu``); the first runs twice (constant mode, fixed weights)."""
    return [_tf1_run(tf1_fn, inputs, [job], fast, cpu, runs)
            for graphs in TF1_JOBS.values() for job, runs in graphs]


def tf2_layer_jobs(make_layer, inputs, layers: int, cpu: list | None = None) -> list:
    """TF2 jobs: the first layer's inference call, a second one (the fixed weights'
    pass), a training call under a tape and its gradients; then ``layers - 1`` fresh
    layers with one call each (inference, training). Seconds each (CPU seconds
    appended to ``cpu``). With ``layers=1`` (the pass floor) one inference call."""
    import tensorflow as tf

    times, cpu = [], [] if cpu is None else cpu
    started, cpu_started = time.perf_counter(), cpu_seconds()
    x = tf.constant(inputs)
    if layers > 1:
        _tf2_pair(make_layer, x)
    else:
        make_layer()(x, training=False)
    times.append(time.perf_counter() - started)
    cpu.append(cpu_seconds() - cpu_started)
    for training in (False, True)[:layers - 1]:
        started, cpu_started = time.perf_counter(), cpu_seconds()
        make_layer()(x, training=training)
        times.append(time.perf_counter() - started)
        cpu.append(cpu_seconds() - cpu_started)
    return times


#: The check's jobs in the order its queue holds them (equivtool.engine.workers):
#: the constant-mode pair's halves, then each num_random_ops pass, TF1 before TF2.
SIDE_BY_SIDE_JOBS = ("tf1_pair", "tf2_pair", "tf1_nro_inference", "tf1_nro_training",
                     "tf2_nro_inference", "tf2_nro_training")


def run_job(name: str, tf1_fn, make_layer, inputs) -> None:
    """One of :data:`SIDE_BY_SIDE_JOBS`, bare (TF1 graphs built with the check's shortcut)."""
    if name in TF1_JOBS:
        for job, runs in TF1_JOBS[name]:
            _tf1_run(tf1_fn, inputs, [job], fast=True, runs=runs)
    elif name in ("tf2_pair", "tf2_nro_inference", "tf2_nro_training"):
        import tensorflow as tf
        x = tf.constant(inputs)
        if name == "tf2_pair":
            _tf2_pair(make_layer, x)
        else:
            make_layer()(x, training=name.endswith("training"))
    else:
        raise ValueError(f"job: expected one of {SIDE_BY_SIDE_JOBS}, got {name!r}")


def serve_jobs(tf1_fn, make_layer, inputs, stdin=None, stdout=None) -> None:
    """A side-by-side floor process: says ``READY``, then runs each job named on a
    line of ``stdin`` and answers ``DONE seconds cpu_seconds``, until ``stdin`` ends."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    print("READY", file=stdout, flush=True)
    for line in stdin:
        started, cpu = time.perf_counter(), cpu_seconds()
        run_job(line.strip(), tf1_fn, make_layer, inputs)
        print(f"DONE {time.perf_counter() - started:.4f} {cpu_seconds() - cpu:.4f}", file=stdout, flush=True)


def side_by_side(processes: list, jobs=SIDE_BY_SIDE_JOBS) -> dict:
    """Hand ``jobs`` in order to the serving ``processes`` (each takes the next as
    soon as it is free), timed from when every one is ready until the last job
    ends: ``{"seconds", "cpu", "jobs": [(job, process index, seconds)]}``."""
    import select

    def ended(proc) -> RuntimeError:
        return RuntimeError(f"a side-by-side floor process ended (exit {proc.wait()}):\n{proc.stderr.read()[-3000:]}")

    def answer(proc) -> str:
        line = proc.stdout.readline()
        if not line:
            raise ended(proc)
        return line.strip()

    def hand(index: int) -> None:
        running[index] = queue.pop(0)
        try:
            processes[index].stdin.write(running[index] + "\n")
            processes[index].stdin.flush()
        except BrokenPipeError:  # it ended after saying it was ready
            raise ended(processes[index]) from None

    for proc in processes:
        while answer(proc) != "READY":
            pass
    started, queue, running, done, cpu = time.perf_counter(), list(jobs), {}, [], 0.0
    for index in range(len(processes)):
        if queue:
            hand(index)
    while running:
        ready, _, _ = select.select([processes[i].stdout for i in running], [], [])
        for index in [i for i in list(running) if processes[i].stdout in ready]:
            words = answer(processes[index]).split()
            if words[0] != "DONE":
                continue
            done.append((running.pop(index), index, float(words[1])))
            cpu += float(words[2])
            if queue:
                hand(index)
    seconds = time.perf_counter() - started
    for proc in processes:
        proc.stdin.close()
        proc.wait()
    return {"seconds": seconds, "cpu": cpu, "jobs": done}


def _side_by_side_floor(spec: str) -> dict:
    processes = [_start("serve", spec, stdin=True) for _ in range(2)]
    try:
        return side_by_side(processes)
    finally:
        for proc in processes:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _tf2_pair(make_layer, x) -> None:
    """The constant-mode pair's TF2 half, bare: one layer, two inference calls (the
    second is ``fixed_weights``' pass), a training call under a tape, its gradients."""
    import tensorflow as tf

    layer = make_layer()
    for _ in range(2):
        layer(x, training=False)
    with tf.GradientTape() as tape:
        out = layer(x, training=True)
        loss = tf.reduce_mean(tf.square(_primary(out))) + tf.add_n(layer.losses or [tf.constant(0.0)])
    tape.gradient(loss, layer.trainable_variables)


def _start(kind: str, spec: str, stdin: bool = False) -> subprocess.Popen:
    code = _CHILD.format(root=ROOT, here=HERE)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, "-c", code, kind, spec], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, bufsize=1 if stdin else -1)


def _result(proc: subprocess.Popen, what: str) -> dict:
    out, err = proc.communicate()
    if proc.returncode != 0 or "RESULT " not in out:
        raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n{err[-3000:]}")
    return json.loads(out.rsplit("RESULT ", 1)[1])


def _pass_floor(spec: str, tf1_kind: str) -> float:
    tf1, tf2 = _start(tf1_kind, spec), _start("tf2", spec)
    return max(_result(tf1, f"the TF1 floor of {spec}")["seconds"], _result(tf2, f"the TF2 floor of {spec}")["seconds"])


def plan_floor(jobs) -> float:
    """The plan's jobs on two processes: the longest job, or half their sum if longer."""
    return max(max(jobs), sum(jobs) / 2)


def measure(spec: str) -> dict:
    """The check, the pass floors (both sides at once; TF1 built bare, then with the
    check's graph-building shortcut) and the plan's jobs, one after another."""
    load = os.getloadavg()[0]
    check = _result(_start("check", spec), f"the check of {spec}")
    cold = _result(_start("check_cold", spec), f"the check of {spec} with its worker started inside")
    floor, floor_fast = _pass_floor(spec, "tf1"), _pass_floor(spec, "tf1_fast")
    plan = _result(_start("plan", spec), f"the plan's jobs of {spec}")
    together = _side_by_side_floor(spec)
    return {"side_by_side": together["seconds"], "side_by_side_cpu": together["cpu"],
            "model": spec, "check": check["seconds"], "verdict": check["verdict"], "floor": floor,
            "check_cold": cold["seconds"], "verdict_cold": cold["verdict"], "check_cold_cpu": cold["cpu"],
            "plan_floor": plan_floor(plan["tf1"] + plan["tf2"]), "floor_fast": floor_fast,
            "plan_floor_fast": plan_floor(plan["tf1_fast"] + plan["tf2"]), "tf1_jobs": plan["tf1"],
            "tf1_fast_jobs": plan["tf1_fast"], "tf2_jobs": plan["tf2"], "load": (load, os.getloadavg()[0]),
            "check_cpu": check["cpu"], "plan_cpu_fast": sum(plan["cpu_fast"])}


HEADER = ("| model | check s | pass floor s | check / pass floor | plan floor s | check / plan floor | "
          "fast-build pass floor s | check / it | fast-build plan floor s | check / it | "
          "side-by-side plan floor s | check / it (goal <= 1.3x) | check, worker started inside s | it / floor | "
          "TF1 jobs s | fast-build TF1 jobs s | TF2 jobs s | check CPU s / fast-build jobs' CPU s | "
          "check CPU s / side-by-side CPU s | load 1 min before/after | verdict |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def row(r: dict) -> str:
    jobs = lambda xs: " + ".join(f"{x:.1f}" for x in xs)  # noqa: E731
    ratio = lambda floor: f"{r['check'] / floor:.2f}x"  # noqa: E731
    cold = "" if r["verdict_cold"] == r["verdict"] else f" (started inside: {r['verdict_cold']})"
    return (f"| {r['model']} | {r['check']:.1f} | {r['floor']:.1f} | {ratio(r['floor'])} | "
            f"{r['plan_floor']:.1f} | {ratio(r['plan_floor'])} | {r['floor_fast']:.1f} | {ratio(r['floor_fast'])} | "
            f"{r['plan_floor_fast']:.1f} | {ratio(r['plan_floor_fast'])} | "
            f"{r['side_by_side']:.1f} | {ratio(r['side_by_side'])} | "
            f"{r['check_cold']:.1f} | {r['check_cold'] / r['side_by_side']:.2f}x | {jobs(r['tf1_jobs'])} | "
            f"{jobs(r['tf1_fast_jobs'])} | {jobs(r['tf2_jobs'])} | "
            f"{r['check_cpu']:.1f} / {r['plan_cpu_fast']:.1f} ({r['check_cpu'] / r['plan_cpu_fast']:.2f}x) | "
            f"{r['check_cpu']:.1f} / {r['side_by_side_cpu']:.1f} ({r['check_cpu'] / r['side_by_side_cpu']:.2f}x) | "
            f"{r['load'][0]:.2f}/{r['load'][1]:.2f} | "
            f"{r['verdict']}{cold} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="irv2:SIZE or a zoo net's name (examples/slim_zoo/zoo.py)")
    parser.add_argument("--header", action="store_true", help="print the machine line and the table's header first")
    args = parser.parse_args(argv)
    if args.header:
        sys.path.insert(0, HERE)
        from zoo_floor import machine_line

        print(machine_line())
        print(HEADER)
    for spec in args.models:
        print(row(measure(spec)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
