"""The random tool's trace: one record per random op a scope seeded, and where two traces part.

:class:`~equivtool.DeterministicRandomTestTool` appends a
:class:`RandomOpRecord` for each seed it hands out (op type, shape, dtype,
the user's source line); :func:`compare_random_traces` finds the first
position where the TF1 and TF2 programs asked for different random numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence, Tuple, Union

import tensorflow as tf  # safe: importing the equivtool package applied the environment fix
from equivtool._platform.tf_internals import context as _context
from equivtool._platform.tf_internals import tensor_util as _tensor_util

if TYPE_CHECKING:
    from equivtool.seeding import DeterministicRandomTestTool

__all__ = ["RandomOpRecord", "TraceDivergence", "compare_random_traces"]

Shape = Optional[Tuple[Optional[int], ...]]


@dataclass(frozen=True)
class RandomOpRecord:
    """One seed handed out by a scope.

    ``kind`` is ``"tf"`` for a stateful op seeded through ``get_seed`` and
    ``"keras"`` for a tf-keras initializer or RandomGenerator. For ``"tf"``,
    ``operation_seed`` is the second element of the ``(seed, operation_seed)``
    pair the op received; for ``"keras"`` it is the tool's Keras counter (or
    the constant operation seed in constant mode). ``shape`` has ``None`` for
    unknown dimensions and is ``None`` when unknown altogether.
    """

    index: int
    operation_seed: int
    op_type: str
    shape: Shape
    dtype: Optional[str]
    source: str
    kind: str = "tf"

    def __str__(self) -> str:
        shape = "?" if self.shape is None else "(" + ", ".join(
            "?" if d is None else str(d) for d in self.shape) + ("," if len(self.shape) == 1 else "") + ")"
        prefix = "keras " if self.kind == "keras" else ""
        return (f"#{self.index} {prefix}{self.op_type} shape={shape} "
                f"dtype={self.dtype or '?'} operation_seed={self.operation_seed} "
                f"at {self.source}")


@dataclass(frozen=True)
class TraceDivergence:
    """Where two random-op traces first differ.

    ``reason`` is one of ``"kind"``, ``"op type"``, ``"shape"``, ``"dtype"``,
    ``"operation seed"`` or ``"length"``. ``left``/``right`` are the two
    records at ``index``; for ``"length"`` the shorter side's is ``None``.
    """

    index: int
    reason: str
    left: Optional[RandomOpRecord]
    right: Optional[RandomOpRecord]

    def __str__(self) -> str:
        left = str(self.left) if self.left is not None else "<trace ended>"
        right = str(self.right) if self.right is not None else "<trace ended>"
        return (f"random-op traces diverge at position {self.index} "
                f"(different {self.reason}):\n  a: {left}\n  b: {right}")


def _shapes_match(a: Shape, b: Shape) -> bool:
    if a is None or b is None:
        return True
    if len(a) != len(b):
        return False
    return all(x is None or y is None or x == y for x, y in zip(a, b))


def _as_trace(name: str, value) -> Sequence[RandomOpRecord]:
    """A tool's trace, or ``value`` itself when it is a sequence of records."""
    if _is_tool(value):
        return value.trace
    if isinstance(value, (list, tuple)):
        for i, record in enumerate(value):
            if not isinstance(record, RandomOpRecord):
                raise TypeError(
                    f"compare_random_traces: {name}[{i}] is a "
                    f"{type(record).__name__}, not a RandomOpRecord. Pass a "
                    "DeterministicRandomTestTool or its `trace` (a tuple of "
                    "RandomOpRecord).")
        return value
    raise TypeError(
        f"compare_random_traces: {name} must be a DeterministicRandomTestTool or "
        f"its `trace` (a tuple of RandomOpRecord), got {type(value).__name__}. "
        f"Pass the tool itself or `tool.trace`.")


def compare_random_traces(
    a: Union["DeterministicRandomTestTool", Sequence[RandomOpRecord]],
    b: Union["DeterministicRandomTestTool", Sequence[RandomOpRecord]],
) -> Optional[TraceDivergence]:
    """Return the first position where two traces diverge, or ``None`` if they agree.

    ``a`` and ``b`` are tools or their ``trace``\\ s. Records are compared in
    program order by kind, op type, shape (an unknown dimension matches any),
    dtype and operation seed; a trace that ends early diverges with reason
    ``"length"``. The result names both sides' source lines.
    """
    left, right = _as_trace("a", a), _as_trace("b", b)
    for i, (x, y) in enumerate(zip(left, right)):
        if x.kind != y.kind:
            reason = "kind"
        elif x.op_type != y.op_type:
            reason = "op type"
        elif not _shapes_match(x.shape, y.shape):
            reason = "shape"
        elif x.dtype is not None and y.dtype is not None and x.dtype != y.dtype:
            reason = "dtype"
        elif x.operation_seed != y.operation_seed:
            reason = "operation seed"
        else:
            continue
        return TraceDivergence(i, reason, x, y)
    if len(left) != len(right):
        i = min(len(left), len(right))
        return TraceDivergence(
            i, "length",
            left[i] if i < len(left) else None,
            right[i] if i < len(right) else None)
    return None


def _as_shape(value) -> Shape:
    """A shape-like value (list, TensorShape, shape tensor) as a tuple, cheaply."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        try:
            return tuple(None if d is None else int(d) for d in value)
        except (TypeError, ValueError):
            return None
    if isinstance(value, tf.TensorShape):
        return None if value.rank is None else tuple(value.as_list())
    try:
        if hasattr(value, "numpy") and _context.executing_eagerly():
            return tuple(int(d) for d in value.numpy().reshape(-1))
        op = getattr(value, "op", None)
        if op is not None and op.type == "Shape":  # tf.shape(x), as dropout's noise shape
            return _as_shape(op.inputs[0].shape)
        constant = _tensor_util.constant_value(value)
        return None if constant is None else tuple(int(d) for d in constant.reshape(-1))
    except Exception:  # a shape we cannot read statically is simply unknown
        return None


def _dtype_name(value) -> Optional[str]:
    if value is None:
        return None
    try:
        return tf.as_dtype(value).name
    except TypeError:
        return None


# Helpers between the op wrapper and the frame asking for a Keras seed.
_KERAS_PLUMBING = frozenset(
    ("_create_seed", "_maybe_init", "make_seed_for_stateless_op", "randint"))


def _describe_tf_op(frame) -> tuple:
    """(op_type, shape, dtype) of the random op whose wrapper is ``frame``."""
    name = frame.f_code.co_name
    # tf.nn.dropout samples through a functools.partial of random_uniform,
    # behind TensorFlow's dispatch/traceback decorators: look a few frames up.
    parent = frame.f_back
    for _ in range(4):
        if parent is None or parent.f_code.co_name == "_dropout":
            break
        parent = parent.f_back
    if parent is not None and parent.f_code.co_name == "_dropout":
        outer = parent.f_locals
        if name == "dummy_rng_step":  # rate == 0: no op, but a seed is still consumed
            noise = outer.get("noise_shape")
            x = outer.get("x")
            shape = noise if noise is not None else getattr(x, "shape", None)
        else:
            shape = frame.f_locals.get("shape")
        return "dropout", _as_shape(shape), _dtype_name(outer.get("x_dtype"))
    local = frame.f_locals
    return name, _as_shape(local.get("shape")), _dtype_name(local.get("dtype"))


class TraceRecorder:
    """What records a trace: :class:`~equivtool.DeterministicRandomTestTool`
    derives from it, so this module (which reads traces) recognises the tool
    without importing the module that defines it."""

    __slots__ = ()


def _is_tool(value) -> bool:
    return isinstance(value, TraceRecorder)

