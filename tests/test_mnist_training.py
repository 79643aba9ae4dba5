"""The MNIST training example: TF1 and TF2 train step for step alike, with equivtool's cross-entropy op.

The whole check (both optimizer pairs) runs once per module; each test
asserts one property of its result.
"""

from __future__ import annotations

import equivtool  # noqa: F401  (before tensorflow)

import numpy as np
import pytest
import tensorflow as tf

from examples.mnist_convnet import train_parity
from examples.mnist_convnet.tf1_model import synthetic_batch


@pytest.fixture(scope="module")
def result():
    return train_parity.run()


def test_every_step_passes_with_each_optimizer(result):
    assert set(result.reports) == {"SGD", "Adam"}
    for name, report in result.reports.items():
        statuses = {step.name: step.status for step in report.steps}
        assert statuses == {
            "variables_once": "passed", "parity": "passed",
            "random/constant/inference": "passed", "random/constant/training": "passed",
            "random/num_random_ops/inference": "passed", "random/num_random_ops/training": "passed",
            "gradients": "passed", "optimizer": "passed"}, f"{name}:\n{report}"
    assert result.passed


def test_optimizer_step_compares_loss_and_every_weight_after_each_step(result):
    for report in result.reports.values():
        optimizer = report.step("optimizer")
        assert [c.name for c in optimizer.comparisons] == [
            f"step_{k}" for k in range(1, train_parity.TRAIN_STEPS + 1)]
        for comparison in optimizer.comparisons:
            names = [leaf.name for leaf in comparison]
            assert names[0] == f"{comparison.name}/loss"
            assert len(names) == 1 + 8  # the loss, then kernel and bias of 4 layers


def test_gradients_cover_every_trainable_variable(result):
    for report in result.reports.values():
        assert report.step("gradients").data["variables"] == 8


def test_loss_decreases_at_every_step(result):
    for name, losses in result.losses.items():
        assert len(losses) == train_parity.TRAIN_STEPS, name
        assert np.isclose(losses[0], np.log(10), atol=0.3), (name, losses)  # ~uniform at init
        assert all(b < a for a, b in zip(losses, losses[1:])), (name, losses)
        assert losses[-1] < 0.7 * losses[0], (name, losses)


def test_the_tf1_graphs_ran_equivtools_cross_entropy_op_and_its_gradient(result):
    assert train_parity.XENT_OP in result.tf1_op_types
    assert train_parity.XENT_GRAD_OP in result.tf1_op_types
    assert "SparseSoftmaxCrossEntropyWithLogits" not in result.tf1_op_types
    assert result.used_xent_op


def test_tf1_loss_reads_the_fed_labels():
    graph = tf.Graph()
    with graph.as_default():
        batch = {"images": tf.compat.v1.placeholder(tf.float32, [4, 28, 28, 1], name="images"),
                 "labels": tf.compat.v1.placeholder(tf.int32, [4], name="labels")}
        outputs = train_parity.tf1_forward_with_loss(batch, training=False)
    xent = [op for op in graph.get_operations() if op.type == train_parity.XENT_OP]
    assert len(xent) == 1
    assert batch["labels"].op in {t.op for t in xent[0].inputs}
    assert sorted(outputs) == ["logits", "loss"] and outputs["loss"].shape.rank == 0


def test_tf2_loss_depends_on_the_labels():
    images, labels = synthetic_batch(4, seed=1)
    layer = train_parity.MnistConvNetWithLoss()
    loss = layer({"images": images, "labels": labels})["loss"].numpy()
    other = layer({"images": images, "labels": (labels + 1) % 10})["loss"].numpy()
    expected = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=layer({"images": images, "labels": labels})["logits"])).numpy()
    assert loss != other
    np.testing.assert_allclose(loss, expected, rtol=1e-6)


def test_main_prints_the_reports_and_exits_zero(result, monkeypatch, capsys):
    monkeypatch.setattr(train_parity, "run", lambda **kwargs: result)
    assert train_parity.main([]) == 0
    out = capsys.readouterr().out
    assert out.count("Verdict: EQUIVALENT") == 2
    assert "per-step loss:" in out and out.rstrip().splitlines()[-2] == "PASSED"


def test_an_optimizer_step_that_errors_is_reported_with_its_own_error(monkeypatch):
    # On tf-keras 2.16 a float seed broke every training step; the example hid
    # that error behind KeyError: 'losses'. It must show the real one.
    def broken_tf2_optimizer():
        raise ValueError("planted optimizer failure")
    monkeypatch.setattr(train_parity, "OPTIMIZERS", {
        "SGD": (train_parity.OPTIMIZERS["SGD"][0], broken_tf2_optimizer)})
    monkeypatch.setattr(train_parity, "STEPS", ("optimizer",))
    result = train_parity.run(batch_size=2, train_steps=1)
    step = result.reports["SGD"].step("optimizer")
    assert step.status == "error"
    assert result.losses["SGD"] == []
    assert not result.passed
    text = str(result)
    assert "planted optimizer failure" in text
    assert "per-step loss: none, the optimizer step error" in text
    assert text.rstrip().endswith("FAILED")
