"""The resume step: a TF1 checkpoint restored with its slots (TF1) and converted (TF2), training resumed identically."""

import types

import equivtool
import pytest
import tensorflow as tf

from equivtool.checkpoints import _resume
from equivtool.variables import slots as _slots
from tests import checkpoint_models as cm

v1 = tf.compat.v1
ADAM = (lambda: v1.train.AdamOptimizer(0.01), lambda: tf.keras.optimizers.Adam(0.01, epsilon=1e-8))
MOMENTUM = (lambda: v1.train.MomentumOptimizer(0.002, 0.9, use_nesterov=True),
            lambda: tf.keras.optimizers.SGD(0.002, momentum=0.9, nesterov=True))


@pytest.fixture(scope="module")
def mapping():
    return equivtool.map_variables(cm.slim_net, cm.NativeNet, cm.images())


@pytest.fixture(scope="module")
def adam_ckpt(tmp_path_factory):
    return cm.train_tf1(cm.slim_net, cm.images(), ADAM[0], 5, str(tmp_path_factory.mktemp("adam") / "model"))


def _run(tf1_fn, layer, inputs, path, optimizers, rename, **kwargs):
    report = equivtool.check_equivalence(tf1_fn, layer, inputs, rename=rename, checkpoint=path,
                                         optimizers=optimizers, **{"steps": ["resume"], **kwargs})
    return report, report.step("resume")


def _leaves(result, step=0):
    return {leaf.name: leaf for leaf in result.comparisons[step].leaves}


@pytest.mark.parametrize("tf_function", [False, True], ids=["eager", "tf_function"])
def test_slim_model_trained_with_adam_resumes_identically(adam_ckpt, mapping, tf_function):
    report, result = _run(cm.slim_net, cm.NativeNet, cm.images(), adam_ckpt, ADAM, mapping,
                             train_steps=3, tf_function=tf_function)
    assert report.passed and result.status == "passed", str(report)
    assert len(result.comparisons) == 3
    leaves = _leaves(result)
    names = set(leaves)
    assert "step_1/loss" in names
    assert {f"step_1/slots/net/{v}/{s}" for v in ("conv1/weights", "bn1/beta", "logits/biases")
            for s in ("Adam", "Adam_1")} <= names
    assert {"step_1/variables/net/bn1/moving_mean", "step_1/optimizer/beta1_power"} <= names
    assert all(leaf.status == "passed" for leaf in leaves.values())
    assert any("iterations=5" in note for note in result.notes)
    if not tf_function:  # the report lists what was mapped and converted, in JSON too
        import json
        data = next(s for s in json.loads(report.to_json())["steps"] if s["name"] == "resume")
        assert "net/conv1/weights/Adam_1" in data["data"]["conversion"]


def test_resume_is_enabled_by_checkpoint_and_optimizers_together(adam_ckpt, mapping):
    report = equivtool.check_equivalence(cm.slim_net, cm.NativeNet, cm.images(), rename=mapping,
                                         checkpoint=adam_ckpt, optimizers=ADAM, steps=None, modes=("constant",))
    assert "resume" in report.meta["steps"]


def test_embedding_model_with_sparse_adam_slots_resumes_identically(tmp_path):
    mapping = equivtool.map_variables(cm.embedding_net, cm.NativeEmbedding, cm.token_ids())
    path = cm.train_tf1(cm.embedding_net, cm.token_ids(), ADAM[0], 5, str(tmp_path / "model"))
    for tf_function in (False, True):
        report, result = _run(cm.embedding_net, cm.NativeEmbedding, cm.token_ids(), path, ADAM, mapping,
                                 train_steps=3, tf_function=tf_function)
        assert report.passed, str(report)
        assert "step_3/slots/emb/table/Adam_1" in _leaves(result, 2)


def test_momentum_model_resumes_identically(tmp_path, mapping):
    path = cm.train_tf1(cm.slim_net, cm.images(), MOMENTUM[0], 4, str(tmp_path / "model"))
    report, result = _run(cm.slim_net, cm.NativeNet, cm.images(), path, MOMENTUM, mapping, train_steps=3)
    assert report.passed, str(report)
    assert "step_1/slots/net/conv1/weights/Momentum" in _leaves(result)


def test_partitioned_variable_resumes_identically(tmp_path):
    mapping = equivtool.map_variables(cm.partitioned_embedding_net, cm.NativeEmbedding, cm.token_ids())
    path = cm.train_tf1(cm.partitioned_embedding_net, cm.token_ids(), ADAM[0], 3, str(tmp_path / "model"))
    report, result = _run(cm.partitioned_embedding_net, cm.NativeEmbedding, cm.token_ids(), path, ADAM,
                             mapping, train_steps=2)
    assert report.passed, str(report)
    assert {"step_1/variables/emb/table", "step_1/slots/emb/table/Adam"} <= set(_leaves(result))


# -- planted faults ------------------------------------------------------------

def test_an_unconverted_slot_fails_the_step_by_name(adam_ckpt, mapping, monkeypatch):
    adam = _slots.LAYOUTS["Adam"]
    dropped = _slots.SlotLayout(adam.tf1, adam.keras, (adam.slots[0], ("v", "Adam_1", None, "copy")), adam.notes)
    monkeypatch.setitem(_slots.LAYOUTS, "Adam", dropped)  # v is left at tf-keras' zeros
    report, result = _run(cm.slim_net, cm.NativeNet, cm.images(), adam_ckpt, ADAM, mapping, train_steps=1)
    assert result.status == "failed"
    failing = {leaf.name for leaf in result.comparisons[0].leaves if leaf.failed}
    assert "step_1/slots/net/conv1/weights/Adam_1" in failing
    assert not any(name.endswith("/Adam") for name in failing if "/slots/" in name)


def test_swapped_same_shape_kernels_fail_at_the_right_end_point(tmp_path):
    mapping = equivtool.map_variables(cm.two_dense, cm.TwoDense, cm.images())
    path = cm.train_tf1(cm.two_dense, cm.images(), ADAM[0], 2, str(tmp_path / "model"))
    rules = [(p, {"mlp/fc2/weights": "mlp/fc3/weights", "mlp/fc3/weights": "mlp/fc2/weights"}.get(r, r))
             for p, r in mapping.rules]
    report = equivtool.check_equivalence(cm.two_dense, cm.TwoDense, cm.images(), rename=rules, checkpoint=path,
                                         optimizers=ADAM, steps=["fixed_weights", "resume"], train_steps=1)
    assert report.step("fixed_weights").status == "failed"
    first = report.step("fixed_weights").comparisons[0].first_failure
    assert first.name == "end_points/fc2", str(report)
    assert report.step("resume").status == "failed"
    good = equivtool.check_equivalence(cm.two_dense, cm.TwoDense, cm.images(), rename=mapping, checkpoint=path,
                                       optimizers=ADAM, steps=["fixed_weights", "resume"], train_steps=1)
    assert good.passed, str(good)


@pytest.mark.parametrize("layer, failing", [
    (lambda: cm.NativeNet(momentum=0.99), "step_1/variables/net/bn1/moving_mean"),  # Keras default vs slim decay
    (lambda: cm.NativeNet(epsilon=1e-5), "step_1/loss"),
    (lambda: cm.NativeNet(rate=0.5), "step_1/loss"),
], ids=["bn_momentum", "bn_epsilon", "dropout_rate"])
def test_a_native_layer_whose_semantics_differ_fails(adam_ckpt, mapping, layer, failing):
    report, result = _run(cm.slim_net, layer, cm.images(), adam_ckpt, ADAM, mapping, train_steps=1)
    assert result.status == "failed", str(report)
    assert failing in {leaf.name for leaf in result.comparisons[0].leaves if leaf.failed}


def test_nothing_compared_is_never_a_pass():
    engine = types.SimpleNamespace(options=types.SimpleNamespace(train_steps=0, tolerances=None))
    tf1 = {"losses": [], "captures": [], "optimizer": "AdamOptimizer"}
    tf2 = {"losses": [], "captures": [], "optimizer": "Adam", "lr": None, "conversion": "", "mapped": 0,
           "converted": 0, "iterations": 0, "notes": []}
    assert _resume._resume_judge(engine, tf1, tf2).status == "inconclusive"


def test_resume_without_a_checkpoint_path_is_skipped_with_the_reason(mapping):
    report = equivtool.check_equivalence(cm.slim_net, cm.NativeNet, cm.images(), rename=mapping, optimizers=ADAM,
                                         steps=["resume"])
    assert report.step("resume").status == "skipped"
    assert "checkpoint=<a TF1 checkpoint path>" in report.step("resume").message


def test_resume_and_aligned_steps_give_the_same_verdicts_with_workers(adam_ckpt, mapping):
    kwargs = dict(rename=mapping, checkpoint=adam_ckpt, optimizers=ADAM, train_steps=1,
                  steps=["random", "gradients", "resume"], modes=("constant",))
    one = equivtool.check_equivalence(cm.slim_net, cm.NativeNet, cm.images(), **kwargs)
    two = equivtool.check_equivalence(cm.slim_net, cm.NativeNet, cm.images(), workers=2, **kwargs)
    assert one.passed and two.passed, str(two)
    assert two.meta["workers"] == 2  # aligned weights need no exchange: the sides ran apart
    def leaves(report):
        return [(s.name, s.status, [(leaf.name, leaf.max_abs) for leaf in s.leaves]) for s in report.steps]
    assert leaves(one) == leaves(two)
