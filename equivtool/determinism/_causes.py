"""The op recorder and the cause rules: from the ops and datasets a step uses to :class:`Cause`\\ s."""

from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

import tensorflow as tf

from equivtool._base.stack import innermost_user_frame, user_frame_location
from equivtool.determinism import _tf
from equivtool.determinism._report import Cause

CAUSE_KINDS = (
    "unseeded_random_op",
    "random_op_state_in_session",
    "nondeterministic_dataset",
    "reshuffling_dataset",
    "dataset_iterator",
    "gpu_nondeterministic_op",
)

# Stateful random ops: they take a (seed, seed2) pair of attributes; (0, 0)
# means "no seed at all" and TensorFlow then seeds the kernel at random.
STATEFUL_RANDOM_OPS = frozenset({
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "ParameterizedTruncatedNormal", "RandomShuffle", "Multinomial", "RandomGamma",
    "RandomPoisson", "RandomPoissonV2", "RandomCrop", "RandomShuffleQueue",
    "RandomShuffleQueueV2", "RandomDataset", "RandomDatasetV2", "ExperimentalRandomDataset",
    "ShuffleDataset", "ShuffleDatasetV2", "ShuffleDatasetV3", "ShuffleAndRepeatDataset",
    "ShuffleAndRepeatDatasetV2", "SampleDistortedBoundingBox", "SampleDistortedBoundingBoxV2",
    "AllCandidateSampler", "UniformCandidateSampler", "LogUniformCandidateSampler",
    "LearnedUnigramCandidateSampler", "FixedUnigramCandidateSampler",
    "ThreadUnsafeUnigramCandidateSampler",
})
# Dataset ops whose seeds are inputs, not attributes: never judged by attributes.
_SEED_AS_INPUT = frozenset({
    "ShuffleDataset", "ShuffleDatasetV2", "ShuffleDatasetV3", "ShuffleAndRepeatDataset",
    "ShuffleAndRepeatDatasetV2", "RandomDataset", "RandomDatasetV2", "ExperimentalRandomDataset",
})

_XENT_HINT = ("use equivtool's deterministic cross-entropy: wrap the step in "
              "`with equivtool.ops.deterministic_xent():` or call "
              "`equivtool.ops.sparse_softmax_cross_entropy_with_logits` directly; "
              "or call tf.config.experimental.enable_op_determinism()")
_DETERMINISM_HINT = "call tf.config.experimental.enable_op_determinism() before building the step"

# Ops with a non-deterministic GPU kernel when op determinism is disabled
# (atomic accumulation, or cuDNN algorithms chosen by autotuning), and what to do.
GPU_NONDETERMINISTIC_OPS: Mapping[str, str] = types.MappingProxyType({
    "SparseSoftmaxCrossEntropyWithLogits": _XENT_HINT,
    "SoftmaxCrossEntropyWithLogits": _XENT_HINT,
    "BiasAddGrad": _DETERMINISM_HINT,
    "Conv2DBackpropFilter": _DETERMINISM_HINT + " (cuDNN backprop algorithms)",
    "Conv2DBackpropInput": _DETERMINISM_HINT + " (cuDNN backprop algorithms)",
    "Conv3DBackpropFilterV2": _DETERMINISM_HINT + " (cuDNN backprop algorithms)",
    "Conv3DBackpropInputV2": _DETERMINISM_HINT + " (cuDNN backprop algorithms)",
    "DepthwiseConv2dNativeBackpropFilter": _DETERMINISM_HINT,
    "DepthwiseConv2dNativeBackpropInput": _DETERMINISM_HINT,
    "MaxPoolGrad": _DETERMINISM_HINT + " (cuDNN max-pool backprop)",
    "MaxPoolGradV2": _DETERMINISM_HINT + " (cuDNN max-pool backprop)",
    "MaxPool3DGrad": _DETERMINISM_HINT,
    "FusedBatchNormGradV3": _DETERMINISM_HINT,
    "UnsortedSegmentSum": _DETERMINISM_HINT + " (also the gradient of tf.gather)",
    "UnsortedSegmentProd": _DETERMINISM_HINT,
    "UnsortedSegmentMax": _DETERMINISM_HINT,
    "UnsortedSegmentMin": _DETERMINISM_HINT,
    "SegmentSum": _DETERMINISM_HINT,
    "SegmentProd": _DETERMINISM_HINT,
    "SparseSegmentSumGrad": _DETERMINISM_HINT,
    "SparseSegmentMeanGrad": _DETERMINISM_HINT,
    "SparseSegmentSqrtNGrad": _DETERMINISM_HINT,
    "ScatterAdd": _DETERMINISM_HINT, "ScatterSub": _DETERMINISM_HINT,
    "ScatterNd": _DETERMINISM_HINT, "ScatterNdAdd": _DETERMINISM_HINT,
    "ScatterNdSub": _DETERMINISM_HINT, "TensorScatterAdd": _DETERMINISM_HINT,
    "TensorScatterSub": _DETERMINISM_HINT, "ResourceScatterAdd": _DETERMINISM_HINT,
    "ResourceScatterSub": _DETERMINISM_HINT, "ResourceScatterNdAdd": _DETERMINISM_HINT,
    "ResourceScatterNdSub": _DETERMINISM_HINT,
    "SparseTensorDenseMatMul": _DETERMINISM_HINT,
    "ResizeBilinearGrad": _DETERMINISM_HINT, "ResizeNearestNeighborGrad": _DETERMINISM_HINT,
    "ResizeBicubicGrad": _DETERMINISM_HINT,
    "CropAndResizeGradImage": _DETERMINISM_HINT, "CropAndResizeGradBoxes": _DETERMINISM_HINT,
    "CTCLoss": _DETERMINISM_HINT, "CTCLossV2": _DETERMINISM_HINT, "CudnnCTCLoss": _DETERMINISM_HINT,
    "Bincount": _DETERMINISM_HINT, "DenseBincount": _DETERMINISM_HINT,
})

# tf.data ops that may hand out elements out of order, and the method that makes them.
_PARALLEL_DATASET_OPS = {
    "ParallelMapDataset": "map", "ParallelMapDatasetV2": "map",
    "ParallelInterleaveDatasetV2": "interleave", "ParallelInterleaveDatasetV3": "interleave",
    "ParallelInterleaveDatasetV4": "interleave", "ParallelBatchDataset": "batch",
    "MapAndBatchDataset": "map_and_batch",
    "LegacyParallelInterleaveDatasetV2": "parallel_interleave",
    "ExperimentalParallelInterleaveDataset": "parallel_interleave",
    "ParseExampleDatasetV2": "parse_example_dataset",
}
_SHUFFLE_DATASET_OPS = frozenset({"ShuffleDataset", "ShuffleDatasetV2", "ShuffleDatasetV3",
                                  "ShuffleAndRepeatDataset", "ShuffleAndRepeatDatasetV2"})

# Ops through which an optimizer applies a sparse gradient (tf.IndexedSlices) to a
# variable, its first input: the scatters of TF1's and Keras's sparse updates
# and TF1's fused sparse-apply kernels, ref and resource forms.
_SPARSE_APPLY = ("Adadelta", "Adagrad", "AdagradV2", "AdagradDA", "CenteredRMSProp", "Ftrl", "FtrlV2",
                 "Momentum", "KerasMomentum", "ProximalAdagrad", "ProximalGradientDescent", "RMSProp")
SPARSE_UPDATE_OPS = frozenset(
    {"ScatterAdd", "ScatterSub", "ResourceScatterAdd", "ResourceScatterSub"}
    | {f"{prefix}SparseApply{name}" for prefix in ("", "Resource") for name in _SPARSE_APPLY})

_INTERESTING_OPS = STATEFUL_RANDOM_OPS | frozenset(_PARALLEL_DATASET_OPS) | frozenset(GPU_NONDETERMINISTIC_OPS)


def _graph_op_location(op) -> str:
    """The innermost user frame of a graph op's creation stack, or ""."""
    try:
        frames = list(op.traceback)
    except Exception:  # noqa: BLE001 - a location is a nicety
        return ""
    return innermost_user_frame(frames)


# ---------------------------------------------------------------------------
# Ops seen
# ---------------------------------------------------------------------------


def _variable_source(tensor) -> Any:
    """What a sparse update's first input names: the eager handle a tf.function
    captured (followed out of nested function graphs), else ``(graph, op name)``
    of the graph variable (``VarHandleOp``/``VariableV2``)."""
    for _ in range(16):  # function graphs nest only a few levels deep
        try:
            graph, op = tensor.graph, tensor.op
        except AttributeError:  # an eager handle
            return tensor
        if op.type != "Placeholder":
            break
        external = next((e for e, i in getattr(graph, "captures", ()) if i is tensor), None)
        if external is None:
            break
        tensor = external
    return (tensor.graph, tensor.op.name)


@dataclass(frozen=True)
class _SparseUpdate:
    """An op that applied a sparse gradient: its type, its target (see
    :func:`_variable_source`, or a FunctionDef input string) and where it was seen."""

    op_type: str
    target: Any
    where: str


@dataclass(frozen=True)
class _OpSeen:
    op_type: str
    attrs: Mapping[str, Any]
    location: str
    where: str  # "eager", "graph", "tf.function <name>", "session graph"


def _attr_value(value: Any) -> Any:
    """An op attribute as a Python value (AttrValue protos decoded; None stays None)."""
    if hasattr(value, "WhichOneof"):
        which = value.WhichOneof("value")
        if which == "s":
            return value.s.decode("utf-8", "replace")
        if which in ("i", "b", "f"):
            return getattr(value, which)
        if which == "func":
            return value.func.name
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


_WANTED_ATTRS = ("seed", "seed2", "deterministic", "sloppy", "reshuffle_each_iteration")


def _wanted_attrs(pairs: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    return {k: _attr_value(v) for k, v in pairs if k in _WANTED_ATTRS}


def _function_names_in_attrs(attr_map) -> list[str]:
    names = []
    for value in attr_map.values():
        which = value.WhichOneof("value")
        if which == "func":
            names.append(value.func.name)
        elif which == "list":
            names.extend(f.name for f in value.list.func)
    return names


class _OpRecorder:
    """Collects the ops a run executes eagerly or creates in graphs (an op callback)."""

    def __init__(self) -> None:
        self.ops: list[_OpSeen] = []
        self._keys: set = set()
        self.functions_done: set[str] = set()
        self._is_function: dict[str, bool] = {}
        self.library: dict[str, Any] = {}  # FunctionDefs found in graph libraries
        self.sparse_updates: list[_SparseUpdate] = []
        self._sparse_keys: set = set()

    def add_sparse_update(self, op_type: str, target: Any, where: str) -> None:
        key = (op_type, id(target) if not isinstance(target, (str, tuple)) else target)
        if key not in self._sparse_keys:
            self._sparse_keys.add(key)
            self.sparse_updates.append(_SparseUpdate(op_type, target, where))

    def add(self, seen: _OpSeen) -> None:
        key = (seen.op_type, tuple(sorted(seen.attrs.items())), seen.location, seen.where)
        if key not in self._keys:
            self._keys.add(key)
            self.ops.append(seen)

    # -- the callback --------------------------------------------------------

    def callback(self, op_type, inputs, attrs, outputs, op_name=None, graph=None):
        op_type = op_type.decode("utf-8") if isinstance(op_type, bytes) else str(op_type)
        if op_type in SPARSE_UPDATE_OPS:
            self._callback_sparse_update(op_type, inputs, outputs, op_name, graph)
        if op_type in _INTERESTING_OPS:
            if graph is None:
                pairs = zip(attrs[0::2], attrs[1::2]) if attrs else ()
                self.add(_OpSeen(op_type, _wanted_attrs(pairs), user_frame_location(2), "eager"))
            else:
                op = outputs[0].op if outputs else None
                if op is None and op_name is not None:
                    try:
                        op = graph.get_operation_by_name(op_name)
                    except (KeyError, ValueError):
                        op = None
                if op is not None:
                    self.add(_OpSeen(op_type, _wanted_attrs(op.node_def.attr.items()),
                                     _graph_op_location(op) or user_frame_location(2), "graph"))
        elif graph is None and self._function_call(op_type):
            self.scan_function(op_type, f"tf.function {op_type} called at {user_frame_location(2)}")
        return None

    def _callback_sparse_update(self, op_type, inputs, outputs, op_name, graph) -> None:
        if graph is None:
            if inputs:
                self.add_sparse_update(op_type, inputs[0], "eager")
            return
        try:
            op = graph.get_operation_by_name(op_name) if op_name is not None else outputs[0].op
            self.add_sparse_update(op_type, _variable_source(op.inputs[0]), "graph")
        except (KeyError, ValueError, IndexError, AttributeError, TypeError):
            pass  # a note is a nicety: never fail the step for it

    def _function_call(self, op_type: str) -> bool:
        known = self._is_function.get(op_type)
        if known is None:
            known = self._is_function[op_type] = _tf.has_function(op_type)
        return known

    # -- graphs and function libraries ----------------------------------------

    def _function_def(self, name: str):
        fdef = self.library.get(name)
        if fdef is not None:
            return fdef
        return _tf.get_function_def(name)

    def scan_function(self, name: str, where: str) -> None:
        if name in self.functions_done:
            return
        self.functions_done.add(name)
        fdef = self._function_def(name)
        if fdef is None:
            return
        for node in fdef.node_def:
            if node.op in _INTERESTING_OPS:
                self.add(_OpSeen(node.op, _wanted_attrs(node.attr.items()), where, f"function {name}"))
            if node.op in SPARSE_UPDATE_OPS and node.input:
                self.add_sparse_update(node.op, f"{node.input[0]} in function {name}", where)
            nested = _function_names_in_attrs(node.attr)
            if node.op in self.library or self._function_call(node.op):
                nested.append(node.op)
            for inner in nested:
                self.scan_function(inner, where)

    def scan_graph(self, graph, where: str, name: Optional[str] = None) -> None:
        """Every op of ``graph`` (with source lines) and the functions it calls."""
        if name is not None:
            if name in self.functions_done:
                return
            self.functions_done.add(name)
        try:
            library = graph.as_graph_def().library.function
        except Exception:  # noqa: BLE001
            library = ()
        for fdef in library:
            self.library.setdefault(fdef.signature.name, fdef)
        for op in graph.get_operations():
            if op.type in _INTERESTING_OPS:
                self.add(_OpSeen(op.type, _wanted_attrs(op.node_def.attr.items()),
                                 _graph_op_location(op), where))
            if op.type in SPARSE_UPDATE_OPS and op.inputs:
                self.add_sparse_update(op.type, _variable_source(op.inputs[0]), where)
            nested = _function_names_in_attrs(op.node_def.attr)
            if op.type in self.library:
                nested.append(op.type)
            if nested:
                location = _graph_op_location(op)
                for inner in nested:
                    self.scan_function(inner, f"{location} (inside {inner})" if location else inner)


# ---------------------------------------------------------------------------
# From what was seen to causes
# ---------------------------------------------------------------------------


def _is_unseeded(attrs: Mapping[str, Any]) -> bool:
    return not attrs.get("seed") and not attrs.get("seed2")


def _op_causes(ops: Sequence[_OpSeen], *, gpu: bool, op_determinism: bool) -> list[Cause]:
    causes = []
    for seen in ops:
        t = seen.op_type
        if t in STATEFUL_RANDOM_OPS and t not in _SEED_AS_INPUT:
            if _is_unseeded(seen.attrs):
                causes.append(Cause(
                    "unseeded_random_op", t,
                    f"random op {t} has no op seed and no global seed was set: it draws new numbers "
                    "on every run", seen.location or seen.where,
                    "pass seed= to the op, or call tf.random.set_seed(...) (tf.compat.v1.set_random_seed "
                    "in a TF1 graph) before building the step"))
            elif seen.where == "session graph":
                causes.append(Cause(
                    "random_op_state_in_session", t,
                    f"random op {t} in the graph of a session that fn reuses: the session keeps its "
                    "random state, so each session.run draws the next numbers", seen.location or seen.where,
                    "audit a fn that builds a fresh tf.Graph and Session on every call (as equivtool's TF1 "
                    "runner does), or run the graph with training=False / stateless random ops"))
        if t in _PARALLEL_DATASET_OPS:
            if seen.attrs.get("deterministic") == "false" or seen.attrs.get("sloppy") is True:
                method = _PARALLEL_DATASET_OPS[t]
                causes.append(Cause(
                    "nondeterministic_dataset", t,
                    f"tf.data {method}(num_parallel_calls=..., deterministic=False) hands out elements "
                    "in completion order", seen.location or seen.where,
                    f"pass deterministic=True to {method}() (or leave it unset, and keep "
                    "tf.data.Options.deterministic True)"))
        if gpu and not op_determinism and t in GPU_NONDETERMINISTIC_OPS:
            causes.append(Cause(
                "gpu_nondeterministic_op", t,
                f"{t} has a non-deterministic GPU kernel and op determinism is disabled",
                seen.location or seen.where, GPU_NONDETERMINISTIC_OPS[t]))
    return causes


def _dataset_causes(label: str, dataset, found_in: str, *, via_iterator: bool) -> list[Cause]:
    causes = []
    nodes = _tf.dataset_graph_nodes(dataset)
    options_deterministic = dataset.options().deterministic
    where = f"dataset {label!r} captured by {found_in}"
    for node in nodes:
        attrs = _wanted_attrs(node.attr.items())
        if node.op in _PARALLEL_DATASET_OPS:
            method = _PARALLEL_DATASET_OPS[node.op]
            det = attrs.get("deterministic")
            if det == "false" or attrs.get("sloppy") is True:
                causes.append(Cause(
                    "nondeterministic_dataset", f"{label}: {method}",
                    f"tf.data {method}(num_parallel_calls=..., deterministic=False) in {label!r} hands out "
                    "elements in completion order", where,
                    f"pass deterministic=True to {method}() (or leave it unset)"))
            elif det == "default" and options_deterministic is False:
                causes.append(Cause(
                    "nondeterministic_dataset", f"{label}: {method}",
                    f"tf.data.Options.deterministic is False on {label!r}, so its parallel {method}() "
                    "hands out elements in completion order", where,
                    "leave tf.data.Options.deterministic (experimental_deterministic) at True"))
        if node.op in _SHUFFLE_DATASET_OPS and attrs.get("reshuffle_each_iteration") is True and not via_iterator:
            causes.append(Cause(
                "reshuffling_dataset", f"{label}: shuffle",
                f"{label!r} shuffles with reshuffle_each_iteration=True: every run iterates it afresh "
                "and sees a new order", where,
                "pass reshuffle_each_iteration=False (and a seed) to shuffle(), or audit one fixed batch"))
    if via_iterator:
        causes.append(Cause(
            "dataset_iterator", label,
            f"fn draws from iterator {label!r}, which advances on every run, so each run sees other "
            "elements", f"captured by {found_in}",
            "audit a step that takes a fixed batch (e.g. next(iterator) once, outside fn)"))
    return causes


def _dedupe(causes: Sequence[Cause]) -> tuple[Cause, ...]:
    merged: dict[tuple, Cause] = {}
    for c in causes:
        key = (c.kind, c.subject, c.location)
        if key in merged:
            merged[key] = dataclasses.replace(merged[key], count=merged[key].count + c.count)
        else:
            merged[key] = c
    return tuple(merged.values())


def _captured_dataset_causes(captured, datasets, found_in: str) -> list[Cause]:
    """Causes in the datasets and iterators fn captures, and in ``datasets``."""
    items: list[tuple[str, Any]] = [(label, obj) for label, obj in captured
                                    if isinstance(obj, (tf.data.Dataset, tf.data.Iterator))]
    if isinstance(datasets, Mapping):
        items += list(datasets.items())
    elif datasets is not None:
        items += [(f"datasets[{i}]", d) for i, d in enumerate(datasets)]
    causes: list[Cause] = []
    seen: set[int] = set()
    for label, obj in items:
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, tf.data.Dataset):
            causes += _dataset_causes(label, obj, found_in, via_iterator=False)
        elif _tf.iterator_dataset(obj) is not None:
            causes += _dataset_causes(label, _tf.iterator_dataset(obj), found_in, via_iterator=True)
        else:
            causes.append(Cause("dataset_iterator", label,
                                f"fn draws from iterator {label!r}, which advances on every run",
                                f"captured by {found_in}", "audit a step that takes a fixed batch"))
    return causes
