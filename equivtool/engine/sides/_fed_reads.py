"""A TF1 pass on given variable values, fed to the variables' reads: nothing copied in or put back.

Why: the constant-mode pair's TF1 half spent most of its time above the bare
passes not computing but moving a model's worth of values in and out of its
two sessions: the fixed values assigned for ``fixed_weights`` and the pair's
own put back, the training graph's variables copied from the inference
graph and back around the training pass. Each is done a chunk at a time (to
hold one chunk, not a second model), and every chunk is a new
``Session.run`` signature, for which TensorFlow prunes and optimises the
whole graph again: about 0.3 s a chunk for Inception-ResNet-v2's training
graph, more than the values' own copy.

Feeding a value to the tensor a variable read produces gives every op
downstream the same value the read would have given, so the pass computes
the same numbers, in one run, and the variable is neither written nor
needed in the session. That holds for a variable only where every op the run
executes that takes the variable is a plain read of it: ``ReadVariableOp``
on its resource handle, or ``Identity`` of a reference variable. Any other
op taking it (an assignment or moving-average update, a gather, a shape
query, a loop or function taking the handle) needs the variable itself: such
a variable is left to the session (:attr:`ReadPlan.real`), set before the
run and, since the run may write it, read back after it.

Graph reading only (duck-typed ops and tensors, no TensorFlow import): the
sides run what it plans.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

from equivtool._base.graph import ancestors

#: Ops that read a variable's value and nothing else: feeding their output replaces them exactly.
_RESOURCE_READ = "ReadVariableOp"
_REF_READ = "Identity"


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    """How a run can get its variables' values, by position in the variables given.

    ``fed``: ``{position: (read tensors,)}`` for the variables whose every use
    in the run is a plain read (feed each tensor the variable's value);
    ``real``: the positions of the variables the run uses otherwise, in order
    (they must hold their values in the session; the run may change them).
    Variables the run does not use are in neither.
    """

    fed: dict
    real: tuple


def _ops(fetches: Iterable) -> list:
    """The ops of ``fetches`` (tensors, ops, or composites already flattened to either)."""
    return [getattr(item, "op", item) for item in fetches]


def read_plan(variables: Iterable, fetches: Iterable) -> ReadPlan:
    """The :class:`ReadPlan` of a run of ``fetches`` (its tensors and ops, flat)
    over ``variables`` (TF1 variables of the fetches' graph)."""
    # a variable is known by its resource handle or reference tensor (variables are not hashable)
    source = {v.op.outputs[0]: i for i, v in enumerate(variables)}
    reads: dict = {}
    real: set = set()
    for op in ancestors(_ops(fetches), control_inputs=True):
        for tensor in op.inputs:
            position = source.get(tensor)
            if position is None:
                continue
            if _plain_read(op, tensor):
                reads.setdefault(position, []).append(op.outputs[0])
            else:
                real.add(position)
    fed = {i: tuple(found) for i, found in sorted(reads.items()) if i not in real}
    return ReadPlan(fed, tuple(sorted(real)))


def _plain_read(op, tensor) -> bool:
    if op.type == _RESOURCE_READ:
        return True
    # a reference variable's "read": an Identity of its ref tensor
    return op.type == _REF_READ and tensor.dtype != tensor.dtype.base_dtype
