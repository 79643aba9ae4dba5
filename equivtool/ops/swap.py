"""Route TensorFlow's and tf-keras' softmax cross-entropy through equivtool's op.

``with deterministic_xent():`` makes every cross-entropy call made inside the
block, by the model code that calls TensorFlow's public functions, run on
the deterministic op:

====================================================  ==========================================
route                                                 global that is patched
====================================================  ==========================================
``tf.nn.sparse_softmax_cross_entropy_with_logits``    ``tf.nn`` / ``tf.compat.v2.nn`` attribute
``tf.compat.v1.nn`` twin                              ``tf.compat.v1.nn`` attribute
``tf.compat.v1.losses.sparse_softmax_cross_entropy``  ``tensorflow.python.ops.nn`` attribute
``tf.nn.softmax_cross_entropy_with_logits``           ``tf.nn`` / ``tf.compat.v2.nn`` attribute
``tf.compat.v1.nn.softmax_cross_entropy_with_logits``
and ``..._v2``                                        ``tf.compat.v1.nn`` attributes
``tf.compat.v1.losses.softmax_cross_entropy``         ``tensorflow.python.ops.nn`` attribute
tf-keras losses and backend with ``from_logits=True`` ``tf.compat.v2.nn`` (tf-keras' ``tf.nn``)
====================================================  ==========================================

plus the same names in ``tensorflow.python.ops.nn_ops``, which TensorFlow's
own wrappers call. Each global is replaced only if it still holds
TensorFlow's original function, and every replaced global is put back when
the block exits, whether it returns or raises. ``enable_deterministic_xent``
and ``disable_deterministic_xent`` do the same without a block (disable
undoes enable); the context manager nests and leaves an outer enable alone.

Only calls that look the function up at call time are routed: a reference
taken before the block (``f = tf.nn.sparse_softmax_cross_entropy_with_logits``)
keeps calling TensorFlow's op.
"""

from __future__ import annotations

import contextlib
import threading
from types import ModuleType
from typing import Callable, Iterator

import equivtool  # noqa: F401  (environment fix before TensorFlow)

import tensorflow as tf

from equivtool.ops import xent
from equivtool.ops._load import load_library

_lock = threading.RLock()
_applied: list[tuple[ModuleType, str, object]] | None = None


def _sparse(labels=None, logits=None, name=None):
    return xent.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits, name=name)


def _dense_v2(labels, logits, axis=-1, name=None):
    return xent.softmax_cross_entropy_with_logits(labels=labels, logits=logits, axis=axis,
                                                  name=name)


def _dense_v2_helper(labels, logits, axis=None, name=None, dim=None):
    axis = dim if axis is None and dim is not None else axis
    return _dense_v2(labels, logits, axis=-1 if axis is None else axis, name=name)


def _dense_v1(labels=None, logits=None, dim=-1, name=None, axis=None):
    # TF's v1 op keeps gradients out of the labels.
    xent._require_args("softmax_cross_entropy_with_logits", labels, logits)
    labels = tf.stop_gradient(labels, name="labels_stop_gradient")
    return _dense_v2(labels, logits, axis=dim if axis is None else axis, name=name)


def _routes() -> list[tuple[ModuleType, str, Callable, Callable]]:
    """(module, attribute, TensorFlow's original, replacement) for every route."""
    from tensorflow.python.ops import nn, nn_ops

    v1, v2, public = tf.compat.v1.nn, tf.compat.v2.nn, tf.nn
    sparse_v1 = nn_ops.sparse_softmax_cross_entropy_with_logits
    sparse_v2 = nn_ops.sparse_softmax_cross_entropy_with_logits_v2
    dense_v1 = nn_ops.softmax_cross_entropy_with_logits
    dense_v2 = nn_ops.softmax_cross_entropy_with_logits_v2
    dense_helper = nn_ops.softmax_cross_entropy_with_logits_v2_helper
    table = [
        # TensorFlow's own modules: the v1 losses call nn.<name>, nn_ops' wrappers call each other.
        (nn_ops, "sparse_softmax_cross_entropy_with_logits", sparse_v1, _sparse),
        (nn_ops, "sparse_softmax_cross_entropy_with_logits_v2", sparse_v2, _sparse),
        (nn_ops, "softmax_cross_entropy_with_logits", dense_v1, _dense_v1),
        (nn_ops, "softmax_cross_entropy_with_logits_v2", dense_v2, _dense_v2),
        (nn_ops, "softmax_cross_entropy_with_logits_v2_helper", dense_helper, _dense_v2_helper),
        (nn, "sparse_softmax_cross_entropy_with_logits", sparse_v1, _sparse),
        (nn, "sparse_softmax_cross_entropy_with_logits_v2", sparse_v2, _sparse),
        (nn, "softmax_cross_entropy_with_logits", dense_v1, _dense_v1),
        (nn, "softmax_cross_entropy_with_logits_v2", dense_v2, _dense_v2),
        (nn, "softmax_cross_entropy_with_logits_v2_helper", dense_helper, _dense_v2_helper),
        # The public API modules: tf.nn, tf.compat.v2.nn (tf-keras' tf.nn), tf.compat.v1.nn.
        (public, "sparse_softmax_cross_entropy_with_logits", sparse_v2, _sparse),
        (public, "softmax_cross_entropy_with_logits", dense_v2, _dense_v2),
        (v2, "sparse_softmax_cross_entropy_with_logits", sparse_v2, _sparse),
        (v2, "softmax_cross_entropy_with_logits", dense_v2, _dense_v2),
        (v1, "sparse_softmax_cross_entropy_with_logits", sparse_v1, _sparse),
        (v1, "softmax_cross_entropy_with_logits", dense_v1, _dense_v1),
        (v1, "softmax_cross_entropy_with_logits_v2", dense_helper, _dense_v2_helper),
    ]
    return table


def is_enabled() -> bool:
    """Whether TensorFlow's cross-entropy functions are currently routed to the op."""
    return _applied is not None


def enable_deterministic_xent() -> None:
    """Route TensorFlow's cross-entropy functions through the op until disabled.

    Loads the op library first, so a missing or stale library raises
    ``OpLibraryError`` before anything is patched. Idempotent.
    """
    global _applied
    with _lock:
        if _applied is not None:
            return
        load_library()
        applied: list[tuple[ModuleType, str, object]] = []
        try:
            for module, attr, original, replacement in _routes():
                if getattr(module, attr, None) is original:
                    setattr(module, attr, replacement)
                    applied.append((module, attr, original))
        except BaseException:
            _restore(applied)
            raise
        _applied = applied


def _restore(applied: list[tuple[ModuleType, str, object]]) -> None:
    for module, attr, original in reversed(applied):
        setattr(module, attr, original)


def disable_deterministic_xent() -> None:
    """Put TensorFlow's original functions back. A no-op when not enabled."""
    global _applied
    with _lock:
        if _applied is None:
            return
        applied, _applied = _applied, None
        _restore(applied)


@contextlib.contextmanager
def deterministic_xent() -> Iterator[None]:
    """Within the block, TensorFlow's and tf-keras' cross-entropy run on the op.

    The originals are restored on every exit path (return, exception,
    generator close). If routing was already enabled outside the block, the
    block leaves it enabled.
    """
    with _lock:
        outer = is_enabled()
        if not outer:
            enable_deterministic_xent()
    try:
        yield
    finally:
        if not outer:
            disable_deterministic_xent()
