"""``--localize`` for exported models: the first node, in topological order, whose output differs.

Both sides are graphs whose every tensor can be fetched (:meth:`Side.graph_view`:
the loaded TF1 graph, the TF2 signature inlined over its loaded variables, or a golden
record's GraphDef with the values it holds). Their nodes are aligned with the
engine's localization rules (:mod:`equivtool.localize.alignment` and :mod:`~equivtool.localize.lockstep`): names with
the model's outer scope stripped first (``StatefulPartitionedCall/net/small_net/
conv1/Conv2D`` and ``small_net/conv1/Conv2D`` are both ``conv1/Conv2D``), then
scope and type in order, then type and shapes. Only nodes computed from the
inputs are compared (constant folding chains of a frozen graph are not).
Memory stays bounded: each side computes its compared nodes in one run that
writes every value to a temporary folder as it is computed (tfdbg's file
watches for a session, write ops in the inlined function), OLD first and,
when equivtool loaded it, closed before NEW runs; the values are then read back
and compared a pair at a time, and the walk stops at the first divergence.
"""

from __future__ import annotations

import os
import time

import numpy as np

from equivtool._base.memory import return_freed_memory
from equivtool.exported import _dump
from equivtool.exported._errors import short
from equivtool.exported._sides import ModelLoadError, Side
from equivtool.localize.alignment import TF1Op, tf1_forward_ops
from equivtool.localize.lockstep import Lockstep, Record, divergence_path
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


def _ops(view, naming=None):
    """The compared ops of a graph view (computed from the inputs; in a record, held
    by it), re-indexed, with keys as ``naming`` (OLD's :class:`~equivtool.localize.alignment.Naming`)
    makes them; without one, the view is OLD and its own naming is returned."""
    ops, _, own_naming = tf1_forward_ops(view.graph, list(view.outputs.values()))
    live = _computed_from_inputs(view.graph, list(view.inputs.values()))
    result = []
    for op in ops:
        if op.op not in live or op.type == "Identity":  # an Identity repeats its input
            continue
        if view.recorded is not None and not all(op.op.outputs[i].name in view.recorded for i in op.outputs):
            continue
        key = op.key
        if naming is not None:
            components = op.name.split("/")
            key = "/".join(naming.other_scope(components[:-1], layer_scope=False) + components[-1:])
        result.append(TF1Op(len(result), op.op, op.outputs, key))
    return result, own_naming


def _tensors(ops) -> list:
    return [op.op.outputs[i] for op in ops for i in op.outputs]


def _return_freed_memory() -> None:
    """Hand freed heap memory back to the system (glibc's ``malloc_trim``): after
    closing OLD, so that NEW's run starts from one model's memory rather than from
    pages the allocator keeps, and after NEW's run; nothing where the C library has
    no such call."""
    return_freed_memory()


def _dumped(view, tensors, folder: str, budget_bytes: int, needed: int):
    """``view.dumped(...)``, a disk that filled up during the run said as such, with the space needed."""
    try:
        return view.dumped(tensors, folder, budget_bytes)
    except _dump.DiskFilled as exc:
        raise _dump.NotEnoughDisk(f"--localize: {exc}; the node values need about {needed / 2**20:.1f} MiB "
                                  f"(plus {_dump.MARGIN_BYTES >> 20} MiB kept free); point TMPDIR at a "
                                  "larger disk") from None


def localize(old: Side, new: Side, old_feed, new_feed, tolerance, folder: str, *, budget_bytes: int = 64 << 20,
             release_old: bool = False):
    """(a :class:`Localization`, OLD's compared nodes, ``read_old(tensor) -> value``, OLD's view).

    Each side computes its compared nodes once, each value written under
    ``folder`` (the caller's, removed by the caller) as it is computed
    (:meth:`GraphView.dumped`); OLD first, after which OLD is closed when
    ``release_old`` (its weights leave memory before NEW's run), then NEW. The
    values are then read back a pair at a time, in NEW's topological order, and
    the walk stops at the first divergence: memory stays that of one model's run
    and one pair of values. ``read_old`` reads OLD's values from ``folder`` while
    it exists (for ``--save-outputs``). ``budget_bytes`` bounds a window of the
    tensors a dump could not hold, fetched by name instead.
    """
    started = time.perf_counter()
    old_view = old.graph_view(old_feed)
    old_ops, naming = _ops(old_view)
    old_tensors = _tensors(old_ops)
    batch = max((int(np.shape(v)[0]) for v in old_feed.values() if np.ndim(v)), default=1)
    os.makedirs(os.path.join(folder, "old"))
    if old_view.dump is not None:  # NEW writes about as much as OLD: both must fit (NEW is checked again)
        needed = _dump.needed_bytes(old_view, old_tensors, batch)
        _dump.check_room(folder, 2 * needed)
        read_old = _dumped(old_view, old_tensors, os.path.join(folder, "old"), budget_bytes, 2 * needed)
    else:
        read_old = old_view.dumped(old_tensors, os.path.join(folder, "old"), budget_bytes)
    if release_old and old_view.dump is not None:  # its values are on disk now (a record reads its file)
        old.close()
        _return_freed_memory()
    new_view = new.graph_view(new_feed)
    new_ops, _ = _ops(new_view, naming)
    new_tensors = _tensors(new_ops)
    os.makedirs(os.path.join(folder, "new"))
    if new_view.dump is not None:  # with what OLD's values left free (the real shapes, when known only now)
        needed = _dump.needed_bytes(new_view, new_tensors, batch)
        _dump.check_room(folder, needed)
        read_new = _dumped(new_view, new_tensors, os.path.join(folder, "new"), budget_bytes, needed)
    else:
        read_new = new_view.dumped(new_tensors, os.path.join(folder, "new"), budget_bytes)
    _return_freed_memory()  # the run's own memory, before the values are read back
    lockstep = Lockstep(old_ops, lambda tensors: [read_old(t) for t in tensors], tolerance, 1)
    for op in new_ops:  # each aligned pair compared as it comes (a budget of 1 byte flushes each)
        if lockstep.divergence is not None:
            break
        values = [read_new(op.op.outputs[i]) for i in op.outputs]
        lockstep.add(Record(op.key, op.scope, op.type, values, None, graph_op=op.op))
    lockstep.flush()
    lockstep.closed = True
    notes = []
    examined = old_ops
    if lockstep.divergence is not None:
        examined = old_ops[:lockstep.divergence[0].index + 1]
        notes.append(f"comparison stopped at the first divergence: {len(old_ops) - len(examined)} later OLD "
                     "nodes not examined")
    unaligned = [f"{op.name} ({op.type})" for op in examined if not op.matched]
    common = dict(mode="graph", sides=("OLD", "NEW"), compared=lockstep.compared, tf1_ops=len(old_ops),
                  tf2_ops=len(new_ops), unaligned_tf1=unaligned[:_LIST_LIMIT],
                  unaligned_tf2=lockstep.unaligned_tf2[:_LIST_LIMIT],
                  unaligned_tf1_count=len(unaligned), unaligned_tf2_count=len(lockstep.unaligned_tf2),
                  seconds=time.perf_counter() - started, **lockstep.inconclusive_fields())
    if lockstep.divergence is not None:
        op, record, leaf = lockstep.divergence
        found = Localization("diverged", tf1_op=op.name, tf2_op=record.graph_op.name, tf1_type=op.type,
                             tf2_type=record.type, tf1_source=old.path, tf2_source=new.path,
                             divergence=leaf, path=divergence_path(op, lockstep), notes=notes, **common)
    elif lockstep.compared == 0:
        found = Localization("inconclusive", reason=lockstep.nothing_proven(
            f"no node could be aligned: {len(old_ops)} OLD nodes, {len(new_ops)} NEW nodes computed from the "
            "inputs"), notes=notes, **common)
    else:
        found = Localization("no_divergence", notes=notes, **common)
    return found, old_ops, read_old, old_view


def localize_step(step, old: Side, new: Side, old_feed, new_feed, output_names, tolerance, folder: str,
                  keep_old: bool, release_old: bool = False):
    """``step`` with ``data["localization"]``; and, for ``--save-outputs``, OLD's
    nodes, their values (read from ``folder`` one at a time, while it exists),
    its GraphDef (empty when not kept) and the graph's tensor of each signature
    input and output (``{"inputs": {name: tensor}, "outputs": ...}``: a TF2
    signature names none of its own, and a record needs them to be localized).
    ``release_old``: OLD is closed once its values are written (see :func:`localize`)."""
    import dataclasses
    for side, which in ((old, "OLD"), (new, "NEW")):
        reason = side.capabilities["intermediates"]
        if reason:
            raise ModelLoadError(f"--localize: {which} {side.path}: {reason}")
    started = time.perf_counter()
    try:
        found, old_ops, read_old, old_view = localize(old, new, old_feed, new_feed, tolerance, folder,
                                                      release_old=release_old)
    except ModelLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - the step's verdict stands; say why nothing was localized
        detail = str(exc) if isinstance(exc, (_dump.NotEnoughDisk, _dump.DumpFailed)) else short(
            f"{type(exc).__name__}: {exc}")
        found = Localization("inconclusive", mode="graph", sides=("OLD", "NEW"),
                             reason=f"localization failed: {detail}", seconds=time.perf_counter() - started)
        keep_old = False
    step = dataclasses.replace(step, data={**dict(step.data), "localization": found})
    if not keep_old:
        return step, (), (), None, {}
    tensors = _tensors(old_ops)
    nodes = [{"tensor": t.name, "op": t.op.name, "type": t.op.type} for t in tensors]
    values = (read_old(t) for t in tensors)  # streamed into the record, one at a time
    signature = {"inputs": {k: t.name for k, t in old_view.inputs.items()},
                 "outputs": {k: t.name for k, t in old_view.outputs.items()}}
    return step, nodes, values, old_view.graph.as_graph_def().SerializeToString(), signature
