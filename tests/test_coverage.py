"""The coverage ledger: EQUIVALENT only when every variable and every output leaf was proven.

Each rule is shown failing on a planted slip (a batch-norm momentum, a
stop_gradient, a fault hidden below atol) and shown unable to pass when
nothing was compared; the faithful model still passes.
"""

from __future__ import annotations

import json

import equivtool
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from equivtool.coverage import Coverage
from equivtool.engine.sides.tf1_side import primary_output, primary_output_path
from equivtool.report import EquivalenceReport, StepResult


def bn_net(x, training, momentum=0.997, stop=False, tiny_fault=False, head_only=False):
    """conv -> batch norm -> relu -> dense; a second, tiny output ("small") of the same features."""
    with tf.compat.v1.variable_scope("net"):
        h = tf.compat.v1.layers.conv2d(x, 4, 3, name="conv")
        h = tf.compat.v1.layers.batch_normalization(h, momentum=momentum, training=training, name="bn")
        h = tf.nn.relu(h)
        h = tf.compat.v1.layers.flatten(h)
        with tf.compat.v1.variable_scope("fc"):
            kernel = tf.compat.v1.get_variable("kernel", [h.shape[-1], 3])
            bias = tf.compat.v1.get_variable("bias", [3], initializer=tf.compat.v1.zeros_initializer())
            if stop:
                kernel = tf.stop_gradient(kernel)
            logits = tf.matmul(h, kernel) + bias
        small = 1e-8 * (tf.nn.elu(logits) if tiny_fault else tf.nn.relu(logits))
        outputs = {"small": small, "logits": logits}  # the default loss uses the last entry: logits
        if head_only:
            with tf.compat.v1.variable_scope("aux"):
                aux = tf.compat.v1.get_variable("kernel", [h.shape[-1], 2])
            outputs = {"aux": tf.matmul(h, aux), "logits": logits}
        return outputs


class BNShim(tf.keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__()
        self.kwargs = kwargs

    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, x, training=None):
        return bn_net(x, bool(training), **self.kwargs)


# the tiny output is compared relative to its size (the remedy the ledger names)
RTOL_FOR_SMALL = {"small": equivtool.Tolerance(rtol=1e-5, atol=0), "*": equivtool.Tolerance()}
X = np.random.RandomState(0).uniform(size=(4, 6, 6, 3)).astype(np.float32)


def check(tf2_kwargs=None, tf1_kwargs=None, **options):
    tf1_kwargs, tf2_kwargs = tf1_kwargs or {}, tf2_kwargs or {}
    return equivtool.check_equivalence(lambda x, training: bn_net(x, training, **tf1_kwargs),
                                       lambda: BNShim(**tf2_kwargs), X, **options)


# --------------------------------------------------------------------------
# The faithful model, and the two slips native rewrites make most often
# --------------------------------------------------------------------------

def test_the_faithful_model_is_equivalent_with_every_variable_and_output_proven():
    report = check(tolerance=RTOL_FOR_SMALL)
    assert report.passed, str(report)
    ledger = report.coverage
    assert ledger.complete and not ledger.not_in_scope
    assert set(ledger.variables) >= {"net/bn/moving_mean", "net/bn/moving_variance", "net/fc/kernel"}
    for key, seen in ledger.variables.items():
        assert seen["value"], key
    assert ledger.variables["net/bn/moving_mean"]["trainable"] is False
    assert ledger.variables["net/fc/kernel"]["gradient"] == ["gradients"]
    assert "coverage: 2/2 output leaves compared above atol" in str(report)


def test_a_batch_norm_momentum_slip_is_not_equivalent_naming_the_moving_statistics():
    report = check(tf2_kwargs={"momentum": 0.99})  # Keras' default against the TF1 model's 0.997
    assert not report.passed
    assert "NOT EQUIVALENT" in report.verdict
    for name in ("random/constant/training", "random/num_random_ops/training"):
        step = report.step(name)
        assert step.status == "failed", str(step)
        assert step.first_divergence == "variables/net/bn/moving_mean"
        assert any("moving statistics" in note for note in step.notes)
    # inference and the gradients never see the momentum
    assert report.step("random/constant/inference").passed
    assert report.step("gradients").passed


def test_a_variable_cut_by_stop_gradient_on_one_side_fails_naming_it():
    report = check(tf2_kwargs={"stop": True})
    step = report.step("gradients")
    assert step.status == "failed"
    assert step.status == "failed" and step.message.startswith("gradient is None on one side only")
    assert "net/fc/kernel (None on the TF2 side)" in step.message


def test_no_gradient_on_either_side_is_agreement_and_is_listed_with_the_loss_it_came_from():
    report = check(tf1_kwargs={"head_only": True}, tf2_kwargs={"head_only": True})
    step = report.step("gradients")
    assert step.passed, str(step)
    assert step.data["loss_target"] == "outputs['logits']"
    listed = [n for n in step.notes if n.startswith("no gradient on either side")]
    assert listed and "net/aux/kernel" in listed[0] and "outputs['logits']" in listed[0]
    assert report.coverage.variables["net/aux/kernel"]["no_gradient"] == ["gradients"]
    assert report.passed, str(report)  # None on both sides counts as agreement


def test_a_fault_living_only_below_atol_is_inconclusive_naming_the_leaf():
    report = check(tf2_kwargs={"tiny_fault": True})
    assert not report.passed
    assert not report.failed_steps, str(report)  # every step passed at the default atol ...
    assert "INCONCLUSIVE" in report.verdict and "end_points/small" in report.verdict
    assert report.coverage.unproven_outputs == ["end_points/small"]
    # ... and a passing step lists the leaves that could not have shown a difference
    notes = report.step("fixed_weights").notes
    assert any(n.startswith("1 of 2 output leaves are below atol on both sides") and "end_points/small" in n
               for n in notes)
    # a step whose output leaves are all above atol says nothing of the kind
    assert not any("below atol" in n for n in check(tolerance=RTOL_FOR_SMALL).step("fixed_weights").notes)
    # the remedy it names finds the fault
    fixed = check(tf2_kwargs={"tiny_fault": True},
                  tolerance=RTOL_FOR_SMALL)
    assert fixed.failed_steps and "NOT EQUIVALENT" in fixed.verdict


def test_a_partial_selection_names_what_it_did_not_cover():
    report = check(steps=["parity", "fixed_weights"], tolerance=RTOL_FOR_SMALL)
    assert report.passed, str(report)
    assert report.verdict.endswith("not covered by the steps run: variable values after training, gradients")
    assert str(report).count("not covered by the steps run") == 1  # said once, in the verdict line


def test_the_ledger_round_trips_through_json_and_is_in_the_html(tmp_path):
    report = check(steps=["parity", "random"], modes=["constant"])
    again = EquivalenceReport.from_json(report.to_json())
    assert again.coverage == report.coverage
    assert again.passed == report.passed
    assert json.loads(report.to_json())["coverage"]["unproven"]["outputs"] == ["end_points/small"]
    path = report.to_html(tmp_path / "r.html")
    html = open(path, encoding="utf-8").read()
    assert 'id="coverage"' in html and "net/bn/moving_variance" in html


# --------------------------------------------------------------------------
# The ledger on its own: it cannot pass on nothing
# --------------------------------------------------------------------------

def _step(name, status="passed", **proves):
    return StepResult(name, name, status, 0.0, data={"proves": proves} if proves else {})


def test_a_ledger_of_steps_that_proved_nothing_is_not_complete():
    ledger = Coverage.from_steps([_step("fixed_weights"), _step("gradients")])
    assert ledger.in_scope and not ledger.complete
    assert "nothing was proven" in ledger.unproven_text()
    report = EquivalenceReport((_step("fixed_weights"), _step("gradients")), coverage=ledger)
    assert not report.passed and "INCONCLUSIVE" in report.verdict


def test_skipped_and_errored_steps_prove_nothing():
    evidence = {"outputs": {"end_points/y": "above_atol"}, "values": ["v"]}
    ledger = Coverage.from_steps([_step("parity", variables={"v": False}),
                                  _step("random/constant/training", "skipped", **evidence),
                                  _step("random/num_random_ops/training", "error", **evidence)])
    assert not ledger.outputs and not ledger.variables["v"]["value"]
    assert ledger.not_in_scope == ["outputs", "variable values after training", "gradients"]


def test_a_variable_known_from_parity_but_never_compared_is_owed():
    ledger = Coverage.from_steps([
        _step("parity", variables={"a": True, "b": False}),
        _step("random/constant/training", outputs={"end_points/y": "above_atol"}, values=["a"]),
        _step("gradients", gradients=["a"], trainable=["a"])])
    assert ledger.unproven_values == ["b"] and not ledger.complete
    assert "b" in ledger.unproven_text() and "remedy" in ledger.unproven_text()


_KEYS = st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=8, unique=True)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(variables=_KEYS, leaves=_KEYS, data=st.data())
def test_removing_the_only_evidence_for_any_item_makes_the_ledger_incomplete(variables, leaves, data):
    trainable = data.draw(st.lists(st.sampled_from(variables), unique=True))
    full = [_step("parity", variables={v: v in trainable for v in variables}),
            _step("random/constant/training", outputs={f"o/{leaf}": "above_atol" for leaf in leaves},
                  values=list(variables)),
            _step("gradients", gradients=list(trainable), trainable=list(trainable))]
    assert Coverage.from_steps(full).complete
    kind = data.draw(st.sampled_from(["outputs", "values"] + (["gradients"] if trainable else [])))
    proves = {"outputs": dict(full[1].data["proves"]["outputs"]), "values": list(variables),
              "gradients": list(trainable)}
    if kind == "outputs":
        leaf = data.draw(st.sampled_from(sorted(proves["outputs"])))
        proves["outputs"][leaf] = "below_atol"
    else:
        proves[kind].remove(data.draw(st.sampled_from(proves[kind])))
    planted = [full[0],
               _step("random/constant/training", outputs=proves["outputs"], values=proves["values"]),
               _step("gradients", gradients=proves["gradients"], trainable=list(trainable))]
    ledger = Coverage.from_steps(planted)
    assert not ledger.complete
    assert not EquivalenceReport(tuple(planted), coverage=ledger).passed


# --------------------------------------------------------------------------
# One rule for the default loss target
# --------------------------------------------------------------------------

@pytest.mark.parametrize("outputs, path, value", [
    (1.0, "", 1.0),
    ((2.0, {"a": 3.0}), "[0]", 2.0),
    ({"conv": 1.0, "logits": 4.0}, "['logits']", 4.0),
    ([{"a": 1.0, "b": (5.0, 6.0)}], "[0]['b'][0]", 5.0),
])
def test_the_default_loss_target_is_named_by_one_rule(outputs, path, value):
    assert primary_output_path(outputs) == path
    assert primary_output(outputs) == value


def test_an_empty_output_structure_is_refused_with_the_remedy():
    with pytest.raises(ValueError, match="pass loss_fn"):
        primary_output({})
