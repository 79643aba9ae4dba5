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
the last block exits, whether it returns or raises.

The patch is process-wide: it changes module attributes, so while any block
is open, every thread's calls are routed, not only the calls of the thread
that opened it. Open blocks are counted: blocks may nest, overlap across
threads and exit in any order (thread A enters, B enters, A exits: B's block
is still routed); the originals come back when the last one exits.
``enable_deterministic_xent`` and ``disable_deterministic_xent`` do the same
without a block: ``disable`` undoes ``enable`` but leaves open blocks routed.

Only calls that look the function up at call time are routed:

- a reference taken before the block
  (``f = tf.nn.sparse_softmax_cross_entropy_with_logits``) keeps calling
  TensorFlow's op;
- a ``tf.function`` traced before the block (and a Keras model whose ``fit``,
  ``evaluate`` or ``predict`` ran before it) keeps the graph it traced, with
  TensorFlow's op. Entering a block warns (:class:`StaleTraceWarning`) when
  functions registered with TensorFlow's eager context already hold
  TensorFlow's cross-entropy op. Pass Keras models to the block,
  ``deterministic_xent(model)``, to have their train/test/predict functions
  re-traced inside it (and again after it); re-create other tf.functions;
- conversely, a ``tf.function`` traced inside the block keeps equivtool's op
  after the block exits.

Inside XLA-compiled code (``tf.function(jit_compile=True)``, Keras
``compile(jit_compile=True)``) the compiled op cannot run, so the functions
route to a composite that XLA compiles; see :mod:`equivtool.ops.xent`.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from types import ModuleType
from typing import Callable, Iterator


import tensorflow as tf

from equivtool.ops import xent
from equivtool.ops._load import load_library


# The routes, like the functions they call and tf.nn's own, are kept out of
# AutoGraph (see xent.sparse_softmax_cross_entropy_with_logits).
@tf.autograph.experimental.do_not_convert
def _sparse(labels=None, logits=None, name=None):
    return xent.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits, name=name)


@tf.autograph.experimental.do_not_convert
def _dense_v2(labels, logits, axis=-1, name=None):
    return xent.softmax_cross_entropy_with_logits(labels=labels, logits=logits, axis=axis,
                                                  name=name)


@tf.autograph.experimental.do_not_convert
def _dense_v2_helper(labels, logits, axis=None, name=None, dim=None):
    axis = dim if axis is None and dim is not None else axis
    return _dense_v2(labels, logits, axis=-1 if axis is None else axis, name=name)


@tf.autograph.experimental.do_not_convert
def _dense_v1(labels=None, logits=None, dim=-1, name=None, axis=None):
    # TF's v1 op keeps gradients out of the labels.
    xent._require_args("softmax_cross_entropy_with_logits", labels, logits)
    labels = tf.stop_gradient(labels, name="labels_stop_gradient")
    return _dense_v2(labels, logits, axis=dim if axis is None else axis, name=name)


def _routes() -> list[tuple[ModuleType, str, Callable, Callable]]:
    """(module, attribute, TensorFlow's original, replacement) for every route."""
    from equivtool._platform.tf_internals import nn, nn_ops

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


class StaleTraceWarning(UserWarning):
    """A deterministic_xent() block opened while traced functions already
    hold TensorFlow's cross-entropy op; those keep it inside the block."""


# TensorFlow's fused ops, which the routed functions would have added.
_TF_XENT_OPS = frozenset({"SparseSoftmaxCrossEntropyWithLogits",
                          "SoftmaxCrossEntropyWithLogits"})

_lock = threading.RLock()
_applied: list[tuple[ModuleType, str, object]] | None = None
_open_blocks = 0          # deterministic_xent() blocks entered and not yet exited
_enabled_by_call = False  # enable_deterministic_xent() without disable
_holds_tf_op: dict[str, bool] = {}  # function name -> its FunctionDef has TF's op
_scan_lock = threading.Lock()  # guards _holds_tf_op


def is_enabled() -> bool:
    """Whether TensorFlow's cross-entropy functions are currently routed to the op."""
    return _applied is not None


def traced_functions_holding_tf_xent() -> list[str]:
    """Names of the functions registered with TensorFlow's eager context whose
    graphs hold TensorFlow's cross-entropy op (``tf.function`` traces, Keras
    train/test/predict functions). Each function is inspected once."""
    from equivtool._platform.tf_internals import context

    ctx = context.context()
    with _scan_lock:
        names = ctx.list_function_names()
        # "__wrapped__<Op>_device_..." functions run single eager ops, not user traces.
        names = {name for name in names if not name.startswith("__wrapped__")}
        for name in set(_holds_tf_op) - names:  # forget functions TF has released
            del _holds_tf_op[name]
        for name in names - set(_holds_tf_op):
            try:
                fdef = ctx.get_function_def(name)
            except Exception:  # released between the listing and the look-up
                continue
            _holds_tf_op[name] = any(node.op in _TF_XENT_OPS for node in fdef.node_def)
        return sorted(name for name in names if _holds_tf_op.get(name))


def _warn_about_stale_traces(released: set[str]) -> None:
    """Warn about traced functions holding TF's op, except ``released`` ones
    (the functions of the models just reset, which TF may keep registered)."""
    stale = [name for name in traced_functions_holding_tf_xent() if name not in released]
    if not stale:
        return
    shown = ", ".join(stale[:3]) + (f" and {len(stale) - 3} more" if len(stale) > 3 else "")
    warnings.warn(
        f"deterministic_xent(): {len(stale)} function(s) traced before this block already "
        f"hold TensorFlow's cross-entropy op and keep it inside the block ({shown}). "
        "Pass Keras models to the block, `deterministic_xent(model)`, to re-trace their "
        "train/test/predict functions, and re-create other tf.functions inside it.",
        StaleTraceWarning, stacklevel=4)


def _apply() -> None:
    """Patch every route (caller holds _lock). Loads the library first, so a
    missing or stale library raises OpLibraryError before anything is patched."""
    global _applied
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


def _release() -> None:
    """Put the originals back if nothing holds the routing (caller holds _lock)."""
    global _applied
    if _applied is None or _open_blocks > 0 or _enabled_by_call:
        return
    applied, _applied = _applied, None
    _restore(applied)


def enable_deterministic_xent() -> None:
    """Route TensorFlow's cross-entropy functions through the op until disabled.

    Loads the op library first, so a missing or stale library raises
    ``OpLibraryError`` before anything is patched. Idempotent.
    """
    global _enabled_by_call
    with _lock:
        _apply()
        _enabled_by_call = True


def disable_deterministic_xent() -> None:
    """Undo :func:`enable_deterministic_xent`. Open ``deterministic_xent()``
    blocks stay routed until they exit. A no-op when not enabled."""
    global _enabled_by_call
    with _lock:
        _enabled_by_call = False
        _release()


def _reset_keras_functions(models) -> set[str]:
    """Drop the models' compiled train/test/predict functions (Keras re-traces
    them on the next fit/evaluate/predict); returns the names of the traced
    functions they held."""
    released: set[str] = set()
    for model in models:
        for attr in ("train_function", "test_function", "predict_function"):
            fn = getattr(model, attr, None)
            list_traces = getattr(fn, "_list_all_concrete_functions", None)
            if callable(list_traces):
                released.update(tf.compat.as_str(cf.name) for cf in list_traces())
        reset = getattr(model, "_reset_compile_cache", None)
        if callable(reset):
            reset()
        else:
            for attr in ("train_function", "test_function", "predict_function"):
                if hasattr(model, attr):
                    setattr(model, attr, None)
    return released


def _check_models(models) -> None:
    for i, model in enumerate(models):
        if not any(hasattr(model, attr) for attr in ("train_function", "predict_function")):
            raise TypeError(
                f"deterministic_xent(): argument {i} must be a Keras model (an object with "
                f"train_function / test_function / predict_function), got "
                f"{type(model).__name__}.")


@contextlib.contextmanager
def deterministic_xent(*models) -> Iterator[None]:
    """Within the block, TensorFlow's and tf-keras' cross-entropy run on the op.

    Args:
      *models: Keras models whose compiled train/test/predict functions are
        reset on entry and on exit, so that ``fit``, ``evaluate`` and
        ``predict`` inside the block trace with equivtool's op and those after
        it trace with TensorFlow's again.

    The patch is process-wide and counted (see the module docstring). The
    originals are restored when the last open block exits, on every exit path
    (return, exception, generator close, another thread). Entering warns with
    :class:`StaleTraceWarning` when functions traced earlier already hold
    TensorFlow's op.
    """
    global _open_blocks
    _check_models(models)
    with _lock:
        was_enabled = is_enabled()
        _apply()
        _open_blocks += 1
    try:
        released = _reset_keras_functions(models)
        if not was_enabled:
            _warn_about_stale_traces(released)
        yield
    finally:
        with _lock:
            _open_blocks -= 1
            _release()
        _reset_keras_functions(models)
