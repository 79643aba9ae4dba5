"""Walking a TensorFlow graph upwards, without importing TensorFlow (ops are read by duck typing)."""

from __future__ import annotations

from typing import Iterable


def ancestors(ops: Iterable, control_inputs: bool = False) -> set:
    """``ops`` and every op they are computed from, walking up each op's inputs
    (and its control inputs when ``control_inputs``)."""
    seen, stack = set(), list(ops)
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
        if control_inputs:
            stack.extend(op.control_inputs)
    return seen
