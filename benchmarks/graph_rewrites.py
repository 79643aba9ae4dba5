"""Which of Grappler's passes change a model's numbers (issue: one verdict on every machine).

For each model, the TF1 inference graph runs with fixed weights (the
``fixed_weights`` step's values) in one session per configuration:

- ``as_written``: every pass of ``equivtool._platform.graph_rewrites.NUMERIC_PASSES`` off
  (equivtool's default);
- ``+PASS``: as written, with that one pass back at TensorFlow's default;
- ``tensorflow_default``: TensorFlow's defaults (every pass on).

Each configuration's outputs are compared with the TF2 shim's, called eagerly
with the same weights (ops one at a time: what was written), and the table gives
the largest absolute difference over every end point, ``0`` for bitwise equal.
It also lists the fused kernels each configuration executed.

    python benchmarks/graph_rewrites.py [NET ...] [--md]

NETs: the tf_slim.nets zoo names (examples/slim_zoo), ``irv2`` (Inception-ResNet-v2
at 107 px), ``mnist`` (examples/mnist_convnet) and ``algebra`` (hand-written
elementwise algebra with constants, then a dense layer). Default: all.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import equivtool  # noqa: E402,F401  (environment fix first)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from equivtool._platform import graph_rewrites as _graph_rewrites  # noqa: E402
from equivtool.engine.sides import tf1_side as runners  # noqa: E402
from equivtool._platform.tf_internals import RewriterConfig  # noqa: E402


def _zoo(name):
    """(tf1_fn, make_layer, inputs)"""
    from examples.slim_zoo.zoo import ZOO
    net = ZOO[name]
    return net.shim().tf1_fn, net.shim, net.inputs(1)


def _irv2():
    import functools
    from examples.inception_resnet_v2.keras_shim import make_shim, tf1_forward
    from examples.inception_resnet_v2.parity import model_kwargs
    images = np.random.RandomState(0).uniform(-1, 1, (1, 107, 107, 3)).astype(np.float32)
    return (functools.partial(tf1_forward, num_classes=10, **model_kwargs()),
            functools.partial(make_shim, 10, **model_kwargs()), images)


def _mnist():
    from examples.mnist_convnet.keras_model import make_model
    from examples.mnist_convnet.tf1_model import synthetic_batch, tf1_forward
    return tf1_forward, make_model, synthetic_batch(8, 0)[0]


def _algebra():
    """Elementwise algebra of the kind TF1 code writes by hand (normalising by constants,
    scaling twice, summing terms): the patterns the arithmetic optimizer and constant
    folding rewrite."""
    import tf_slim as slim

    def tf1_fn(inputs, training):
        scale = tf.constant(0.1) * tf.constant(7.0)          # a product of constants
        net = inputs / 3.0                                   # division by a constant
        net = net * 0.37 * 5.3                               # a chain of constant factors
        net = net * net + 2.0 * net + net                    # a common factor
        net = slim.fully_connected(net, 16, activation_fn=tf.nn.tanh, scope="fc")
        return {"net": net * scale, "sum": tf.add_n([net, net * 2.0, net / 7.0])}

    class Layer(tf.keras.layers.Layer):
        @tf.compat.v1.keras.utils.track_tf1_style_variables
        def call(self, inputs, training=None):
            return tf1_fn(inputs, bool(training))
    inputs = np.random.RandomState(0).uniform(-3, 3, (64, 32)).astype(np.float32)
    return tf1_fn, Layer, inputs


def models() -> dict:
    from examples.slim_zoo.zoo import ZOO
    found = {name: (lambda name=name: _zoo(name)) for name in ZOO}
    found["irv2"] = _irv2
    found["mnist"] = _mnist
    found["algebra"] = _algebra
    return found


def configs() -> dict:
    passes = _graph_rewrites._known_passes()

    def config(on=()):
        c = tf.compat.v1.ConfigProto()
        for name in passes:
            if name not in on:
                setattr(c.graph_options.rewrite_options, name, RewriterConfig.OFF)
        return c
    found = {"as_written": config()}
    found.update({f"+{name}": config(on=(name,)) for name in passes})
    found["tensorflow_default"] = tf.compat.v1.ConfigProto()
    return found


def measure(tf1_fn, make_layer, inputs) -> dict:
    """{config: (max abs difference from the eager TF2 side, fused kernel types)}."""
    layer = make_layer()
    graph = tf.Graph()
    with graph.as_default():
        placeholder = tf.compat.v1.placeholder(tf.float32, inputs.shape)
        outputs = tf.nest.flatten(tf1_fn(placeholder, False))
        variables = tf.compat.v1.global_variables()
        written = _graph_rewrites.written_types(graph.as_graph_def())
    values = {runners.strip_output_index(v.name): runners.fixed_value(runners.strip_output_index(v.name),
                                                                       v.shape, v.dtype) for v in variables}
    layer(tf.convert_to_tensor(inputs), training=False)
    for variable in layer.variables:
        variable.assign(values[runners.strip_output_index(variable.name)])
    eager = [np.asarray(t) for t in tf.nest.flatten(layer(tf.convert_to_tensor(inputs), training=False))]
    results = {}
    for name, config in configs().items():
        with tf.compat.v1.Session(graph=graph, config=config) as session:
            runners.load_by_initializer(session, [(v, values[runners.strip_output_index(v.name)])
                                                  for v in variables])
            kernels = _graph_rewrites.session_kernels(session, outputs, {placeholder: inputs})
            got = session.run(outputs, {placeholder: inputs})
        error = max(float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
                    for a, b in zip(got, eager))
        fused = sorted(set(_graph_rewrites.fused_kernels(kernels, written).values()))
        results[name] = (error, fused)
    return results


def machine() -> str:
    cpu = _graph_rewrites.cpu()
    return (f"{cpu['model']} ({', '.join(cpu['isa'])}), {os.cpu_count()} cores, oneDNN "
            f"{'on' if _graph_rewrites.onednn_enabled() else 'off'}, TensorFlow {tf.__version__}, "
            f"Python {platform.python_version()}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*")
    args = parser.parse_args(argv)
    found = models()
    names = args.names or list(found)
    names_of_configs = list(configs())
    print(f"# graph rewrites: max abs difference from the eager TF2 side, fixed weights, inference")
    print(f"# machine: {machine()}")
    print("| model | " + " | ".join(names_of_configs) + " | fused kernels under tensorflow_default |")
    print("|---|" + "---|" * (len(names_of_configs) + 1))
    for name in names:
        started = time.perf_counter()
        results = measure(*found[name]())
        cells = ["0" if results[c][0] == 0 else f"{results[c][0]:.1e}" for c in names_of_configs]
        print(f"| {name} | " + " | ".join(cells) + f" | {', '.join(results['tensorflow_default'][1])} |",
              flush=True)
        leftover = results["as_written"][1]
        if leftover:
            print(f"<!-- {name}: as_written still ran {leftover} -->")
        print(f"<!-- {name}: {time.perf_counter() - started:.0f}s -->", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
