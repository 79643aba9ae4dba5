"""The environment fix that importing equivtool applies (fresh interpreters)."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

import equivtool
from equivtool._platform import env as _env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_fresh(code: str, env_update=None, drop=("TF_USE_LEGACY_KERAS",)):
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    env.update(env_update or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=240)


def test_slim_batch_norm_and_shim_work_after_import_in_fresh_interpreter():
    result = run_fresh("""
        import os
        import equivtool
        assert os.environ["TF_USE_LEGACY_KERAS"] == "1"
        import tensorflow as tf, tf_slim as slim
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [1, 6, 6, 2])
            slim.batch_norm(slim.conv2d(x, 3, 3), scale=True)
            assert len(tf.compat.v1.global_variables()) == 6

        class Shim(tf.keras.layers.Layer):
            @tf.compat.v1.keras.utils.track_tf1_style_variables
            def call(self, x):
                y = slim.batch_norm(slim.conv2d(x, 3, 3, scope="c"), scale=True, is_training=False)
                return slim.fully_connected(slim.flatten(y), 2, scope="fc")
        layer = Shim()
        out = layer(tf.ones([1, 6, 6, 2]))
        assert out.shape == (1, 2), out.shape
        assert sorted(v.name for v in layer.variables)[0] == "BatchNorm/beta:0"
        assert tf.compat.v1.keras.utils.DeterministicRandomTestTool is not None
        print("OK", type(tf.keras.layers.Layer).__module__)
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "OK" in result.stdout


def test_tensorflow_imported_first_with_keras3_raises_with_instructions():
    result = run_fresh("""
        import tensorflow as tf
        tf.keras.layers  # resolves tf.keras to Keras 3
        try:
            import equivtool
        except Exception as exc:
            print(type(exc).__name__, exc)
        else:
            print("NO ERROR")
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "EquivtoolEnvironmentError" in result.stdout
    assert "TF_USE_LEGACY_KERAS=1" in result.stdout
    assert "import equivtool" in result.stdout


def test_tensorflow_imported_first_with_variable_set_is_accepted():
    result = run_fresh("""
        import tensorflow as tf
        import equivtool
        print(hasattr(tf.compat.v1.keras.utils, "track_tf1_style_variables"))
    """, env_update={"TF_USE_LEGACY_KERAS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("True")


def test_import_equivtool_does_not_import_tensorflow():
    result = run_fresh("import sys, equivtool; print('tensorflow' in sys.modules)")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "False"


def test_alias_finder_ignores_unrelated_and_existing_names():
    assert _env._FINDER.find_spec("numpy") is None
    assert _env._FINDER.find_spec("tf_keras.src.legacy_tf_layers") is None
    assert _env._FINDER.find_spec("tf_keras.legacy_tf_layers.no_such_module") is None


def test_alias_resolves_to_the_moved_module():
    import importlib
    old = importlib.import_module("tf_keras.legacy_tf_layers.normalization")
    new = importlib.import_module("tf_keras.src.legacy_tf_layers.normalization")
    assert old is new
    assert _env.slim_fix_state() == "aliased"


def test_mismatched_tf_keras_minor_version_is_refused(monkeypatch):
    import tensorflow as tf
    import tf_keras
    minor = int(tf.__version__.split(".")[1])
    other = f"2.{minor - 1 if minor > 16 else minor + 1}.0"  # another declared minor, whatever TF this is
    monkeypatch.setattr(tf_keras, "__version__", other)
    with pytest.raises(equivtool.EquivtoolEnvironmentError,
                       match=rf"tf-keras {re.escape(other)} does not match TensorFlow 2\.{minor}\b"):
        _env.check_versions()


def test_matching_versions_are_reported():
    check = _env.check_versions()
    assert check.tensorflow.split(".")[:2] == check.tf_keras.split(".")[:2]
    assert check.tf_slim == "1.1.0"
