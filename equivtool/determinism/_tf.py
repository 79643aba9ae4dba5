"""The TensorFlow the determinism audit needs, as small functions.

Every private symbol comes from :mod:`equivtool._platform.tf_internals` (the one file
a TensorFlow upgrade has to check); this module only gives the audit the
few operations it performs on them.
"""

from __future__ import annotations

from typing import Any, Optional

from equivtool._platform import tf_internals as _tfi
from equivtool._platform.tf_internals import BaseSession, Trackable, is_op_determinism_enabled  # noqa: F401


def executing_eagerly() -> bool:
    return _tfi.context.executing_eagerly()


def add_op_callback(callback) -> None:
    _tfi.op_callbacks.add_op_callback(callback)


def remove_op_callback(callback) -> None:
    _tfi.op_callbacks.remove_op_callback(callback)


def global_seed_state() -> tuple[Optional[int], Any]:
    """TensorFlow's global seed and its op-seed counter's random state."""
    rng = _tfi.eager_rng()
    return _tfi.eager_global_seed(), (rng.getstate() if rng is not None else None)


def set_global_seed_state(seed: Optional[int], rng_state: Any) -> None:
    """Put back what :func:`global_seed_state` returned (also clears the kernel cache)."""
    _tfi.context.set_global_seed(seed)
    rng = _tfi.eager_rng()
    if rng is not None and rng_state is not None:
        rng.setstate(rng_state)


def has_function(name: str) -> bool:
    """Whether ``name`` is a function registered in the eager context."""
    try:
        return bool(_tfi.context.context().has_function(name))
    except Exception:  # noqa: BLE001
        return False


def get_function_def(name: str):
    """The FunctionDef registered in the eager context under ``name``, or None."""
    try:
        return _tfi.context.context().get_function_def(name)
    except Exception:  # noqa: BLE001 - not registered in this context
        return None


def dataset_graph_nodes(dataset) -> list:
    """The NodeDefs of the graph a ``tf.data.Dataset`` was built from."""
    serialized = _tfi.serialized_dataset_graph(dataset)
    graph = _tfi.GraphDef()
    graph.ParseFromString(serialized.numpy() if hasattr(serialized, "numpy") else serialized)
    return list(graph.node)


def iterator_dataset(iterator) -> Any:
    """The dataset a ``tf.data.Iterator`` iterates, or None when it does not say."""
    return _tfi.iterator_dataset(iterator)
