"""The variable values both ends of the old-side protocol hold, so that a model crosses once.

Why: a check with ``tf1_python`` reads, assigns, saves and puts back the
model's variables many times (fixed weights and their restore, the pair's
reads after each pass, the optimizer's start, its steps and the noise floor's
run, the start put back): for resnet_v1_50 the 94 MB of variables crossed 13
times, though most crossings carried values the other end had just sent or
received. Both ends (this module here, ``Known`` in the self-contained
program :mod:`equivtool.engine.sides._old_side_program` there) keep, per
request kind (``read``, ``global_state``, ``assign``, ``load_global_state``),
the values the last request of that kind carried, by variable (its name
without ``":0"``, so a read's ``"w:0"`` and a global state's ``"w"`` meet).

A sender compares each value bit for bit with what both ends hold under the
same name (dtype, shape and bytes: a NaN equals its own bits, ``-0.0`` is not
``0.0``) and sends, for an equal one, a reference ``[kind, name]`` instead of
the array; the receiver takes it from its own copy. Values are never stale:
equality is checked on the value being sent, every time, and this end keeps
copies (a caller that changes an array in place after sending it, or after
receiving it, changes no kept value). Both ends replace a kind's values only
once its request has succeeded there, so they hold the same values; a
reference this end cannot resolve is an error (and both ends forget), never a
guess. The cost: up to one copy of the model per kind at each end.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

__all__ = ["KnownValues", "same_bits", "value_key"]


def value_key(name: str) -> str:
    """The name a kept value is found under: ``"w:0"`` and ``"w"`` are the same variable."""
    return name[:-2] if name.endswith(":0") else name


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` have the same dtype, shape and bytes (object arrays: never)."""
    if a.dtype != b.dtype or a.shape != b.shape or a.dtype.kind == "O":
        return False
    a, b = np.ascontiguousarray(a).reshape(-1).view(np.uint8), np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    return bool(np.array_equal(a[:256], b[:256]) and np.array_equal(a, b))  # a changed value: seen early


class KnownValues:
    """This end's copy of the values both ends hold, by request kind and :func:`value_key`."""

    def __init__(self):
        self.kinds: dict = {}

    def clear(self) -> None:
        self.kinds = {}

    def find(self, name: str, value: np.ndarray):
        """``[kind, key]`` of a kept value with the same bits as ``value`` under ``name``, or None."""
        key = value_key(name)
        for kind, values in self.kinds.items():
            found = values.get(key)
            if found is not None and same_bits(found, value):
                return [kind, key]
        return None

    def split(self, names: Sequence[str], values: Sequence[np.ndarray]) -> tuple:
        """``(names to send, their arrays, {name: [kind, key]} held at both ends})``."""
        sent_names, sent, same = [], [], {}
        for name, value in zip(names, values):
            found = self.find(name, value)
            if found is None:
                sent_names.append(name)
                sent.append(value)
            else:
                same[name] = found
        return sent_names, sent, same

    def resolve(self, order: Sequence[str], received: Mapping[str, np.ndarray], same: Mapping) -> dict:
        """``{name: array}`` in ``order``: the ``received`` ones, and the ``same`` ones from
        this end's copies (copied again: the caller may change what it gets)."""
        result = {}
        for name in order:
            if name in received:
                result[name] = received[name]
                continue
            kind, key = same[name]
            try:
                result[name] = np.array(self.kinds[kind][key], copy=True)
            except KeyError:
                raise KeyError(f"{name!r}: the TF1 interpreter referred to a value kept as {kind}/{key}, "
                               "which this end does not hold") from None
        return result

    def keep(self, kind: str, names: Sequence[str], values: Sequence[np.ndarray]) -> None:
        """``kind``'s values are now these (copies), at both ends."""
        self.kinds[kind] = {value_key(name): np.array(value, copy=True) for name, value in zip(names, values)}
