"""The lockstep comparison: TF2 op records arrive in execution order, are aligned
with TF1 ops (by name, then scope and type, then type and order, a swapped op
at its place), buffered up to a byte budget, then compared with the TF1
values fetched in one run; it stops at the first divergence and keeps the path
to it.
"""

from __future__ import annotations

import collections
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from equivtool.comparison import Tolerance, compare, resolve_tolerance
from equivtool.localize.result import OpError
from equivtool.localize.alignment import LIST_LIMIT, TF1Op, WINDOW, base_scope, is_float


class Record:
    __slots__ = ("name", "scope", "type", "values", "frames", "nbytes", "graph_op")

    def __init__(self, name, scope, op_type, values, frames, graph_op=None):
        self.name = name
        self.scope = scope
        self.type = op_type
        self.values = values  # list of arrays (or loaders) by compared output
        self.frames = frames
        self.graph_op = graph_op
        self.nbytes = 0


def record_shapes(record: Record) -> list:
    """The shapes of a TF2 record's compared outputs."""
    if record.graph_op is None:
        return [tf.TensorShape(np.shape(v)) for v in record.values]
    return [t.shape for t in record.graph_op.outputs if is_float(t.dtype)][:len(record.values)]


class Lockstep:
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
            self.by_base_scope_type[(base_scope(op.scope), op.type)].append(op)
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
    def _take(queue) -> Optional[TF1Op]:
        while queue and queue[0].matched:
            queue.popleft()
        return queue[0] if queue else None

    def align(self, record: Record) -> Optional[TF1Op]:
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

    def _same_place(self, record: Record, op: TF1Op) -> Optional[TF1Op]:
        """The first unmatched TF1 op of another type between the cursor and ``op``
        (at most ``WINDOW`` ops on), under the record's scope (compared by
        structure), whose first output has the record's first output's shape."""
        base, shapes = base_scope(record.scope), record_shapes(record)
        for other in self.ops[self.cursor + 1:min(op.index, self.cursor + 1 + WINDOW)]:
            if other.matched or other.type == record.type or base_scope(other.scope) != base:
                continue
            theirs = [other.op.outputs[i].shape for i in other.outputs]
            if shapes and theirs and shapes[0].is_compatible_with(theirs[0]):
                return other
        return None

    def _agrees(self, op: TF1Op, record: Record) -> bool:
        """Whether ``record``'s values are within tolerance of ``op``'s (fetched now)."""
        record.values = [v() if callable(v) else v for v in record.values]
        expected = self.run_tf1([op.op.outputs[i] for i in op.outputs])
        tol = self._tolerance(op)
        return len(expected) == len(record.values) and not any(
            leaf.status == "failed" for e, a in zip(expected, record.values) for leaf in compare(e, a, tol).leaves)

    def _tolerance(self, op: TF1Op) -> Tolerance:
        if isinstance(self.tolerance, Tolerance):
            return self.tolerance
        return resolve_tolerance(self.tolerance, op.name)

    def _candidate(self, record: Record) -> Optional[TF1Op]:
        # 1. the same name (tf.function graphs name ops as the TF1 graph does; an eager
        #    op's scope numbers are its own, so under a uniquified scope it goes to 2.)
        op = self.by_name.get(record.name)
        if (op is not None and not op.matched and op.type == record.type
                and (record.graph_op is not None or base_scope(record.scope) == record.scope)):
            return op
        # 2. the same scope and type, in order (eager ops carry only their scope), the
        #    scope compared by structure: eager execution uniquifies scopes with other
        #    numbers than a graph ("x_2" where the graph says "x_1"), so the k-th op under
        #    "x*" of a type aligns with the k-th such TF1 op, whatever the suffixes;
        #    an op named after its own name scope (math_ops' "mul") has the scope as its name
        for key, table in (((base_scope(record.scope), record.type), self.by_base_scope_type),
                           ((record.scope, record.type), self.by_scope_type),
                           ((record.scope, record.type), self.by_name_type)):
            op = self._take(table.get(key, collections.deque()))
            if op is not None:
                return op
        # 3. the same type and output shapes, next in order (renamed scopes, loops)
        shapes = record_shapes(record)
        for op in self.by_type.get(record.type, ()):
            if op.matched or op.index <= self.cursor:
                continue
            if op.index > self.cursor + WINDOW:
                break
            theirs = [op.op.outputs[i].shape for i in op.outputs]
            if len(theirs) == len(shapes) and all(a.is_compatible_with(b) for a, b in zip(shapes, theirs)):
                return op
        if "Random" in record.type or record.type in ("TruncatedNormal", "Multinomial"):
            return None  # a draw depends on no input: an op of another type cannot stand in for it
        # 4. another type in the same scope, next in order: a swapped op (Relu vs Elu)
        op = self._take(self.by_scope.get(record.scope, collections.deque()))
        if op is not None and op.index > self.cursor and len(op.outputs) == len(shapes):
            theirs = [op.op.outputs[i].shape for i in op.outputs]
            if all(a.is_compatible_with(b) for a, b in zip(shapes, theirs)):
                return op
        # 5. another type under another scope (a layer swapped for another: MaxPool
        #    for AvgPool): the next TF1 op in order, when its output shapes are the same
        #    fully known shapes
        following = next((o for o in self.ops[self.cursor + 1:self.cursor + 1 + WINDOW] if not o.matched), None)
        if following is not None and len(following.outputs) == len(shapes):
            theirs = [following.op.outputs[i].shape for i in following.outputs]
            if all(a.is_fully_defined() and a.rank and a == b for a, b in zip(shapes, theirs)):
                return following
        return None

    def inconclusive_fields(self) -> dict:
        """The :class:`Localization` fields naming the ops where nothing that could differ was compared."""
        names = [f"{e.name} ({e.op_type})" for e in self.errors.values() if e.inconclusive]
        return {"inconclusive_ops": names[:LIST_LIMIT], "inconclusive_count": len(names)}

    def nothing_proven(self, aligned_reason: str) -> str:
        """Why a walk that found no divergence proved nothing either."""
        if self.inconclusive:
            return (f"every aligned op ({self.inconclusive}) was inconclusive: only values below atol or "
                    "only NaN/inf were compared")
        return aligned_reason

    # -- comparing -----------------------------------------------------------

    def add(self, record: Record) -> None:
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

    def _compare(self, op: TF1Op, record: Record, expected: list, actual: list) -> None:
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


def divergence_path(target: TF1Op, lockstep: Lockstep) -> list:
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
        current = max(candidates, key=lambda o: (sortable(lockstep.errors[o.index].max_abs), o.index),
                      default=None) if candidates else None
    path.reverse()
    return path


def sortable(x: float) -> float:
    return float("inf") if x != x else x
