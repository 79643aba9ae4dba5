"""Both sides execute what was written (issue: one verdict on every machine).

Numbers cannot show a fusion on a CPU whose fused kernels happen to round like
the unfused ones, so these tests read what ran: the TF1 session's partition
graphs and the TF2 side's function graphs after every rewrite.
"""

from __future__ import annotations

import threading
import warnings

import equivtool  # noqa: F401  (environment fix first)
import numpy as np
import pytest
import tensorflow as tf
import tf_slim as slim

from equivtool._platform import graph_rewrites as _graph_rewrites
from equivtool.engine.sides import tf1_side as runners, tf2_side as tf2_layer
from equivtool._platform.tf_internals import RewriterConfig, context
from equivtool.variables import make_renamer

INPUTS = np.random.RandomState(0).uniform(-1, 1, (2, 8, 8, 3)).astype(np.float32)


def conv_bn_relu(inputs, training):
    """Conv (no bias: batch norm follows) + batch norm + ReLU, then a dense layer:
    the pattern the remapper fuses into _FusedConv2D / _FusedMatMul."""
    net = slim.conv2d(inputs, 8, 3, normalizer_fn=slim.batch_norm,
                      normalizer_params={"is_training": training, "scale": True}, scope="conv")
    return {"logits": slim.fully_connected(slim.flatten(net), 4, scope="fc")}


class ConvBnRelu(tf.keras.layers.Layer):
    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, inputs, training=None):
        return conv_bn_relu(inputs, bool(training))


def _old_session_config() -> tf.compat.v1.ConfigProto:
    """The TF1 session config before graph_rewrites: arithmetic optimizer off only."""
    config = tf.compat.v1.ConfigProto()
    config.graph_options.rewrite_options.arithmetic_optimization = RewriterConfig.OFF
    return config


def _tf1_kernels(config=None, graph_rewrites="as_written", fn=conv_bn_relu):
    side = runners.TF1Side(fn, INPUTS, renamer=make_renamer(None), loss_fn=None,
                           graph_rewrites=graph_rewrites)
    try:
        if config is not None:  # the planted fault: another session config
            side.session.close()
            side._config = config
            side.session = tf.compat.v1.Session(graph=side.graph, config=config)
        forward = side.forward(training=False)
        side.initialize()
        kernels = _graph_rewrites.session_kernels(side.session, forward.outputs, side.feed())
        return kernels, _graph_rewrites.written_types(side.graph.as_graph_def())
    finally:
        side.close()


def _tf2_kernels(graph_rewrites="as_written"):
    side = tf2_layer.TF2Side(ConvBnRelu(), renamer=make_renamer(None), loss_fn=None,
                           use_tf_function=True, graph_rewrites=graph_rewrites)
    # A function graph is optimized, and recorded, when first instantiated: the first call.
    return _graph_rewrites.function_kernels(lambda: side.forward(INPUTS, training=False))


def test_tf1_session_runs_no_fused_kernel_as_written():
    kernels, written = _tf1_kernels()
    assert {"Conv2D", "FusedBatchNormV3", "Relu", "MatMul"} <= written
    assert kernels, "nothing was read from the session's partition graphs"
    assert _graph_rewrites.fused_kernels(kernels, written) == {}


def test_tf1_planted_old_config_runs_fused_kernels():
    """The session config before this change (arithmetic optimizer off only)
    lets the remapper fuse conv + batch norm + ReLU: the check catches it."""
    kernels, written = _tf1_kernels(config=_old_session_config())
    fused = set(_graph_rewrites.fused_kernels(kernels, written).values())
    assert fused & {"_MklNativeFusedConv2D", "_FusedConv2D", "_MklFusedConv2D"}, fused
    assert fused & {"_MklNativeFusedMatMul", "_FusedMatMul", "_MklFusedMatMul"}, fused


def test_tf1_tensorflow_default_runs_fused_kernels():
    kernels, written = _tf1_kernels(graph_rewrites="tensorflow_default")
    assert _graph_rewrites.fused_kernels(kernels, written)


def test_tf2_function_runs_no_fused_kernel_as_written():
    kernels, written = _tf2_kernels()
    assert {"Conv2D", "FusedBatchNormV3", "Relu", "MatMul"} <= written
    assert kernels, "nothing was read from the function graphs"
    assert _graph_rewrites.fused_kernels(kernels, written) == {}


def test_tf2_function_tensorflow_default_runs_fused_kernels():
    """Without the function options (TensorFlow's defaults) tf.function graphs are fused too."""
    kernels, written = _tf2_kernels(graph_rewrites="tensorflow_default")
    fused = set(_graph_rewrites.fused_kernels(kernels, written).values())
    assert fused & {"_MklNativeFusedConv2D", "_FusedConv2D", "_MklFusedConv2D"}, fused


def _leave_graphs_behind():
    """Run a fresh tf.function, with nothing recording: the runtime keeps its graphs
    for the next call that records."""
    @tf.function
    def left_behind(x):
        return tf.nn.softplus(x) * 3.0
    left_behind(tf.constant(1.0))


def test_graphs_instantiated_before_the_call_are_not_read_as_its_own(monkeypatch):
    """The CI failure this fixes: an earlier test's fused training graphs were read as the
    measured call's kernels. With the drain they are not; without it (planted) they are."""
    def left_over(kernels):
        return {name: kind for name, kind in kernels.items() if "Softplus" in kind}
    # The runtime keeps left-over graphs once anything in the process has recorded.
    _graph_rewrites.function_kernels(tf.function(tf.identity), tf.constant(0.0))
    _leave_graphs_behind()
    kernels, _ = _tf2_kernels()
    assert kernels and left_over(kernels) == {}
    monkeypatch.setattr(_graph_rewrites, "_drain_function_graphs", lambda ctx: None)
    _leave_graphs_behind()
    kernels, _ = _tf2_kernels()
    assert left_over(kernels), "the planted leak was not seen: the test proves nothing"


def test_conv_bias_merge_is_the_one_onednn_rewrite_left():
    """oneDNN's graph pass merges Conv2D + BiasAdd whatever the session options;
    the check names it unless allowed, and allows nothing else."""
    def conv_bias(inputs, training):
        return slim.conv2d(inputs, 4, 3, activation_fn=None, scope="conv")
    kernels, written = _tf1_kernels(fn=conv_bias)
    merged = _graph_rewrites.fused_kernels(kernels, written, allow=())
    if _graph_rewrites.onednn_enabled():
        assert set(merged.values()) == {"_MklNativeConv2DWithBias"}
    assert _graph_rewrites.fused_kernels(kernels, written) == {}


def test_fused_kernels_judges_names():
    written = {"Conv2D", "BiasAdd", "Relu"}
    kernels = {"a": "_MklNativeConv2D", "b": "BiasAdd", "c": "_Arg", "d": "_FusedConv2D", "e": "Relu"}
    assert _graph_rewrites.fused_kernels(kernels, written) == {"d": "_FusedConv2D"}
    assert _graph_rewrites.fused_kernels({}, written) == {}


def test_function_rewrites_restores_options_and_leaves_other_threads():
    ctx = context.context()
    before = ctx.function_call_options
    seen = {}

    def other_thread():
        seen["other"] = ctx.function_call_options.config_proto_serialized

    with pytest.raises(RuntimeError):
        with _graph_rewrites.function_rewrites("as_written"):
            inside = tf.compat.v1.ConfigProto()
            inside.ParseFromString(ctx.function_call_options.config_proto_serialized)
            assert inside.graph_options.rewrite_options.remapping == RewriterConfig.OFF
            thread = threading.Thread(target=other_thread)
            thread.start()
            thread.join()
            raise RuntimeError("planted")
    assert ctx.function_call_options is before
    other = tf.compat.v1.ConfigProto()
    other.ParseFromString(seen["other"])
    assert other.graph_options.rewrite_options.remapping != RewriterConfig.OFF


def test_function_rewrites_over_an_all_default_config():
    """A thread whose function-call config serializes to nothing (every field at its
    default) still gets the passes off, and its own options back."""
    from tensorflow.python.eager.context import FunctionCallOptions
    ctx = context.context()
    before = ctx.function_call_options
    ctx.function_call_options = FunctionCallOptions(config_proto=tf.compat.v1.ConfigProto())
    empty = ctx.function_call_options
    try:
        assert empty.config_proto_serialized == b""
        with _graph_rewrites.function_rewrites("as_written"):
            inside = tf.compat.v1.ConfigProto()
            inside.ParseFromString(ctx.function_call_options.config_proto_serialized)
            assert inside.graph_options.rewrite_options.remapping == RewriterConfig.OFF
        assert ctx.function_call_options is empty
    finally:
        ctx.function_call_options = before


def test_function_rewrites_out_of_order_exit_on_threads():
    """Scopes entered on two threads end in any order; each thread gets its own options back."""
    ctx = context.context()
    results, barrier = {}, threading.Barrier(2)

    def run(name, wait_first):
        before = ctx.function_call_options
        scope = _graph_rewrites.function_rewrites("as_written")
        scope.__enter__()
        barrier.wait()
        if wait_first:
            barrier.wait()
        scope.__exit__(None, None, None)
        if not wait_first:
            barrier.wait()
        results[name] = ctx.function_call_options is before

    threads = [threading.Thread(target=run, args=("a", True)), threading.Thread(target=run, args=("b", False))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {"a": True, "b": True}


def test_session_config_as_written_turns_numeric_passes_off():
    config = runners.session_config("as_written")
    options = config.graph_options.rewrite_options
    for name in _graph_rewrites.turned_off("as_written"):
        assert getattr(options, name) == RewriterConfig.OFF, name
    assert {"remapping", "arithmetic_optimization", "constant_folding"} <= set(
        _graph_rewrites.turned_off("as_written"))
    default = runners.session_config("tensorflow_default").graph_options.rewrite_options
    assert default.arithmetic_optimization == RewriterConfig.DEFAULT


@pytest.mark.parametrize("value", ["as-written", None, True, "default"])
def test_graph_rewrites_refused(value):
    with pytest.raises(ValueError, match="graph_rewrites: expected one of 'as_written', 'tensorflow_default'"):
        equivtool.check_equivalence(conv_bn_relu, ConvBnRelu, INPUTS, graph_rewrites=value)


def test_disable_arithmetic_optimization_is_deprecated():
    from equivtool.engine.options import _graph_rewrites
    with pytest.warns(DeprecationWarning, match="graph_rewrites='tensorflow_default'"):
        assert _graph_rewrites("as_written", False) == "tensorflow_default"
    with pytest.warns(DeprecationWarning, match="graph_rewrites='as_written'"):
        assert _graph_rewrites("as_written", True) == "as_written"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _graph_rewrites("tensorflow_default", None) == "tensorflow_default"
    with pytest.raises(ValueError, match="contradicts graph_rewrites"):
        _graph_rewrites("tensorflow_default", True)
    with pytest.raises(TypeError, match="disable_arithmetic_optimization: expected True or False"):
        _graph_rewrites("as_written", "yes")


def test_report_header_says_what_the_verdict_depends_on():
    report = equivtool.check_equivalence(conv_bn_relu, ConvBnRelu, INPUTS, steps=["fixed_weights"],
                                         tf_function=True)
    platform = report.meta["platform"]
    assert platform["cpu"]["model"] and isinstance(platform["cpu"]["isa"], list)
    assert platform["onednn"] in (True, False)
    assert platform["threads"]["intra_op"] >= 1 and platform["threads"]["inter_op"] >= 1
    assert "remapping" in platform["rewrites_off"]["tf1"] and "remapping" in platform["rewrites_off"]["tf2"]
    assert "depends_on_cpu" not in platform
    text = str(report)
    assert "machine: " + platform["cpu"]["model"] in text and "graph rewrites: as_written" in text
    assert report.to_dict()["meta"]["platform"]["graph_rewrites"] == "as_written"
    default = equivtool.check_equivalence(conv_bn_relu, ConvBnRelu, INPUTS, steps=["fixed_weights"],
                                          graph_rewrites="tensorflow_default")
    assert "may differ on another CPU" in str(default)
    assert default.meta["platform"]["rewrites_off"]["tf2"].startswith("eager")
