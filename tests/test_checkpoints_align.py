"""A faithful native tf-keras rewrite passes every default step with its proposed mapping (weights aligned); faults still fail."""

import equivtool
import pytest

from tests import checkpoint_models as cm


@pytest.fixture(scope="module")
def mapping():
    return equivtool.map_variables(cm.slim_net, cm.NativeNet, cm.images())


@pytest.mark.parametrize("tf_function", [False, True], ids=["eager", "tf_function"])
def test_native_rewrite_passes_every_default_step(mapping, tf_function):
    report = equivtool.check_equivalence(cm.slim_net, cm.NativeNet, cm.images(), rename=mapping,
                                         tf_function=tf_function)
    assert report.passed, str(report)
    assert [s.name for s in report.steps if s.status == "passed"] == [
        "variables_once", "parity", "fixed_weights", "random/constant/inference", "random/constant/training",
        "random/num_random_ops/inference", "random/num_random_ops/training", "gradients"]
    assert report.meta["weights"].startswith("weights aligned")  # the report says how
    assert any(note.startswith("weights aligned") for note in report.step("random/constant/training").notes)


def test_without_the_mapping_the_same_rules_leave_initializers_compared(mapping):
    # Rules alone (a shim's case) align nothing: the rewrite's initializers draw other numbers.
    report = equivtool.check_equivalence(cm.slim_net, cm.NativeNet, cm.images(), rename=list(mapping.rules),
                                         steps=["fixed_weights", "random", "gradients"], modes=("constant",))
    assert "weights" not in report.meta
    assert report.step("fixed_weights").status == "passed"
    assert report.step("random/constant/inference").status == "failed"
    assert report.step("gradients").status == "failed"


@pytest.mark.parametrize("layer, failing", [
    (lambda: cm.NativeNet(rate=0.5), {"random/constant/training", "random/num_random_ops/training", "gradients"}),
    (lambda: cm.NativeNet(activation="elu"), {"fixed_weights", "random/constant/inference", "gradients"}),
    (lambda: cm.NativeNet(epsilon=1e-5), {"fixed_weights", "random/constant/inference"}),
], ids=["dropout_rate", "activation", "bn_epsilon"])
def test_a_fault_in_the_rewrite_still_fails(mapping, layer, failing):
    report = equivtool.check_equivalence(cm.slim_net, layer, cm.images(), rename=mapping)
    failed = {s.name for s in report.steps if s.status == "failed"}
    assert failing <= failed, str(report)
    assert {"variables_once", "parity"}.isdisjoint(failed)


def test_docs_native_path_runs_end_to_end(tmp_path):
    import os
    import re
    import subprocess
    import sys
    page = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "native-end-state.md")
    with open(page) as handle:
        text = handle.read()
    (tmp_path / "my_models.py").write_text(re.search(r'```python title="my_models.py"\n(.*?)```', text, re.S).group(1))
    example = next(block for block in re.findall(r"```python\n(.*?)```", text, re.S)
                   if "equivtool.map_variables(tf1_forward, Native" in block)
    result = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONDONTWRITEBYTECODE="1"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rename = [" in result.stdout and "Verdict: EQUIVALENT (1 passed)" in result.stdout
    assert sorted(os.listdir(tmp_path)) == ["my_models.py", "my_rules.py", "tf1", "tf2_model.data-00000-of-00001",
                                            "tf2_model.index"]


class _FailsInTraining(cm.NativeNet):
    def call(self, inputs, training=None):
        if training:
            raise RuntimeError("planted: the training pass fails")
        return super().call(inputs, training=training)


def test_alignment_leaves_no_variable_creator_behind_when_a_step_fails(mapping):
    import numpy as np
    import tensorflow as tf
    report = equivtool.check_equivalence(cm.slim_net, _FailsInTraining, cm.images(), rename=mapping,
                                         steps=["random"], modes=("constant", "num_random_ops"))
    assert report.step("random/constant/training").status == "error"
    assert report.step("random/num_random_ops/training").status == "error"
    # A variable made now, under a mapped name, keeps its own value (no aligning creator left) ...
    kernel = tf.Variable(tf.ones([3, 3, 3, 4]), name="net/conv2d/kernel")
    np.testing.assert_array_equal(kernel.numpy(), np.ones([3, 3, 3, 4]))
    # ... in a TF1 graph too.
    with tf.Graph().as_default():
        weights = tf.compat.v1.get_variable("net/conv1/weights", [2], initializer=tf.compat.v1.ones_initializer())
        with tf.compat.v1.Session() as session:
            session.run(weights.initializer)
            np.testing.assert_array_equal(session.run(weights), [1.0, 1.0])


def test_optimizer_steps_from_aligned_weights_and_a_bn_momentum_fault(mapping):
    import tensorflow as tf
    optimizers = (lambda: tf.compat.v1.train.AdamOptimizer(0.01),
                  lambda: tf.keras.optimizers.Adam(0.01, epsilon=1e-8))
    good = equivtool.check_equivalence(cm.slim_net, cm.NativeNet, cm.images(), rename=mapping,
                                       optimizers=optimizers, steps=["optimizer"], train_steps=2)
    assert good.passed, str(good)
    # Keras' default batch-norm momentum (0.99) against slim's decay (0.9 here): the moving statistics part.
    bad = equivtool.check_equivalence(cm.slim_net, lambda: cm.NativeNet(momentum=0.99), cm.images(),
                                      rename=mapping, optimizers=optimizers, steps=["optimizer"], train_steps=2)
    failed = {leaf.name for leaf in bad.step("optimizer").leaves if leaf.failed}
    assert "step_1/variables/net/bn1/moving_mean" in failed, str(bad)
    assert "step_1/loss" not in failed  # the first loss is computed before any update


def test_localization_of_a_native_rewrite_runs_from_aligned_weights(mapping):
    # A dropout-rate fault: localized, the first op that differs is in the dropout, not the first conv.
    report = equivtool.check_equivalence(cm.slim_net, lambda: cm.NativeNet(rate=0.5), cm.images(), rename=mapping,
                                         steps=["random"], modes=("num_random_ops",), localize=True)
    result = report.step("random/num_random_ops/training")
    assert result.status == "failed"
    where = result.data["localization"]
    assert where.tf1_op == "net/dropout/dropout_1/Mul", str(where)  # the convolution before it matches
