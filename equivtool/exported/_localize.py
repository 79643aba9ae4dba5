"""``--localize`` for exported models: the first node, in topological order, whose output differs.

Both sides are graphs whose every tensor can be fetched (:meth:`Side.graph_view`:
the loaded TF1 graph, the TF2 signature inlined over its loaded variables, or a golden
record's GraphDef with the values it holds). Their nodes are aligned with the
engine's localization rules (:mod:`equivtool.localize._capture`): names with
the model's outer scope stripped first (``StatefulPartitionedCall/net/small_net/
conv1/Conv2D`` and ``small_net/conv1/Conv2D`` are both ``conv1/Conv2D``), then
scope and type in order, then type and shapes. Only nodes computed from the
inputs are compared (constant folding chains of a frozen graph are not).
Memory stays bounded: NEW's values are fetched in windows of ``budget_bytes``
of static size, OLD's counterparts fetched and compared as they come, and the
walk stops at the first divergence.
"""

from __future__ import annotations

import time

import numpy as np

from equivtool.exported._sides import ModelLoadError, Side
from equivtool.localize import _capture
from equivtool.localize.result import Localization

_LIST_LIMIT = 10


def _computed_from_inputs(graph, inputs) -> set:
    """The ops whose value depends on an input placeholder."""
    consumers = {}
    for op in graph.get_operations():
        for tensor in op.inputs:
            consumers.setdefault(tensor.op, []).append(op)
    found, stack = set(), [t.op for t in inputs]
    while stack:
        op = stack.pop()
        if op in found:
            continue
        found.add(op)
        stack.extend(consumers.get(op, ()))
    return found


def _ops(view, roots=None):
    """The compared ops of a graph view (computed from the inputs; in a record, held
    by it), re-indexed, with keys canonical under ``roots`` (OLD's outer scopes)."""
    ops, _, own_roots = _capture._tf1_ops(view.graph, list(view.outputs.values()))
    live = _computed_from_inputs(view.graph, list(view.inputs.values()))
    roots = own_roots if roots is None else roots
    result = []
    for op in ops:
        if op.op not in live or op.type == "Identity":  # an Identity repeats its input
            continue
        if view.recorded is not None and not all(op.op.outputs[i].name in view.recorded for i in op.outputs):
            continue
        components = op.name.split("/")
        key = op.name
        if any(c in roots for c in components[:-1]):
            key = "/".join(_capture._canonical_scope(components[:-1], roots) + components[-1:])
        result.append(_capture._TF1Op(len(result), op.op, op.outputs, key))
    return result, own_roots


def _static_bytes(op) -> int:
    total = 0
    for i in op.outputs:
        shape = op.op.outputs[i].shape
        dims = [d if d is not None else 1 for d in (shape.as_list() if shape.rank is not None else [1])]
        total += int(np.prod(dims, dtype=np.int64)) * op.op.outputs[i].dtype.size
    return total


def localize(old: Side, new: Side, old_feed, new_feed, tolerance, *, budget_bytes: int = 256 << 20,
             keep_old: bool = False):
    """(a :class:`Localization`, OLD's compared nodes and their values when ``keep_old``)."""
    started = time.perf_counter()
    old_view, new_view = old.graph_view(old_feed), new.graph_view(new_feed)
    old_ops, roots = _ops(old_view)
    new_ops, _ = _ops(new_view, roots)
    kept = {}

    def fetch_old(tensors):
        values = old_view.fetch(tensors)
        if keep_old:
            kept.update(zip((t.name for t in tensors), values))
        return values

    lockstep = _capture._Lockstep(old_ops, fetch_old, tolerance, budget_bytes)
    start = 0
    while start < len(new_ops) and lockstep.divergence is None:  # a window of NEW's nodes at a time
        end, size = start, 0
        while end < len(new_ops) and (end == start or size + _static_bytes(new_ops[end]) <= budget_bytes):
            size += _static_bytes(new_ops[end])
            end += 1
        window = new_ops[start:end]
        values = iter(new_view.fetch([op.op.outputs[i] for op in window for i in op.outputs]))
        for op in window:
            record = _capture._Record(op.key, op.scope, op.type, [next(values) for _ in op.outputs], None,
                                      graph_op=op.op)
            lockstep.add(record)
        lockstep.flush()
        start = end
    lockstep.closed = True
    notes = []
    examined = old_ops
    if lockstep.divergence is not None:
        examined = old_ops[:lockstep.divergence[0].index + 1]
        notes.append(f"comparison stopped at the first divergence: {len(old_ops) - len(examined)} later OLD "
                     "nodes not examined")
    unaligned = [f"{op.name} ({op.type})" for op in examined if not op.matched]
    common = dict(mode="graph", compared=lockstep.compared, tf1_ops=len(old_ops), tf2_ops=len(new_ops),
                  unaligned_tf1=unaligned[:_LIST_LIMIT], unaligned_tf2=lockstep.unaligned_tf2[:_LIST_LIMIT],
                  unaligned_tf1_count=len(unaligned), unaligned_tf2_count=len(lockstep.unaligned_tf2),
                  seconds=time.perf_counter() - started)
    if lockstep.divergence is not None:
        op, record, leaf = lockstep.divergence
        found = Localization("diverged", tf1_op=op.name, tf2_op=record.graph_op.name, tf1_type=op.type,
                             tf2_type=record.type, tf1_source=f"OLD {old.path}", tf2_source=f"NEW {new.path}",
                             divergence=leaf, path=_capture._path(op, lockstep), notes=notes, **common)
    elif lockstep.compared == 0:
        found = Localization("inconclusive", reason=f"no node could be aligned: {len(old_ops)} OLD nodes, "
                             f"{len(new_ops)} NEW nodes computed from the inputs", notes=notes, **common)
    else:
        found = Localization("no_divergence", notes=notes, **common)
    return found, old_ops, kept, old_view


def localize_step(step, old: Side, new: Side, old_feed, new_feed, output_names, tolerance, keep_old: bool):
    """``step`` with ``data["localization"]``; and, for ``--save-outputs``, OLD's
    nodes, their values and its GraphDef (empty when not kept)."""
    import dataclasses
    for side, which in ((old, "OLD"), (new, "NEW")):
        reason = side.capabilities["intermediates"]
        if reason:
            raise ModelLoadError(f"--localize: {which} {side.path}: {reason}")
    started = time.perf_counter()
    try:
        found, old_ops, kept, old_view = localize(old, new, old_feed, new_feed, tolerance, keep_old=keep_old)
    except ModelLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - the step's verdict stands; say why nothing was localized
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        found = Localization("inconclusive", mode="graph", reason=f"localization failed: {detail}",
                             seconds=time.perf_counter() - started)
        keep_old = False
    step = dataclasses.replace(step, data={**dict(step.data), "localization": found})
    if not keep_old:
        return step, (), (), None
    tensors = [op.op.outputs[i] for op in old_ops for i in op.outputs]
    rest = [t for t in tensors if t.name not in kept]  # not reached (after the divergence): fetched for the record
    kept.update(zip((t.name for t in rest), old_view.fetch(rest) if rest else ()))
    nodes = [{"tensor": t.name, "op": t.op.name, "type": t.op.type} for t in tensors]
    values = [kept[t.name] for t in tensors]
    return step, nodes, values, old_view.graph.as_graph_def().SerializeToString()
