"""The old-side program (``check_equivalence(tf1_python=...)``) runs in TensorFlow 1.15 on
Python 3.6+: a static check of its ``tf.`` names against TF 1.x's API list and of its
syntax, as tests/test_exported_recorder.py does for the recorder (it is run for real in
tests/test_tf1_python_side.py, where a TensorFlow 1.15 interpreter exists)."""

from __future__ import annotations

import ast

import pytest

from equivtool.engine.sides import old_python
from test_exported_recorder import imported_modules, tf_names, unknown_names


def source() -> str:
    with open(old_python.PROGRAM, encoding="utf-8") as f:
        return f.read()


def test_the_program_names_only_tf_1_15_symbols():
    names = tf_names(source())
    assert "tensorflow.placeholder" in names and "tensorflow.Session" in names
    assert unknown_names(source()) == []


def test_the_check_catches_a_tf2_only_symbol_in_the_program():
    planted = source() + "\ntf.random.Generator.from_seed(1)\n"
    assert unknown_names(planted) == ["tensorflow.random.Generator.from_seed"]


def test_the_program_parses_as_python_3_6_and_imports_nothing_but_tf_and_numpy():
    tree = ast.parse(source(), feature_version=(3, 6))
    with pytest.raises(SyntaxError):
        ast.parse(source() + "\nif (x := 1):\n    pass\n", feature_version=(3, 6))  # the check can fail
    imported = imported_modules(tree)
    assert imported <= {"importlib", "json", "os", "platform", "sys", "traceback", "numpy", "tensorflow"}, imported
    assert "equivtool" not in imported and "pickle" not in imported
    assert "allow_pickle=True" not in source()


def test_the_program_turns_off_the_same_graph_rewrites_as_equivtool():
    from equivtool._platform import graph_rewrites as _graph_rewrites
    from equivtool.engine.sides import _old_side_program
    assert set(_old_side_program.NUMERIC_PASSES) == set(_graph_rewrites.NUMERIC_PASSES)


def test_the_program_builds_the_default_loss_from_the_same_output():
    from equivtool.engine.sides import _old_side_program
    from equivtool.engine.sides.tf1_side import primary_output
    for outputs in ({"a": 1, "b": 2}, (3, {"x": 4}), [[5, 6]], 7, {"e": (8, 9)}):
        assert _old_side_program.primary_output(outputs) == primary_output(outputs)


def test_structures_cross_in_both_directions():
    import numpy as np

    from equivtool.engine.sides import _old_side_program as program
    inputs = {"ids": np.zeros(2), "pair": (np.ones(1), [np.ones(3)])}
    leaves = program.flatten(inputs)
    description = old_python._describe(inputs)
    assert description == program.describe(inputs)
    rebuilt = program.rebuild(description, list(range(len(leaves))))
    assert rebuilt == old_python._rebuild(description, list(range(len(leaves)))) == {"ids": 0, "pair": (1, [2])}
    with pytest.raises(TypeError, match="a dict key must be a str"):
        program.describe({1: np.zeros(1)})


def test_the_program_knows_the_same_stateful_random_ops_as_equivtool():
    from equivtool.engine.sides import _old_side_program, tf1_graph_reading as tf1_graph
    assert _old_side_program._STATEFUL_RANDOM_OPS == tf1_graph.STATEFUL_RANDOM_OPS
