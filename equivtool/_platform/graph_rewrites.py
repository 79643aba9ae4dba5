"""What each side executes, and what a verdict depends on.

A verdict must not depend on the machine. TensorFlow does not run the graph a
user wrote: before a TF1 session or a ``tf.function`` runs, Grappler rewrites
it, and some of its passes change float results. The remapper fuses
``Conv2D``/``MatMul`` + ``BiasAdd`` + ``FusedBatchNorm`` + an activation into one
oneDNN kernel (``_FusedConv2D``, ``_FusedMatMul``, ``_FusedBatchNormEx``) whose
rounding depends on the CPU's instruction set (AVX2, AVX-512, AMX); an eagerly
run TF2 side executes the same ops one by one, unfused. The same faithful model
was EQUIVALENT on an AMD EPYC and NOT on an Intel Xeon with AMX.

So every graph a side runs is, by default, run **as written**
(``graph_rewrites="as_written"``): the passes in :data:`NUMERIC_PASSES` are off
in the TF1 session's ``ConfigProto`` and, through this thread's function-call
options (thread-local, restored on exit), for the TF2 side's ``tf.function``
graphs. ``"tensorflow_default"`` runs TensorFlow's defaults on both sides, to
prove the deployed, fused graphs against each other; the report then says the
verdict may depend on the CPU.

oneDNN's own graph pass (on by default on x86-64 Linux, switched only by
``TF_ENABLE_ONEDNN_OPTS`` before TensorFlow starts) still swaps each op for its
oneDNN kernel of the same op (``Conv2D`` -> ``_MklNativeConv2D``), as eager
execution does; it also merges ``Conv2D`` + ``BiasAdd`` into
``_MklNativeConv2DWithBias`` and ``Pad`` + ``Conv2D`` into ``_MklNativePadWithConv2D``,
which no session option switches off. Those merges are the rewrites left
(:data:`ONEDNN_MERGES`; measured bitwise equal to the unfused ops on the zoo,
``benchmarks/graph_rewrites.py``); :func:`fused_kernels` reports every other
kernel that was not written.

:func:`platform` describes what a verdict depends on: the CPU and the
instruction sets oneDNN can use, whether oneDNN is on, the rewrites turned off
on each side, and the thread counts.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import platform as _platform_module
import re
from typing import Any, Callable, Iterable, Iterator

GRAPH_REWRITES = ("as_written", "tensorflow_default")

#: Grappler passes that can change a float result, and how. Each is off under
#: ``"as_written"``, in the TF1 session and in the TF2 side's function graphs.
#: (Measured on the zoo: see docs/graph-rewrites.md.)
NUMERIC_PASSES: dict[str, str] = {
    "remapping": "fuses Conv2D/MatMul + BiasAdd + FusedBatchNorm + activation into one oneDNN kernel "
                 "(_FusedConv2D, _FusedMatMul, _FusedBatchNormEx) whose rounding depends on the CPU",
    "arithmetic_optimization": "rewrites the algebra (hoists common factors, folds chains of adds and "
                               "multiplications by constants, ...)",
    "constant_folding": "evaluates float subgraphs of constants once at optimization time",
    "layout_optimizer": "transposes convolutions between NHWC and NCHW (GPU)",
    "auto_mixed_precision": "computes in float16 (GPU)",
    "auto_mixed_precision_onednn_bfloat16": "computes in bfloat16 (oneDNN CPUs)",
    "auto_mixed_precision_mkl": "computes in bfloat16 (oneDNN CPUs; the older name)",
    "auto_mixed_precision_cpu": "computes in float16 on the CPU",
    "implementation_selector": "swaps a function for another implementation of the same API "
                               "(the cuDNN LSTM/GRU)",
}

#: Rewrites of oneDNN's graph pass that merge written ops and that no session
#: option switches off (only ``TF_ENABLE_ONEDNN_OPTS=0`` before TensorFlow starts).
ONEDNN_MERGES = ("Conv2DWithBias", "PadWithConv2D")

# Kernels of TensorFlow's own plumbing: they move values, not compute them.
_PLUMBING = frozenset({
    "_Arg", "_Retval", "_Send", "_Recv", "_HostSend", "_HostRecv", "_DeviceArg", "_DeviceRetval",
    "Const", "HostConst", "Identity", "IdentityN", "NoOp", "_MklToTf", "_MklInputConversion",
    "ReadVariableOp", "VarHandleOp", "Placeholder", "PlaceholderWithDefault", "_ReadVariablesOp",
    "StatefulPartitionedCall", "PartitionedCall", "_ConstantFolding"})
_ONEDNN_PREFIX = re.compile(r"^_Mkl(Native)?")


def check_graph_rewrites(graph_rewrites, argument: str = "graph_rewrites") -> str:
    """``graph_rewrites`` itself, or an error naming the argument and the choices."""
    if graph_rewrites not in GRAPH_REWRITES:
        raise ValueError(f"{argument}: expected one of {', '.join(repr(g) for g in GRAPH_REWRITES)}, "
                         f"got {graph_rewrites!r}")
    return graph_rewrites


@functools.lru_cache(maxsize=None)
def _known_passes() -> tuple:
    """The passes of :data:`NUMERIC_PASSES` this TensorFlow's RewriterConfig has."""
    from equivtool._platform.tf_internals import RewriterConfig
    fields = {field.name for field in RewriterConfig.DESCRIPTOR.fields}
    return tuple(name for name in NUMERIC_PASSES if name in fields)


def remapper_aborts_on_layer_norm(version: str | None = None) -> bool:
    """Whether Grappler's remapper kills the process on a TF1 layer norm.

    TensorFlow 2.16's remapper (with oneDNN, the default on x86-64 Linux) takes
    a layer norm written out of ``tf.nn.moments``, ``rsqrt`` and graph variables
    (BERT's, in TF1 code) for its oneDNN layer-norm fusion and aborts in
    protobuf (``CHECK failed: ... key not found: value``): a segmentation fault
    at the first ``session.run``, in any TF1 session. 2.17 and later run the
    same graph. Found by ``./dev matrix`` (2.16.2); a crash cannot be probed in
    the process it kills, so this one is known by version.
    """
    import tensorflow as tf
    from equivtool._platform.env import _minor
    return _minor(version or tf.__version__) == (2, 16)


def turned_off(graph_rewrites: str) -> tuple:
    """The Grappler passes turned off on a graph-running side under ``graph_rewrites``."""
    check_graph_rewrites(graph_rewrites)
    if graph_rewrites == "as_written":
        return _known_passes()
    return ("remapping",) if remapper_aborts_on_layer_norm() else ()


def rewrite_config(graph_rewrites: str, config=None):
    """A ``ConfigProto`` (a copy of ``config``, or a new one) with the passes of
    :func:`turned_off` off."""
    import tensorflow as tf
    from equivtool._platform.tf_internals import RewriterConfig
    result = tf.compat.v1.ConfigProto()
    if config is not None:
        result.CopyFrom(config)
    options = result.graph_options.rewrite_options
    for name in turned_off(graph_rewrites):
        setattr(options, name, RewriterConfig.OFF)
    return result


@contextlib.contextmanager
def function_rewrites(graph_rewrites: str) -> Iterator[None]:
    """Run this thread's ``tf.function`` calls with the passes of :func:`turned_off` off.

    The options live in the eager context's per-thread function-call options
    (the ``config_proto`` every function call carries), so other threads are
    untouched; the thread's own options object is put back on every exit path.
    A function is optimized when it is first instantiated with a given config, so
    a function called both inside and outside gets two instantiations.
    """
    off = turned_off(graph_rewrites)
    if not off:
        yield
        return
    from equivtool._platform.tf_internals import context
    ctx = context.context()
    previous = ctx.function_call_options
    options = copy.copy(previous)
    serialized = previous.config_proto_serialized  # b"" for an all-default config
    options.config_proto_serialized = rewrite_config(graph_rewrites, _parse_config(serialized) if serialized else None)
    ctx.function_call_options = options
    try:
        yield
    finally:
        ctx.function_call_options = previous


def _parse_config(serialized: bytes):
    import tensorflow as tf
    config = tf.compat.v1.ConfigProto()
    config.ParseFromString(serialized)
    return config


# --------------------------------------------------------------------------
# What ran
# --------------------------------------------------------------------------

def session_kernels(session, fetches, feed_dict=None) -> dict:
    """Run ``fetches`` once and return ``{node name: kernel type}`` of what the
    session executed: its partition graphs after every rewrite."""
    import tensorflow as tf
    metadata = tf.compat.v1.RunMetadata()
    session.run(fetches, feed_dict, options=tf.compat.v1.RunOptions(output_partition_graphs=True),
                run_metadata=metadata)
    return {node.name: node.op for graph in metadata.partition_graphs for node in graph.node}


def function_kernels(fn: Callable, *args, graph_rewrites: str | None = None) -> tuple[dict, set]:
    """Call ``fn(*args)`` (a ``tf.function``) once, under :func:`function_rewrites`
    when ``graph_rewrites`` is given, and return ``{node name: kernel type}`` of the
    function graphs the runtime executed, after every rewrite, and the op types
    of the same functions as traced (written). The runtime records a function
    graph when it instantiates it, at the first call with given options: call a
    fresh function."""
    from equivtool._platform.tf_internals import context
    ctx = context.context()
    scope = function_rewrites(graph_rewrites) if graph_rewrites else contextlib.nullcontext()
    ctx.enable_run_metadata()
    try:
        _drain_function_graphs(ctx)
        with scope:
            fn(*args)
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    kernels = {node.name: node.op for function in metadata.function_graphs
               for graph in function.partition_graphs for node in graph.node}
    written = set().union(*(written_types(function.pre_optimization_graph)
                            for function in metadata.function_graphs))
    return kernels, written


def _drain_function_graphs(ctx) -> None:
    """Empty the context's record of function graphs before a measured call.

    Once anything in the process has recorded run metadata, the runtime keeps
    the graphs of every function instantiated while nobody records, and hands
    them to the next call that runs with run metadata on (in CI, an earlier
    test's fused training kernels were read as a dump run's). One call of a
    fresh function flushes them into the metadata, which is then thrown away."""
    import tensorflow as tf
    tf.function(tf.identity, autograph=False)(tf.constant(0.0))
    ctx.export_run_metadata()


def written_types(graph_def) -> set:
    """The op types a ``GraphDef`` holds, its function library's included."""
    types = {node.op for node in graph_def.node}
    for function in graph_def.library.function:
        types.update(node.op for node in function.node_def)
    return types


def fused_kernels(kernels: dict, written: Iterable[str], allow: Iterable[str] = ONEDNN_MERGES) -> dict:
    """The kernels of ``kernels`` ({name: type}) that compute something not
    written: a type that is neither a written op type, nor its oneDNN kernel
    (``_Mkl``/``_MklNative`` + the written type), nor TensorFlow's plumbing, nor
    one of ``allow`` (by default the oneDNN merges no option switches off)."""
    written, allow = set(written), set(allow)
    return {name: kind for name, kind in kernels.items()
            if kind not in _PLUMBING and kind not in written
            and _ONEDNN_PREFIX.sub("", kind) not in written | allow}


# --------------------------------------------------------------------------
# What a verdict depends on
# --------------------------------------------------------------------------

_ISA_FLAGS = (("avx2", "AVX2"), ("avx512f", "AVX-512"), ("avx512_vnni", "AVX-512 VNNI"),
              ("avx512_bf16", "AVX-512 BF16"), ("avx512_fp16", "AVX-512 FP16"),
              ("amx_bf16", "AMX BF16"), ("amx_fp16", "AMX FP16"))


@functools.lru_cache(maxsize=None)
def cpu() -> dict:
    """The CPU's model name and the instruction sets oneDNN can use on it."""
    model, flags = _platform_module.processor() or _platform_module.machine(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name":
                    model = value.strip()
                elif key == "flags":
                    flags = set(value.split())
                if model and flags and key == "flags":
                    break
    except OSError:
        pass
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    return {"model": model, "isa": [name for flag, name in _ISA_FLAGS if flag in flags],
            **({"onednn_max_cpu_isa": limit} if limit else {})}


def onednn_enabled() -> bool:
    from equivtool._platform.tf_internals import util_port
    return bool(util_port.IsMklEnabled())


def threads() -> dict:
    """TensorFlow's intra- and inter-op thread counts, and whether they are
    TensorFlow's default (0 asked: one per core) or set by the user."""
    import tensorflow as tf
    cores = os.cpu_count() or 1
    intra = tf.config.threading.get_intra_op_parallelism_threads()
    inter = tf.config.threading.get_inter_op_parallelism_threads()
    return {"intra_op": intra or cores, "inter_op": inter or cores,
            "default": not intra and not inter}


def platform(graph_rewrites: str | None = None, tf_function: bool = False) -> dict:
    """What a verdict depends on: CPU, oneDNN, thread counts and, with
    ``graph_rewrites``, the rewrites turned off on each side."""
    described = {"cpu": cpu(), "onednn": onednn_enabled(), "threads": threads()}
    if graph_rewrites is not None:
        off = list(turned_off(graph_rewrites))
        described["graph_rewrites"] = graph_rewrites
        described["rewrites_off"] = {
            "tf1": off,
            "tf2": off if tf_function else "eager: no graph, each op runs as written"}
        if graph_rewrites == "tensorflow_default":
            described["depends_on_cpu"] = (
                "TensorFlow's graph rewrites are on: fused kernels round differently across CPUs "
                "(AVX2, AVX-512, AMX), so this verdict may not hold on another machine")
    return described
