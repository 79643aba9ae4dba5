"""The recorder ``equivtool record-script`` prints runs in TensorFlow 1.15 on Python 3.6+:
a static check of its ``tf.`` names against TF 1.x's API list and of its syntax
(it is run for real, on this TensorFlow through ``tf.compat.v1``, in tests/test_exported.py).
Methods called on TensorFlow objects (``graph.get_operations()``) are not checked: only
``tf.`` names are."""

from __future__ import annotations

import ast
import os

import pytest

from equivtool.exported._record import recorder_source

API_LIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tf115_api_symbols.txt")
# module attributes every TensorFlow release has that API golden files do not list
_DUNDERS = {"tensorflow.__version__"}


def api_symbols() -> set:
    with open(API_LIST, encoding="utf-8") as f:
        return {line.strip() for line in f if line.strip() and not line.startswith("#")}


def tf_names(source: str) -> list:
    """Every ``tf.a.b.c`` attribute chain, as TF 1.x's ``tensorflow.a.b.c`` (``compat.v1.`` dropped)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        parts, current = [], node
        while isinstance(current, ast.Attribute):
            parts.append(current.attr)
            current = current.value
        if isinstance(current, ast.Name) and current.id == "tf":
            names.append(".".join(["tensorflow", *reversed(parts)]))
    longest = [n for n in names if not any(o != n and o.startswith(n + ".") for o in names)]
    return sorted({n.replace("tensorflow.compat.v1.", "tensorflow.", 1) for n in longest})


def unknown_names(source: str) -> list:
    known = api_symbols() | _DUNDERS
    return [name for name in tf_names(source) if name not in known]


def test_the_recorder_names_only_tf_1_15_symbols():
    source = recorder_source()
    names = tf_names(source)
    assert "tensorflow.saved_model.loader.load" in names and "tensorflow.Session" in names
    assert unknown_names(source) == []


def test_the_check_catches_a_tf2_only_symbol():
    # names TensorFlow added after 1.15 (2.8 and 2.4); tf.function and tf.saved_model.load
    # are not among them: TF 1.15 has both.
    planted = recorder_source() + (
        "\ntf.config.experimental.enable_op_determinism()\nnp_api = tf.experimental.numpy\n")
    assert unknown_names(planted) == [
        "tensorflow.config.experimental.enable_op_determinism", "tensorflow.experimental.numpy"]
    assert unknown_names("import tensorflow as tf\ntf.compat.v1.io.gfile.join('a', 'b')\n") == [
        "tensorflow.io.gfile.join"]


def test_the_api_list_is_tf_1_15s_whole_api():
    """The list is TF 1.15's whole API, not the recorder's own names (a check against those
    could not fail): it has TF 1.x-only names the recorder never uses, and lacks TF2's."""
    known = api_symbols()
    assert len(known) > 15000
    assert {"tensorflow.placeholder", "tensorflow.estimator.Estimator", "tensorflow.Session",
            "tensorflow.saved_model.loader.load", "tensorflow.layers.conv2d"} <= known
    assert "tensorflow.estimator.Estimator" not in tf_names(recorder_source())
    assert "tensorflow.random.Generator" not in known


def imported_modules(tree) -> set:
    """The top-level modules a parsed source imports."""
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    return imported


def test_the_recorder_parses_as_python_3_6_and_imports_nothing_but_tf_and_numpy():
    source = recorder_source()
    tree = ast.parse(source, feature_version=(3, 6))
    with pytest.raises(SyntaxError):
        ast.parse("if (x := 1):\n    pass\n", feature_version=(3, 6))  # the check can fail
    imported = imported_modules(tree)
    assert imported <= {"argparse", "importlib", "json", "os", "pkgutil", "platform", "sys", "tempfile",
                        "zipfile", "numpy", "tensorflow"}, imported
    assert "allow_pickle=True" not in source


def test_the_recorder_turns_off_the_same_graph_rewrites_as_equivtool():
    from equivtool._platform import graph_rewrites as _graph_rewrites
    from equivtool.exported import _recorder
    assert set(_recorder.NUMERIC_PASSES) == set(_graph_rewrites.NUMERIC_PASSES)


def test_the_recorder_names_this_equivtool_version():
    import equivtool
    from equivtool.exported import _recorder
    assert _recorder.EQUIVTOOL_VERSION == equivtool.__version__  # a record says which equivtool wrote it


def test_a_record_streams_its_intermediates_one_at_a_time(tmp_path):
    """write_record takes a generator and keeps no value once written (the check can fail:
    a writer that collected the values first keeps them all alive), and the file is
    what np.load reads without pickle."""
    import gc
    import weakref

    import numpy as np

    from equivtool.exported import _recorder
    alive = []

    def values():
        for k in range(5):
            gc.collect()
            alive.append(sum(ref() is not None for ref in refs))
            value = np.full((64, 64), k, np.float32)
            refs.append(weakref.ref(value))
            yield value
            del value

    refs = []
    spec = {"name": "x", "dtype": "float32", "shape": [2], "tensor": "x:0"}
    meta = {"inputs": [spec], "outputs": [dict(spec, name="y", tensor="y:0")]}
    nodes = [{"tensor": f"n{k}:0", "op": f"n{k}", "type": "Relu"} for k in range(5)]
    path = tmp_path / "r.npz"
    _recorder.write_record(path, meta, [{"x": np.ones(2, np.float32)}], [{"y": np.zeros(2, np.float32)}],
                           nodes, values())
    assert alive == [0, 0, 0, 0, 0]
    with np.load(path, allow_pickle=False) as data:
        assert [float(data[f"node/{k}"][0, 0]) for k in range(5)] == [0, 1, 2, 3, 4]
        assert data["batch0/input/0"].tolist() == [1, 1]
    with pytest.raises(_recorder.RecordError, match="4 intermediate values for 5"):
        _recorder.write_record(tmp_path / "s.npz", meta, [{"x": np.ones(2, np.float32)}],
                               [{"y": np.zeros(2, np.float32)}], nodes, (np.zeros(1) for _ in range(4)))
    assert not (tmp_path / "s.npz").exists() and not list(tmp_path.glob(".equivtool-*"))


def test_the_recorder_fetches_intermediates_in_windows():
    import numpy as np
    import tensorflow as tf

    from equivtool.exported import _recorder
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 256])
        tensors = [x * float(k) for k in range(1, 7)]  # 1 KiB each per row
        runs = []
        with tf.compat.v1.Session(graph=graph) as session:
            real_run = session.run

            def run(fetches, feed_dict):
                runs.append(len(fetches))
                return real_run(fetches, feed_dict=feed_dict)

            session.run = run
            values = list(_recorder.fetch_in_windows(session, tensors, {x: np.ones([1, 256])}, 2048))
    assert runs == [2, 2, 2]
    assert [float(v[0, 0]) for v in values] == [1, 2, 3, 4, 5, 6]
