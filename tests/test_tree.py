"""Structure helpers (equivtool._base.tree) and the two small TF1 mechanisms the runners share."""

import collections
import os
import subprocess
import sys

import numpy as np
import pytest

import equivtool  # noqa: F401  (before TensorFlow)
import tensorflow as tf
from equivtool._base import tree as _tree
from equivtool.engine.sides import tf1_side as runners

Pair = collections.namedtuple("Pair", "left right")


def nested():
    return {"b": [np.float32(1), (np.arange(2), Pair(np.ones(1), None))],
            "a": collections.OrderedDict([("z", np.zeros(3)), ("y", np.full(2, 7))])}


def test_flatten_keeps_insertion_order_not_sorted_keys():
    leaves = _tree.flatten_tensors(nested())
    assert [np.asarray(x).tolist() if x is not None else None for x in leaves] == [
        1.0, [0, 1], [1.0], None, [0.0, 0.0, 0.0], [7, 7]]
    assert _tree.flatten_tensors(5) == [5]


def test_pack_like_inverts_flatten_and_keeps_container_types():
    structure = nested()
    packed = _tree.pack_like(structure, list(range(6)))
    assert list(packed) == ["b", "a"]
    assert isinstance(packed["a"], collections.OrderedDict) and list(packed["a"]) == ["z", "y"]
    assert isinstance(packed["b"][1][1], Pair) and packed["b"][1][1] == Pair(2, 3)
    assert packed["b"][1][0] == 1 and isinstance(packed["b"][1], tuple)
    assert _tree.flatten_tensors(packed) == list(range(6))


def test_pack_like_with_too_few_leaves_raises():
    with pytest.raises(StopIteration):
        _tree.pack_like([1, 2], [1])


def test_to_numpy_converts_tensors_and_keeps_structure():
    converted = _tree.to_numpy({"p": Pair(tf.constant([1.0]), [tf.constant(2)]), "n": None})
    assert isinstance(converted["p"], Pair)
    assert isinstance(converted["p"].left, np.ndarray) and converted["p"].left.tolist() == [1.0]
    assert isinstance(converted["p"].right, list) and converted["p"].right[0] == 2
    assert converted["n"] is None
    assert isinstance(_tree.to_numpy(3.5), np.ndarray)


def test_is_namedtuple():
    assert _tree.is_namedtuple(Pair(1, 2))
    assert not _tree.is_namedtuple((1, 2))
    assert not _tree.is_namedtuple([1, 2])


def test_the_tree_module_imports_no_tensorflow():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = "import sys, equivtool._base.tree, equivtool.comparison; sys.exit(1 if 'tensorflow' in sys.modules else 0)"
    done = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=root),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("name, expected", [
    ("net/w:0", "net/w"), ("net/w:12", "net/w"), ("net/w", "net/w"), ("a:b/c:1", "a:b/c"), ("x:y", "x:y")])
def test_strip_output_index(name, expected):
    assert runners.strip_output_index(name) == expected


def test_load_by_initializer_assigns_without_adding_ops():
    graph = tf.Graph()
    with graph.as_default():
        a = tf.compat.v1.get_variable("a", [2], initializer=tf.compat.v1.zeros_initializer())
        b = tf.compat.v1.get_variable("b", [], initializer=tf.compat.v1.ones_initializer())
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            ops_before = len(graph.get_operations())
            runners.load_by_initializer(session, [(a, np.array([3.0, 4.0], np.float32)),
                                                  (b, np.float32(-1))])
            assert len(graph.get_operations()) == ops_before
            np.testing.assert_array_equal(session.run(a), [3.0, 4.0])
            assert session.run(b) == -1.0
            runners.load_by_initializer(session, [])  # nothing to do: no run, no error
            np.testing.assert_array_equal(session.run(a), [3.0, 4.0])
