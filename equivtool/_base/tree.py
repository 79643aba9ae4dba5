"""Nested structures of tensors and arrays, walked the way equivtool reports them.

Unlike ``tf.nest``, which sorts dict keys, these keep insertion order: a dict
of end points in forward order stays in forward order, so the first failing
leaf is where divergence begins. Namedtuples are rebuilt with their fields;
other mappings with their own type. Imports no TensorFlow (tensors are
recognised by their ``numpy()`` method), so the NumPy-only comparison can use it.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from equivtool._base.slices import SlicesArrays, slices_arrays

__all__ = ["is_namedtuple", "is_sparse", "dense_gradient", "sparse_paths", "to_numpy", "flatten_tensors",
           "pack_like", "tensor_values"]


def is_namedtuple(x: Any) -> bool:
    """A ``collections.namedtuple`` (or ``typing.NamedTuple``) instance."""
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def rebuild_mapping(original: Mapping, items: list):
    return dict(items) if type(original) is dict else type(original)(items)


def _rebuild_sequence(original, items: list):
    if is_namedtuple(original):
        return type(original)(*items)
    return type(original)(items)


def is_sparse(value: Any) -> bool:
    """A ``tf.IndexedSlices``, or the ``IndexedSlicesValue`` a session returns for one
    (recognised by type name and fields, so this module imports no TensorFlow), or
    the :class:`~equivtool._base.slices.SlicesArrays` a side captured of one."""
    if isinstance(value, SlicesArrays):
        return True
    return type(value).__name__ in ("IndexedSlices", "IndexedSlicesValue") and all(
        hasattr(value, field) for field in ("values", "indices", "dense_shape"))


def tensor_values(value):
    """``value`` as a NumPy array. An eager tensor's own buffer, read-only, when
    the buffer protocol can describe its dtype (tensors are immutable, so nothing
    needs copying: a gradient is a model's worth of values); else the copy its
    ``numpy()`` makes (bfloat16, strings, variables)."""
    if not hasattr(value, "numpy"):
        return np.asarray(value)
    try:
        view = np.asarray(memoryview(value))
    except (TypeError, ValueError, BufferError):
        return value.numpy()
    return value.numpy() if view.dtype == object or view.ndim == 0 else view  # (a scalar: NumPy's, as before)


def dense_gradient(value, shape=None) -> tuple:
    """``(dense NumPy array, was_sparse)`` for a gradient.

    The gradient of ``tf.gather``/``tf.nn.embedding_lookup`` w.r.t. the table
    is sparse: ``tf.IndexedSlices`` eagerly, ``IndexedSlicesValue`` from a
    session. Both sides are scattered into a dense array the same way (rows
    of repeated indices summed in index order), so the comparison sees only
    the values and where they go.
    """
    if not is_sparse(value):
        return tensor_values(value), False
    values, indices = tensor_values(value.values), tensor_values(value.indices)
    if value.dense_shape is not None:
        shape = tuple(int(d) for d in tensor_values(value.dense_shape))
    elif shape is None:
        raise ValueError("a sparse gradient without dense_shape needs the variable's shape")
    dense = np.zeros(tuple(int(d) for d in shape), dtype=values.dtype)
    np.add.at(dense, indices, values)
    return dense, True


def sparse_paths(structure, path: tuple = ()) -> list:
    """The paths of the sparse leaves of ``structure``, labelled the way
    :func:`equivtool.comparison.compare` names leaves (dict keys as ``str``,
    namedtuple fields, sequence positions), in insertion order."""
    if is_sparse(structure):
        return [path]
    if isinstance(structure, Mapping):
        return [p for k, v in structure.items() for p in sparse_paths(v, (*path, str(k)))]
    if isinstance(structure, (list, tuple)):
        labels = structure._fields if is_namedtuple(structure) else [str(i) for i in range(len(structure))]
        return [p for label, v in zip(labels, structure) for p in sparse_paths(v, (*path, label))]
    return []


def composite_parts(value: Any) -> Optional[dict]:
    """The component arrays of a ragged or sparse value, as a dict compared leaf by
    leaf (``None`` for anything else): ``tf.RaggedTensor`` / ``RaggedTensorValue``
    -> ``flat_values``, ``row_splits_0`` ... (outermost partition first);
    ``tf.SparseTensor`` / ``SparseTensorValue`` -> ``indices``, ``values``,
    ``dense_shape``. Both sides give the same keys, so values, row partitions,
    indices and dense shape are each compared (the names match
    :func:`equivtool.exported._sides.component_names`)."""
    name = type(value).__name__
    if name in ("RaggedTensor", "RaggedTensorValue") and hasattr(value, "nested_row_splits"):
        parts = {"flat_values": tensor_values(value.flat_values)}
        parts.update((f"row_splits_{i}", tensor_values(s)) for i, s in enumerate(value.nested_row_splits))
        return parts
    if name in ("SparseTensor", "SparseTensorValue") and all(
            hasattr(value, field) for field in ("indices", "values", "dense_shape")):
        return {"indices": tensor_values(value.indices), "values": tensor_values(value.values),
                "dense_shape": tensor_values(value.dense_shape)}
    return None


def expand_composites(structure):
    """``structure`` with each ragged or sparse value replaced by its parts
    (:func:`composite_parts`), each ``IndexedSlicesValue`` by its
    :class:`~equivtool._base.slices.SlicesArrays`, everything else left as it is
    (a session's results)."""
    if is_sparse(structure) and not isinstance(structure, SlicesArrays):
        return slices_arrays(structure)
    parts = composite_parts(structure)
    if parts is not None:
        return parts
    if isinstance(structure, Mapping):
        return rebuild_mapping(structure, [(k, expand_composites(v)) for k, v in structure.items()])
    if isinstance(structure, (list, tuple)) and not is_sparse(structure):
        return _rebuild_sequence(structure, [expand_composites(v) for v in structure])
    return structure


def to_numpy(structure, keep_slices: bool = False):
    """Tensors (eager) to NumPy, keeping dict insertion order and containers;
    sparse gradients (``tf.IndexedSlices``, ``IndexedSlicesValue``) become dense arrays
    (with ``keep_slices``, their :class:`~equivtool._base.slices.SlicesArrays`: a
    model's output, judged by the comparison); ragged and sparse tensors their
    components (:func:`composite_parts`)."""
    if is_sparse(structure):
        return slices_arrays(structure) if keep_slices else dense_gradient(structure)[0]
    parts = composite_parts(structure)
    if parts is not None:
        return parts
    if isinstance(structure, Mapping):
        return rebuild_mapping(structure, [(k, to_numpy(v, keep_slices)) for k, v in structure.items()])
    if isinstance(structure, (list, tuple)):
        return _rebuild_sequence(structure, [to_numpy(v, keep_slices) for v in structure])
    if structure is None:
        return None
    if hasattr(structure, "numpy"):
        return structure.numpy()
    return np.asarray(structure)


def flatten_tensors(structure) -> list:
    """Leaves in insertion order (``tf.nest`` would sort dict keys)."""
    if isinstance(structure, Mapping):
        return [leaf for value in structure.values() for leaf in flatten_tensors(value)]
    if isinstance(structure, (list, tuple)):
        return [leaf for value in structure for leaf in flatten_tensors(value)]
    return [structure]


def pack_like(structure, leaves: list):
    """Inverse of :func:`flatten_tensors`: ``leaves`` in ``structure``'s shape."""
    iterator = iter(leaves)

    def build(node):
        if isinstance(node, Mapping):
            return rebuild_mapping(node, [(k, build(v)) for k, v in node.items()])
        if isinstance(node, (list, tuple)):
            return _rebuild_sequence(node, [build(v) for v in node])
        return next(iterator)

    return build(structure)
