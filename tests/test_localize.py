"""Localization: the first TF op whose output differs, on planted one-op faults.

Each fault is planted in the TF2 side only (the shim's call runs inside a patch
that is undone when the call returns), so the TF1 graph is the reference and the
divergence must be reported at exactly the op the fault changed.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import tempfile
import types

import numpy as np
import pytest

import equivtool
import tensorflow as tf
import tf_slim
from equivtool._platform.tf_internals import op_callbacks

from equivtool import check_equivalence
from equivtool.engine.sides.tf2_side import run_tapped
from equivtool.localize import Localization, OpError, as_localization, localize_forward
from equivtool.localize.result import rerun_hint
from tests import small_models
from tests.small_models import INPUT_SHAPE, SlimNetShim, slim_net

FORWARD_STEPS = ("fixed_weights", "random/constant/inference", "random/constant/training",
                 "random/num_random_ops/inference", "random/num_random_ops/training", "checkpoint")


@contextlib.contextmanager
def patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


class SlimProxy:
    """tf_slim with some functions replaced (installed as a model module's ``slim``)."""

    def __init__(self, **replacements):
        self._replacements = replacements

    def __getattr__(self, name):
        return self._replacements.get(name) or getattr(tf_slim, name)


def conv_changed(module, target: str, **changes):
    """A patch of ``module.slim.conv2d``: the convolution whose full scope ends with
    ``target`` gets ``changes`` (e.g. another activation or padding)."""
    def conv2d(*args, scope=None, **kwargs):
        full = f"{tf.compat.v1.get_variable_scope().name}/{scope}"
        if full.endswith(target):
            kwargs.update(changes)
        return tf_slim.conv2d(*args, scope=scope, **kwargs)
    # slim.arg_scope([slim.conv2d], ...) keys its defaults by this attribute: the
    # original conv2d called inside still gets them, the changes override them
    conv2d._key_op = tf_slim.conv2d._key_op
    return lambda: patched(module, "slim", SlimProxy(conv2d=conv2d))


class FaultySlimShim(SlimNetShim):
    """The small net's shim with a fault planted for the duration of each call."""

    def __init__(self, fault, logits_only=False, **net_kwargs):
        super().__init__(**net_kwargs)
        self.fault = fault
        self.logits_only = logits_only

    def call(self, inputs, training=None):
        with self.fault():
            outputs = super().call(inputs, training=training)
        return outputs["logits"] if self.logits_only else outputs


def slim_logits(inputs, training):
    return slim_net(inputs, training)["logits"]


def _inputs(shape=INPUT_SHAPE):
    return np.random.RandomState(0).uniform(-1, 1, shape).astype(np.float32)


def _run_small(fault=contextlib.nullcontext, *, logits_only=False, localize=True, steps=("fixed_weights",),
               net_kwargs=None, **kwargs):
    tf1_fn = slim_logits if logits_only else slim_net
    return check_equivalence(tf1_fn, lambda: FaultySlimShim(fault, logits_only, **(net_kwargs or {})),
                             _inputs(), steps=list(steps), localize=localize, **kwargs)


def _localization(report, step="fixed_weights") -> Localization:
    found = report.step(step).data["localization"]
    assert isinstance(found, Localization)
    return found


def _assert_localized(found: Localization, op_name: str, tf1_type: str, tf2_type: str | None = None):
    assert found.status == "diverged", str(found)
    assert found.tf1_op == op_name, str(found)
    assert found.tf1_type == tf1_type
    assert found.tf2_type == (tf2_type or tf1_type)
    assert found.compared >= 1
    # the path ends at the divergent op, and every op before it on the path agrees
    assert found.path and found.path[-1].name == op_name and not found.path[-1].ok
    assert all(point.ok for point in found.path[:-1])


# --------------------------------------------------------------------------
# The small slim model
# --------------------------------------------------------------------------

def _relu_to_elu():
    return patched(small_models.tf.nn, "relu", tf.nn.elu)


SMALL_FAULTS = {
    "batch_norm_epsilon": (lambda: contextlib.nullcontext(), {"bn_epsilon": 0.05},
                           "small_net/bn1/FusedBatchNormV3", "FusedBatchNormV3", None),
    "activation": (_relu_to_elu, {}, "small_net/Relu", "Relu", "Elu"),
    # a layer swapped for another (its scope and op type both change)
    "pooling": (lambda: patched(small_models, "slim", SlimProxy(max_pool2d=tf_slim.avg_pool2d)), {},
                "small_net/pool1/MaxPool", "MaxPool", "AvgPool"),
}


@pytest.mark.parametrize("logits_only", [False, True], ids=["end_points", "logits_only"])
@pytest.mark.parametrize("fault", sorted(SMALL_FAULTS))
def test_small_model_fault_is_localized_to_the_exact_op(fault, logits_only):
    patch, net_kwargs, op_name, tf1_type, tf2_type = SMALL_FAULTS[fault]
    report = _run_small(patch, logits_only=logits_only, net_kwargs=net_kwargs)
    assert report.step("fixed_weights").status == "failed"
    found = _localization(report)
    _assert_localized(found, op_name, tf1_type, tf2_type)
    assert found.tf1_source.split(":")[0].endswith("small_models.py")
    assert found.tf2_source.split(":")[0].endswith("small_models.py")
    assert found.divergence.first_mismatch is not None and found.divergence.max_abs > 1e-5


def test_fault_is_localized_in_every_forward_step_and_under_tf_function():
    patch, net_kwargs, op_name, tf1_type, _ = SMALL_FAULTS["batch_norm_epsilon"]
    for tf_function in (False, True):
        report = _run_small(patch, net_kwargs=net_kwargs, steps=("fixed_weights", "random", "checkpoint"),
                            checkpoint=True, tf_function=tf_function)
        for step in FORWARD_STEPS:
            found = _localization(report, step)
            assert found.status == "diverged", (step, str(found))
            # the training pass is a second pass in the constant-mode graph: "small_net_1/..."
            assert found.tf1_op.replace("small_net_1/", "small_net/") == op_name, (step, found.tf1_op)
        expected_mode = "tf.function" if tf_function else "eager"
        assert _localization(report, "fixed_weights").mode == expected_mode


def test_faithful_model_reports_no_divergence_and_the_same_verdicts_and_numbers():
    kwargs = dict(steps=("fixed_weights", "random", "checkpoint"), checkpoint=True)
    plain = _run_small(localize=False, **kwargs)
    localized = _run_small(localize="all", **kwargs)  # passing steps are localized only when asked
    assert plain.passed and localized.passed
    for step in FORWARD_STEPS:
        before, after = plain.step(step), localized.step(step)
        assert before.status == after.status == "passed"
        assert [leaf.max_abs for leaf in before.leaves] == [leaf.max_abs for leaf in after.leaves]
        found = _localization(localized, step)
        assert found.status == "no_divergence", (step, str(found))
        # every TF1 op of the pass had a counterpart, but the moving averages' arithmetic of a training
        # pass: TF1 builds it as ops (AssignMovingAvg/sub, mul), TF2's eager fused batch norm does it
        # inside FusedBatchNormV3, so those stay unaligned (never blamed)
        updates = [op for op in found.unaligned_tf1 if "/AssignMovingAvg" in op]
        assert len(updates) == (6 if step.endswith("/training") else 0) == len(found.unaligned_tf1), step
        assert found.compared == found.tf1_ops - len(updates) >= 9
        assert "localization" not in before.data


def test_verdicts_and_numbers_are_unchanged_by_localization_on_a_faulty_model():
    patch, net_kwargs, *_ = SMALL_FAULTS["activation"]
    kwargs = dict(steps=("fixed_weights", "random", "gradients"), net_kwargs=net_kwargs)
    plain = _run_small(patch, localize=False, **kwargs)
    localized = _run_small(patch, localize=True, **kwargs)
    assert [s.name for s in plain.steps] == [s.name for s in localized.steps]
    for before, after in zip(plain.steps, localized.steps):
        assert before.status == after.status
        assert [leaf.max_abs for leaf in before.leaves] == [leaf.max_abs for leaf in after.leaves]
    assert plain.verdict() == localized.verdict()


# --------------------------------------------------------------------------
# localize_forward itself: taps removed, bounded buffering, nothing aligned
# --------------------------------------------------------------------------

def _small_tf1(training=False):
    graph = tf.Graph()
    with graph.as_default():
        placeholder = tf.compat.v1.placeholder(tf.float32, INPUT_SHAPE)
        outputs = slim_net(placeholder, training)
        session = tf.compat.v1.Session(graph=graph)
        session.run(tf.compat.v1.global_variables_initializer())
    values = {v.name.split(":")[0]: session.run(v) for v in graph.get_collection("variables")}
    return graph, placeholder, outputs, session, values


@pytest.fixture(scope="module")
def small_pair():
    graph, placeholder, outputs, session, values = _small_tf1()
    layer = SlimNetShim()
    layer(_inputs())
    for variable in layer.variables:
        variable.assign(values[variable.name.split(":")[0]])
    yield graph, placeholder, outputs, session, layer
    session.close()


def _run_tf1(session, placeholder, calls=None):
    def run(tensors):
        if calls is not None:
            calls.append(len(tensors))
        return session.run(tensors, feed_dict={placeholder: _inputs()})
    return run


def tapped(fn):
    """A TF2 call as localize_forward takes it: ``call(tap)`` runs ``fn`` with the tap installed."""
    return lambda tap: run_tapped(tap, fn)


def _no_callbacks() -> bool:
    return not op_callbacks.should_invoke_op_callbacks()


def test_the_op_tap_is_removed_after_a_run_and_after_an_exception(small_pair):
    graph, placeholder, outputs, session, layer = small_pair
    assert _no_callbacks()
    found = localize_forward(graph, outputs, _run_tf1(session, placeholder), tapped(lambda: layer(_inputs())))
    assert found.status == "no_divergence" and found.compared == 9
    assert _no_callbacks()

    def failing_call():
        layer(_inputs())
        raise RuntimeError("the TF2 call failed")
    with pytest.raises(RuntimeError, match="the TF2 call failed"):
        localize_forward(graph, outputs, _run_tf1(session, placeholder), tapped(failing_call))
    assert _no_callbacks()
    # eager ops after the failure are not seen by a stale tap
    assert float(tf.reduce_sum(tf.ones([2]))) == 2.0


def test_buffering_is_bounded_by_the_budget(small_pair):
    graph, placeholder, outputs, session, layer = small_pair
    calls_small, calls_large = [], []
    small = localize_forward(graph, outputs, _run_tf1(session, placeholder, calls_small),
                             tapped(lambda: layer(_inputs())), budget_bytes=1)
    large = localize_forward(graph, outputs, _run_tf1(session, placeholder, calls_large),
                             tapped(lambda: layer(_inputs())), budget_bytes=1 << 30)
    assert small.to_dict() | {"seconds": 0} == large.to_dict() | {"seconds": 0}
    assert calls_small == [1] * 9  # one op at a time: never more than one op's outputs held
    assert calls_large == [9]


def test_comparison_stops_at_the_first_divergence(small_pair):
    graph, placeholder, outputs, session, layer = small_pair
    calls = []
    with patched(small_models.tf.nn, "relu", tf.nn.elu):
        found = localize_forward(graph, outputs, _run_tf1(session, placeholder, calls),
                                 tapped(lambda: layer(_inputs())), budget_bytes=1)
    assert found.tf1_op == "small_net/Relu" and found.tf2_type == "Elu"
    assert found.compared == 4  # Conv2D, BiasAdd, FusedBatchNormV3, then the activation
    assert len(calls) == 4  # nothing after the divergent op was fetched


def test_the_tf_function_spill_folder_is_removed(small_pair, monkeypatch, tmp_path):
    graph, placeholder, outputs, session, layer = small_pair
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    found = localize_forward(graph, outputs, _run_tf1(session, placeholder),
                             tapped(lambda: tf.function(lambda x: layer(x))(_inputs())))
    assert found.mode == "tf.function" and found.status == "no_divergence" and found.compared == 9
    assert glob.glob(os.path.join(tmp_path, "equivtool-localize-*")) == []


def test_nothing_aligned_is_inconclusive_not_no_divergence(small_pair):
    graph, placeholder, outputs, session, _ = small_pair
    found = localize_forward(graph, outputs, _run_tf1(session, placeholder),
                             tapped(lambda: tf.sin(tf.constant([1.0, 2.0]))))
    assert found.status == "inconclusive"
    assert "no op could be aligned" in found.reason
    assert found.compared == 0 and found.unaligned_tf1_count == 9
    with pytest.raises(ValueError, match="needs at least one compared op"):
        Localization("no_divergence", compared=0)


def test_a_failed_localization_is_inconclusive_and_keeps_the_verdict(small_pair):
    from equivtool.localize import localize_on_step
    from equivtool.report import StepResult
    graph, placeholder, outputs, session, _ = small_pair
    step = StepResult.from_comparisons("fixed_weights", "t", [equivtool.compare(np.ones(2), np.ones(2))])
    side = types.SimpleNamespace(graph=graph, op_runner=lambda outputs: _run_tf1(session, placeholder))

    def failing(tap):
        raise RuntimeError("boom")
    result = localize_on_step(step, side, outputs, failing, equivtool.Tolerance(), only_failed=False)
    assert result.status == step.status == "passed" and result.comparisons == step.comparisons
    found = result.data["localization"]
    assert found.status == "inconclusive" and "RuntimeError: boom" in found.reason
    assert _no_callbacks()


def test_localize_argument_is_checked_before_any_work():
    with pytest.raises(TypeError, match="localize: expected True .*, 'all' .* or False"):
        check_equivalence(slim_net, SlimNetShim, _inputs(), localize="yes")
    with pytest.raises(ValueError, match="budget_bytes"):
        localize_forward(tf.Graph(), [], lambda t: [], lambda tap: None, budget_bytes=0)


# --------------------------------------------------------------------------
# The report: text, JSON round trip, HTML path plot, the re-run hint
# --------------------------------------------------------------------------

def test_report_shows_the_localization_and_survives_json(tmp_path):
    patch, net_kwargs, op_name, *_ = SMALL_FAULTS["batch_norm_epsilon"]
    report = _run_small(patch, net_kwargs=net_kwargs)
    text = str(report)
    assert f"first divergent op: {op_name}" in text
    assert "created at" in text and "path from the input" in text
    back = equivtool.EquivalenceReport.from_json(report.to_json())
    found = as_localization(back.step("fixed_weights").data["localization"])
    assert found == _localization(report)
    assert f"first divergent op: {op_name}" in str(back)
    html_path = report.to_html(tmp_path / "report.html")
    document = open(html_path, encoding="utf-8").read()
    assert f"max abs error per op on the path to {op_name}" in document
    assert "Localization (eager)" in document


def test_failed_step_without_localization_says_how_to_rerun_it():
    patch, net_kwargs, *_ = SMALL_FAULTS["batch_norm_epsilon"]
    report = _run_small(patch, net_kwargs=net_kwargs, localize=False)
    assert "localize=True" in str(report) and "--localize" in str(report)
    assert rerun_hint("parity", "failed", {}) is None
    assert rerun_hint("random/constant/training", "failed", {}).count("--steps random ") == 1
    assert rerun_hint("fixed_weights", "passed", {}) is None


def test_cli_prints_the_localized_command():
    from equivtool.cli.check import localize_command
    from equivtool.report import EquivalenceReport, StepResult
    steps = (StepResult("fixed_weights", "t", "failed", 0.0), StepResult("random/num_random_ops/training", "t",
                                                                        "failed", 0.0),
             StepResult("gradients", "t", "failed", 0.0))
    args = types.SimpleNamespace(localize=False, tf1_fn="m:tf1", tf2_factory="m:tf2", input_shape="2,8,8,3",
                                 seed=42, tf_function=True, graph_rewrites="as_written")
    command = localize_command(args, EquivalenceReport(steps))
    assert command == ("equivtool check m:tf1 m:tf2 --input-shape 2,8,8,3 --steps fixed_weights,random "
                       "--seed 42 --mode num_random_ops --tf-function --localize")
    args.graph_rewrites = "tensorflow_default"  # the re-run keeps the rewrites the failing run had
    assert "--tf-function --graph-rewrites tensorflow_default --localize" in localize_command(
        args, EquivalenceReport(steps))
    args.localize = True
    assert localize_command(args, EquivalenceReport(steps)) == ""


def test_localization_round_trips_through_its_dict():
    found = Localization("inconclusive", reason="r", path=(OpError("a", "Relu", 0.5, 1e-5, False),))
    assert Localization.from_dict(json.loads(json.dumps(found.to_dict()))) == found


# --------------------------------------------------------------------------
# Inception-ResNet-v2 (107 px, no auxiliary head, 10 classes)
# --------------------------------------------------------------------------

IRV2_SIZE = 107  # the smallest input whose 17x17 stage still has a 5x5 map


def _irv2():
    from examples.inception_resnet_v2 import keras_shim, tf1_model
    return keras_shim, tf1_model


def _irv2_block17_scale():
    _, tf1_model = _irv2()
    original = tf1_model.block17

    def block17(net, scale=1.0, activation_fn=tf.nn.relu, scope=None, reuse=None):
        if scope == "block17_3":  # slim.repeat names the third repeat block17_3
            scale = 0.25
        return original(net, scale=scale, activation_fn=activation_fn, scope=scope, reuse=reuse)
    block17.__name__ = "block17"  # slim.repeat names its scopes after the function
    return patched(tf1_model, "block17", block17)


def _irv2_mixed_5b_concat_swapped():
    _, tf1_model = _irv2()
    slim, v1 = tf_slim, tf.compat.v1

    def mixed_5b(net):  # tf1_model._mixed_5b with Branch_0 and Branch_1 concatenated the other way round
        with v1.variable_scope("Mixed_5b"):
            with v1.variable_scope("Branch_0"):
                b0 = slim.conv2d(net, 96, 1, scope="Conv2d_1x1")
            with v1.variable_scope("Branch_1"):
                b1 = slim.conv2d(net, 48, 1, scope="Conv2d_0a_1x1")
                b1 = slim.conv2d(b1, 64, 5, scope="Conv2d_0b_5x5")
            with v1.variable_scope("Branch_2"):
                b2 = slim.conv2d(net, 64, 1, scope="Conv2d_0a_1x1")
                b2 = slim.conv2d(b2, 96, 3, scope="Conv2d_0b_3x3")
                b2 = slim.conv2d(b2, 96, 3, scope="Conv2d_0c_3x3")
            with v1.variable_scope("Branch_3"):
                b3 = slim.avg_pool2d(net, 3, stride=1, padding="SAME", scope="AvgPool_0a_3x3")
                b3 = slim.conv2d(b3, 64, 1, scope="Conv2d_0b_1x1")
            return tf.concat([b1, b0, b2, b3], 3)
    return patched(tf1_model, "_mixed_5b", mixed_5b)


def _irv2_conv(target, **changes):
    _, tf1_model = _irv2()
    return conv_changed(tf1_model, target, **changes)()


_P = "InceptionResnetV2/InceptionResnetV2/"  # the graph opens the model's scope twice

IRV2_FAULTS = {
    # fault: (patch, model kwargs of the TF2 side, logits only, TF1 op, TF1 type, TF2 type)
    "block17_residual_scale": (_irv2_block17_scale, {}, True, _P + "Repeat_1/block17_3/mul", "Mul", None),
    "activation_in_one_branch": (
        lambda: _irv2_conv("Repeat/block35_2/Branch_1/Conv2d_0a_1x1", activation_fn=tf.nn.elu), {}, False,
        _P + "Repeat/block35_2/Branch_1/Conv2d_0a_1x1/Relu", "Relu", "Elu"),
    "batch_norm_epsilon": (contextlib.nullcontext, {"batch_norm_epsilon": 0.01}, False,
                           _P + "Conv2d_1a_3x3/BatchNorm/FusedBatchNormV3", "FusedBatchNormV3", None),
    "padding": (lambda: _irv2_conv("InceptionResnetV2/Conv2d_2a_3x3", padding="SAME"), {}, True,
                _P + "Conv2d_2a_3x3/Conv2D", "Conv2D", None),
    "concat_order": (_irv2_mixed_5b_concat_swapped, {}, False, _P + "Mixed_5b/concat", "ConcatV2", None),
}


class _FaultyIRV2:
    """A factory of the Inception-ResNet-v2 shim with a fault planted in each call."""

    def __init__(self, fault, logits_only, **model_kwargs):
        self.fault, self.logits_only, self.model_kwargs = fault, logits_only, model_kwargs

    def __call__(self):
        keras_shim, _ = _irv2()
        fault, logits_only = self.fault, self.logits_only

        class Faulty(keras_shim.InceptionResnetV2):
            def call(self, inputs, training=None):
                with fault():
                    logits, end_points = super().call(inputs, training=training)
                return logits if logits_only else (logits, end_points)
        return Faulty(10, create_aux_logits=False, **self.model_kwargs)


def _irv2_tf1(logits_only):
    keras_shim, _ = _irv2()

    def tf1_fn(inputs, training):
        logits, end_points = keras_shim.tf1_forward(inputs, training, num_classes=10, create_aux_logits=False)
        return logits if logits_only else (logits, end_points)
    return tf1_fn


def _run_irv2(fault=contextlib.nullcontext, logits_only=False, localize=True, **model_kwargs):
    return check_equivalence(_irv2_tf1(logits_only), _FaultyIRV2(fault, logits_only, **model_kwargs),
                             _inputs((1, IRV2_SIZE, IRV2_SIZE, 3)), steps=["fixed_weights"], localize=localize)


@pytest.mark.slow
@pytest.mark.parametrize("fault", sorted(IRV2_FAULTS))
def test_inception_resnet_v2_fault_is_localized_to_the_exact_op(fault):
    patch, model_kwargs, logits_only, op_name, tf1_type, tf2_type = IRV2_FAULTS[fault]
    report = _run_irv2(patch, logits_only, **model_kwargs)
    assert report.step("fixed_weights").status == "failed"
    found = _localization(report)
    _assert_localized(found, op_name, tf1_type, tf2_type)
    assert found.tf1_source.split(":")[0].endswith("tf1_model.py")
    assert found.unaligned_tf1_count == 0 or found.unaligned_tf1_count < found.tf1_ops // 10
    if fault == "padding":
        assert found.divergence.shape_mismatch


@pytest.mark.slow
@pytest.mark.parametrize("logits_only", [False, True], ids=["end_points", "logits_only"])
def test_faithful_inception_resnet_v2_reports_no_divergence(logits_only):
    localized = _run_irv2(logits_only=logits_only, localize="all")  # a passing step: localized when asked
    assert localized.passed
    found = _localization(localized)
    assert found.status == "no_divergence", str(found)
    assert found.compared == found.tf1_ops > 800 and found.unaligned_tf1_count == 0
    if not logits_only:  # the same numbers and verdict without localization
        plain = _run_irv2(logits_only=logits_only, localize=False)
        assert plain.passed and "localization" not in plain.step("fixed_weights").data
        assert [leaf.max_abs for leaf in plain.step("fixed_weights").leaves] == \
            [leaf.max_abs for leaf in localized.step("fixed_weights").leaves]


def test_docs_localization_example_names_the_planted_op(tmp_path):
    import re
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "docs", "checking-a-model.md"), encoding="utf-8") as handle:
        blocks = re.findall(r"```python\n(.*?)```", handle.read(), re.S)
    example = next(block for block in blocks if "localize=True)" in block and "class Migrated" in block)
    result = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True,
                            timeout=600, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=root))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "first divergent op: net/bn1/FusedBatchNormV3 [FusedBatchNormV3]" in result.stdout
    assert "compared 4 ops (TF1 forward: 10 ops, TF2 call: 10 ops)" in result.stdout
    assert "net/conv1/Relu [Relu] 0 ok" in result.stdout
    assert (tmp_path / "report.html").stat().st_size > 1000
