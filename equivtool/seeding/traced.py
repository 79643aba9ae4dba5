"""``num_random_ops`` seeds under ``tf.function``: every trace sees the TF1 graph's order.

In ``num_random_ops`` mode a random op's seed is its position in program order
(see :mod:`equivtool.seeding`). A TF1 graph creates each op once, in program
order: variable initializers interleaved with the forward pass's random ops
(dropout). A ``tf.function`` whose first call creates variables is traced
twice: the first trace creates the variables (their initializers run once,
lifted out of the function) and the forward ops in the same program order as
the TF1 graph; the second trace, which is the function that actually runs,
builds the forward ops again, without initializers, so the seed counter has
moved on and its dropout would draw other numbers than TF1's.

:class:`TraceAlignment` keeps the first trace's order. During the first trace
it records the operation seeds handed to random ops that are not part of a
variable's creation (a ``tf.variable_creator_scope`` marks creation); every
later trace receives those seeds again, in the same order. So the function
that runs holds, op for op, the seeds the TF1 graph's ops got.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import tensorflow as tf

from equivtool.seeding.tool import DeterministicRandomTestTool


class TraceAlignment:
    """Per-trace seed alignment for one ``tf.function`` under ``tool`` (``num_random_ops``)."""

    def __init__(self, tool: DeterministicRandomTestTool):
        self.tool = tool
        self.forward_seeds: list | None = None  # the first trace's non-initializer seeds

    def _creator(self, next_creator, **kwargs):
        tool = self.tool
        tool._creating += 1
        try:
            return next_creator(**kwargs)
        finally:
            tool._creating -= 1

    @contextlib.contextmanager
    def trace(self) -> Iterator[None]:
        """Wraps the body of one trace of the function."""
        tool = self.tool
        if tool.mode == "constant":  # every op gets the same seeds anyway
            yield
            return
        if self.forward_seeds is None:
            recorded: list = []
            tool._forward_log = recorded
            try:
                with tf.variable_creator_scope(self._creator):
                    yield
            finally:
                tool._forward_log = None
            self.forward_seeds = recorded
            return
        tool._replay = list(self.forward_seeds)
        try:
            yield
        finally:
            tool._replay = None


def execution_note(tf_function: bool, distributed: bool, localize: bool = False) -> str:
    """The report header's ``execution``: how the TF2 side ran, and which steps ran eagerly and why."""
    if not tf_function:
        return ("eager in every step (tf_function=False); code that reads graph-only attributes "
                "(tensor.name, .graph, .op) needs tf_function=True")
    if distributed:
        return ("tf.function in every step, except the layer's first (variable-creating) call, made eagerly "
                "in the strategy's cross-replica context")
    if localize:
        return ("tf.function in every step (num_random_ops steps included); localization of a num_random_ops "
                "step calls its fresh layer eagerly (a variable-creating tf.function is traced twice, and the "
                "op taps would see both traces)")
    return "tf.function in every step (num_random_ops steps included)"
