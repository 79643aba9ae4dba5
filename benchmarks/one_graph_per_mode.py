"""Would one graph per mode change the numbers? (issue 14's question, measured)

In ``num_random_ops`` mode the random tool seeds each random op by its index
in program order. The engine builds the inference pass and the training pass
of that mode separately (a fresh TF1 graph and a fresh TF2 layer each), as
the guide does. Building both passes in one graph (and calling one layer
twice) would save a graph build and a layer per side; both sides would still
see the same order. This script measures, per model, whether the training
pass then computes the same numbers as a separate build:

* ``TF1 one graph vs separate``: the training outputs of a TF1 graph that
  built the inference pass first, against a graph with the training pass only;
* ``TF2 one layer vs separate``: the same for a layer called for inference first;
* ``one graph: TF1 vs TF2``: whether the two sides still agree with each other.

Usage (not a test; each model builds 4 graphs and 4 layers):

    .venv/bin/python benchmarks/one_graph_per_mode.py [MODEL ...]

MODEL: ``irv2`` (Inception-ResNet-v2, 107 px) or a name of
``examples.slim_zoo.ZOO`` (default: irv2 alexnet_v2 resnet_v1_50 inception_v3).
"""

from __future__ import annotations

import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import equivtool  # noqa: E402  (the environment fix, before TensorFlow)
import numpy as np  # noqa: E402

from equivtool.engine.sides.tf1_side import TF1Side  # noqa: E402
from equivtool.engine.sides.tf2_side import TF2Side  # noqa: E402
from equivtool.seeding import DeterministicRandomTestTool  # noqa: E402
from equivtool.variables import make_renamer  # noqa: E402

RENAMER = make_renamer(None)
MODE = "num_random_ops"


def _model(name: str):
    """``(tf1_fn, make_layer, inputs)``."""
    if name == "irv2":
        from examples.inception_resnet_v2 import keras_shim
        inputs = np.random.RandomState(0).uniform(-1, 1, (1, 107, 107, 3)).astype(np.float32)
        return (functools.partial(keras_shim.tf1_forward, num_classes=10, create_aux_logits=False),
                functools.partial(keras_shim.make_shim, 10, create_aux_logits=False), inputs)
    from examples.slim_zoo.zoo import ZOO
    net = ZOO[name]
    return net.shim().tf1_fn, net.shim, net.inputs()


def _tf1(tf1_fn, inputs, passes):
    side = TF1Side(tf1_fn, inputs, renamer=RENAMER, loss_fn=None,
                   random_tool=DeterministicRandomTestTool(mode=MODE))
    try:
        forwards = [side.forward(training=training) for training in passes]
        last = forwards[-1]
        return side.run(last.outputs, update_ops=last.update_ops)
    finally:
        side.close()


def _tf2(make_layer, inputs, passes):
    with DeterministicRandomTestTool(mode=MODE).scope():
        side = TF2Side(make_layer(), renamer=RENAMER, loss_fn=None)
        for training in passes:
            outputs = side.forward(inputs, training=training)[0]
    return outputs


def _max_diff(a, b) -> float:
    from equivtool._base.tree import flatten_tensors
    left, right = flatten_tensors(a), flatten_tensors(b)
    if len(left) != len(right):
        return float("nan")
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
               for x, y in zip(left, right))


def main(names) -> None:
    print(f"{'model':<14} {'TF1 one graph vs separate':>26} {'TF2 one layer vs separate':>26} "
          f"{'one graph: TF1 vs TF2':>22}")
    for name in names:
        tf1_fn, make_layer, inputs = _model(name)
        tf1_alone, tf1_after = _tf1(tf1_fn, inputs, [True]), _tf1(tf1_fn, inputs, [False, True])
        tf2_alone, tf2_after = _tf2(make_layer, inputs, [True]), _tf2(make_layer, inputs, [False, True])
        print(f"{name:<14} {_max_diff(tf1_alone, tf1_after):>26.3g} {_max_diff(tf2_alone, tf2_after):>26.3g} "
              f"{_max_diff(tf1_after, tf2_after):>22.3g}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["irv2", "alexnet_v2", "resnet_v1_50", "inception_v3"])
