"""Capture every op's output on both sides, align them, find the first divergence.

TF1 side: the forward pass's ops (the ancestors of its outputs, in creation
order) are fetched from the session by name. TF2 side: TensorFlow's op-callback
mechanism (``op_callbacks.add_op_callback``, the hook tfdbg v2 is built on)
sees every eager op's outputs as it executes; under ``tf.function`` it sees
the graph being built, and a ``numpy_function`` sink spills each output to a
temporary folder when the function runs.

Memory stays bounded: TF2 outputs are buffered up to ``budget_bytes``, then
the TF1 counterparts of the buffered ops are fetched in one ``Session.run``
and compared op by op in order; comparison stops at the first divergence.
"""

from __future__ import annotations

import collections
import os
import re
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
from equivtool._platform import execution as _execution
from equivtool._platform.tf_internals import op_callbacks  # private TF: the hook tfdbg v2 is built on

from equivtool._base import stack as _stack
from equivtool._base.graph import ancestors
from equivtool._base.stack import is_library_frame
from equivtool.comparison import Tolerance, compare, resolve_tolerance
from equivtool.localize.result import Localization, OpError

_SKIPPED_TYPES = frozenset({
    "Const", "Placeholder", "PlaceholderWithDefault", "VarHandleOp", "VariableV2", "Variable",
    "ReadVariableOp", "NoOp", "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
    "VarIsInitializedOp", "Shape", "ShapeN", "Size", "Rank", "StopGradient", "PyFunc", "EagerPyFunc",
    "PyFuncStateless", "DebugIdentityV2",
    "Fill",  # a constant of a given shape (eager batch norm's implicit gamma of ones)
})
# Ops whose extra outputs are implementation details (batch-norm reserve spaces).
_FIRST_OUTPUT_ONLY = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
_LIST_LIMIT = 10
_WINDOW = 64


def _user_line(frames, library_dirs) -> str:
    """The innermost ``(filename, lineno, name)`` frame outside the libraries."""
    for filename, lineno, name in reversed(frames):
        if not filename.startswith("<") and not is_library_frame(filename, library_dirs=library_dirs):
            return f"{filename}:{lineno} in {name}"
    return "<unknown>"


def _current_frames(skip: int = 2) -> list:
    frames, frame = [], sys._getframe(skip)
    while frame is not None:
        frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    frames.reverse()
    return frames


def _is_float(dtype) -> bool:
    dtype = tf.as_dtype(dtype)
    return dtype.is_floating or dtype.is_complex


def _compared_outputs(op_type: str, dtypes) -> list:
    indices = [i for i, d in enumerate(dtypes) if _is_float(d)]
    if op_type in _FIRST_OUTPUT_ONLY:
        indices = indices[:1]
    return indices


def _canonical_scope(components: list, roots: frozenset) -> list:
    """The part of a scope that both sides name alike: what follows the last
    occurrence of the model's outer scope.

    The outer scope appears once or more depending on the side: a graph opens
    ``net/net/...`` where slim re-enters its variable scope, eager execution
    appends a re-entered absolute scope (``net/conv1/net/conv1``), and the Keras
    layer adds its own name in front. Without the outer scope (a model that
    opens none) the first component, the Keras layer's own scope, is dropped.
    """
    last = max((i for i, c in enumerate(components) if c in roots), default=None)
    if last is None:
        return components[1:]
    return components[last + 1:]


# The function graphs of tf.cond / tf.while_loop branches (control flow v2).
_BRANCH_GRAPHS = frozenset({"CondBranchFuncGraph", "WhileCondFuncGraph", "WhileBodyFuncGraph"})
_CONTROL_FLOW = frozenset({"If", "StatelessIf", "While", "StatelessWhile", "Case", "StatelessCase"})


class _Naming:
    """How op names become the keys both sides are aligned on, decided from the
    TF1 side's compared op names.

    A model that opens one outer scope around every op (``net/conv1/...``,
    ``net/logits/...``) has it stripped on both sides, wherever it occurs (:func:`_canonical_scope`).
    A model without one (top-level ``conv1/...``, ``conv2/...``, Keras layers
    built in a TF1 graph) keeps its names whole: taking every first component
    for an outer scope would make ``conv1/Conv2D`` and ``conv2/Conv2D`` both
    ``Conv2D``, and a model compared with itself would blame the wrong layer.
    The other side's names lose what comes before the first of the TF1 side's
    top-level scopes (the TF2 layer's own name scope, an exported function's
    ``StatefulPartitionedCall``), compared without uniquifying suffixes.
    """

    def __init__(self, names):
        names = list(names)
        firsts = {name.split("/", 1)[0] for name in names}
        scoped = all("/" in name for name in names)
        self.outer = next(iter(firsts)) if len(firsts) == 1 and scoped else None
        #: the outer scope, as a set for :func:`_canonical_scope` (empty without one)
        self.roots = frozenset(firsts) if self.outer is not None else frozenset()
        #: every first name component of the TF1 side (where its ops live)
        self.tops = frozenset(name.split("/", 1)[0] for name in names)
        self._base_tops = frozenset(_UNIQUIFIED_SUFFIX.sub("", top) for top in self.tops)

    def tf1_key(self, name: str) -> str:
        components = name.split("/")
        if self.outer is None or len(components) == 1:
            return name
        return "/".join(_canonical_scope(components[:-1], self.roots) + components[-1:])

    def in_model(self, name: str) -> bool:
        """Whether a TF2 graph op ``name`` lies inside the model's scopes (an op
        outside every scope, such as a function's output identity, does not)."""
        parts = name.split("/")
        if not self.tops or any(c in self.tops for c in parts):
            return True
        return self.outer is None and len(parts) > 1  # an unscoped TF1 op, under the TF2 layer's scope

    def other_scope(self, parts: list, *, layer_scope: bool) -> list:
        """The other side's scope ``parts`` as the TF1 keys have it; ``layer_scope``:
        the first component is the TF2 layer's own name scope when nothing else
        marks where the model starts."""
        if self.outer is not None:
            return _canonical_scope(parts, self.roots) if layer_scope or self.outer in parts else parts
        start = next((i for i, part in enumerate(parts) if _UNIQUIFIED_SUFFIX.sub("", part) in self._base_tops),
                     None)
        if start is None:
            return parts[1:] if layer_scope else parts
        return parts[start:]


_UNIQUIFIED_SUFFIX = re.compile(r"_\d+$")


def _base_scope(scope: str) -> str:
    """``scope`` with each component's uniquifying suffix removed (``x_2/y_1`` -> ``x/y``)."""
    return "/".join(_UNIQUIFIED_SUFFIX.sub("", part) for part in scope.split("/"))


# --------------------------------------------------------------------------
# TF1 side: the forward pass's ops
# --------------------------------------------------------------------------

class _TF1Op:
    __slots__ = ("index", "op", "name", "key", "scope", "type", "outputs", "matched")

    def __init__(self, index, op, outputs, key):
        self.index = index
        self.op = op
        self.name = op.name
        self.key = key  # the name aligned on (a second pass's "net_1/..." as "net/...")
        self.scope = key.rsplit("/", 1)[0] if "/" in key else ""
        self.type = op.type
        self.outputs = outputs  # indices of compared outputs
        self.matched = False


def _tf1_ops(graph, outputs) -> tuple:
    """The compared ops among the ancestors of ``outputs``, in creation order,
    and the count of those inside v1 control flow (not fetchable)."""
    wanted = ancestors(t.op for t in tf.nest.flatten(outputs) if hasattr(t, "op"))
    result, in_loops = [], 0
    for op in graph.get_operations():  # creation order: a topological order
        if op not in wanted or op.type in _SKIPPED_TYPES:
            continue
        if op.type == "Identity" and op.inputs and op.inputs[0].op.type in ("VariableV2", "VarHandleOp"):
            continue
        indices = _compared_outputs(op.type, [t.dtype for t in op.outputs])
        if not indices:
            continue
        if op._get_control_flow_context() is not None:  # inside a v1 while loop or cond
            in_loops += 1
            continue
        if not all(graph.is_fetchable(op.outputs[i]) for i in indices):
            continue
        result.append((op, indices))
    # A second pass built in the same graph lives under a uniquified outer scope
    # ("net_1/...") while the TF2 layer's ops are named "net/...": align on "net".
    other_roots = {op.name.split("/", 1)[0] for op in graph.get_operations() if op not in wanted}
    renamed = {}
    for op, _ in result:
        root = op.name.split("/", 1)[0]
        base = re.sub(r"_\d+$", "", root)
        if "/" in op.name and base != root and base in other_roots:
            renamed[root] = base
    names = []
    for op, _ in result:
        root, _, rest = op.name.partition("/")
        names.append(f"{renamed[root]}/{rest}" if root in renamed and rest else op.name)
    naming = _Naming(names)
    ops = [_TF1Op(i, op, indices, naming.tf1_key(name)) for i, ((op, indices), name) in enumerate(zip(result, names))]
    return ops, in_loops, naming


# --------------------------------------------------------------------------
# Alignment and comparison in order
# --------------------------------------------------------------------------

class _Record:
    __slots__ = ("name", "scope", "type", "values", "frames", "nbytes", "graph_op")

    def __init__(self, name, scope, op_type, values, frames, graph_op=None):
        self.name = name
        self.scope = scope
        self.type = op_type
        self.values = values  # list of arrays (or loaders) by compared output
        self.frames = frames
        self.graph_op = graph_op
        self.nbytes = 0


def _record_shapes(record: _Record) -> list:
    """The shapes of a TF2 record's compared outputs."""
    if record.graph_op is None:
        return [tf.TensorShape(np.shape(v)) for v in record.values]
    return [t.shape for t in record.graph_op.outputs if _is_float(t.dtype)][:len(record.values)]


class _Lockstep:
    def __init__(self, tf1_ops, run_tf1: Callable[[list], list], tolerance, budget_bytes: int):
        self.ops = tf1_ops
        self.run_tf1 = run_tf1
        self.tolerance = tolerance
        self.budget = budget_bytes
        self.by_name = {op.key: op for op in tf1_ops}
        self.by_scope_type = collections.defaultdict(collections.deque)
        self.by_name_type = collections.defaultdict(collections.deque)
        self.by_scope = collections.defaultdict(collections.deque)
        self.by_base_scope_type = collections.defaultdict(collections.deque)
        for op in tf1_ops:
            self.by_scope_type[(op.scope, op.type)].append(op)
            self.by_base_scope_type[(_base_scope(op.scope), op.type)].append(op)
            self.by_name_type[(op.key, op.type)].append(op)
            self.by_scope[op.scope].append(op)
        self.by_type = collections.defaultdict(list)
        for op in tf1_ops:
            self.by_type[op.type].append(op)
        self.cursor = -1
        self.buffer: list = []
        self.buffered = 0
        self.errors: dict = {}  # tf1 index -> OpError
        self.compared = 0  # aligned ops proven equal or divergent
        self.inconclusive = 0  # aligned ops where nothing that could differ was compared
        self.tf2_seen = 0
        self.unaligned_tf2: list = []
        self.divergence = None  # (tf1 op, record, LeafComparison)
        self.closed = False

    # -- alignment -----------------------------------------------------------

    @staticmethod
    def _take(queue) -> Optional[_TF1Op]:
        while queue and queue[0].matched:
            queue.popleft()
        return queue[0] if queue else None

    def align(self, record: _Record) -> Optional[_TF1Op]:
        """The TF1 op ``record`` stands for, or None.

        A candidate of the record's type found further on (by name, scope or
        shape) is checked against the place the record is at: when an unmatched
        op of another type comes first in the same scope, either that op was
        swapped (``Relu`` where TF1 has ``Elu``, and the ``Relu`` found is the
        next layer's) or it exists on the TF1 side only. The record's values
        decide: if they agree with the candidate, it is the candidate; if not,
        the op at the record's place is blamed, not one a node later.
        """
        op = self._candidate(record)
        if op is None or op.type != record.type:
            return op
        place = self._same_place(record, op)
        if place is not None and not self._agrees(op, record):
            return place
        return op

    def _same_place(self, record: _Record, op: _TF1Op) -> Optional[_TF1Op]:
        """The first unmatched TF1 op of another type between the cursor and ``op``
        (at most ``_WINDOW`` ops on), under the record's scope (compared by
        structure), whose first output has the record's first output's shape."""
        base, shapes = _base_scope(record.scope), _record_shapes(record)
        for other in self.ops[self.cursor + 1:min(op.index, self.cursor + 1 + _WINDOW)]:
            if other.matched or other.type == record.type or _base_scope(other.scope) != base:
                continue
            theirs = [other.op.outputs[i].shape for i in other.outputs]
            if shapes and theirs and shapes[0].is_compatible_with(theirs[0]):
                return other
        return None

    def _agrees(self, op: _TF1Op, record: _Record) -> bool:
        """Whether ``record``'s values are within tolerance of ``op``'s (fetched now)."""
        record.values = [v() if callable(v) else v for v in record.values]
        expected = self.run_tf1([op.op.outputs[i] for i in op.outputs])
        tol = self._tolerance(op)
        return len(expected) == len(record.values) and not any(
            leaf.status == "failed" for e, a in zip(expected, record.values) for leaf in compare(e, a, tol).leaves)

    def _tolerance(self, op: _TF1Op) -> Tolerance:
        if isinstance(self.tolerance, Tolerance):
            return self.tolerance
        return resolve_tolerance(self.tolerance, op.name)

    def _candidate(self, record: _Record) -> Optional[_TF1Op]:
        # 1. the same name (tf.function graphs name ops as the TF1 graph does; an eager
        #    op's scope numbers are its own, so under a uniquified scope it goes to 2.)
        op = self.by_name.get(record.name)
        if (op is not None and not op.matched and op.type == record.type
                and (record.graph_op is not None or _base_scope(record.scope) == record.scope)):
            return op
        # 2. the same scope and type, in order (eager ops carry only their scope), the
        #    scope compared by structure: eager execution uniquifies scopes with other
        #    numbers than a graph ("x_2" where the graph says "x_1"), so the k-th op under
        #    "x*" of a type aligns with the k-th such TF1 op, whatever the suffixes;
        #    an op named after its own name scope (math_ops' "mul") has the scope as its name
        for key, table in (((_base_scope(record.scope), record.type), self.by_base_scope_type),
                           ((record.scope, record.type), self.by_scope_type),
                           ((record.scope, record.type), self.by_name_type)):
            op = self._take(table.get(key, collections.deque()))
            if op is not None:
                return op
        # 3. the same type and output shapes, next in order (renamed scopes, loops)
        shapes = _record_shapes(record)
        for op in self.by_type.get(record.type, ()):
            if op.matched or op.index <= self.cursor:
                continue
            if op.index > self.cursor + _WINDOW:
                break
            theirs = [op.op.outputs[i].shape for i in op.outputs]
            if len(theirs) == len(shapes) and all(a.is_compatible_with(b) for a, b in zip(shapes, theirs)):
                return op
        # 4. another type in the same scope, next in order: a swapped op (Relu vs Elu)
        op = self._take(self.by_scope.get(record.scope, collections.deque()))
        if op is not None and op.index > self.cursor and len(op.outputs) == len(shapes):
            theirs = [op.op.outputs[i].shape for i in op.outputs]
            if all(a.is_compatible_with(b) for a, b in zip(shapes, theirs)):
                return op
        # 5. another type under another scope (a layer swapped for another: MaxPool
        #    for AvgPool): the next TF1 op in order, when its output shapes are the same
        #    fully known shapes
        following = next((o for o in self.ops[self.cursor + 1:self.cursor + 1 + _WINDOW] if not o.matched), None)
        if following is not None and len(following.outputs) == len(shapes):
            theirs = [following.op.outputs[i].shape for i in following.outputs]
            if all(a.is_fully_defined() and a.rank and a == b for a, b in zip(shapes, theirs)):
                return following
        return None

    def inconclusive_fields(self) -> dict:
        """The :class:`Localization` fields naming the ops where nothing that could differ was compared."""
        names = [f"{e.name} ({e.op_type})" for e in self.errors.values() if e.inconclusive]
        return {"inconclusive_ops": names[:_LIST_LIMIT], "inconclusive_count": len(names)}

    def nothing_proven(self, aligned_reason: str) -> str:
        """Why a walk that found no divergence proved nothing either."""
        if self.inconclusive:
            return (f"every aligned op ({self.inconclusive}) was inconclusive: only values below atol or "
                    "only NaN/inf were compared")
        return aligned_reason

    # -- comparing -----------------------------------------------------------

    def add(self, record: _Record) -> None:
        if self.closed or self.divergence is not None:
            return  # comparison stops at the first divergence
        self.tf2_seen += 1
        op = self.align(record)
        if op is None:
            self.unaligned_tf2.append(f"{record.name} ({record.type})")
            return
        op.matched = True
        self.cursor = max(self.cursor, op.index)
        self.buffer.append((op, record))
        self.buffered += sum(int(getattr(v, "nbytes", 0)) for v in record.values)
        if self.buffered >= self.budget:
            self.flush()

    def flush(self) -> None:
        if not self.buffer:
            return
        buffer, self.buffer, self.buffered = self.buffer, [], 0
        if self.divergence is not None:
            return
        tensors = [op.op.outputs[i] for op, _ in buffer for i in op.outputs]
        values = iter(self.run_tf1(tensors))
        for op, record in buffer:
            expected = [next(values) for _ in op.outputs]
            if self.divergence is not None:
                continue
            actual = [v() if callable(v) else v for v in record.values]
            self._compare(op, record, expected, actual)
            record.values = None

    def _compare(self, op: _TF1Op, record: _Record, expected: list, actual: list) -> None:
        tol = self._tolerance(op)
        leaves = []
        for k, (e, a) in enumerate(zip(expected, actual)):
            name = op.name if len(expected) == 1 else f"{op.name}:{op.outputs[k]}"
            leaves.extend(compare(e, a, tol, name=name).leaves)
        if len(actual) != len(expected):
            leaves.extend(compare(expected, actual, tol, name=op.name).leaves)
        worst = max((leaf.max_abs for leaf in leaves if leaf.max_abs == leaf.max_abs), default=float("nan"))
        failed = next((leaf for leaf in leaves if leaf.status == "failed"), None)
        # an op whose outputs agree only where nothing could differ (all inf on both
        # sides, every value below atol) is neither proven nor divergent: the walk goes on
        inconclusive = failed is None and any(leaf.inconclusive for leaf in leaves)
        if inconclusive:
            self.inconclusive += 1
        else:
            self.compared += 1
        self.errors[op.index] = OpError(op.name, op.type, float(worst), float(tol.atol),
                                        failed is None and not inconclusive, inconclusive=inconclusive)
        if failed is not None:
            self.divergence = (op, record, failed)


# --------------------------------------------------------------------------
# The TF2 op callback
# --------------------------------------------------------------------------

class _Tap:
    """The op callback, installed for one TF2 call and removed on every exit path."""

    def __init__(self, lockstep: _Lockstep, naming: _Naming, spill_dir: str):
        self.lockstep = lockstep
        self.naming = naming
        self.spill_dir = spill_dir
        self.local = threading.local()
        self.thread = threading.get_ident()
        self.graph_records: list = []
        self.eager_ops = 0
        self.graph_mode = False

    def _names(self, op_name: Optional[str], op_type: str, scope: str):
        """``(name, scope)`` to align on: canonical scope, then the op's own name
        (graph construction) or its type (eager ops have no name)."""
        if op_name:
            components = op_name.strip("/").split("/")
            scope_parts, last = components[:-1], components[-1]
        else:
            scope_parts, last = [c for c in scope.strip("/").split("/") if c], op_type
        scope = "/".join(self.naming.other_scope(scope_parts, layer_scope=True))
        return (f"{scope}/{last}" if scope else last), scope

    def __call__(self, op_type, inputs, attrs, outputs, op_name=None, graph=None):
        if getattr(self.local, "busy", False) or threading.get_ident() != self.thread:
            return None
        if isinstance(op_type, bytes):  # eager execution passes the type as bytes
            op_type = op_type.decode("utf-8")
        if op_type in _SKIPPED_TYPES or op_type.startswith("__") or not outputs:
            return None
        indices = _compared_outputs(op_type, [t.dtype for t in outputs])
        if not indices:
            return None
        self.local.busy = True
        try:
            if graph is None:
                self._eager(op_type, outputs, indices)
            else:
                self._graph(op_type, outputs, indices, op_name)
        finally:
            self.local.busy = False
        return None

    def _eager(self, op_type, outputs, indices) -> None:
        if self.lockstep.divergence is not None:  # found: the rest of the call runs untapped
            self.eager_ops += 1
            return
        scope_now = tf.get_current_name_scope()
        if "/Initializer" in scope_now:  # a variable's initial value (a layer's first call)
            return
        self.eager_ops += 1
        name, scope = self._names(None, op_type, scope_now)
        values = [outputs[i].numpy() for i in indices]
        self.lockstep.add(_Record(name, scope, op_type, values, _current_frames(3)))

    def _graph(self, op_type, outputs, indices, op_name) -> None:
        self.graph_mode = True
        op = outputs[0].op
        if (op.control_inputs or not self.naming.in_model(op.name) or op_type in _CONTROL_FLOW
                or type(op.graph).__name__ in _BRANCH_GRAPHS):
            # outside the model's scopes: the function's output identities (which
            # wait for every stateful op: a sink there would make a cycle), losses;
            # inside a cond or while branch, whose outputs wait for its stateful ops
            # too. The If/While op is left out as on the TF1 side (not fetchable
            # there): the Identity ops control flow v2 puts after it carry its outputs
            return
        name, scope = self._names(op.name, op_type, "")
        number = len(self.graph_records)
        paths = [os.path.join(self.spill_dir, f"{number}_{i}.npy") for i in indices]

        def sink(*arrays, paths=paths):
            for path, array in zip(paths, arrays):
                np.save(path, np.asarray(array))
            return np.zeros((), np.int8)

        tf.numpy_function(sink, [outputs[i] for i in indices], tf.int8, stateful=True,
                          name="equivtool_localize_sink")
        loaders = [lambda path=path: np.load(path) for path in paths]
        record = _Record(name, scope, op_type, loaders, None, graph_op=op)
        self.graph_records.append(record)


# --------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------

def localize_forward(tf1_graph, tf1_outputs, tf1_run: Callable[[list], list], tf2_call: Callable[[], Any],
                     tolerance=None, *, budget_bytes: int = 256 << 20) -> Localization:
    """Find the first op whose output differs between a TF1 forward pass and a TF2 call.

    Args:
      tf1_graph: the graph holding the TF1 forward pass.
      tf1_outputs: the forward pass's output tensors (a nested structure).
      tf1_run: ``tf1_run(tensors) -> values``: one ``Session.run`` of the given
        tensors with the step's inputs fed (a fresh session per call where the
        pass has stateful random ops).
      tf2_call: runs the TF2 forward pass once (eagerly, or a new ``tf.function``
        trace and its call).
      tolerance: a :class:`Tolerance` or a tolerance mapping (resolved per op name).
      budget_bytes: how many bytes of TF2 outputs are buffered before the TF1
        counterparts are fetched and compared.
    """
    if not isinstance(budget_bytes, int) or isinstance(budget_bytes, bool) or budget_bytes <= 0:
        raise ValueError(f"budget_bytes: expected a positive int, got {budget_bytes!r}")
    started = time.perf_counter()
    tolerance = Tolerance() if tolerance is None else tolerance
    ops, in_loops, naming = _tf1_ops(tf1_graph, tf1_outputs)
    lockstep = _Lockstep(ops, tf1_run, tolerance, budget_bytes)
    notes = []
    if in_loops:
        notes.append(f"{in_loops} TF1 ops inside v1 control flow (while_loop/cond) cannot be fetched and were "
                     "not compared")
    library_dirs = _stack.find_library_dirs()
    with tempfile.TemporaryDirectory(prefix="equivtool-localize-") as spill_dir:
        tap = _Tap(lockstep, naming, spill_dir)
        op_callbacks.add_op_callback(tap)
        try:
            tf2_call()
        finally:
            op_callbacks.remove_op_callback(tap)
        graph_records = _forward_records(tap.graph_records)
        for record in graph_records:  # tf.function: in creation order, from the spill folder
            lockstep.add(record)
        lockstep.flush()
        lockstep.closed = True
    mode = "tf.function" if tap.graph_mode else "eager"
    tf2_ops = len(graph_records) if tap.graph_mode else tap.eager_ops
    examined = ops
    if lockstep.divergence is not None:  # ops after the divergent one were never looked for
        examined = ops[:lockstep.divergence[0].index + 1]
        notes.append(f"comparison stopped at the first divergence: {len(ops) - len(examined)} later TF1 ops "
                     "not examined")
    unaligned_tf1 = [f"{op.name} ({op.type})" for op in examined if not op.matched]
    common = dict(mode=mode, compared=lockstep.compared, tf1_ops=len(ops), tf2_ops=tf2_ops,
                  unaligned_tf1=unaligned_tf1[:_LIST_LIMIT], unaligned_tf2=lockstep.unaligned_tf2[:_LIST_LIMIT],
                  unaligned_tf1_count=len(unaligned_tf1), unaligned_tf2_count=len(lockstep.unaligned_tf2),
                  **lockstep.inconclusive_fields())
    if lockstep.divergence is not None:
        op, record, leaf = lockstep.divergence
        tf2_frames = record.frames if record.graph_op is None else _graph_frames(record.graph_op)
        return Localization(
            "diverged", tf1_op=op.name, tf2_op=_tf2_label(op, record), tf1_type=op.type, tf2_type=record.type,
            tf1_source=_user_line(_graph_frames(op.op), library_dirs),
            tf2_source=_user_line(tf2_frames, library_dirs), divergence=leaf,
            path=_path(op, lockstep), seconds=time.perf_counter() - started, notes=notes, **common)
    if lockstep.compared == 0:
        reason = lockstep.nothing_proven(("no op could be aligned: " if ops and tf2_ops else "nothing to compare: ")
                                         + f"{len(ops)} TF1 ops, {tf2_ops} TF2 ops captured")
        return Localization("inconclusive", reason=reason, seconds=time.perf_counter() - started,
                            notes=notes, **common)
    return Localization("no_divergence", seconds=time.perf_counter() - started, notes=notes, **common)


def _tf2_label(op: _TF1Op, record: _Record) -> str:
    """The TF2 op's name as shown. An eager op carries its scope as it was entered,
    not uniquified (the third ``x`` block is ``x/...``, where a graph says ``x_2/...``):
    aligned by structure, it is shown under the scope the TF1 graph gave that instance."""
    if (record.graph_op is None and record.scope != op.scope
            and _base_scope(record.scope) == _base_scope(op.scope)):
        last = record.name.rsplit("/", 1)[-1]
        return (f"{op.scope}/{last} (eager name {record.name}: eager scopes are not uniquified; "
                f"aligned by structure)")
    return record.name


def _forward_records(records: list) -> list:
    """The records of ops the traced function's outputs depend on (as on the TF1
    side: regularization losses built in the same trace are left out)."""
    graphs = {}
    for record in records:
        graphs.setdefault(record.graph_op.graph, None)
    wanted = ancestors(t.op for graph in graphs for t in getattr(graph, "outputs", ()))
    return [r for r in records if r.graph_op in wanted]


def _graph_frames(op) -> list:
    try:
        return [(f.filename, f.lineno, f.name) for f in op.traceback]
    except Exception:  # an op without a recorded traceback
        return []


def _path(target: _TF1Op, lockstep: _Lockstep) -> list:
    """From the input to ``target``: at each compared op, the compared input with the largest error."""
    by_op = {op.op: op for op in lockstep.ops}
    cache: dict = {}

    def nearest_compared(op) -> set:
        if op in cache:
            return cache[op]
        cache[op] = found = set()
        for tensor in op.inputs:
            source = by_op.get(tensor.op)
            if source is not None and source.index in lockstep.errors:
                found.add(source)
            else:
                found |= nearest_compared(tensor.op)
        return found

    path, current = [], target
    while current is not None:
        path.append(lockstep.errors[current.index])
        candidates = nearest_compared(current.op)
        current = max(candidates, key=lambda o: (_sortable(lockstep.errors[o.index].max_abs), o.index),
                      default=None) if candidates else None
    path.reverse()
    return path


def _sortable(x: float) -> float:
    return float("inf") if x != x else x


def call_layer(layer, inputs, training: bool, use_tf_function: bool, graph_rewrites: str = "as_written"):
    """The TF2 layer's forward pass alone (no losses), eagerly or in a new ``tf.function``
    (a new trace, which the taps see being built; run with ``graph_rewrites``'
    passes off, as the step's own call)."""
    inputs = tf.nest.map_structure(tf.convert_to_tensor, inputs)
    if use_tf_function:
        with _execution.function_rewrites(graph_rewrites):
            return tf.function(lambda x: layer(x, training=training))(inputs)
    return layer(inputs, training=training)


# --------------------------------------------------------------------------
# The TF1 session runner
# --------------------------------------------------------------------------

_STATEFUL_RANDOM = ("RandomUniform", "RandomStandardNormal", "TruncatedNormal", "RandomUniformInt",
                    "RandomShuffle", "Multinomial", "RandomGamma", "RandomPoisson", "RandomPoissonV2")


def tf1_runner(tf1_side, outputs) -> Callable[[list], list]:
    """``run(tensors) -> values`` for a :class:`~equivtool.engine.sides.runners.TF1Side` pass.

    A stateful random op moves along its stream on every ``Session.run``; when
    the pass has one (dropout in training mode), each run gets a new session
    holding the current variable values, so every run sees the first draws, as
    the step's own single run did. The step's session is left untouched.
    """
    graph = tf1_side.graph
    upstream = ancestors(t.op for t in tf.nest.flatten(outputs) if hasattr(t, "op"))
    stateful = any(op.type in _STATEFUL_RANDOM for op in upstream)
    feed = tf1_side.feed()
    if not stateful:
        return lambda tensors: tf1_side.session.run(tensors, feed_dict=feed)
    with graph.as_default():
        everything = tf.compat.v1.global_variables()
    values = tf1_side.session.run(everything)

    def run(tensors):
        with tf.compat.v1.Session(graph=graph, config=tf1_side._config) as session:
            session.run([v.initializer for v in everything],
                        feed_dict={v.initializer.inputs[1]: value for v, value in zip(everything, values)})
            return session.run(tensors, feed_dict=feed)
    return run
