"""Issue 33, item 4: localization never names the wrong op.

The three cases of the issue as regression tests: moving statistics updated by an
earlier step's training call leaking into a localization re-run; a TF1 graph
without a single outer scope; a swapped op at the same place. And: an
inconclusive node is never "DIFFERS"; only failing steps are localized unless
asked; a passing step with a divergent intermediate says so in the verdict line
(or fails with ``strict_intermediates``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import types

import numpy as np
import pytest

import equivtool
import tensorflow as tf

from equivtool import check_equivalence
from equivtool.comparison import compare
from equivtool.localize import Localization, OpError, as_localization
from equivtool.localize.alignment import TF1Op
from equivtool.localize.lockstep import Lockstep, Record
from equivtool.localize.result import hidden_divergence, localization_html, strict_intermediates
from equivtool.report import EquivalenceReport, StepResult
from tests import small_models
from tests.published_models import shim_of
from tests.small_models import INPUT_SHAPE, SlimNetShim, slim_net
from tests.test_localize import FaultySlimShim, _relu_to_elu, patched


def _inputs(shape=INPUT_SHAPE, scale=1.0):
    return (np.random.RandomState(0).uniform(-1, 1, shape) * scale).astype(np.float32)


# --------------------------------------------------------------------------
# 1. State: a re-run starts from the variables its step started from
# --------------------------------------------------------------------------

def _bn_check(fault, localize):
    # slim's batch norm (decay 0.999 < 1): the training call of variables_once moves the
    # TF2 layer's moving statistics before random/constant/inference is judged
    return check_equivalence(slim_net, lambda: FaultySlimShim(fault), _inputs(),
                             steps=["variables_once", "random"], modes=["constant"], localize=localize)


def test_a_fault_after_a_training_call_is_named_not_the_batch_norm():
    report = _bn_check(_relu_to_elu, True)
    step = report.step("random/constant/inference")
    assert step.status == "failed"
    found = step.data["localization"]
    assert found.status == "diverged", str(found)
    assert (found.tf1_op, found.tf1_type, found.tf2_type) == ("small_net/Relu", "Relu", "Elu"), str(found)
    # every op before it on the path agrees, the batch norm included
    assert any(p.op_type == "FusedBatchNormV3" and p.ok for p in found.path), str(found)


def test_a_passing_step_after_a_training_call_finds_no_divergence():
    report = _bn_check(lambda: patched(small_models, "slim", small_models.slim), "all")
    assert report.passed, report
    found = report.step("random/constant/inference").data["localization"]
    assert found.status == "no_divergence", str(found)
    assert found.compared == found.tf1_ops
    # the training step's own re-run starts from the statistics before its call, too
    assert report.step("random/constant/training").data["localization"].status == "no_divergence"


def test_the_variables_after_a_localized_step_are_those_before_it():
    """The re-run's state is put back: the layer leaves the check holding what the
    steps left it, the same with and without localization."""
    layers = []

    def factory():
        layers.append(SlimNetShim())
        return layers[-1]

    values = []
    for localize in (False, "all"):
        check_equivalence(slim_net, factory, _inputs(), steps=["variables_once", "random"], modes=["constant"],
                          localize=localize)
        values.append({v.name: v.numpy() for v in layers[-1].variables})
    assert values[0].keys() == values[1].keys()
    for name in values[0]:
        np.testing.assert_array_equal(values[0][name], values[1][name], err_msg=name)


# --------------------------------------------------------------------------
# 2. No single outer scope (top-level conv1/, conv2/: Keras layers in a TF1 graph)
# --------------------------------------------------------------------------

def top_level_layers(x, training, fault=False):
    x = tf.compat.v1.layers.conv2d(x, 4, 3, name="conv1", padding="same")
    x = tf.nn.relu(x)
    x = tf.compat.v1.layers.conv2d(x, 4, 3, name="conv2", padding="same")
    x = (tf.nn.elu if fault else tf.nn.relu)(x)
    return tf.compat.v1.layers.conv2d(x, 2, 3, name="conv3", padding="same")


TopLevelShim = shim_of(top_level_layers)


@pytest.mark.parametrize("tf_function", [False, True], ids=["eager", "tf_function"])
def test_a_model_without_an_outer_scope_against_itself_localizes_nothing(tf_function):
    report = check_equivalence(top_level_layers, TopLevelShim, _inputs((2, 6, 6, 3), 4), steps=["fixed_weights"],
                               localize="all", tf_function=tf_function)
    found = report.step("fixed_weights").data["localization"]
    assert found.status == "no_divergence", str(found)
    assert found.compared == found.tf1_ops == 8


@pytest.mark.parametrize("tf_function", [False, True], ids=["eager", "tf_function"])
def test_a_fault_without_an_outer_scope_is_blamed_on_its_layer(tf_function):
    report = check_equivalence(top_level_layers, functools.partial(TopLevelShim, fault=True),
                               _inputs((2, 6, 6, 3), 4), steps=["fixed_weights"], localize=True,
                               tf_function=tf_function)
    found = report.step("fixed_weights").data["localization"]
    assert (found.status, found.tf1_op, found.tf2_type) == ("diverged", "Relu_1", "Elu"), str(found)
    assert [p.name for p in found.path] == ["conv1/Conv2D", "conv1/BiasAdd", "Relu", "conv2/Conv2D",
                                            "conv2/BiasAdd", "Relu_1"]


# --------------------------------------------------------------------------
# 3. A swapped op at the same place is aligned there, not skipped
# --------------------------------------------------------------------------

def bn_in_cond(x, training, fault=False):
    """A batch norm the TF1 code wraps in tf.cond; the TF2 rewrite calls it directly."""
    x = tf.compat.v1.layers.conv2d(x, 4, 3, name="conv1", padding="same")
    with tf.compat.v1.variable_scope("bn"):
        gamma = tf.compat.v1.get_variable("gamma", [4], initializer=tf.compat.v1.ones_initializer())
        beta = tf.compat.v1.get_variable("beta", [4], initializer=tf.compat.v1.zeros_initializer())
        mean = tf.compat.v1.get_variable("mean", [4], initializer=tf.compat.v1.zeros_initializer(),
                                         trainable=False)
        var = tf.compat.v1.get_variable("var", [4], initializer=tf.compat.v1.ones_initializer(), trainable=False)

        def norm():
            return tf.compat.v1.nn.fused_batch_norm(x, gamma, beta, mean, var, epsilon=0.5 if fault else 1e-3,
                                                    is_training=False)[0]
        x = norm() if tf.executing_eagerly() else tf.cond(tf.constant(True), norm, lambda: x)
    x = tf.nn.relu(x)
    return tf.compat.v1.layers.conv2d(x, 2, 3, name="conv2", padding="same")


def relu6_at_conv2(x, training, fault=False):
    with tf.compat.v1.variable_scope("net"):
        for name in ("conv1", "conv2", "conv3"):
            x = tf.compat.v1.layers.conv2d(x, 4, 3, name=name, padding="same")
            with tf.compat.v1.variable_scope(f"{name}_act"):
                x = (tf.nn.relu6 if fault and name == "conv2" else tf.nn.relu)(x)
    return x


@pytest.mark.parametrize("model, where, types_, tf_function", [
    (bn_in_cond, "bn/cond/Identity", ("Identity", "FusedBatchNormV3"), False),
    (relu6_at_conv2, "net/conv2_act/Relu", ("Relu", "Relu6"), False),
    (relu6_at_conv2, "net/conv2_act/Relu", ("Relu", "Relu6"), True),
], ids=["batch_norm_in_cond", "relu6", "relu6_tf_function"])
def test_a_swapped_op_is_blamed_where_it_is(model, where, types_, tf_function):
    shim = shim_of(model)
    inputs = _inputs((2, 6, 6, 3), 40)
    # the initial values (fixed weights would give the batch norm a negative variance)
    step = "random/constant/inference"
    kwargs = dict(steps=["random"], modes=["constant"], tf_function=tf_function)
    faithful = check_equivalence(model, shim, inputs, localize="all", **kwargs)
    assert faithful.step(step).passed, faithful
    assert faithful.step(step).data["localization"].status == "no_divergence"
    report = check_equivalence(model, functools.partial(shim, fault=True), inputs, localize=True, **kwargs)
    found = report.step(step).data["localization"]
    assert (found.status, found.tf1_op, (found.tf1_type, found.tf2_type)) == ("diverged", where, types_), str(found)
    assert found.unaligned_tf1_count == 0 and found.unaligned_tf2_count == 0, str(found)


# --------------------------------------------------------------------------
# 4. An inconclusive node is never "DIFFERS"
# --------------------------------------------------------------------------

def _op(index, name, op_type):
    tensor = types.SimpleNamespace(name=f"{name}:0")
    return TF1Op(index, types.SimpleNamespace(name=name, type=op_type, outputs=[tensor], inputs=[]), [0], name)


def _walk(tf1_values, tf2_values):
    """A lockstep over a chain of ops whose values are given per side."""
    ops = [_op(i, f"net/op{i}", "Exp") for i in range(len(tf1_values))]
    by_name = {op.op.outputs[0].name: v for op, v in zip(ops, tf1_values)}
    lockstep = Lockstep(ops, lambda tensors: [by_name[t.name] for t in tensors], equivtool.Tolerance(), 1)
    for op, value in zip(ops, tf2_values):
        lockstep.add(Record(op.key, op.scope, op.type, [value], []))
    lockstep.flush()
    return lockstep


def test_an_all_inf_op_is_inconclusive_and_the_walk_goes_on():
    inf, finite = np.full(3, np.inf, np.float32), np.arange(3, dtype=np.float32)
    lockstep = _walk([inf, finite], [inf, finite])
    assert lockstep.divergence is None and lockstep.compared == 1 and lockstep.inconclusive == 1
    first = lockstep.errors[0]
    assert first.inconclusive and not first.ok and first.mark == "INCONCLUSIVE"
    # planted: the finite op after it differs, and is the one named
    lockstep = _walk([inf, finite], [inf, finite + 1])
    assert lockstep.divergence[0].name == "net/op1"
    # nothing but inconclusive ops compared: not "no divergence"
    only = _walk([inf], [inf])
    assert only.compared == 0 and "inconclusive" in only.nothing_proven("x")


def test_an_inconclusive_op_is_inconclusive_in_text_json_and_html():
    leaf = compare(np.zeros(2), np.ones(2)).leaves[0]
    path = (OpError("net/a", "Exp", float("inf"), 1e-5, False, inconclusive=True),
            OpError("net/b", "Mul", 1.0, 1e-5, False))
    found = Localization("diverged", compared=1, tf1_op="net/b", tf2_op="net/b", tf1_type="Mul", tf2_type="Mul",
                         divergence=leaf, path=path, inconclusive_ops=["net/a (Exp)"], inconclusive_count=1)
    text = str(found)
    assert "net/a [Exp] inf INCONCLUSIVE" in text and "net/a [Exp] inf DIFFERS" not in text
    assert "net/b [Mul] 1 DIFFERS" in text
    back = as_localization(json.loads(json.dumps(found.to_dict())))
    assert back == found and back.path[0].mark == "INCONCLUSIVE"
    html = localization_html(found, lambda s: s, None)
    assert "INCONCLUSIVE (1 ops" in html and "net/a (Exp)" in html
    with pytest.raises(ValueError, match="inconclusive op cannot be ok"):
        OpError("x", "Exp", 0.0, 1e-5, True, inconclusive=True)


# --------------------------------------------------------------------------
# 5. Only failing steps are localized, unless asked; a hidden intermediate is named
# --------------------------------------------------------------------------

class TrainingOnlyElu(SlimNetShim):
    """Relu -> Elu in training mode only: the inference step passes, the training step fails."""

    def call(self, inputs, training=None):
        with (_relu_to_elu() if training else contextlib.nullcontext()):
            return super().call(inputs, training=training)


def test_only_failing_steps_are_localized_unless_all_are_asked_for():
    kwargs = dict(steps=["random"], modes=["constant"])
    report = check_equivalence(slim_net, TrainingOnlyElu, _inputs(), localize=True, **kwargs)
    passed, failed = report.step("random/constant/inference"), report.step("random/constant/training")
    assert (passed.status, failed.status) == ("passed", "failed")
    assert "localization" not in passed.data
    assert failed.data["localization"].tf1_op.endswith("/Relu"), str(failed.data["localization"])
    assert str(report).count("first divergent op") == 1
    asked = check_equivalence(slim_net, TrainingOnlyElu, _inputs(), localize="all", **kwargs)
    assert asked.step("random/constant/inference").data["localization"].status == "no_divergence"
    with pytest.raises(TypeError, match="localize: expected True .*'all'"):
        check_equivalence(slim_net, SlimNetShim, _inputs(), steps=["fixed_weights"], localize="failing")


def _passing_step(localization):
    step = StepResult.from_comparisons("outputs", "signature outputs", [compare(np.ones(2), np.ones(2))])
    return StepResult(step.name, step.title, step.status, step.seconds, comparisons=step.comparisons,
                      data={"localization": localization})


def _diverged(op="net/conv2/Conv2D"):
    leaf = compare(np.zeros(2), np.ones(2)).leaves[0]
    return Localization("diverged", compared=2, tf1_op=op, tf2_op=op, tf1_type="Conv2D", tf2_type="Conv2D",
                        divergence=leaf, sides=("OLD", "NEW"))


def test_passing_outputs_over_a_divergent_intermediate_say_so_in_the_verdict():
    report = EquivalenceReport((_passing_step(_diverged()),), {})
    assert report.passed
    assert str(report.verdict).startswith(
        "Verdict: EQUIVALENT at the outputs; an intermediate differs: net/conv2/Conv2D (step outputs)")
    # nothing diverged (or nothing localized): the plain verdict
    quiet = EquivalenceReport((_passing_step(Localization("no_divergence", compared=3)),), {})
    assert str(quiet.verdict).startswith("Verdict: EQUIVALENT (") and hidden_divergence(quiet.steps) == ""


def test_strict_intermediates_fails_the_step_and_leaves_others_alone():
    step = _passing_step(_diverged())
    failed = strict_intermediates(step)
    assert failed.status == "failed" and "net/conv2/Conv2D" in failed.message
    assert not EquivalenceReport((failed,), {}).passed
    calm = _passing_step(Localization("no_divergence", compared=3))
    assert strict_intermediates(calm) is calm


def test_strict_intermediates_needs_localize():
    from equivtool.exported._compare import compare_models
    with pytest.raises(ValueError, match="strict_intermediates: .* without localize"):
        compare_models("old", "new", strict_intermediates=True)


def test_as_started_puts_the_current_values_back_after_an_exception():
    from equivtool.engine.pair import _Half

    class Side:
        def __init__(self):
            self.values = {"bn/moving_mean": 1.0}

        def read_variables(self):
            return dict(self.values)

        def assign_variables(self, values):
            self.values.update(values)

    half, side = _Half(), Side()
    half.localize, half._starts, half.inference_pass = True, {}, lambda: None
    half._remember_start("inference", side)
    side.values["bn/moving_mean"] = 2.0  # a later training call moved it
    with pytest.raises(RuntimeError, match="the re-run failed"):
        with half.as_started("inference"):
            assert side.values["bn/moving_mean"] == 1.0
            raise RuntimeError("the re-run failed")
    assert side.values["bn/moving_mean"] == 2.0


# --------------------------------------------------------------------------
# compare --localize on exported models: no outer scope, a hidden intermediate
# --------------------------------------------------------------------------

def _exported(swap_activation):
    rng = np.random.RandomState(0)  # the same weights in both exports
    kernel, fc = rng.normal(size=(3, 3, 3, 4)).astype(np.float32), rng.normal(size=(4, 3)).astype(np.float32)

    def build(images):
        h = tf.compat.v1.layers.conv2d(images, 4, 3, name="conv1", padding="same",
                                       kernel_initializer=tf.compat.v1.constant_initializer(kernel))
        h = (tf.nn.relu6 if swap_activation else tf.nn.relu)(h)
        pooled = tf.reduce_mean(h, [1, 2])
        # a saturated softmax: the head hides what happened above it
        logits = tf.compat.v1.layers.dense(pooled, 3, name="fc",
                                           kernel_initializer=tf.compat.v1.constant_initializer(fc))
        return {"probs": tf.nn.softmax(logits + [[400.0, 0.0, 0.0]])}
    return build


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from examples.exported.export import export_tf1
    root = tmp_path_factory.mktemp("exported")
    paths = {}
    for name, swap in (("old", False), ("new", True)):
        paths[name] = str(root / name)
        export_tf1(_exported(swap), (2, 6, 6, 3), paths[name])
    return paths


def test_an_exported_model_without_an_outer_scope_against_itself_localizes_nothing(exported):
    report = equivtool.compare_models(exported["old"], exported["old"], localize=True)
    found = report.step("outputs").data["localization"]
    assert found.status == "no_divergence" and found.unaligned_tf1_count == 0, str(found)
    assert str(report.verdict).startswith("Verdict: EQUIVALENT (")


def test_a_hidden_intermediate_is_in_the_verdict_and_fails_when_strict(exported):
    report = equivtool.compare_models(exported["old"], exported["new"], localize=True, val_range="images:0,10")
    assert report.passed, report
    found = report.step("outputs").data["localization"]
    assert (found.tf1_type, found.tf2_type) == ("Relu", "Relu6"), str(found)
    assert str(report.verdict).startswith(
        f"Verdict: EQUIVALENT at the outputs; an intermediate differs: {found.tf1_op} (step outputs)")
    strict = equivtool.compare_models(exported["old"], exported["new"], localize=True, val_range="images:0,10",
                                      strict_intermediates=True)
    assert not strict.passed and strict.step("outputs").status == "failed"
    assert "an intermediate differs beyond tolerance" in strict.step("outputs").message


def hidden_head(x, training, fault=False):
    """A Relu (Relu6 with ``fault``) under a saturated softmax head that hides it."""
    h = tf.compat.v1.layers.conv2d(x, 4, 3, name="conv1", padding="same")
    h = (tf.nn.relu6 if fault else tf.nn.relu)(h)
    logits = tf.compat.v1.layers.dense(tf.reduce_mean(h, [1, 2]), 3, name="fc")
    return tf.nn.softmax(logits + [[400.0, 0.0, 0.0]])


def test_check_names_a_hidden_intermediate_and_strict_intermediates_fails_it():
    shim, inputs = shim_of(hidden_head), _inputs((2, 6, 6, 3), 40)
    kwargs = dict(steps=["fixed_weights"])
    report = check_equivalence(hidden_head, functools.partial(shim, fault=True), inputs, localize="all", **kwargs)
    assert report.passed, report
    assert str(report.verdict).startswith(
        "Verdict: EQUIVALENT at the outputs; an intermediate differs: Relu (step fixed_weights)"), report.verdict
    strict = check_equivalence(hidden_head, functools.partial(shim, fault=True), inputs, localize=True,
                               strict_intermediates=True, **kwargs)
    assert not strict.passed and strict.step("fixed_weights").status == "failed"
    assert "an intermediate differs beyond tolerance" in strict.step("fixed_weights").message
    faithful = check_equivalence(hidden_head, shim, inputs, localize=True, strict_intermediates=True, **kwargs)
    assert faithful.passed and str(faithful.verdict).startswith("Verdict: EQUIVALENT (")
    with pytest.raises(TypeError, match="strict_intermediates: .* without localize"):
        check_equivalence(hidden_head, shim, inputs, strict_intermediates=True, **kwargs)


@pytest.mark.parametrize("flags, expected", [
    ([], (False, False)), (["--localize"], (True, False)), (["--localize-all"], ("all", False)),
    (["--localize", "--strict-intermediates"], (True, True)),
])
def test_check_flags_reach_check_equivalence(flags, expected, monkeypatch, capsys):
    from equivtool import cli
    seen = {}

    def fake(*args, localize, strict_intermediates, **kwargs):
        seen["got"] = (localize, strict_intermediates)
        return EquivalenceReport((StepResult("fixed_weights", "t", "passed", 0.0),))
    monkeypatch.setattr(equivtool, "check_equivalence", fake)
    monkeypatch.chdir(os.path.dirname(os.path.abspath(__file__)))
    cli.main(["check", "small_models:slim_net", "small_models:SlimNetShim", "--input-shape", "2,8,8,3",
              "--steps", "fixed_weights", *flags])
    assert seen["got"] == expected
    help_text = cli.build_parser().format_help() + cli.build_parser()._subparsers._group_actions[0].choices[
        "check"].format_help()
    assert "for failing forward-pass steps" in help_text and "--localize-all" in help_text


def test_an_outer_scope_is_stripped_only_when_every_op_is_under_it():
    from equivtool.localize.alignment import Naming
    outer = Naming(["net/conv1/Conv2D", "net/net/fc/MatMul"])
    assert outer.outer == "net" and outer.tf1_key("net/net/fc/MatMul") == "fc/MatMul"
    assert outer.other_scope(["layer", "net", "conv1", "net", "conv1"], layer_scope=True) == ["conv1"]
    for names in (["conv1/Conv2D", "conv2/Conv2D"], ["net/conv1/Tanh", "Tanh"]):  # none: names stay whole
        naming = Naming(names)
        assert naming.outer is None and [naming.tf1_key(n) for n in names] == names
    top = Naming(["conv1/Conv2D", "conv2/Conv2D", "Relu"])
    assert top.other_scope(["migrated", "conv2"], layer_scope=True) == ["conv2"]
    assert top.other_scope(["StatefulPartitionedCall", "conv2_1"], layer_scope=False) == ["conv2_1"]
    assert top.other_scope(["migrated"], layer_scope=True) == []  # an unscoped op under the layer's scope
    assert top.in_model("migrated/Relu") and not top.in_model("Identity")
