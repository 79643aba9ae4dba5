"""A forward pass of the TF1 side in the old interpreter, read as a graph for localization.

Localization (:func:`equivtool.localize.forward.localize_forward`) walks a
``tf.Graph``: the ancestors of the pass's outputs, each op's type, inputs,
outputs (dtype, shape), whether it sits inside v1 control flow, whether it can
be fetched, and the line that created it. With ``tf1_python`` that graph lives
in another interpreter (TensorFlow 1.15), and no TensorFlow object can cross.
The old-side program describes the pass as JSON instead (its ``describe``
request), and this module gives that description the few attributes
localization reads, so the alignment and the comparison in order run
unchanged. The values come back by tensor name (the ``fetch`` request).

The description covers what the pass's outputs and its ``UPDATE_OPS`` are
computed from: a batch norm's moving-average update (``AssignMovingAvg/sub``,
``.../mul``, where the decay is applied) is compared with the TF2 side's, so a
changed decay is localized where it is used, not only seen in the moving
variables afterwards. Ops that write a variable (``Assign*``) are described
but never fetched: fetching them would change the old side's state.
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf


class OldTensor:
    """An output of a described op: ``name`` (``op:index``), ``op``, ``dtype``, ``shape``."""

    __slots__ = ("name", "op", "dtype", "shape", "fetchable")

    def __init__(self, op: "OldOp", index: int, spec: dict, fetchable: bool):
        self.name = f"{op.name}:{index}"
        self.op = op
        self.dtype = tf.as_dtype(spec["dtype"])
        self.shape = tf.TensorShape(spec["shape"])
        self.fetchable = fetchable

    def __repr__(self) -> str:
        return f"<OldTensor {self.name} {self.dtype.name} {self.shape}>"


class OldOp:
    """A described op: ``name``, ``type``, ``inputs``, ``outputs``, ``control_inputs`` (none
    are described: localization walks inputs only) and ``traceback`` (the user's frame there)."""

    __slots__ = ("name", "type", "inputs", "outputs", "control_inputs", "traceback", "_loop")

    def __init__(self, spec: dict):
        self.name = spec["name"]
        self.type = spec["type"]
        self.inputs: list = []
        self.outputs = [OldTensor(self, i, out, fetch) for i, (out, fetch)
                        in enumerate(zip(spec["outputs"], spec["fetchable"]))]
        self.control_inputs: list = []
        frame = spec.get("frame")
        self.traceback = [] if not frame else [_Frame(*frame)]
        self._loop = bool(spec["loop"])

    def _get_control_flow_context(self):
        """Truthy inside a v1 while loop or cond (as ``tf.Operation``'s: such ops cannot be fetched)."""
        return "v1 control flow" if self._loop else None

    def __repr__(self) -> str:
        return f"<OldOp {self.name} ({self.type})>"


class _Frame:
    __slots__ = ("filename", "lineno", "name")

    def __init__(self, filename: str, lineno: int, name: str):
        self.filename, self.lineno, self.name = filename, int(lineno), name


class _Root:
    """An update op where localization expects a tensor (it reads ``.op``)."""

    __slots__ = ("op",)

    def __init__(self, op: OldOp):
        self.op = op


class OldGraph:
    """The described pass: ``get_operations()`` in creation order, ``is_fetchable``,
    ``outputs`` (the pass's output tensors, flattened), ``updates`` and ``random``
    (whether it draws random numbers)."""

    def __init__(self, description: dict):
        ops = [OldOp(spec) for spec in description["ops"]]
        tensors = {t.name: t for op in ops for t in op.outputs}
        for op, spec in zip(ops, description["ops"]):
            # the description is closed upwards (every input's op is in it); an input
            # that is not would end the walk upwards there
            op.inputs = [tensors[name] for name in spec["inputs"] if name in tensors]
        self._ops = ops
        missing = [name for name in description["outputs"] if name not in tensors]
        if missing:
            raise ValueError(f"describe: the pass's outputs {missing[:3]} are not among its described ops")
        self.outputs = [tensors[name] for name in description["outputs"]]
        by_name = {op.name: op for op in ops}
        #: the pass's UPDATE_OPS, as roots of the walk upwards (``.op`` as a tensor has)
        self.updates = [_Root(by_name[name]) for name in description["updates"]]
        self.random = bool(description["random"])

    def roots(self) -> list:
        """What localization walks up from: the outputs, then the updates."""
        return list(self.outputs) + list(self.updates)

    def get_operations(self) -> list:
        return list(self._ops)

    def is_fetchable(self, tensor: OldTensor) -> bool:
        return tensor.fetchable


def op_runner(fetch: Callable[[list], dict]) -> Callable[[list], list]:
    """``run(tensors) -> values`` over ``fetch(names) -> {name: value}`` (one request there)."""
    def run(tensors: list) -> list:
        names = [t.name for t in tensors]
        found = fetch(names)
        return [found[name] for name in names]
    return run
