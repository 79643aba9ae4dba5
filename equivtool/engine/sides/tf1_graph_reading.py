"""Reading a built TF1 graph: random ops inside while loops, and the end-point
keys of a second pass built in the same graph.

Both answer questions the engine asks of the TF1 side after building it
(:class:`equivtool.engine.sides.tf1_side.TF1Side` records the first; the step runs judge
with it); nothing here runs a session.
"""

from __future__ import annotations

import re
from typing import Mapping

import tensorflow as tf  # safe: importing the equivtool package applied the environment fix
from equivtool._base.graph import ancestors
from equivtool._base.tree import rebuild_mapping

__all__ = ["align_pass_keys", "depends_on", "loop_random_ops"]


# Stateful random ops: inside a while loop, one such op draws anew at every
# iteration of a TF1 session run, while an eager loop creates a new op (seeded
# afresh by the random tool) at every iteration.
STATEFUL_RANDOM_OPS = frozenset({
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "ParameterizedTruncatedNormal", "RandomShuffle", "Multinomial", "RandomGamma",
    "RandomPoisson", "RandomPoissonV2", "RandomCrop"})
_WHILE_OPS = ("While", "StatelessWhile")


def _function_random_ops(library: dict, name: str, seen: set) -> list:
    """Stateful random ops in a graph function and the functions it calls."""
    if name in seen or name not in library:
        return []
    seen.add(name)
    found = []
    for node in library[name].node_def:
        if node.op in STATEFUL_RANDOM_OPS:
            found.append(f"{node.name} ({node.op})")
        for attr in node.attr.values():
            called = [attr.func.name] if attr.HasField("func") else [f.name for f in attr.list.func]
            for function_name in called:
                found += _function_random_ops(library, function_name, seen)
    return found


def loop_random_ops(graph: tf.Graph, ops) -> dict:
    """``{loop: [random ops]}`` for the while loops among ``ops`` whose body draws random numbers.

    A loop is a ``While`` op (control flow v2; the random ops are in its body
    function) or a v1 loop frame (named by its ``Enter`` ops; the random ops
    are graph ops under the loop's name scope).
    """
    ops = list(ops)
    loops: dict = {}
    whiles = [op for op in ops if op.type in _WHILE_OPS]
    if whiles:
        library = {f.signature.name: f for f in graph.as_graph_def().library.function}
        for op in whiles:
            found = _function_random_ops(library, op.get_attr("body").name, set())
            if found:
                loops[op.name] = found
    frames = {op.get_attr("frame_name").decode() for op in ops if op.type == "Enter"}
    for frame in frames:
        prefix = frame.rsplit("/", 1)[0] + "/"
        found = [f"{op.name} ({op.type})" for op in ops
                 if op.type in STATEFUL_RANDOM_OPS and op.name.startswith(prefix)]
        if found:
            loops[prefix.rstrip("/")] = found
    return loops


def depends_on(value, loops: Mapping) -> bool:
    """Whether a graph tensor (or op, or IndexedSlices) is computed from one of ``loops``."""
    if value is None:
        return False
    targets = set(loops) | {entry.split(" (", 1)[0] for found in loops.values() for entry in found}
    start = getattr(value, "values", value) if isinstance(value, tf.IndexedSlices) else value
    return any(op.name in targets for op in ancestors([getattr(start, "op", start)], control_inputs=True))


_UNIQUIFIED = re.compile(r"^(.*)_\d+$")


def _same_but_uniquified(key: str, first: str) -> bool:
    """``alexnet_v2_1/pool1`` vs ``alexnet_v2/pool1``: equal but for ``_N`` suffixes
    that a graph adds to a name scope used a second time."""
    parts, first_parts = key.split("/"), first.split("/")
    if len(parts) != len(first_parts):
        return False
    for part, first_part in zip(parts, first_parts):
        if part != first_part:
            match = _UNIQUIFIED.match(part)
            if match is None or match.group(1) != first_part:
                return False
    return True


def align_pass_keys(outputs, first):
    """A later pass's end-point keys as the first pass named them.

    Every pass after the first is built in the same graph, so name-scope-based
    end-point keys (slim's pooling layers) get ``_N`` suffixes; eagerly, the
    TF2 side never uniquifies. A dict whose keys match the first pass's, in
    order, up to such suffixes takes the first pass's keys; anything else is
    left as it is.
    """
    if isinstance(outputs, Mapping) and isinstance(first, Mapping):
        keys, first_keys = list(outputs), list(first)
        if (keys != first_keys and len(keys) == len(first_keys)
                and all(isinstance(k, str) and isinstance(f, str) and _same_but_uniquified(k, f)
                        for k, f in zip(keys, first_keys))):
            return rebuild_mapping(outputs, [(f, align_pass_keys(outputs[k], first[f]))
                                              for k, f in zip(keys, first_keys)])
        return rebuild_mapping(outputs, [(k, align_pass_keys(v, first.get(k))) for k, v in outputs.items()])
    if (isinstance(outputs, (list, tuple)) and not hasattr(outputs, "_fields")
            and isinstance(first, (list, tuple)) and len(outputs) == len(first)):
        return type(outputs)(align_pass_keys(v, f) for v, f in zip(outputs, first))
    return outputs
