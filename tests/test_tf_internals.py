"""Every private TensorFlow / tf-keras symbol equivtool uses resolves in this TensorFlow.

After a TensorFlow or tf-keras upgrade, a failure here names the symbol that
moved; ``equivtool/_platform/tf_internals.py`` is the one file to fix.
"""

import importlib
import io
import os
import pathlib
import random
import subprocess
import sys
import tokenize

import numpy as np
import pytest

import equivtool  # noqa: F401  (before TensorFlow)
import tensorflow as tf
from equivtool._platform import tf_internals as tfi

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", sorted(tfi.SYMBOLS))
def test_every_symbol_resolves(name):
    try:
        value = tfi.resolve(name)
    except ImportError as exc:
        pytest.fail(f"{name} = {tfi.SYMBOLS[name]} is gone: {exc}")
    missing = [attr for attr in tfi.ATTRIBUTES.get(name, ()) if not hasattr(value, attr)]
    assert not missing, f"{tfi.SYMBOLS[name]} lacks {missing}"


def test_attribute_table_names_only_registered_symbols():
    assert set(tfi.ATTRIBUTES) <= set(tfi.SYMBOLS)


def test_a_missing_symbol_is_named_in_the_error(monkeypatch):
    monkeypatch.setitem(tfi.SYMBOLS, "gone", "tensorflow.python.no_such_module:thing")
    with pytest.raises(ImportError, match=r"'gone' \(tensorflow.python.no_such_module:thing\)"):
        tfi.resolve("gone")
    with pytest.raises(AttributeError, match="no attribute 'never_registered'"):
        tfi.never_registered  # noqa: B018


def test_importing_the_module_imports_nothing():
    code = "import sys, equivtool._platform.tf_internals; sys.exit(1 if 'tensorflow' in sys.modules else 0)"
    done = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_eager_seed_and_generator_are_readable_and_restorable():
    before_seed, before_rng = tfi.eager_global_seed(), tfi.eager_rng()
    try:
        tf.random.set_seed(1234)
        assert tfi.eager_global_seed() == 1234
        rng = tfi.eager_rng()
        assert isinstance(rng, random.Random)
        replacement = random.Random(5)
        tfi.set_eager_rng(replacement)
        assert tfi.eager_rng() is replacement
        sentinel = object()
        assert tfi.eager_rng(sentinel) is replacement
    finally:
        tf.random.set_seed(before_seed)
        if before_rng is not None:
            tfi.set_eager_rng(before_rng)


def test_tf_keras_seed_generator_holder_is_there():
    holder = tfi.keras_seed_generator()
    assert holder is not None, f"{tfi.KERAS_BACKEND}._SEED_GENERATOR is gone"
    assert hasattr(holder, "__dict__")  # the random tool sets and removes .generator on it
    importlib.import_module(tfi.KERAS_LEGACY_TF_LAYERS)


def test_a_dataset_graph_and_an_iterators_dataset_are_readable():
    dataset = tf.data.Dataset.range(3).map(lambda x: x * 2)
    graph = tfi.resolve("GraphDef")()
    serialized = tfi.serialized_dataset_graph(dataset)
    graph.ParseFromString(serialized.numpy())
    assert any(node.op == "MapDataset" for node in graph.node)
    assert isinstance(tfi.iterator_dataset(iter(dataset)), tf.data.Dataset)
    assert tfi.iterator_dataset(object()) is None


def test_a_legacy_optimizer_builds_its_slots_now():
    variable = tf.Variable(np.ones(3, np.float32))
    optimizer = tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9)
    assert tfi.build_legacy_optimizer(optimizer, [variable])
    assert any("momentum" in v.name for v in optimizer.variables())
    assert not tfi.build_legacy_optimizer(object(), [variable])


def test_sessions_and_trackables_are_the_classes_equivtool_checks_for():
    assert isinstance(tf.compat.v1.Session(graph=tf.Graph()), tfi.resolve("BaseSession"))
    assert isinstance(tf.Variable(1.0), tfi.resolve("Trackable"))
    assert isinstance(tfi.resolve("is_op_determinism_enabled")(), bool)


# _platform/tf_internals.py itself is where the symbols live.
_NOT_YET_SWITCHED: set = set()
_PRIVATE_ACCESS = ("from tensorflow.python", "import tensorflow.python", "from tensorflow.core",
                   "import tensorflow.core", "from tf_keras.src", "import tf_keras.src", "._SEED_GENERATOR",
                   "._create_all_weights", "._as_serialized_graph", "._rng", "tf.__internal__",
                   "._save_slice_info")


def private_accesses(source: str) -> list:
    """Lines of code (strings and comments removed) that reach a private TensorFlow symbol."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
              if t.type not in (tokenize.STRING, tokenize.COMMENT)]
    lines: dict = {}
    for token in tokens:
        lines.setdefault(token.start[0], []).append(token.string)
    code = {number: " ".join(parts).replace(" . ", ".").replace(" .", ".").replace(". ", ".")
            for number, parts in lines.items()}
    return [(number, text) for number, text in code.items()
            if any(pattern in text for pattern in _PRIVATE_ACCESS)]


def test_the_scan_finds_a_planted_private_access():
    planted = 'import x\nfrom tensorflow.python.eager import context\n"from tensorflow.python in a string"\n'
    assert [number for number, _ in private_accesses(planted)] == [2]
    assert private_accesses("ctx = c.context()\nseed = ctx._rng  # private\n")


@pytest.mark.parametrize("path", sorted((ROOT / "equivtool").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(ROOT / "equivtool")))
def test_modules_reach_private_symbols_only_through_tf_internals(path):
    if path.relative_to(ROOT / "equivtool").as_posix() == "_platform/tf_internals.py" or path.name in _NOT_YET_SWITCHED:
        return
    found = private_accesses(path.read_text())
    assert not found, f"{path.name}: use equivtool._platform.tf_internals instead: {found}"
