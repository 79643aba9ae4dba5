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

import tempfile
import time
from typing import Any, Callable


from equivtool._base import stack as _stack
from equivtool.comparison import Tolerance
from equivtool.localize.result import Localization
from equivtool.localize.alignment import LIST_LIMIT, TF1Op, base_scope, tf1_forward_ops
from equivtool.localize.lockstep import Lockstep, Record, divergence_path
from equivtool.localize.tap import Tap, forward_records, graph_frames, user_line


def localize_forward(tf1_graph, tf1_outputs, tf1_run: Callable[[list], list], tf2_call: Callable[[], Any],
                     tolerance=None, *, budget_bytes: int = 256 << 20) -> Localization:
    """Find the first op whose output differs between a TF1 forward pass and a TF2 call.

    Args:
      tf1_graph: the graph holding the TF1 forward pass.
      tf1_outputs: the forward pass's output tensors (a nested structure).
      tf1_run: ``tf1_run(tensors) -> values``: one ``Session.run`` of the given
        tensors with the step's inputs fed (a fresh session per call where the
        pass has stateful random ops).
      tf2_call: ``tf2_call(tap)`` runs the TF2 forward pass once (eagerly, or a
        new ``tf.function`` trace and its call) with ``tap`` installed as an op
        callback (:func:`equivtool.engine.sides.tf2_side.run_tapped`).
      tolerance: a :class:`Tolerance` or a tolerance mapping (resolved per op name).
      budget_bytes: how many bytes of TF2 outputs are buffered before the TF1
        counterparts are fetched and compared.
    """
    if not isinstance(budget_bytes, int) or isinstance(budget_bytes, bool) or budget_bytes <= 0:
        raise ValueError(f"budget_bytes: expected a positive int, got {budget_bytes!r}")
    started = time.perf_counter()
    tolerance = Tolerance() if tolerance is None else tolerance
    ops, in_loops, naming = tf1_forward_ops(tf1_graph, tf1_outputs)
    lockstep = Lockstep(ops, tf1_run, tolerance, budget_bytes)
    notes = []
    if in_loops:
        notes.append(f"{in_loops} TF1 ops inside v1 control flow (while_loop/cond) cannot be fetched and were "
                     "not compared")
    library_dirs = _stack.find_library_dirs()
    with tempfile.TemporaryDirectory(prefix="equivtool-localize-") as spill_dir:
        tap = Tap(lockstep, naming, spill_dir)
        tf2_call(tap)  # the side installs the tap for its call, and removes it
        graph_records = forward_records(tap.graph_records)
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
                  unaligned_tf1=unaligned_tf1[:LIST_LIMIT], unaligned_tf2=lockstep.unaligned_tf2[:LIST_LIMIT],
                  unaligned_tf1_count=len(unaligned_tf1), unaligned_tf2_count=len(lockstep.unaligned_tf2),
                  **lockstep.inconclusive_fields())
    if lockstep.divergence is not None:
        op, record, leaf = lockstep.divergence
        tf2_frames = record.frames if record.graph_op is None else graph_frames(record.graph_op)
        return Localization(
            "diverged", tf1_op=op.name, tf2_op=tf2_label(op, record), tf1_type=op.type, tf2_type=record.type,
            tf1_source=user_line(graph_frames(op.op), library_dirs),
            tf2_source=user_line(tf2_frames, library_dirs), divergence=leaf,
            path=divergence_path(op, lockstep), seconds=time.perf_counter() - started, notes=notes, **common)
    if lockstep.compared == 0:
        reason = lockstep.nothing_proven(("no op could be aligned: " if ops and tf2_ops else "nothing to compare: ")
                                         + f"{len(ops)} TF1 ops, {tf2_ops} TF2 ops captured")
        return Localization("inconclusive", reason=reason, seconds=time.perf_counter() - started,
                            notes=notes, **common)
    return Localization("no_divergence", seconds=time.perf_counter() - started, notes=notes, **common)


def tf2_label(op: TF1Op, record: Record) -> str:
    """The TF2 op's name as shown. An eager op carries its scope as it was entered,
    not uniquified (the third ``x`` block is ``x/...``, where a graph says ``x_2/...``):
    aligned by structure, it is shown under the scope the TF1 graph gave that instance."""
    if (record.graph_op is None and record.scope != op.scope
            and base_scope(record.scope) == base_scope(op.scope)):
        last = record.name.rsplit("/", 1)[-1]
        return (f"{op.scope}/{last} (eager name {record.name}: eager scopes are not uniquified; "
                f"aligned by structure)")
    return record.name
