"""The sides: the only code that executes TensorFlow, behind one small protocol.

A **side** is one of the two things a check compares: today the user's TF1
graph function (:class:`~equivtool.engine.sides.tf1_side.TF1Side`, graph
helpers in :mod:`~equivtool.engine.sides.tf1_graph_reading`) and the user's TF2 layer
(:class:`~equivtool.engine.sides.tf2_side.TF2Side`). A side builds or loads a
model, runs a forward pass, reads and assigns variables, computes gradients,
trains and checkpoints; what crosses a process from it is NumPy captures only.

**The protocol.** A side class declares what it can do, and may refuse a
capability with a reason::

    class ExportedModelSide(Side):
        CAPABILITIES = frozenset({FORWARD})        # a SavedModel has no training
        REFUSALS = {TRAINING: "an exported model cannot be trained"}

Each registered step names the capabilities it needs
(:attr:`equivtool.engine.registry.Step.needs`). Before a step runs either
side, the engine asks both sides' classes (:func:`refusal`, the TF1 side
first), without building anything; a side that refuses skips the step with
that side's reason. A new
kind of side is one module here: a :class:`Side` subclass with its
capabilities, and the engine choosing it for ``"tf1"`` or ``"tf2"``
(:meth:`equivtool.engine.run.Engine.side_class`).
"""

from __future__ import annotations

from typing import Callable, ClassVar, Iterable, Mapping

#: The capabilities a step may ask of a side.
FORWARD = "forward"              # a forward pass on the inputs (outputs, regularization losses)
VARIABLES = "variables"          # read, compare and assign variables by name
GRADIENTS = "gradients"          # gradients of a scalar loss w.r.t. the trainable variables
TRAINING = "training"            # optimizer steps
CHECKPOINTS = "checkpoints"      # write or load a TF1 name-based checkpoint
INTERMEDIATES = "intermediates"  # every op's output (localization)
CAPABILITIES = (FORWARD, VARIABLES, GRADIENTS, TRAINING, CHECKPOINTS, INTERMEDIATES)


class Side:
    """Base of every side: what it can do. Subclasses set :attr:`CAPABILITIES`
    (a subset of :data:`CAPABILITIES`) and, for what they cannot, a reason in
    :attr:`REFUSALS`."""

    KIND: ClassVar[str] = "side"
    CAPABILITIES: ClassVar[frozenset] = frozenset()
    REFUSALS: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def step_side(cls, step) -> Callable | None:
        """The function computing this side of ``step`` when it is not the step's own
        (a side in another interpreter, :mod:`~equivtool.engine.sides.old_python`); None: the step's own."""
        return None

    @classmethod
    def refuses(cls, capability: str) -> str | None:
        """None when this kind of side can do ``capability``, else why not."""
        if capability not in CAPABILITIES:
            raise ValueError(f"capability: expected one of {list(CAPABILITIES)}, got {capability!r}")
        if capability in cls.CAPABILITIES:
            return None
        return cls.REFUSALS.get(capability) or f"the {cls.KIND} side has no {capability}"


def refusal(side: type, needs: Iterable[str]) -> str | None:
    """The first reason ``side`` (a :class:`Side` class) gives for refusing one of ``needs``, or None."""
    for capability in needs:
        reason = side.refuses(capability)
        if reason is not None:
            return reason
    return None
