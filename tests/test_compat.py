"""The tf-slim repairs of the import-time fix: what they do, and that they do nothing where things work."""

import os
import subprocess
import sys

import equivtool  # noqa: F401
import numpy as np
import tensorflow as tf
import tf_slim as slim

from equivtool import _compat
from equivtool._compat import _tf_slim

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _states():
    return {r.name: r.state for r in _compat.repairs()}


def test_every_repair_is_recorded_with_a_state():
    states = _states()
    assert set(states) == {"moved TensorFlow symbols", "collection membership by identity",
                           "eager name scopes for outputs_collections"}
    assert all(state in ("applied", "not needed") for state in states.values()), states


def test_repairs_are_no_ops_once_things_work():
    # Run again now that everything is repaired: each probe finds nothing to do.
    again = {r.name: r.state for r in _tf_slim.apply()}
    assert set(again.values()) == {"not needed"}, again


def test_moved_symbols_point_at_the_new_homes():
    from tensorflow.python.framework import ops, tensor
    from tensorflow.python.ops import array_ops, array_ops_stack
    assert ops.Tensor is tensor.Tensor
    assert array_ops.unstack is array_ops_stack.unstack


def test_batch_norm_without_updates_collection_works_eagerly_and_in_a_graph():
    # The first symptom: utils.constant_value used ops.Tensor.
    x = np.random.RandomState(0).rand(2, 4, 4, 3).astype(np.float32)
    with tf.Graph().as_default():
        y = slim.batch_norm(tf.constant(x), updates_collections=None, is_training=True)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            assert session.run(y).shape == x.shape


def test_identity_membership_and_eager_name_scopes_in_eager_slim_layers():
    with tf.compat.v1.variable_scope("probe_net"):
        net = slim.conv2d(tf.zeros([1, 8, 8, 3]), 2, [3, 3], scope="conv", variables_collections=["extra"],
                          outputs_collections=["probe_end_points"])
        pooled = slim.max_pool2d(net, [2, 2], scope="pool", outputs_collections=["probe_end_points"])
    assert pooled.aliases == ["probe_net/pool"]
    tf.compat.v1.get_default_graph().clear_collection("probe_end_points")


def test_tf_slim_imported_before_equivtool_is_repaired_at_once():
    code = ("import os; os.environ['TF_USE_LEGACY_KERAS'] = '1'\n"
            "import tf_slim\n"
            "from tensorflow.python.framework import ops\n"
            "import equivtool\n"
            "from equivtool import _compat\n"
            "print(sorted(r.state for r in _compat.repairs()))\n"
            "assert hasattr(ops, 'Tensor')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "applied" in proc.stdout


def test_doctor_lists_the_repairs():
    proc = subprocess.run([sys.executable, "-m", "equivtool.cli", "doctor"], cwd=ROOT, capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)
    assert "tf-slim repairs" in proc.stdout and "moved TensorFlow symbols" in proc.stdout, proc.stdout


def test_importing_tf_slim_leaves_the_runtime_uninitialised():
    # The repairs' probes must not run eager ops at `import tf_slim`: a user
    # configures devices (logical CPUs, GPU memory growth) after importing,
    # and TensorFlow refuses once its runtime is initialised.
    code = (
        "import equivtool, tensorflow as tf, tf_slim\n"
        "cpu = tf.config.list_physical_devices('CPU')[0]\n"
        "tf.config.set_logical_device_configuration(\n"
        "    cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])\n"
        "print(len(tf.config.list_logical_devices('CPU')))\n")
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "2", result.stderr[-2000:]


def test_membership_probe_follows_tensorflows_equality_switch():
    try:
        tf.compat.v1.disable_tensor_equality()
        assert not _tf_slim._membership_is_broken()
    finally:
        tf.compat.v1.enable_tensor_equality()
    assert _tf_slim._membership_is_broken()
