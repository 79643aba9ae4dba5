"""Every private TensorFlow symbol the determinism audit uses, in one place.

A TensorFlow upgrade that moves one of these breaks this module only; the
rest of the package calls the small functions below.
"""

from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.python.client import session as _session_lib
from tensorflow.python.data.ops import options as _data_options
from tensorflow.python.eager import context as _context
from tensorflow.python.framework import config as _config
from tensorflow.python.framework import op_callbacks as _op_callbacks

BaseSession = _session_lib.BaseSession
Trackable = tf.__internal__.tracking.Trackable

executing_eagerly = _context.executing_eagerly
is_op_determinism_enabled = _config.is_op_determinism_enabled
add_op_callback = _op_callbacks.add_op_callback
remove_op_callback = _op_callbacks.remove_op_callback


def global_seed_state() -> tuple[Optional[int], Any]:
    """TensorFlow's global seed and its op-seed counter's random state."""
    ctx = _context.context()
    rng = getattr(ctx, "_rng", None)
    return ctx._seed, (rng.getstate() if rng is not None else None)


def set_global_seed_state(seed: Optional[int], rng_state: Any) -> None:
    """Put back what :func:`global_seed_state` returned (also clears the kernel cache)."""
    _context.set_global_seed(seed)
    rng = getattr(_context.context(), "_rng", None)
    if rng is not None and rng_state is not None:
        rng.setstate(rng_state)


def has_function(name: str) -> bool:
    """Whether ``name`` is a function registered in the eager context."""
    try:
        return bool(_context.context().has_function(name))
    except Exception:  # noqa: BLE001
        return False


def get_function_def(name: str):
    """The FunctionDef registered in the eager context under ``name``, or None."""
    try:
        return _context.context().get_function_def(name)
    except Exception:  # noqa: BLE001 - not registered in this context
        return None


def dataset_graph_nodes(dataset) -> list:
    """The NodeDefs of the graph a ``tf.data.Dataset`` was built from."""
    serialized = dataset._as_serialized_graph(
        external_state_policy=_data_options.ExternalStatePolicy.IGNORE)
    graph = graph_pb2.GraphDef()
    graph.ParseFromString(serialized.numpy() if hasattr(serialized, "numpy") else serialized)
    return list(graph.node)


def iterator_dataset(iterator) -> Any:
    """The dataset a ``tf.data.Iterator`` iterates, or None when it does not say."""
    return getattr(iterator, "_dataset", None)
