"""examples/slim_zoo/contrib_nets.py: the zoo's smaller nets as they ran, ``tf.contrib.slim.nets`` under TF 1.15.

Here (TensorFlow 2) the module builds the nets from ``tf_slim.nets``, and must
build what the zoo's shim builds (the same scopes and variables), so that the
zoo's TF2 rewrite is the right counterpart. In the TensorFlow 1.15
interpreter (``$EQUIVTOOL_TF1_PYTHON``, skipped without it) alexnet_v2 built
from contrib is checked against the zoo's shim: EQUIVALENT, and NOT EQUIVALENT
with a planted slip in the rewrite's arg scope (another weight decay).
benchmarks/zoo_tf1_python.py runs all three nets on every step.
"""

from __future__ import annotations

import os
import sys

import pytest
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
ZOO_DIR = os.path.join(os.path.dirname(HERE), "examples", "slim_zoo")
sys.path[:0] = [ZOO_DIR]
import contrib_nets  # noqa: E402
from examples.slim_zoo.zoo import ZOO  # noqa: E402

sys.path[:0] = [HERE]
from test_tf1_python_side import tf1_python  # noqa: E402,F401 (the interpreter's fixture: skips without one)


def _variables(fn, size: int) -> list:
    graph = tf.Graph()
    with graph.as_default():
        fn(tf.compat.v1.placeholder(tf.float32, (1, size, size, 3)), True)
        return [(v.name, tuple(v.shape.as_list())) for v in tf.compat.v1.global_variables()]


@pytest.mark.parametrize("name", sorted(contrib_nets.NETS))
def test_each_net_builds_what_the_zoos_shim_builds(name):
    net = ZOO[name]
    mine = _variables(getattr(contrib_nets, name), net.size)
    assert len(mine) > 10 and mine == _variables(net.shim().tf1_fn, net.size)


def test_a_different_net_does_not_build_the_same_variables():
    """The comparison above can fail: two nets' variables differ."""
    assert _variables(contrib_nets.alexnet_v2, 195) != _variables(ZOO["resnet_v1_50"].shim().tf1_fn, 195)


@pytest.mark.parametrize("weight_decay, status", [(None, "passed"), (0.001, "failed")])
def test_alexnet_as_it_ran_against_the_zoos_rewrite(tf1_python, weight_decay, status):
    import equivtool
    from tf_slim.nets import alexnet
    net = ZOO["alexnet_v2"]
    layer = net.shim if weight_decay is None else (
        lambda: equivtool.slim_shim(alexnet.alexnet_v2, lambda: alexnet.alexnet_v2_arg_scope(weight_decay),
                                    num_classes=10))
    report = equivtool.check_equivalence("contrib_nets:alexnet_v2", layer, net.inputs(1), tf1_python=tf1_python,
                                         tf1_path=[ZOO_DIR], steps=["parity", "fixed_weights"])
    assert [step.status for step in report.steps] == ["passed", status], str(report)
    assert report.meta["old_interpreter"]["contrib_imported"] and report.meta["old_ran_under"].startswith(
        "TensorFlow 1.15")
    assert all(leaf.compared > 0 for leaf in report.step("fixed_weights").leaves)
