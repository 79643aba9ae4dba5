"""Multi-head attention kernels: a TF1 layout and Keras' ``MultiHeadAttention``, paired by their roles.

A TF1 Transformer (BERT's ``attention_layer``, or any hand-written one) keeps
each attention block as dense layers: ``<block>/query``, ``key`` and
``value`` with a kernel ``[hidden, heads * head_size]`` and a bias
``[heads * head_size]``, and an output projection ``[heads * head_size,
hidden]`` (``<block>/output``, or BERT's ``<attention>/output/dense`` beside
``<attention>/self``). Keras' ``MultiHeadAttention`` (Keras 3 and tf-keras)
keeps the same numbers in ``EinsumDense`` layers ``query``, ``key``,
``value`` (kernel ``[hidden, heads, head_size]``, bias ``[heads, head_size]``)
and ``attention_output`` (kernel ``[heads, head_size, hidden]``, bias
``[hidden]``): the TF1 value reshaped to the Keras shape, because both split
the projected width as ``head * head_size + i`` (the TF1 code reshapes
``[..., heads * head_size]`` to ``[..., heads, head_size]``).

Shapes alone cannot pair them (four ``[hidden]`` biases against one, kernels
of other ranks), so :func:`attention_pairs` pairs them by that structure: the
blocks of each side in creation order (when both sides have as many), and in
a block each projection by its role (``weights``/``kernel``,
``biases``/``bias``), with ``"reshape"`` where the shapes differ and the
element counts agree. A block whose parts do not all agree is left to the
other rules, which then report what is unmapped.

``"reshape"`` is right only for that split. The TF1 graph says which split
its code makes: the ``Reshape`` that first follows a projection
(:func:`head_splits`) turns ``[..., heads * head_size]`` into ``[...,
heads, head_size]``. Code that splits it ``[..., head_size, heads]`` (the
width as ``i * heads + head``) pairs other columns, which no declared
transform expresses (a reshape keeps the element order, a transpose
reverses every axis): :func:`split_refusals` refuses that block in one
line naming the kernel. A split the graph does not show (a dynamic shape)
is not judged here; the ``fixed_weights`` step then fails on it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["attention_pairs", "head_splits", "split_refusals"]

_PROJECTIONS = ("query", "key", "value")
_KERAS_OUTPUT = "attention_output"
_ROLES = {"kernel": "kernel", "weights": "kernel", "w": "kernel", "bias": "bias", "biases": "bias", "b": "bias"}


def _parts(names, scope_of_output) -> list:
    """``[{(projection, role): name}]`` per attention block, in creation order."""
    by_scope: dict = {}
    for name in names:
        scope, _, leaf = name.rpartition("/")
        block, _, projection = scope.rpartition("/")
        if leaf in _ROLES and block:
            by_scope.setdefault((block, projection), {})[_ROLES[leaf]] = name
    blocks = []
    for name in names:  # creation order: a block appears with its query kernel
        scope, _, leaf = name.rpartition("/")
        block, _, projection = scope.rpartition("/")
        if projection != "query" or _ROLES.get(leaf) != "kernel":
            continue
        parts = {}
        for part in _PROJECTIONS:
            for role, variable in by_scope.get((block, part), {}).items():
                parts[(part, role)] = variable
        for output_scope in scope_of_output(block):
            found = by_scope.get(output_scope)
            if found:
                parts.update({("output", role): variable for role, variable in found.items()})
                break
        if all((part, "kernel") in parts for part in _PROJECTIONS + ("output",)):
            blocks.append(parts)
    return blocks


def _tf1_outputs(block: str) -> list:
    parent = block.rpartition("/")[0]
    candidates = [(block, "output"), (block, _KERAS_OUTPUT)]
    if block.endswith("/self") and parent:  # BERT: attention/self/{query,key,value}, attention/output/dense
        candidates.append((parent + "/output", "dense"))
    return candidates


def _keras_outputs(block: str) -> list:
    return [(block, _KERAS_OUTPUT)]


def attention_pairs(tf1_infos: dict, tf2_infos: dict, taken: set) -> tuple:
    """``(pairs, transforms)``: ``{TF1 name: TF2 name}`` for the attention blocks
    both sides have as many of, and ``{TF1 name: "reshape"}`` for the pairs whose
    shapes differ. ``*_infos``: name -> VariableInfo in creation order; names in
    ``taken`` (already paired) are left alone."""
    tf1_blocks = _parts([n for n in tf1_infos if n not in taken], _tf1_outputs)
    tf2_blocks = _parts([n for n in tf2_infos if n not in taken], _keras_outputs)
    if not tf1_blocks or len(tf1_blocks) != len(tf2_blocks):
        return {}, {}
    pairs, transforms = {}, {}
    for tf1_parts, tf2_parts in zip(tf1_blocks, tf2_blocks):
        if set(tf1_parts) != set(tf2_parts):
            continue  # a bias on one side only: not this layout
        found, reshaped = {}, {}
        for key, tf1 in tf1_parts.items():
            tf2 = tf2_parts[key]
            a, b = tf1_infos[tf1], tf2_infos[tf2]
            if a.dtype != b.dtype or a.trainable != b.trainable or \
                    int(np.prod(a.shape)) != int(np.prod(b.shape)):
                break
            found[tf1] = tf2
            if tuple(a.shape) != tuple(b.shape):
                reshaped[tf1] = "reshape"
        else:
            pairs.update(found)
            transforms.update(reshaped)
    return pairs, transforms


# Ops a projection's value passes through between its kernel and the head split.
_THROUGH = frozenset({"Identity", "ReadVariableOp", "MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3",
                      "BiasAdd", "Add", "AddV2", "Reshape", "Mul", "Cast"})
_VARIABLES = frozenset({"VariableV2", "VarHandleOp", "Variable"})


def _static(shape) -> tuple | None:
    try:
        dims = shape.as_list()
    except ValueError:  # unknown rank
        return None
    return tuple(dims)


def head_splits(graph) -> dict:
    """``{kernel name: (a, b)}`` for each 2-D variable of ``graph`` (a TF1 graph)
    whose value reaches a ``Reshape`` of ``[..., a * b]`` into ``[..., a, b]``
    (static shapes) through matmuls, bias adds and reshapes only: how the
    code splits that projection's width. The nearest such reshape counts."""
    found: dict = {}
    for op in graph.get_operations():
        if op.type != "Reshape":
            continue
        out, source = _static(op.outputs[0].shape), _static(op.inputs[0].shape)
        if not out or not source or len(out) < 3 or len(out) != len(source) + 1:
            continue
        a, b = out[-2], out[-1]
        if a is None or b is None or source[-1] != a * b or a == 1 or b == 1:
            continue
        frontier, seen = [(op.inputs[0].op, 0)], set()
        while frontier:
            node, depth = frontier.pop()
            if node.name in seen or depth > 8:
                continue
            seen.add(node.name)
            if node.type in _VARIABLES:
                shape = _static(node.outputs[0].shape) if node.type != "VarHandleOp" else \
                    tuple(node.get_attr("shape").dim[i].size for i in range(len(node.get_attr("shape").dim)))
                if shape and len(shape) == 2 and shape[-1] == a * b:
                    found.setdefault(node.name, (int(a), int(b)))
                continue
            if node.type in _THROUGH:
                frontier.extend((t.op, depth + 1) for t in node.inputs)
    return found


def split_refusals(pairs: dict, transforms: dict, tf1_infos: dict, tf2_infos: dict, splits: dict) -> list:
    """``(TF1 names, TF2 names, why)`` for each attention block :func:`attention_pairs`
    paired (``pairs``, ``transforms``) whose TF1 graph splits a query, key or value
    kernel's width as ``[..., head_size, heads]`` (``splits``: :func:`head_splits`)
    where ``MultiHeadAttention`` holds ``[heads, head_size]``."""
    blocks: dict = {}
    for tf1, tf2 in pairs.items():
        scope = tf2.rpartition("/")[0]
        blocks.setdefault(scope.rpartition("/")[0], []).append((tf1, tf2))
    refusals = []
    for members in blocks.values():
        wrong = None
        for tf1, tf2 in members:
            projection, leaf = tf2.rsplit("/", 2)[-2:]
            shape = tuple(tf2_infos[tf2].shape)
            if (projection in _PROJECTIONS and _ROLES.get(leaf) == "kernel" and tf1 in transforms
                    and tf1 in splits and len(shape) == 3 and tuple(splits[tf1]) != shape[1:]):
                wrong = (tf1, tf2, splits[tf1], shape)
                break
        if wrong is None:
            continue
        tf1, tf2, (a, b), shape = wrong
        refusals.append((tuple(t for t, _ in members), tuple(u for _, u in members),
                         f"the TF1 graph splits {tf1} {list(tf1_infos[tf1].shape)}'s width into [..., {a}, {b}] "
                         f"(its Reshape), {tf2} {list(shape)} holds [heads={shape[1]}, head_size={shape[2]}]: "
                         f"the width is split as i * {b} + head there, not head * {shape[2]} + i, so "
                         "mapping.resolve({%r: (%r, 'reshape')}) would pair other columns and no declared "
                         "transform expresses it; reorder the TF1 columns (reshape to [..., %d, %d], swap the "
                         "last two axes) or keep the TF1 dense layers" % (tf1, tf2, a, b)))
    return refusals
