"""Time equivtool's full Inception-ResNet-v2 check against the guide's checks written by hand.

Two variants perform the same checks on the same model configuration
(``parity.model_kwargs()``, 1000 classes) and the same input
(``RandomState(0).uniform(-1, 1)``, as ``parity.run`` makes it):

``equivtool``
    ``examples.inception_resnet_v2.parity.run`` with its default steps:
    variables_once, parity, fixed_weights, random in both modes for inference
    and training, gradients. It must pass.

``plain``
    The same checks the way TensorFlow's guide "Validating correctness &
    numerical equivalence" writes them, with no equivtool engine: for each
    check a fresh ``tf.Graph`` + ``Session`` building the TF1 model and a
    fresh shim layer, tf-keras' own ``DeterministicRandomTestTool`` and
    ``numpy.testing.assert_allclose``. Checks: variables once (second call
    under a ``variable_creator_scope`` guard), parity (names, trainability,
    shapes), fixed weights (every variable set to ``0.001`` as in the guide;
    inference outputs and regularization losses), constant mode inference
    and training, num_random_ops inference and training, gradients of the
    engine's default loss (mean square of the logits plus regularization)
    w.r.t. every trainable variable. Every comparison covers the logits and
    every end point, with equivtool's default tolerance (rtol 1e-6,
    atol 1e-5), and the TF1 session has Grappler's arithmetic optimizer off,
    as the engine's does; the script fails if any comparison fails, so it is
    not a strawman doing less work.

Each variant runs in its own subprocess (its peak RSS is its own); with
``--repeats N`` the order alternates between repeats. Printed: the machine
(CPU model, cores, load average before and after each run), the versions,
each run's wall time of the check (imports excluded), the process wall and
CPU time, peak RSS, and the ratio equivtool / plain (target <= 0.8).
Not a test. Usage:

    .venv/bin/python benchmarks/bench_parity.py [--image-size 299] [--batch-size 1] [--repeats 1]
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
RTOL, ATOL = 1e-6, 1e-5  # equivtool.Tolerance() defaults (the guide's)


# --------------------------------------------------------------------------
# The plain variant: the guide's checks, by hand
# --------------------------------------------------------------------------

def run_plain(image_size: int, batch_size: int) -> dict:
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
    model = make_shim(NUM_CLASSES, **kwargs)
    model(images, training=False)

    def invalid_variable_creator(next_creator, **kw):
        raise ValueError(f"Attempted to create a new variable instead of reusing one: {kw.get('name')}")

    with tf.variable_creator_scope(invalid_variable_creator):
        model(images, training=True)
    del model

    # Step 2: variable counts, names, trainability and shapes match.
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

def run_equivtool(image_size: int, batch_size: int) -> dict:
    import equivtool  # noqa: F401
    from examples.inception_resnet_v2 import parity

    report = parity.run(image_size=image_size, batch_size=batch_size, num_classes=NUM_CLASSES)
    if not report.passed:
        print(report, file=sys.stderr)
        raise AssertionError("equivtool's check did not pass")
    return {"passed": True, "comparisons": sum(len(c) for s in report.steps for c in s.comparisons),
            "steps": {s.name: round(s.seconds, 2) for s in report.steps}}


VARIANTS = {"plain": run_plain, "equivtool": run_equivtool}


def child(variant: str, image_size: int, batch_size: int) -> None:
    """Run one variant in this process and print its result as one tagged JSON line."""
    sys.path.insert(0, ROOT)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    start_cpu = time.process_time()
    imported = time.perf_counter()
    import equivtool  # noqa: F401
    import tensorflow as tf
    tf.get_logger().setLevel("ERROR")
    import_seconds = time.perf_counter() - imported
    start = time.perf_counter()
    result = VARIANTS[variant](image_size, batch_size)
    result.update(variant=variant, seconds=time.perf_counter() - start, import_seconds=import_seconds,
                  cpu_seconds=time.process_time() - start_cpu,
                  peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
    print(RESULT_TAG + json.dumps(result), flush=True)


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


def run_variant(variant: str, image_size: int, batch_size: int) -> dict:
    load_before = os.getloadavg()[0]
    usage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", variant,
                           "--image-size", str(image_size), "--batch-size", str(batch_size)],
                          capture_output=True, text=True, cwd=ROOT)
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image-size", type=int, default=299)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--child", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.image_size, args.batch_size)
        return 0

    print(f"machine: {machine()}")
    print(f"versions: {versions()}")
    print(f"Inception-ResNet-v2, {args.image_size}x{args.image_size}, batch {args.batch_size}, "
          f"{NUM_CLASSES} classes; {args.repeats} repeat(s), order alternating", flush=True)
    header = (f"{'repeat':>6} {'variant':<10} {'check s':>8} {'process s':>9} {'cpu s':>8} "
              f"{'peak RSS MB':>11} {'comparisons':>11} {'load 1m before/after':>21}")
    print(header, flush=True)
    runs = {name: [] for name in VARIANTS}
    for repeat in range(args.repeats):
        order = ("plain", "equivtool") if repeat % 2 == 0 else ("equivtool", "plain")
        for name in order:
            r = run_variant(name, args.image_size, args.batch_size)
            runs[name].append(r)
            print(f"{repeat + 1:>6} {name:<10} {r['seconds']:>8.1f} {r['process_wall']:>9.1f} "
                  f"{r['process_cpu']:>8.1f} {r['peak_rss_mb']:>11.0f} {r['comparisons']:>11} "
                  f"{r['load_before']:>10.2f}/{r['load_after']:<10.2f}", flush=True)
    for r in runs["equivtool"]:
        print(f"equivtool step seconds: {r['steps']}")

    def median(name, key):
        return statistics.median(r[key] for r in runs[name])

    ratio = median("equivtool", "seconds") / median("plain", "seconds")
    print(f"ratio equivtool/plain, check wall time (median): {ratio:.3f}  (target <= 0.8: "
          f"{'met' if ratio <= 0.8 else 'MISSED'})")
    print(f"ratio equivtool/plain, process wall time:       "
          f"{median('equivtool', 'process_wall') / median('plain', 'process_wall'):.3f}")
    print(f"ratio equivtool/plain, process CPU time:        "
          f"{median('equivtool', 'process_cpu') / median('plain', 'process_cpu'):.3f}")
    print(f"peak RSS: equivtool {max(r['peak_rss_mb'] for r in runs['equivtool']):.0f} MB, "
          f"plain {max(r['peak_rss_mb'] for r in runs['plain']):.0f} MB")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
