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
other rules, which then report what is unmapped. The fixed weights and the
``fixed_weights`` step check the layout: a TF1 code that splits its heads
otherwise fails there.
"""

from __future__ import annotations

import numpy as np

__all__ = ["attention_pairs"]

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
