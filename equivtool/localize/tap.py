"""The TF2 tap: TensorFlow's op callbacks (the hook tfdbg v2 is built on) see every
eager op's outputs as it runs; under ``tf.function`` they see the graph being
built, and a ``numpy_function`` sink spills each output to a folder when the
function runs. Each output becomes a :class:`~equivtool.localize.lockstep.Record`.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Optional

import numpy as np
import tensorflow as tf

from equivtool._base.graph import ancestors
from equivtool._base.stack import is_library_frame
from equivtool.localize.alignment import BRANCH_GRAPHS, CONTROL_FLOW, Naming, SKIPPED_TYPES, compared_outputs
from equivtool.localize.lockstep import Lockstep, Record


def user_line(frames, library_dirs) -> str:
    """The innermost ``(filename, lineno, name)`` frame outside the libraries."""
    for filename, lineno, name in reversed(frames):
        if not filename.startswith("<") and not is_library_frame(filename, library_dirs=library_dirs):
            return f"{filename}:{lineno} in {name}"
    return "<unknown>"


def current_frames(skip: int = 2) -> list:
    frames, frame = [], sys._getframe(skip)
    while frame is not None:
        frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    frames.reverse()
    return frames


#: The frame every resource variable's initial value is computed under (the
#: initializer of a shim's get_variable, a tf-keras or a Keras 3 layer's weight,
#: an initial_value callable), whatever scope the layer names it in.
_INITIAL_VALUE_FRAME = ("resource_variable_ops.py", "_init_from_args")


def making_initial_value(frames) -> bool:
    """Whether an eager op runs to make a variable's initial value: a fresh TF2
    layer's first call (the ``num_random_ops`` steps make one) creates its
    variables inside the tapped call. Those ops are not the forward pass, and
    the TF1 side never fetches their counterparts (initializers are not the
    outputs' ancestors): compared against forward ops they would be blamed
    for differences that are not there."""
    return any(os.path.basename(filename) == _INITIAL_VALUE_FRAME[0] and name == _INITIAL_VALUE_FRAME[1]
               for filename, _, name in frames)


class Tap:
    """The op callback, installed for one TF2 call and removed on every exit path."""

    def __init__(self, lockstep: Lockstep, naming: Naming, spill_dir: str):
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
        if op_type in SKIPPED_TYPES or op_type.startswith("__") or not outputs:
            return None
        indices = compared_outputs(op_type, [t.dtype for t in outputs])
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
        frames = current_frames(3)
        if making_initial_value(frames):
            return
        self.eager_ops += 1
        name, scope = self._names(None, op_type, scope_now)
        values = [outputs[i].numpy() for i in indices]
        self.lockstep.add(Record(name, scope, op_type, values, frames))

    def _graph(self, op_type, outputs, indices, op_name) -> None:
        self.graph_mode = True
        op = outputs[0].op
        if (op.control_inputs or not self.naming.in_model(op.name) or op_type in CONTROL_FLOW
                or type(op.graph).__name__ in BRANCH_GRAPHS):
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
        record = Record(name, scope, op_type, loaders, None, graph_op=op)
        self.graph_records.append(record)


# --------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------


def forward_records(records: list) -> list:
    """The records of ops the traced function's outputs depend on (as on the TF1
    side: regularization losses built in the same trace are left out)."""
    graphs = {}
    for record in records:
        graphs.setdefault(record.graph_op.graph, None)
    wanted = ancestors(t.op for graph in graphs for t in getattr(graph, "outputs", ()))
    return [r for r in records if r.graph_op in wanted]


def graph_frames(op) -> list:
    try:
        return [(f.filename, f.lineno, f.name) for f in op.traceback]
    except Exception:  # an op without a recorded traceback
        return []
