"""Time equivtool's Inception-ResNet-v2 check against the guide's own code and a plain script.

Three variants check the same model configuration (``parity.model_kwargs()``,
1000 classes) at the same size; each must pass, or the benchmark stops:

``guide`` (the primary baseline)
    TensorFlow's guide "Validating correctness & numerical equivalence"
    (tensorflow/docs, ``site/en/guide/migrate/validate_correctness.ipynb``),
    its steps 1-4 as the notebook's code cells write them, in
    ``benchmarks/_guide_steps.py``: variables created once (its two
    ``variable_creator_scope`` guards), variable parity (counts, names,
    trainability, shapes), fixed weights (every variable assigned 0.001;
    logits and regularization loss), the random tool in ``num_random_ops``
    mode for inference and for training and in ``constant`` mode for training
    through a Keras functional model. Its inputs (``tf.ones``), asserts and
    ``np.testing.assert_allclose`` tolerances are the notebook's; it compares
    the logits and the regularization loss only. By hand: the project's model
    behind the notebook's ``inception_resnet_v2`` / ``InceptionResnetV2``
    names, the ``tf_slim`` alias, and tf-keras' ``DeterministicRandomTestTool``
    for the notebook's copy of it. Before its TF1 sessions it turns
    Grappler's ``arithmetic_optimization`` and ``remapping`` passes off, as the
    notebook's troubleshooting section advises: with TensorFlow's defaults the
    inference cells fail the notebook's ``rtol=1e-07`` on a CPU (fused oneDNN
    kernels in the session, unfused eagerly; ``--guide-default-grappler``
    shows it). ``--guide-constant-inference`` adds a constant-mode inference
    cell, which the notebook does not have.

``equivtool``
    ``examples.inception_resnet_v2.parity.run`` with ``--steps`` (default the
    guide's steps 1-4: variables_once, parity, fixed_weights, random in both
    modes for inference and training) and, with ``--workers N``,
    ``workers=N`` (only where ``run`` accepts it). It compares the logits,
    every end point and the regularization loss, input
    ``RandomState(0).uniform(-1, 1)``.

``plain`` (the earlier baseline)
    The same checks as equivtool's written by hand with no equivtool engine:
    for each check a fresh ``tf.Graph`` + ``Session`` building the TF1 model
    and a fresh shim layer, tf-keras' ``DeterministicRandomTestTool`` and
    ``numpy.testing.assert_allclose`` on the logits and every end point, with
    equivtool's default tolerance (rtol 1e-6, atol 1e-5) and Grappler's
    arithmetic optimizer off as in the engine; random mode covers both modes
    for inference and training; ``gradients`` (in ``--steps``) compares the
    gradients of the engine's default loss. It runs the blocks for the
    selected ``--steps``, so it does the same steps as equivtool.

Each variant runs in its own subprocess, with the order alternating between
repeats (A B C, then C B A). Printed: the machine (CPU model, cores, load
average before and after each run), the versions, each run's wall time of the
check (imports excluded), the process wall and CPU time (the subprocess and
its waited-for descendants), its number of checks (assertions; compared
leaves for equivtool), peak memory, and the ratios equivtool / guide (targets:
wall time <= 0.5, largest process's peak RSS <= 1.0, all processes together
<= 1.5) and equivtool / plain (wall time <= 0.8).

Peak memory of a variant is read inside its subprocess: its own
``ru_maxrss``; ``RUSAGE_CHILDREN``'s ``ru_maxrss`` (the largest of the
descendants it has waited for, not their sum); and, sampled from /proc every
0.25 s, each descendant's ``VmHWM`` (its kernel-kept peak RSS). "largest" is
the maximum of these; "sum" adds the subprocess's own peak to every
descendant's (a process that grows in its last 0.25 s is undercounted by that
growth). Beside those RSS figures (never instead of them) it prints, from
``/proc/<pid>/smaps_rollup`` sampled the same way, the largest process's
peak PSS and the peaks of the PSS and private memory (USS) summed over all
processes at one moment: RSS counts the TensorFlow libraries a worker shares
with its parent in both, PSS once. The "all processes" goal (1.5x) is judged
on summed PSS, the "largest" goal (1.0x) on peak RSS (benchmarks/RESULTS.md,
"Memory against the guide's code"). ``--timeline-dir`` keeps every sample
and when each step was judged. Not a test. Usage:

    .venv/bin/python benchmarks/bench_parity.py [--image-size 299] [--batch-size 1] [--repeats 1]
        [--variants guide,equivtool,plain] [--steps variables_once,parity,fixed_weights,random]
        [--workers N] [--guide-constant-inference] [--guide-default-grappler] [--timeline-dir DIR]
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
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULT_TAG = "BENCH_PARITY_RESULT "
NUM_CLASSES = 1000
RTOL, ATOL = 1e-6, 1e-5  # equivtool.Tolerance() defaults (the plain variant's)
#: The guide's steps 1-4 under equivtool's step names (the default --steps).
GUIDE_STEPS = ("variables_once", "parity", "fixed_weights", "random")
#: examples.inception_resnet_v2.parity.MIN_IMAGE_SIZE (importing it would load TensorFlow here).
MIN_IMAGE_SIZE = 107


# --------------------------------------------------------------------------
# The plain variant: the guide's checks, by hand
# --------------------------------------------------------------------------

def run_plain(image_size: int, batch_size: int, steps: tuple) -> dict:
    import equivtool  # noqa: F401  (environment fix before TensorFlow; nothing else is used)
    import numpy as np
    import tensorflow as tf
    from tensorflow.core.protobuf import rewriter_config_pb2

    from examples.inception_resnet_v2.keras_shim import make_shim, tf1_forward
    from examples.inception_resnet_v2.parity import model_kwargs

    Tool = tf.compat.v1.keras.utils.DeterministicRandomTestTool
    kwargs = model_kwargs()
    images = np.random.RandomState(0).uniform(
        -1, 1, (batch_size, image_size, image_size, 3)).astype(np.float32)
    comparisons = 0

    def session(graph):
        config = tf.compat.v1.ConfigProto()
        config.graph_options.rewrite_options.arithmetic_optimization = rewriter_config_pb2.RewriterConfig.OFF
        return tf.compat.v1.Session(graph=graph, config=config)

    def assert_close(expected, actual, what):
        nonlocal comparisons
        np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL, err_msg=what)
        comparisons += 1

    def assert_outputs_close(tf1_outputs, tf2_outputs, what):
        (tf1_logits, tf1_end_points), (tf2_logits, tf2_end_points) = tf1_outputs, tf2_outputs
        assert list(tf1_end_points) == list(tf2_end_points), what + ": end point names differ"
        for name in tf1_end_points:
            assert_close(tf1_end_points[name], np.asarray(tf2_end_points[name]), f"{what}: {name}")
        assert_close(tf1_logits, np.asarray(tf2_logits), f"{what}: logits")

    def tf1_reg_loss():
        return tf.math.add_n(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES))

    def loss_of(logits, reg):  # the engine's default loss
        return tf.reduce_mean(tf.square(logits)) + reg

    # Step 1: variables are created only once.
    if "variables_once" in steps:
        model = make_shim(NUM_CLASSES, **kwargs)
        model(images, training=False)

        def invalid_variable_creator(next_creator, **kw):
            raise ValueError(f"Attempted to create a new variable instead of reusing one: {kw.get('name')}")

        with tf.variable_creator_scope(invalid_variable_creator):
            model(images, training=True)
        del model

    # Step 2: variable counts, names, trainability and shapes match.
    if "parity" in steps:
        graph = tf.Graph()
        with graph.as_default(), session(graph):
            tf1_forward(tf.constant(images), False, num_classes=NUM_CLASSES, **kwargs)
            tf1_vars = {v.name: (v.trainable, tuple(v.shape.as_list())) for v in tf.compat.v1.global_variables()}
            num_tf1 = len(tf.compat.v1.global_variables())
        model = make_shim(NUM_CLASSES, **kwargs)
        model(images, training=False)
        model(images, training=False)
        tf2_vars = {v.name: (v.trainable, tuple(v.shape.as_list())) for v in model.variables}
        assert num_tf1 == len(model.variables), (num_tf1, len(model.variables))
        assert tf1_vars == tf2_vars, "variable names, trainability or shapes differ"
        comparisons += 1
        del model

    # Step 3: every variable reset to a fixed value; inference outputs and
    # regularization losses match.
    if "fixed_weights" in steps:
        graph = tf.Graph()
        with graph.as_default(), session(graph) as sess:
            outputs = tf1_forward(tf.constant(images), False, num_classes=NUM_CLASSES, **kwargs)
            reg = tf1_reg_loss()
            sess.run(tf.group([v.assign(tf.ones_like(v) * 0.001) for v in tf.compat.v1.global_variables()]))
            tf1_outputs, tf1_reg = sess.run((outputs, reg))
        model = make_shim(NUM_CLASSES, **kwargs)
        model(images, training=False)
        for v in model.variables:
            v.assign(tf.ones_like(v) * 0.001)
        tf2_outputs = model(images, training=False)
        assert_close(tf1_reg, tf.math.add_n(model.losses).numpy(), "fixed weights: regularization loss")
        assert_outputs_close(tf1_outputs, tf2_outputs, "fixed weights")
        del model, tf2_outputs

    # Step 4: the random tool in each mode, inference and training.
    if "random" in steps:
        for mode in ("constant", "num_random_ops"):
            for training in (False, True):
                what = f"{mode} {'training' if training else 'inference'}"
                with Tool(mode=mode).scope():
                    graph = tf.Graph()
                    with graph.as_default(), session(graph) as sess:
                        outputs = tf1_forward(tf.constant(images), training, num_classes=NUM_CLASSES, **kwargs)
                        reg = tf1_reg_loss()
                        updates = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
                        sess.run(tf.compat.v1.global_variables_initializer())
                        tf1_outputs, tf1_reg, _ = sess.run((outputs, reg, updates))
                with Tool(mode=mode).scope():
                    model = make_shim(NUM_CLASSES, **kwargs)
                    tf2_outputs = model(images, training=training)
                    tf2_reg = tf.math.add_n(model.losses).numpy()
                assert_close(tf1_reg, tf2_reg, f"{what}: regularization loss")
                assert_outputs_close(tf1_outputs, tf2_outputs, what)
                del model, tf2_outputs

    # Gradients of the loss w.r.t. every trainable variable (training, constant mode).
    if "gradients" in steps:
        with Tool(mode="constant").scope():
            graph = tf.Graph()
            with graph.as_default(), session(graph) as sess:
                logits, _ = tf1_forward(tf.constant(images), True, num_classes=NUM_CLASSES, **kwargs)
                loss = loss_of(logits, tf1_reg_loss())
                # The auxiliary head does not feed the loss: it gets no gradient (None).
                trainable = tf.compat.v1.trainable_variables()
                pairs = [(v.name, g) for v, g in zip(trainable, tf.gradients(loss, trainable)) if g is not None]
                updates = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
                sess.run(tf.compat.v1.global_variables_initializer())
                tf1_loss, tf1_grads, _ = sess.run((loss, [g for _, g in pairs], updates))
                tf1_grads = {name: value for (name, _), value in zip(pairs, tf1_grads)}
        with Tool(mode="constant").scope():
            model = make_shim(NUM_CLASSES, **kwargs)
            with tf.GradientTape() as tape:
                logits, _ = model(images, training=True)
                loss = loss_of(logits, tf.math.add_n(model.losses))
            grads = tape.gradient(loss, model.trainable_variables)
            tf2_grads = {v.name: g.numpy() for v, g in zip(model.trainable_variables, grads) if g is not None}
        assert_close(tf1_loss, loss.numpy(), "gradients: loss")
        assert sorted(tf1_grads) == sorted(tf2_grads), "gradients: variables differ"
        for name, value in tf1_grads.items():
            assert_close(value, tf2_grads[name], f"gradients: {name}")
    return {"passed": True, "comparisons": comparisons}


# --------------------------------------------------------------------------
# The equivtool variant
# --------------------------------------------------------------------------

def run_equivtool(image_size: int, batch_size: int, steps: tuple, workers: int | None) -> dict:
    import equivtool  # noqa: F401
    from examples.inception_resnet_v2 import parity

    extra = {} if workers is None else {"workers": workers}  # main() checked that run() takes it
    report = parity.run(image_size=image_size, batch_size=batch_size, num_classes=NUM_CLASSES,
                        steps=steps, **extra)
    if not report.passed:
        print(report, file=sys.stderr)
        raise AssertionError("equivtool's check did not pass")
    return {"passed": True, "comparisons": sum(len(c) for s in report.steps for c in s.comparisons),
            "steps": {s.name: round(s.seconds, 2) for s in report.steps},
            "jobs": report.meta.get("worker_jobs", [])}


# --------------------------------------------------------------------------
# The guide variant: the notebook's own code (benchmarks/_guide_steps.py)
# --------------------------------------------------------------------------

def run_guide(image_size: int, batch_size: int, constant_inference: bool, grappler_off: bool) -> dict:
    from benchmarks._guide_steps import run_guide as guide

    return guide(image_size, batch_size, NUM_CLASSES, constant_inference=constant_inference,
                 grappler_off=grappler_off)


VARIANTS = ("guide", "equivtool", "plain")
CHECKS_LABEL = {"guide": "assertions", "plain": "assertions", "equivtool": "compared leaves"}


def run_in_child(variant: str, args: argparse.Namespace) -> dict:
    steps = tuple(args.steps.split(","))
    if variant == "guide":
        return run_guide(args.image_size, args.batch_size, args.guide_constant_inference,
                         not args.guide_default_grappler)
    if variant == "equivtool":
        return run_equivtool(args.image_size, args.batch_size, steps,
                             None if args.workers is None else int(args.workers))
    return run_plain(args.image_size, args.batch_size, steps)


# --------------------------------------------------------------------------
# Memory of the variant's process tree (read from /proc while it runs)
# --------------------------------------------------------------------------

def _status_kib(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _descendants(root: int) -> list:
    """The pids below ``root`` now, from the parent field of every /proc/<pid>/stat."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), ()):
            found.append(pid)
            todo.append(pid)
    return found


def _smaps_kib(pid: int) -> tuple | None:
    """``(Pss, private)`` of ``pid`` in KiB from ``/proc/<pid>/smaps_rollup``, or None.

    Pss (proportional set size) charges each resident page to the processes
    mapping it in equal shares, so PSS summed over processes counts a page that
    two interpreters share (TensorFlow's mapped libraries) once, where RSS counts
    it in both. "private" (Private_Clean + Private_Dirty, USS) is what only
    this process holds: what ending it would give back.
    """
    pss = private = None
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1])
                elif line.startswith(("Private_Clean:", "Private_Dirty:")):
                    private = (private or 0) + int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None if pss is None or private is None else (pss, private)


class TreeMemory:
    """Samples this process and its descendants every ``interval`` seconds from /proc.

    Per descendant it keeps the last ``VmHWM`` read (the kernel's own peak RSS of
    that process, so only growth in its last ``interval`` before exiting is
    missed); it also keeps the largest sampled sum of ``VmRSS`` over the whole
    tree (this process included), i.e. the memory all processes held at once.
    Where ``/proc/<pid>/smaps_rollup`` exists (Linux 4.14+) it keeps, per
    process (this one included), the peak PSS and the peak private memory
    (USS), and the peaks of their sums over the tree: sampled, not kernel-kept,
    so a peak shorter than ``interval`` can be missed. ``timeline`` holds every
    sample as ``(seconds since start, {pid: (rss, pss) KiB})``.
    """

    def __init__(self, interval: float = 0.25):
        import threading

        self.interval = interval
        self.available = os.path.isdir(f"/proc/{os.getpid()}")
        self.smaps = _smaps_kib(os.getpid()) is not None
        self.peak_kib: dict = {}
        self.peak_total_kib = 0
        self.peak_pss_kib: dict = {}       # pid -> its largest sampled Pss
        self.peak_private_kib: dict = {}   # pid -> its largest sampled private (USS)
        self.peak_total_pss_kib = 0        # the largest sampled sum of Pss over the tree
        self.peak_total_private_kib = 0    # the largest sampled sum of private memory over the tree
        self.timeline: list = []
        self.started = time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tree-memory", daemon=True)

    def sample(self) -> None:
        me = os.getpid()
        total = _status_kib(me, "VmRSS") or 0
        point = {me: (total, None)}
        pss_total = private_total = 0
        for pid in [me] + _descendants(me):
            if pid != me:
                hwm, rss = _status_kib(pid, "VmHWM"), _status_kib(pid, "VmRSS")
                if hwm is not None:
                    self.peak_kib[pid] = max(hwm, self.peak_kib.get(pid, 0))
                total += rss or 0
                point[pid] = (rss, None)
            smaps = _smaps_kib(pid) if self.smaps else None
            if smaps is not None:
                pss, private = smaps
                self.peak_pss_kib[pid] = max(pss, self.peak_pss_kib.get(pid, 0))
                self.peak_private_kib[pid] = max(private, self.peak_private_kib.get(pid, 0))
                pss_total += pss
                private_total += private
                point[pid] = (point[pid][0], pss)
        self.peak_total_kib = max(self.peak_total_kib, total)
        self.peak_total_pss_kib = max(self.peak_total_pss_kib, pss_total)
        self.peak_total_private_kib = max(self.peak_total_private_kib, private_total)
        self.timeline.append((round(time.perf_counter() - self.started, 2), point))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> "TreeMemory":
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.available:
            self._stop.set()
            self._thread.join()
            self.sample()


def child(variant: str, args: argparse.Namespace) -> None:
    """Run one variant in this process and print its result as one tagged JSON line."""
    sys.path.insert(0, ROOT)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    start_cpu = time.process_time()
    imported = time.perf_counter()
    import equivtool  # noqa: F401
    import tensorflow as tf
    tf.get_logger().setLevel("ERROR")
    import_seconds = time.perf_counter() - imported
    tree = TreeMemory()
    marks = _mark_steps(variant, tree.started)
    with tree:
        start = time.perf_counter()
        result = run_in_child(variant, args)
        seconds = time.perf_counter() - start
    self_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    children_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
    sampled = [kib / 1024.0 for kib in tree.peak_kib.values()]
    result.update(
        variant=variant, seconds=seconds, import_seconds=import_seconds,
        cpu_seconds=time.process_time() - start_cpu,
        peak_rss_mb=self_mb,  # this process (ru_maxrss)
        children_max_rss_mb=children_mb,  # the largest waited-for descendant (ru_maxrss), 0 if none
        largest_rss_mb=max([self_mb, children_mb] + sampled),
        processes=1 + len(sampled),
        sum_peak_rss_mb=self_mb + sum(sampled) if tree.available else None,
        peak_total_rss_mb=tree.peak_total_kib / 1024.0 if tree.available else None)
    if tree.smaps:
        me = os.getpid()
        result.update(
            largest_pss_mb=max(tree.peak_pss_kib.values()) / 1024.0,
            largest_private_mb=max(tree.peak_private_kib.values()) / 1024.0,
            self_pss_mb=tree.peak_pss_kib.get(me, 0) / 1024.0,
            peak_total_pss_mb=tree.peak_total_pss_kib / 1024.0,
            peak_total_private_mb=tree.peak_total_private_kib / 1024.0,
            peak_at=_peak_at(tree, marks))
    if args.timeline_dir:
        os.makedirs(args.timeline_dir, exist_ok=True)
        name = f"{variant}{'' if args.workers is None else '@' + str(args.workers)}-{os.getpid()}.json"
        with open(os.path.join(args.timeline_dir, name), "w") as f:
            json.dump({"timeline": tree.timeline, "marks": marks, "parent": os.getpid()}, f)
    print(RESULT_TAG + json.dumps(result), flush=True)


def _mark_steps(variant: str, started: float) -> list:
    """``[(seconds since started, step name)]`` as each equivtool step is judged in this
    process (a hook on ``Engine.record``; the guide and plain variants get none)."""
    marks: list = []
    if variant != "equivtool":
        return marks
    from equivtool.engine.run import Engine

    record = Engine.record

    def recorded(self, result, *a, **k):
        marks.append((round(time.perf_counter() - started, 2), getattr(result, "name", "?")))
        return record(self, result, *a, **k)

    Engine.record = recorded
    return marks


def _peak_at(tree: TreeMemory, marks: list) -> str:
    """When the tree's summed PSS peaked, each process's PSS then, and the step judged next."""
    best = max(tree.timeline, key=lambda point: sum(pss or 0 for _, pss in point[1].values()), default=None)
    if best is None:
        return "n/a"
    seconds, point = best
    after = next((name for t, name in marks if t >= seconds), "the end")
    return (f"{seconds:.1f} s: " + ", ".join(f"pid {pid} {(pss or 0) / 1024:.0f} MB"
                                             for pid, (_, pss) in point.items())
            + f" (next step judged: {after})")


# --------------------------------------------------------------------------
# The parent: alternating subprocesses, the machine, the table
# --------------------------------------------------------------------------

def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        with open("/proc/meminfo") as f:
            mem = int(next(line.split()[1] for line in f if line.startswith("MemTotal"))) / 2 ** 20
    except (OSError, StopIteration):
        mem = float("nan")
    return (f"{platform.platform()}; {cpu}; {os.cpu_count()} CPUs; {mem:.0f} GiB RAM; "
            f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def versions() -> str:
    from importlib import metadata

    packages = ("tensorflow", "tf-keras", "tf-slim", "numpy", "equivtool")
    found = []
    for package in packages:
        try:
            found.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            found.append(f"{package} (not installed)")
    return f"Python {platform.python_version()}, " + ", ".join(found)


def _variant_workers(variant: str) -> tuple:
    """``equivtool@2`` -> ``("equivtool", "2")``; other variants -> ``(variant, None)``."""
    name, _, workers = variant.partition("@")
    return name, workers or None


def child_argv(variant: str, args: argparse.Namespace) -> list:
    name, workers = _variant_workers(variant)
    if workers is None and name == "equivtool" and args.workers is not None:
        workers = str(args.workers)  # a single --workers value names no variant
    argv = [sys.executable, os.path.abspath(__file__), "--child", name, "--image-size", str(args.image_size),
            "--batch-size", str(args.batch_size), "--steps", args.steps]
    if workers is not None:
        argv += ["--workers", workers]
    if args.guide_constant_inference:
        argv.append("--guide-constant-inference")
    if args.guide_default_grappler:
        argv.append("--guide-default-grappler")
    if args.timeline_dir:
        argv += ["--timeline-dir", os.path.abspath(args.timeline_dir)]
    return argv


def run_variant(variant: str, args: argparse.Namespace) -> dict:
    load_before = os.getloadavg()[0]
    usage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(child_argv(variant, args), capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = [l for l in proc.stdout.splitlines() if l.startswith(RESULT_TAG)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
        raise SystemExit(f"{variant} failed (exit {proc.returncode})")
    result = json.loads(lines[-1][len(RESULT_TAG):])
    result.update(process_wall=wall, load_before=load_before, load_after=os.getloadavg()[0],
                  process_cpu=(usage.ru_utime - usage_before.ru_utime) + (usage.ru_stime - usage_before.ru_stime))
    return result


def _names(text: str, allowed, option: str) -> tuple:
    names = tuple(n.strip() for n in text.split(","))
    bad = [n for n in names if n not in allowed]
    if not names or bad or len(set(names)) != len(names):
        raise ValueError(f"{option}: expected distinct comma-separated names among {', '.join(allowed)}, "
                         f"got {text!r}")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image-size", type=int, default=299,
                        help=f"image height and width, at least {MIN_IMAGE_SIZE} (default 299)")
    parser.add_argument("--batch-size", type=int, default=1, help="images per batch (default 1)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each variant, order alternating (default 1)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, among {', '.join(VARIANTS)}; run in this order, then reversed "
                             f"(default {','.join(VARIANTS)})")
    parser.add_argument("--steps", default=",".join(GUIDE_STEPS),
                        help="the steps equivtool and plain run (default: the guide's steps 1-4, "
                             f"{','.join(GUIDE_STEPS)}); the guide variant always runs its steps 1-4")
    parser.add_argument("--workers", default=None,
                        help="passed as workers= to examples.inception_resnet_v2.parity.run (default: not passed); "
                             "a comma-separated list (e.g. 1,2) runs the equivtool variant once per value, "
                             "side by side, and prints the scaling table")
    parser.add_argument("--guide-constant-inference", action="store_true",
                        help="add a constant-mode inference cell to the guide (the notebook has none)")
    parser.add_argument("--guide-default-grappler", action="store_true",
                        help="run the guide's TF1 sessions with Grappler's defaults, as the notebook does "
                             "(default: arithmetic_optimization and remapping off, the notebook's advice; "
                             "see benchmarks/_guide_steps.py)")
    parser.add_argument("--timeline-dir", default=None,
                        help="write each run's memory samples (seconds, per-process RSS and PSS) and the "
                             "times its steps were judged as JSON into this folder")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    return parser


def check_args(args: argparse.Namespace) -> tuple:
    """The variants, after checking every option; raises ValueError naming the option."""
    from equivtool.engine.registry import STEPS  # the step registry; does not load TensorFlow

    for option, value, low in (("--image-size", args.image_size, MIN_IMAGE_SIZE), ("--batch-size", args.batch_size, 1),
                               ("--repeats", args.repeats, 1)):
        if value < low:
            raise ValueError(f"{option}: expected an int >= {low}, got {value}")
    variants = _names(args.variants, VARIANTS, "--variants")
    _names(args.steps, STEPS, "--steps")
    if args.workers is not None:
        counts = [w.strip() for w in str(args.workers).split(",")]
        if not all(w.isdigit() and int(w) >= 1 for w in counts) or len(set(counts)) != len(counts):
            raise ValueError(f"--workers: expected an int >= 1 or distinct comma-separated ints, got {args.workers}")
        if "equivtool" not in variants:
            raise ValueError("--workers: applies to the equivtool variant, which --variants leaves out")
        import inspect
        sys.path.insert(0, ROOT)
        from examples.inception_resnet_v2 import parity

        if "workers" not in inspect.signature(parity.run).parameters:
            raise ValueError("--workers: this equivtool has no workers= "
                             "(examples.inception_resnet_v2.parity.run does not accept it)")
        if len(counts) > 1:  # one equivtool variant per worker count, in the variants' order
            expanded = []
            for name in variants:
                expanded += [f"equivtool@{w}" for w in counts] if name == "equivtool" else [name]
            variants = tuple(expanded)
    return variants


def ratio_lines(runs: dict, base: str, wall_target: float, largest_target: float | None,
                sum_target: float | None, e: str = "equivtool") -> list:
    def median(name, key):
        return statistics.median(r[key] for r in runs[name])

    def peak(name, key):
        values = [r[key] for r in runs[name] if r.get(key) is not None]
        return max(values) if values else None

    def verdict(value, target):
        return "" if target is None else f"  (target <= {target}: {'met' if value <= target else 'MISSED'})"

    wall = median(e, "seconds") / median(base, "seconds")
    lines = [f"ratio {e}/{base}, check wall time (median):       {wall:.3f}{verdict(wall, wall_target)}",
             f"ratio {e}/{base}, process wall time (median):     "
             f"{median(e, 'process_wall') / median(base, 'process_wall'):.3f}",
             f"ratio {e}/{base}, process CPU time (median):      "
             f"{median(e, 'process_cpu') / median(base, 'process_cpu'):.3f}"]
    largest = peak(e, "largest_rss_mb") / peak(base, "largest_rss_mb")
    lines.append(f"ratio {e}/{base}, largest process's peak RSS:    {largest:.3f}{verdict(largest, largest_target)}"
                 f"  ({peak(e, 'largest_rss_mb'):.0f} / {peak(base, 'largest_rss_mb'):.0f} MB)")
    if peak(e, "sum_peak_rss_mb") and peak(base, "sum_peak_rss_mb"):
        total = peak(e, "sum_peak_rss_mb") / peak(base, "sum_peak_rss_mb")
        lines.append(f"ratio {e}/{base}, sum of all processes' peaks: {total:.3f}{verdict(total, sum_target)}"
                     f"  ({peak(e, 'sum_peak_rss_mb'):.0f} / {peak(base, 'sum_peak_rss_mb'):.0f} MB)")
    # Beside RSS, never instead of it: PSS counts a page shared by two processes once.
    for key, what, target in (("largest_pss_mb", "largest process's peak PSS:   ", None),
                              ("largest_private_mb", "largest process's peak USS:   ", None),
                              ("peak_total_pss_mb", "peak of all processes' PSS:   ", sum_target),
                              ("peak_total_private_mb", "peak of all processes' USS:   ", None)):
        if peak(e, key) and peak(base, key):
            value = peak(e, key) / peak(base, key)
            lines.append(f"ratio {e}/{base}, {what} {value:.3f}{verdict(value, target)}"
                         f"  ({peak(e, key):.0f} / {peak(base, key):.0f} MB)")
    return lines


def scaling_lines(runs: dict, names: list) -> list:
    """Check time per worker count, and the time on N cores predicted from the worker jobs.

    A job is one side of the constant-mode pair or of one num_random_ops
    comparison; the longest is the critical path. On N cores (a worker per
    job) the check takes about ``max(critical path, sum of jobs / N)`` plus what
    does not shrink (starting workers, judging), read off the run with the most
    workers as its check time minus that same bound at its worker count.
    """
    measured = [(int(_variant_workers(n)[1] or 1), statistics.median(r["seconds"] for r in runs[n]), n)
                for n in names if runs.get(n)]
    if not measured:
        return []
    lines = ["scaling: " + ", ".join(f"workers={w}: {seconds:.1f} s" for w, seconds, _ in sorted(measured))]
    with_jobs = [(w, seconds, n) for w, seconds, n in measured if w > 1 and runs[n][-1].get("jobs")]
    if not with_jobs:
        return lines
    workers, seconds, name = max(with_jobs)
    jobs = runs[name][-1]["jobs"]
    longest = max(jobs, key=lambda job: job["seconds"])
    total = sum(job["seconds"] for job in jobs)
    fixed = max(0.0, seconds - max(longest["seconds"], total / workers))
    lines.append(f"critical path: {longest['seconds']:.1f} s ({longest['side']} side of "
                 f"{', '.join(longest['steps'][:3])}{'...' if len(longest['steps']) > 3 else ''}); "
                 f"sum of {len(jobs)} jobs: {total:.1f} s; fixed cost at workers={workers}: {fixed:.1f} s")
    for cores in (2, 4, 6, 16):
        lines.append(f"predicted on {cores:>2} cores (workers={min(cores, len(jobs))}): "
                     f"{fixed + max(longest['seconds'], total / min(cores, len(jobs))):.1f} s")
    return lines


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args)
        return 0
    try:
        variants = check_args(args)
    except ValueError as exc:
        parser.error(str(exc))

    steps = tuple(args.steps.split(","))
    print(f"machine: {machine()}")
    print(f"versions: {versions()}")
    print(f"Inception-ResNet-v2, {args.image_size}x{args.image_size}, batch {args.batch_size}, "
          f"{NUM_CLASSES} classes; {args.repeats} repeat(s), order alternating")
    print(f"equivtool and plain steps: {', '.join(steps)}"
          + ("" if args.workers is None else f"; equivtool workers={args.workers}"))
    if "guide" in variants:
        print("guide: the notebook's steps 1-4" + (" plus a constant-mode inference cell"
                                                   if args.guide_constant_inference else "")
              + ("; Grappler defaults" if args.guide_default_grappler
                 else "; Grappler's arithmetic_optimization and remapping off"))
        if "equivtool" in variants and set(steps) != set(GUIDE_STEPS):
            print(f"NOTE: equivtool's steps are not the guide's ({','.join(GUIDE_STEPS)}): "
                  "equivtool/guide is not like for like")
    print("peak RSS: 'largest' is the largest process's ru_maxrss (/proc VmHWM for processes still running); "
          "'sum' adds every process's peak, sampled from /proc every 0.25 s", flush=True)
    print("PSS/USS (from /proc/<pid>/smaps_rollup, sampled every 0.25 s): 'PSS' is the largest process's peak "
          "PSS, 'sum PSS' the peak of the PSS summed over all processes at one moment (a page two processes "
          "share counts once), 'sum USS' the same for private memory", flush=True)
    header = (f"{'repeat':>6} {'variant':<12} {'check s':>8} {'process s':>9} {'cpu s':>8} {'largest MB':>10} "
              f"{'sum MB':>8} {'PSS MB':>7} {'sum PSS':>8} {'sum USS':>8} {'procs':>5} {'checks':>7} "
              f"{'load 1m before/after':>21}")
    print(header, flush=True)
    runs = {name: [] for name in variants}
    for repeat in range(args.repeats):
        order = variants if repeat % 2 == 0 else tuple(reversed(variants))
        for name in order:
            r = run_variant(name, args)
            runs[name].append(r)
            total = "n/a" if r["sum_peak_rss_mb"] is None else f"{r['sum_peak_rss_mb']:.0f}"
            pss, sum_pss, sum_uss = (("n/a" if r.get(key) is None else f"{r[key]:.0f}")
                                     for key in ("largest_pss_mb", "peak_total_pss_mb", "peak_total_private_mb"))
            print(f"{repeat + 1:>6} {name:<12} {r['seconds']:>8.1f} {r['process_wall']:>9.1f} "
                  f"{r['process_cpu']:>8.1f} {r['largest_rss_mb']:>10.0f} {total:>8} {pss:>7} {sum_pss:>8} "
                  f"{sum_uss:>8} {r['processes']:>5} "
                  f"{r['comparisons']:>7} {r['load_before']:>10.2f}/{r['load_after']:<10.2f}", flush=True)
    print("checks: " + "; ".join(f"{name}: {CHECKS_LABEL[_variant_workers(name)[0]]}" for name in variants))
    mine = [name for name in variants if _variant_workers(name)[0] == "equivtool"]
    for name in ["guide"] + mine:
        for r in runs.get(name, ()):
            print(f"{name} step seconds: {r['steps']}")
    for name in variants:
        for r in runs[name]:
            if r.get("peak_at"):
                print(f"{name} summed PSS peaked at {r['peak_at']}")
    for name in mine:
        if "guide" in runs:
            for line in ratio_lines(runs, "guide", 0.5, 1.0, 1.5, e=name):
                print(line)
        if "plain" in runs:
            for line in ratio_lines(runs, "plain", 0.8, None, None, e=name):
                print(line)
    for line in scaling_lines(runs, mine):
        print(line)
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
