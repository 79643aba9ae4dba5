"""Issue 23: published-style TF1 code (graph-only attributes, graph-scanned end
points, get_variable under default_name) under ``tf_function=True``, every step traced."""

import functools

import pytest

import equivtool
from equivtool._base.errors import GRAPH_MODE_HINT
from published_models import (EncoderShim, MobileNetShim, encoder, image_inputs, mobile_net,
                              token_inputs)

STEPS = ["variables_once", "parity", "fixed_weights", "random", "gradients"]


def _check(tf1_fn, shim, inputs, **kwargs):
    return equivtool.check_equivalence(tf1_fn, shim, inputs, steps=STEPS, tf_function=True, **kwargs)


def test_mobile_net_reading_the_graph_is_equivalent_with_every_step_traced():
    report = _check(mobile_net, MobileNetShim, image_inputs())
    assert report.passed, str(report)
    assert report.meta["execution"].startswith("tf.function in every step")
    names = {s.name for s in report.steps if s.passed}
    assert {"random/num_random_ops/inference", "random/num_random_ops/training"} <= names
    keys = [leaf.name for leaf in report.step("random/num_random_ops/training").leaves]
    assert any(k.endswith("depthwise_output") for k in keys), keys  # the graph-scanned end points compared


def test_mobile_net_planted_fault_is_caught():
    report = _check(mobile_net, functools.partial(MobileNetShim, fault=True), image_inputs())
    assert not report.passed
    assert report.step("random/num_random_ops/inference").status == "failed"


def test_encoder_on_int_inputs_is_equivalent_with_every_step_traced_and_a_fault_is_caught():
    report = _check(encoder, EncoderShim, token_inputs())
    assert report.passed, str(report)
    assert report.step("random/num_random_ops/training").passed  # dropout, traced, aligned with TF1
    faulty = equivtool.check_equivalence(encoder, functools.partial(EncoderShim, fault=True), token_inputs(),
                                         steps=["random"], modes=["num_random_ops"], tf_function=True)
    assert faulty.step("random/num_random_ops/inference").status == "failed"


def test_graph_only_code_run_eagerly_says_to_pass_tf_function():
    report = equivtool.check_equivalence(mobile_net, MobileNetShim, image_inputs(),
                                         steps=["random"], modes=["num_random_ops"])
    step = report.step("random/num_random_ops/inference")
    assert step.status == "error"
    assert step.message.endswith(GRAPH_MODE_HINT) and "\n" not in step.message, step.message
    assert "undefined when eager execution is enabled" in step.message
