"""The equivalence engine on a small slim model and deliberately broken TF2 variants."""

import functools

import numpy as np
import pytest

import equivtool
import tensorflow as tf

from options_support import equivalence_arguments
from equivtool.engine.sides import tf1_side as runners
from equivtool._platform import tf_internals as _tfi
from equivtool.testing import assert_equivalent

from small_models import INPUT_SHAPE, SlimNetShim, slim_net

X = np.random.RandomState(0).rand(*INPUT_SHAPE).astype(np.float32)
SGD = (lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1), lambda: tf.keras.optimizers.SGD(0.1))
ADAM = (lambda: tf.compat.v1.train.AdamOptimizer(1e-2, epsilon=1e-7),
        lambda: tf.keras.optimizers.Adam(1e-2, epsilon=1e-7))


def shim(**kwargs):
    return functools.partial(SlimNetShim, **kwargs)


def statuses(report):
    return {step.name: step.status for step in report.steps}


def test_small_slim_model_passes_every_step():
    seen = []
    report = equivtool.check_equivalence(slim_net, SlimNetShim, X, optimizers=SGD, checkpoint=True,
                                         progress=seen.append)
    assert report.passed, str(report)
    assert set(statuses(report)) == {
        "variables_once", "parity", "fixed_weights", "random/constant/inference",
        "random/constant/training", "random/num_random_ops/inference",
        "random/num_random_ops/training", "gradients", "optimizer", "checkpoint"}
    assert [s.name for s in seen][:2] == ["variables_once", "parity"]  # progress in run order
    assert report.step("gradients").data["variables"] == 6


def test_adam_steps_match_with_the_same_epsilon():
    # conv1's biases feed batch norm, which removes their effect: their gradients
    # are rounding noise that Adam normalises to full-size steps. The measured
    # noise floor (TF1 against itself, 1 ULP apart) explains them: no per-key
    # tolerance is needed, and without the floor they fail the default one.
    report = equivtool.check_equivalence(slim_net, SlimNetShim, X, steps=["optimizer"], optimizers=ADAM,
                                         train_steps=3)
    assert report.passed, str(report)
    step = report.step("optimizer")
    assert step.data["steps"] == 3
    explained = step.data["noise_floor"]["consistent_with_rounding"]
    assert explained and all(name.endswith("/conv1/biases") for name in explained)
    without = equivtool.check_equivalence(slim_net, SlimNetShim, X, steps=["optimizer"], optimizers=ADAM,
                                          train_steps=3, noise_floor=False).step("optimizer")
    assert without.status == "failed"
    assert {leaf.name for leaf in without.leaves if leaf.failed} == set(explained)


def test_adam_default_epsilons_differ_and_fail_at_step_one():
    # tf.compat.v1.train.AdamOptimizer defaults to epsilon=1e-8, Keras Adam to 1e-7.
    optimizers = (lambda: tf.compat.v1.train.AdamOptimizer(1e-2), lambda: tf.keras.optimizers.Adam(1e-2))
    report = equivtool.check_equivalence(slim_net, SlimNetShim, X, steps=["optimizer"],
                                         optimizers=optimizers)
    step = report.step("optimizer")
    assert step.status == "failed"
    assert step.data["first_failing_step"] == 1


def test_tf_function_mode_passes():
    report = equivtool.check_equivalence(slim_net, SlimNetShim, X, tf_function=True,
                                         steps=["variables_once", "random", "gradients"])
    assert report.passed, str(report)


def test_different_batch_norm_epsilon_fails_fixed_weights_at_bn1():
    report = equivtool.check_equivalence(slim_net, shim(bn_epsilon=0.5), X)
    step = report.step("fixed_weights")
    assert step.status == "failed"
    assert step.first_divergence == "end_points/bn1"
    assert statuses(report)["parity"] == "passed"


def test_missing_regularizer_fails_on_regularization_loss():
    report = equivtool.check_equivalence(slim_net, shim(fc_regularizer=False), X,
                                         steps=["parity", "fixed_weights"])
    step = report.step("fixed_weights")
    assert step.status == "failed"
    assert step.first_divergence == "regularization_loss"
    assert statuses(report)["parity"] == "passed"


def test_dropout_in_another_place_fails_training_only_at_the_next_end_point():
    report = equivtool.check_equivalence(slim_net, shim(dropout_after="bn"), X,
                                         steps=["random"], modes=["constant"])
    assert statuses(report)["random/constant/inference"] == "passed"
    step = report.step("random/constant/training")
    assert step.status == "failed"
    assert step.first_divergence == "end_points/pool1"  # bn1 is recorded before the moved dropout


def test_different_initializer_fails_random_inference_at_conv1_but_not_fixed_weights():
    glorot = tf.compat.v1.glorot_uniform_initializer()
    report = equivtool.check_equivalence(slim_net, shim(weights_initializer=glorot), X,
                                         steps=["fixed_weights", "random"], modes=["constant"])
    assert statuses(report)["fixed_weights"] == "passed"
    step = report.step("random/constant/inference")
    assert step.status == "failed"
    assert step.first_divergence == "end_points/conv1"


def test_renamed_variable_fails_parity():
    report = equivtool.check_equivalence(slim_net, shim(fc_scope="fc"), X, steps=["parity"])
    step = report.step("parity")
    assert step.status == "failed"
    assert "small_net/logits/weights" in step.message and "small_net/fc/weights" in step.message


def test_rename_rules_repair_a_renamed_variable():
    report = equivtool.check_equivalence(slim_net, shim(fc_scope="fc"), X, rename={"/fc/": "/logits/"},
                                         steps=["parity", "fixed_weights"])
    assert report.passed, str(report)


def test_extra_variable_fails_parity():
    report = equivtool.check_equivalence(slim_net, shim(extra_variable=True), X, steps=["parity"])
    step = report.step("parity")
    assert step.status == "failed"
    assert "extra in TF2" in step.message and "small_net/unexpected" in step.message


def test_layer_creating_variables_every_call_fails_variables_once():
    class Leaky(tf.keras.layers.Layer):
        @tf.compat.v1.keras.utils.track_tf1_style_variables
        def call(self, inputs, training=None):
            out = slim_net(inputs, bool(training))
            tf.Variable(1.0, name="leak")  # a new variable on every call
            return out

    report = equivtool.check_equivalence(slim_net, Leaky, X, steps=["variables_once"])
    step = report.step("variables_once")
    assert step.status == "failed" and "leak" in step.message


def test_step_tolerance_override_accepts_a_small_difference():
    broken = shim(bn_epsilon=1.1e-3)
    strict = equivtool.check_equivalence(slim_net, broken, X, steps=["fixed_weights"])
    assert strict.step("fixed_weights").status == "failed"
    loose = equivtool.check_equivalence(slim_net, broken, X, steps=["fixed_weights"],
                                        step_tolerances={"fixed_weights": equivtool.Tolerance(atol=1e-3)})
    assert loose.passed, str(loose)


def test_user_layer_instance_values_are_restored_after_a_failing_step():
    layer = SlimNetShim(bn_epsilon=0.5)
    layer(X)
    before = [v.numpy().copy() for v in layer.variables]
    report = equivtool.check_equivalence(slim_net, layer, X, steps=["fixed_weights", "random"])
    assert report.step("fixed_weights").status == "failed"
    assert report.step("random/num_random_ops/inference").status == "skipped"
    constant = report.step("random/constant/inference")
    assert any("initializers are not compared" in note for note in constant.notes)
    for old, variable in zip(before, layer.variables):
        np.testing.assert_array_equal(old, variable.numpy())


def test_prebuilt_layer_instance_gets_tf1_initial_values_and_passes():
    layer = SlimNetShim()
    layer(X)
    report = equivtool.check_equivalence(slim_net, layer, X, steps=["random", "gradients"],
                                         modes=["constant"])
    assert report.passed, str(report)


def test_user_layer_instance_values_are_restored_when_a_step_raises(monkeypatch):
    layer = SlimNetShim()
    layer(X)
    before = [v.numpy().copy() for v in layer.variables]
    calls = {"n": 0}

    def failing(original):  # the TF1 side's runs, plain or with the fixed values fed to its reads
        def run(self, *args, **kwargs):
            calls["n"] += 1
            if calls["n"] >= 2:  # the run with the fixed values (the first is the pair's inference pass)
                raise RuntimeError("session died")
            return original(self, *args, **kwargs)
        return run

    monkeypatch.setattr(runners.TF1Side, "run", failing(runners.TF1Side.run))
    monkeypatch.setattr(runners.TF1Side, "run_fed", failing(runners.TF1Side.run_fed))
    report = equivtool.check_equivalence(slim_net, layer, X, steps=["fixed_weights"])
    assert calls["n"] == 2
    assert report.step("fixed_weights").status == "error"
    assert "session died" in report.step("fixed_weights").message
    for old, variable in zip(before, layer.variables):
        np.testing.assert_array_equal(old, variable.numpy())


def test_model_build_failure_is_reported_once_and_later_steps_skip():
    def broken_tf1(inputs, training):
        raise ValueError("cannot build")

    report = equivtool.check_equivalence(broken_tf1, SlimNetShim, X)
    assert report.step("variables_once").status == "error"
    assert "cannot build" in report.step("variables_once").message
    for name in ("parity", "fixed_weights", "random/constant/inference", "random/constant/training",
                 "gradients"):
        assert report.step(name).status == "skipped", name
    assert not report.passed


def test_fixed_values_depend_only_on_name_and_shape():
    a = runners.fixed_value("net/conv/weights", (3, 3, 2, 4), tf.float32)
    b = runners.fixed_value("net/conv/weights", (3, 3, 2, 4), tf.float32)
    c = runners.fixed_value("net/conv2/weights", (3, 3, 2, 4), tf.float32)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert np.all(runners.fixed_value("bn/moving_variance", (16,), tf.float32) > 0)
    assert len(np.unique(a)) > a.size // 2  # varies along elements: catches a transposed kernel


def test_fixed_values_are_made_as_each_variable_is_assigned(monkeypatch):
    """Not a second copy of the model at once: a side assigning a chunk at a time
    holds one chunk of fixed values."""
    from equivtool.engine.steps import common as _step_runs

    made = []
    monkeypatch.setattr(_step_runs, "fixed_value",
                        lambda name, shape, dtype: made.append(name) or runners.fixed_value(name, shape, dtype))
    variables = [tf.Variable(tf.zeros([2, 3])), tf.Variable(tf.zeros([3]))]
    values = _step_runs.FixedValues(["w", "b"], variables, "ckpt/")
    assert "w" in values and "x" not in values and list(values) == ["w", "b"] and made == []
    np.testing.assert_array_equal(values["b"], runners.fixed_value("ckpt/b", (3,), tf.float32))
    assert made == ["ckpt/b"]


@pytest.mark.parametrize("kwargs, argument", [
    ({"steps": ["nope"]}, "steps"),
    ({"modes": ["sometimes"]}, "modes"),
    ({"train_steps": 0}, "train_steps"),
    ({"optimizers": (1, 2)}, "optimizers"),
    ({"step_tolerances": {"bogus": equivtool.Tolerance()}}, "step_tolerances"),
    ({"tolerance": 0.1}, "tolerance"),
])
def test_bad_options_name_the_argument(kwargs, argument):
    with pytest.raises((TypeError, ValueError), match=argument):
        equivtool.check_equivalence(slim_net, SlimNetShim, X, **kwargs)


def test_bad_positional_arguments_name_the_argument():
    with pytest.raises(TypeError, match="tf1_fn"):
        equivtool.check_equivalence("slim_net", SlimNetShim, X)
    with pytest.raises(TypeError, match="tf2_layer"):
        equivtool.check_equivalence(slim_net, 3, X)
    with pytest.raises(ValueError, match="inputs"):
        equivtool.check_equivalence(slim_net, SlimNetShim, ())


def test_assert_equivalent_fails_with_the_table():
    with pytest.raises(AssertionError, match=r"fixed_weights\s+FAILED"):
        assert_equivalent(slim_net, shim(bn_epsilon=0.5), X, steps=["fixed_weights"])
    report = assert_equivalent(slim_net, SlimNetShim, X, steps=["parity"])
    assert report.passed


def test_random_tool_fixture_makes_fresh_tools(random_tool):
    first, second = random_tool(mode="num_random_ops"), random_tool(mode="num_random_ops")
    assert first is not second
    with first.scope():
        a = tf.random.uniform([3])
    with second.scope():
        b = tf.random.uniform([3])
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_tf1_session_fixture_gives_a_graph_session(tf1_session):
    x = tf.compat.v1.placeholder(tf.float32, [2])
    assert tf1_session.graph is x.graph
    np.testing.assert_array_equal(tf1_session.run(x * 2, {x: [1, 2]}), [2, 4])


def test_only_the_runners_execute_tensorflow():
    # Graphs, sessions, optimizers and checkpoints live behind TF1Side/TF2Side:
    # the engine, its steps and the shared pair touch none of their APIs.
    import ast
    import inspect

    from equivtool import equivalence
    from equivtool.engine import pair as _pair
    from equivtool.engine.steps import checkpoint, common, forward, training, variables
    from equivtool.engine import registry as steps
    forbidden = {"session", "graph", "Session", "Saver", "minimize", "as_default", "variables_initializer"}
    # type checks of arguments, and the version in the report header
    allowed_tf = {"tf.distribute.Strategy", "tf.Module", "tf.distribute", "tf.__version__"}

    def dotted(node):
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        return ".".join([node.id] + parts[::-1]) if isinstance(node, ast.Name) else ""

    for module in (equivalence, common, variables, forward, training, checkpoint, _pair, steps):
        tree = ast.parse(inspect.getsource(module))
        attributes = [node for node in ast.walk(tree) if isinstance(node, ast.Attribute)]
        used = {node.attr for node in attributes}
        assert not used & forbidden, (module.__name__, sorted(used & forbidden))
        tf_uses = {dotted(node) for node in attributes if dotted(node).startswith("tf.")}
        assert tf_uses <= allowed_tf, (module.__name__, sorted(tf_uses - allowed_tf))


# --------------------------------------------------------------------------
# Arguments are checked before any step runs (issue 11)
# --------------------------------------------------------------------------

def _tf1_never_built(inputs, training):
    raise AssertionError("a step ran before the arguments were checked")


@pytest.mark.parametrize("kwargs, error, argument", [
    ({"step_tolerances": equivtool.Tolerance()}, TypeError, "step_tolerances"),
    ({"step_tolerances": [("gradients", equivtool.Tolerance())]}, TypeError, "step_tolerances"),
    ({"step_tolerances": {"gradients": 0.1}}, TypeError, "step_tolerances"),
    ({"step_tolerances": {"random/sometimes": equivtool.Tolerance()}}, ValueError, "step_tolerances"),
    ({"tolerance": {"logits": 0.1}}, TypeError, "tolerance"),
    ({"meta": ["model"]}, TypeError, "meta"),
    ({"meta": {1: "one"}}, TypeError, "meta"),
    ({"progress": 3}, TypeError, "progress"),
    ({"seed": "42"}, TypeError, "seed"),
    ({"seed": 2 ** 64}, ValueError, "seed"),
    ({"tf_function": "yes"}, TypeError, "tf_function"),
    ({"disable_arithmetic_optimization": "yes"}, TypeError, "disable_arithmetic_optimization"),
    ({"graph_rewrites": "fused"}, ValueError, "graph_rewrites"),
    ({"checkpoint": 3}, TypeError, "checkpoint"),
    ({"checkpoint": "/nonexistent/model.ckpt"}, ValueError, "checkpoint"),
])
def test_bad_arguments_are_refused_before_any_step_runs(kwargs, error, argument):
    seen = []
    with pytest.raises(error, match=argument) as info:
        equivtool.check_equivalence(_tf1_never_built, SlimNetShim, X, steps=["parity"],
                                    **{"progress": seen.append, **kwargs})
    assert "expected" in str(info.value)  # says what form the argument takes
    assert seen == []


@pytest.mark.parametrize("inputs", [np.ones([0, 4], np.float32),
                                    {"x": X, "mask": np.ones([X.shape[0], 0], np.float32)}])
def test_zero_size_inputs_are_refused(inputs):
    with pytest.raises(ValueError, match=r"inputs: leaf \d has shape .* no elements"):
        equivtool.check_equivalence(_tf1_never_built, SlimNetShim, inputs)


def test_non_finite_inputs_are_counted_in_the_report_header():
    x = X.copy()
    x.flat[0], x.flat[1], x.flat[2] = np.nan, np.inf, np.nan
    report = equivtool.check_equivalence(slim_net, SlimNetShim, x, steps=["parity"])
    assert report.meta["non_finite_inputs"] == f"leaf 0 (shape {list(X.shape)}): 2 NaN, 1 +inf of {X.size}"
    assert "non_finite_inputs" in str(report)
    clean = equivtool.check_equivalence(slim_net, SlimNetShim, X, steps=["parity"])
    assert "non_finite_inputs" not in clean.meta


def test_a_checkpoint_path_written_by_tf1_is_accepted_and_loaded(tmp_path):
    graph = tf.Graph()
    with graph.as_default():
        slim_net(tf.compat.v1.placeholder(tf.float32, X.shape), False)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            prefix = tf.compat.v1.train.Saver().save(session, str(tmp_path / "model.ckpt"))
    report = equivtool.check_equivalence(slim_net, SlimNetShim, X, steps=["checkpoint"],
                                         checkpoint=tmp_path / "model.ckpt")
    assert prefix == str(tmp_path / "model.ckpt")
    assert report.passed, str(report)
    assert report.step("checkpoint").data["missing"] == 0
    assert report.step("checkpoint").data["loaded_variables"] > 0


def test_the_engine_reads_one_frozen_options_object():
    import dataclasses

    from equivtool.engine.options import Options as _Options
    options = _Options.build(slim_net, SlimNetShim, X, **equivalence_arguments(
        optimizers=SGD, train_steps=2, seed=np.int64(7), meta={"model": "small"}))
    assert options.steps == equivtool.DEFAULT_STEPS + ("optimizer",)
    assert options.seed == 7 and type(options.seed) is int
    assert options.want_gradients and options.meta == {"model": "small"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.seed = 8


def test_a_variable_whose_shape_differs_fails_fixed_weights_by_name():
    def tf1_fn(x, training):
        return tf.compat.v1.layers.dense(x, 3, name="d")

    class Wider(tf.keras.layers.Layer):
        @tf.compat.v1.keras.utils.track_tf1_style_variables
        def call(self, x, training=None):
            return tf.compat.v1.layers.dense(tf.concat([x, x], 1), 3, name="d")

    x = np.ones([2, 4], np.float32)
    for workers in (1, 2):
        step = equivtool.check_equivalence(tf1_fn, Wider, x, steps=["fixed_weights"], workers=workers).steps[0]
        assert step.status == "failed", workers
        assert "d/kernel: TF1 [4, 3] float32, TF2 [8, 3] float32" in step.message, step.message


_LAYER_NORM_CHECK = """
import equivtool, numpy as np, tensorflow as tf
v1 = tf.compat.v1

def layer_norm_net(x, training=False):
    gamma = v1.get_variable("gamma", [8], initializer=v1.ones_initializer())
    beta = v1.get_variable("beta", [8], initializer=v1.zeros_initializer())
    mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(variance + 1e-12) * gamma + beta

class Shim(tf.keras.layers.Layer):
    @v1.keras.utils.track_tf1_style_variables
    def call(self, x, training=None):
        return layer_norm_net(x)

x = np.random.RandomState(0).rand(2, 6, 8).astype(np.float32)
report = equivtool.check_equivalence(layer_norm_net, Shim, x, steps=["fixed_weights"])
step = report.step("fixed_weights")
print(step.message)
print(step.status)
"""


def test_a_tf1_layer_norm_runs_on_every_tensorflow():
    # TensorFlow 2.16's remapper aborted the process at the TF1 side's first
    # session.run (a segmentation fault: in a child process, so it fails this
    # test instead of killing the run); equivtool's TF1 sessions switch it off there.
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", _LAYER_NORM_CHECK], cwd=root, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL="3"), timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-1500:])
    assert proc.stdout.split()[-1:] == ["passed"], proc.stdout


def test_the_remapper_is_switched_off_where_it_aborts_even_with_tensorflow_defaults():
    assert runners.remapper_aborts_on_layer_norm("2.16.2") and runners.remapper_aborts_on_layer_norm("2.16.0")
    assert not any(runners.remapper_aborts_on_layer_norm(v) for v in ("2.15.1", "2.17.1", "2.20.0", "2.21.0"))
    off = _tfi.RewriterConfig.OFF
    assert runners.session_config("as_written").graph_options.rewrite_options.remapping == off
    default = runners.session_config("tensorflow_default").graph_options.rewrite_options
    assert (default.remapping == off) == runners.remapper_aborts_on_layer_norm()  # on this TensorFlow
    assert default.arithmetic_optimization == 0  # TensorFlow's default


def test_check_equivalence_declares_its_arguments_once():
    """Its signature is the only declaration: Options.build reads every keyword
    argument by that name, and no other."""
    import inspect
    import re

    from equivtool.engine import options as _options
    source = inspect.getsource(_options.Options.build)
    read = set(re.findall(r"\ba\.(\w+)", source))
    keywords = {name for name, p in inspect.signature(equivtool.check_equivalence).parameters.items()
                if p.kind is p.KEYWORD_ONLY}
    assert len(keywords) > 20 and read == keywords, (sorted(keywords - read), sorted(read - keywords))
    with pytest.raises(AttributeError, match="slot_layout"):  # a name left out is not defaulted quietly
        arguments = equivalence_arguments()
        del arguments["slot_layout"]
        _options.Options.build(slim_net, SlimNetShim, X, **arguments)
