"""Deterministic softmax cross-entropy: the Python API and the gradients.

Drop-in counterparts of ``tf.nn.sparse_softmax_cross_entropy_with_logits``
and ``tf.nn.softmax_cross_entropy_with_logits`` backed by equivtool's
compiled ops (``custom_ops/``). They give bitwise identical losses and
gradients from run to run, whatever the thread count or batch split, on CPU
and GPU; the forward pass reads the logits once and allocates no B x C
buffer, the gradient reads them once more and writes dlogits once.

Behaviour matches TensorFlow's fused ops, including special values: a row
holding +inf or NaN, or only -inf, gives NaN loss and NaN gradient; a -inf
logit elsewhere has probability 0 (infinite loss when it is the label; for
dense labels a -inf logit makes the loss NaN, 0 * inf, exactly as TF); huge
finite logits (1e32 in float32, 1e300 in float64) give TF's finite values.
Labels outside [0, C) raise ``InvalidArgumentError`` on the CPU (naming the
batch index, the value and C) and give NaN rows on the GPU. Dense labels
broadcast against the logits (``[C]``, ``[1, C]`` or ``[B, 1]`` against
``[B, C]``) and zero classes give a zero loss, as with TF.

The dense gradient is TF's ``softmax - labels`` by default: it assumes each
label row sums to 1 and is not the derivative of the loss otherwise.
``exact_gradient=True`` gives the true derivative ``sum(labels) * softmax -
labels`` instead; both agree when the label rows are distributions.

Gradients: first order comes from the gradient kernels; second order is a
composite of TensorFlow ops (``tf.test.compute_gradient`` checks both).

The training step (sparse labels, CPU): when a gradient tape records the
logits (eager, or a ``tf.function`` traced around a tape, as Keras' ``fit``
is) and TensorFlow sees no GPU, the loss comes from a fused op that computes
one exponential per element and, while it has them, writes the gradient for
the upstream gradient it guesses (one value for every row: a mean's 1/B, or
what this op's gradient saw last time); the gradient op hands those rows on
when every row's upstream gradient is the guess, so a training step touches
B x C memory once, and otherwise scales or recomputes them. Its
loss and gradient are bit for bit those of the separate path (loss-only
forward, then a gradient kernel that recomputes the exponentials), which
serves everything else: no tape (inference, ``tf.stop_gradient``, TF1
``tf.gradients``), GPUs, dense labels. The loss-only path allocates nothing of
size B x C.

XLA: the compiled op has no XLA lowering, so inside code that XLA compiles
(``tf.function(jit_compile=True)``, Keras ``compile(jit_compile=True)``) both
functions route to TensorFlow's own fused op instead (``SparseSoftmaxCross
EntropyWithLogits`` / ``SoftmaxCrossEntropyWithLogits``, evaluated in float32
for 16-bit logits, as ``tf.nn`` does), which XLA lowers to its own row
reductions; ``exact_gradient=True`` routes to ``-sum(labels *
log_softmax(logits))``, whose derivative is the exact one. Chosen over an XLA
lowering of our own because XLA fuses TensorFlow's op with its neighbours
and the numbers are exactly ``tf.nn``'s under XLA. Determinism there is
XLA's: the lowering is element-wise work and row reductions. On the CPU a
compiled reduction runs in one fixed order, so results are bitwise
reproducible run to run (tested); on the GPU it is deterministic by
construction, since XLA names only scatter, select-and-scatter, GEMMs,
convolutions and attention as non-deterministic, and the lowering has none
(not run on a GPU here). Labels out of range give NaN rows under XLA (XLA
cannot raise inside a kernel), as with ``tf.nn`` under XLA.
"""

from __future__ import annotations


import numpy as np
import tensorflow as tf
from equivtool._platform.tf_internals import ops as _tf_ops
from equivtool._platform.tf_internals import record as _tf_record

from equivtool.ops._load import load_library

SPARSE_OP = "EquivtoolSparseXent"
SPARSE_GRAD_OP = "EquivtoolSparseXentGrad"
DENSE_OP = "EquivtoolXent"
DENSE_GRAD_OP = "EquivtoolXentGrad"
SPARSE_FUSED_OP = "EquivtoolSparseXentFused"
SPARSE_SCALE_OP = "EquivtoolSparseXentScale"
SPARSE_STEP_OP = "EquivtoolSparseXentStep"
SPARSE_STEP_GRAD_OP = "EquivtoolSparseXentStepGrad"

_FLOAT_TYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
_LABEL_TYPES = (tf.int32, tf.int64)


def _acc_dtype(dtype: tf.DType) -> tf.DType:
    return tf.float64 if dtype == tf.float64 else tf.float32


def _check_logits_dtype(logits: tf.Tensor, fn: str) -> None:
    if logits.dtype not in _FLOAT_TYPES:
        raise TypeError(
            f"{fn}: logits must be float16, bfloat16, float32 or float64, "
            f"got {logits.dtype.name}.")


def _require_args(fn: str, labels, logits) -> None:
    if labels is None or logits is None:
        raise ValueError(f"{fn} needs both `labels` and `logits` (pass them by name); "
                         f"got labels={labels!r} and logits={logits!r}.")


def _in_xla_context() -> bool:
    """Whether the graph being built is compiled by XLA (jit_compile=True)."""
    if tf.executing_eagerly():
        return False
    from equivtool._platform.tf_internals import control_flow_util

    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def _fused_step(logits: tf.Tensor) -> bool:
    """Whether the fused training-step op serves this call: a gradient tape
    records the logits (so their gradient is about to be asked for) and
    TensorFlow sees no GPU (the fused kernels are CPU only)."""
    return (_tf_record.should_record_backprop([logits])
            and not tf.config.list_logical_devices("GPU"))


def _sparse_rows_fused(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """Loss of [B, C] logits and [B] labels by the one-pass step op: it writes
    the gradient for the upstream gradient it guesses (a mean's 1/B, or what
    this op's gradient saw last), and its gradient op hands that on when the
    guess holds in every row, else scales or recomputes it (same bits)."""
    lib = load_library()
    if not hasattr(lib, "equivtool_sparse_xent_step"):
        return _sparse_rows_fused_pair(lib, logits, labels)  # a library built before the step op
    acc = _acc_dtype(logits.dtype)

    @tf.custom_gradient
    @tf.autograph.experimental.do_not_convert  # plain op calls; nothing to convert
    def fused(x):
        loss, dlogits_guess, guess, site, shift, log_norm = lib.equivtool_sparse_xent_step(
            logits=x, labels=labels, Tacc=acc)

        def grad(grad_loss):
            return lib.equivtool_sparse_xent_step_grad(
                dlogits_guess=dlogits_guess, guess=guess, site=site, grad_loss=grad_loss,
                logits=x, labels=labels, shift=shift, log_norm=log_norm)
        return loss, grad

    return fused(logits)


def _sparse_rows_fused_pair(lib, logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """The fused path of a library without the one-pass step op: the fused op
    writes softmax - onehot, its gradient scales the rows (a second B x C
    pass; the same bits)."""
    acc = _acc_dtype(logits.dtype)

    @tf.custom_gradient
    @tf.autograph.experimental.do_not_convert  # plain op calls; nothing to convert
    def fused(x):
        loss, backprop = lib.equivtool_sparse_xent_fused(logits=x, labels=labels, Tacc=acc)

        def grad(grad_loss):
            # x and labels ride along for the second-order gradient only
            return lib.equivtool_sparse_xent_scale(backprop=backprop, grad_loss=grad_loss,
                                                   logits=x, labels=labels)
        return loss, grad

    return fused(logits)


def _sparse_rows(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """Loss of [B, C] logits and [B] labels: equivtool's op (fused with the
    gradient in a CPU training step), or under XLA TensorFlow's fused op (see
    the module docstring)."""
    acc = _acc_dtype(logits.dtype)
    if _in_xla_context():
        loss, _ = tf.raw_ops.SparseSoftmaxCrossEntropyWithLogits(
            features=tf.cast(logits, acc), labels=labels)
        return tf.cast(loss, logits.dtype)
    if _fused_step(logits):
        return _sparse_rows_fused(logits, labels)
    loss, _, _ = load_library().equivtool_sparse_xent(logits=logits, labels=labels, Tacc=acc)
    return loss


def _dense_rows(logits: tf.Tensor, labels: tf.Tensor, exact_gradient: bool) -> tf.Tensor:
    """Loss of [B, C] logits and labels, as _sparse_rows."""
    acc = _acc_dtype(logits.dtype)
    if _in_xla_context():
        x, y = tf.cast(logits, acc), tf.cast(labels, acc)
        if exact_gradient:
            loss = -tf.reduce_sum(y * tf.nn.log_softmax(x, axis=-1), axis=-1)
        else:
            loss, _ = tf.raw_ops.SoftmaxCrossEntropyWithLogits(features=x, labels=y)
        return tf.cast(loss, logits.dtype)
    loss, _, _ = load_library().equivtool_xent(logits=logits, labels=labels, Tacc=acc,
                                               exact_gradient=exact_gradient)
    return loss


def _flatten(t: tf.Tensor, classes) -> tf.Tensor:
    """[..., C] -> [N, C]; N is computed, not -1, so that C == 0 reshapes."""
    outer = tf.reduce_prod(tf.shape(t)[:-1])
    return tf.reshape(t, tf.stack([outer, classes]))


# ---------------------------------------------------------------------------
# Sparse labels.

# The public functions below are plain op calls with Python branches on static
# shapes and dtypes only: AutoGraph, which converts a caller's code inside a
# tf.function, is kept out of them (as it is out of tf.nn's own). Converted,
# every trace would re-convert them, and the first call in a process, which
# loads the library, warned "AutoGraph could not transform <function isfile>".
@tf.autograph.experimental.do_not_convert
def sparse_softmax_cross_entropy_with_logits(labels=None, logits=None, name=None):
    """Per-example ``logsumexp(logits) - logits[label]``, deterministic.

    Args:
      labels: int32 or int64 class indices, shape ``logits.shape[:-1]``.
      logits: float16, bfloat16, float32 or float64, rank >= 1, classes last.
      name: optional name scope.

    Returns:
      The loss, shaped like ``labels``, in the dtype of ``logits``.

    Raises:
      TypeError: labels are not integers, or logits are not floating point.
      ValueError: logits are a scalar, or the ranks or static shapes of labels
        and logits disagree (shapes known only at run time are checked then).
    """
    fn = "sparse_softmax_cross_entropy_with_logits"
    _require_args(fn, labels, logits)
    with tf.name_scope(name or "equivtool_sparse_xent"):
        logits = tf.convert_to_tensor(logits, name="logits")
        labels = tf.convert_to_tensor(labels, name="labels")
        _check_logits_dtype(logits, fn)
        if labels.dtype not in _LABEL_TYPES:
            raise TypeError(
                f"{fn}: labels must be int32 or int64 class indices, got "
                f"{labels.dtype.name}. For probability labels use "
                "softmax_cross_entropy_with_logits.")
        x_shape, y_shape = logits.shape, labels.shape
        # The messages keep TensorFlow's wording (its tests match on it).
        if x_shape.rank == 0:
            raise ValueError(f"{fn}: `logits` cannot be a scalar (need rank >= 1, classes "
                             f"last); got logits.shape={x_shape}.")
        if x_shape.rank is not None and y_shape.rank is not None \
                and y_shape.rank != x_shape.rank - 1:
            raise ValueError(
                f"{fn}: `labels.shape.rank` must equal `logits.shape.rank - 1`; got "
                f"labels.shape={y_shape} (rank {y_shape.rank}) and "
                f"logits.shape={x_shape} (rank {x_shape.rank}).")
        static = (x_shape.rank is not None and y_shape.is_fully_defined()
                  and x_shape[:-1].is_fully_defined())
        if static and y_shape != x_shape[:-1]:
            raise ValueError(
                f"{fn}: `labels.shape` must equal `logits.shape` except for the last "
                f"dimension; got labels.shape={y_shape} and logits.shape={x_shape}.")
        if x_shape.rank == 2:
            return _sparse_rows(logits, labels)
        checks = [] if static else [tf.debugging.assert_equal(
            tf.shape(labels, out_type=tf.int64), tf.shape(logits, out_type=tf.int64)[:-1],
            message=f"{fn}: labels.shape must equal logits.shape without its last dimension")]
        with tf.control_dependencies(checks):
            flat_logits = _flatten(logits, tf.shape(logits)[-1])
            flat_labels = tf.reshape(labels, [-1])
        loss = tf.reshape(_sparse_rows(flat_logits, flat_labels), tf.shape(labels))
        loss.set_shape(y_shape)
        return loss


def _probabilities(logits, shift, log_norm):
    """softmax(logits) in the accumulation dtype, from the forward statistics."""
    x = tf.cast(logits, shift.dtype)
    return tf.exp((x - shift[:, None]) - log_norm[:, None])


@_tf_ops.RegisterGradient(SPARSE_OP)
def _sparse_xent_grad(op, grad_loss, *unused_stat_grads):
    # shift and log_norm are internal statistics that the Python API never
    # returns; their incoming gradients are zero and are ignored.
    if grad_loss is None:
        return None, None
    logits, labels = op.inputs
    _, shift, log_norm = op.outputs
    dlogits = load_library().equivtool_sparse_xent_grad(
        logits=logits, labels=labels, shift=shift, log_norm=log_norm, grad_loss=grad_loss)
    return dlogits, None


@_tf_ops.RegisterGradient(SPARSE_GRAD_OP)
def _sparse_xent_grad_grad(op, grad_dlogits):
    """Second order: dlogits = g * (p - onehot) with p = softmax(logits).

    The statistics are functions of logits, so the full derivative goes to
    logits (through the softmax Jacobian) and none to shift and log_norm.
    """
    logits, labels, shift, log_norm, grad_loss = op.inputs
    return _sparse_grad_grad(logits, labels, shift, log_norm, grad_loss, grad_dlogits)


@_tf_ops.RegisterGradient(SPARSE_STEP_GRAD_OP)
def _sparse_xent_step_grad_grad(op, grad_dlogits):
    """Second order of the one-pass step: the same derivative as
    SPARSE_GRAD_OP's, from the step's logits and statistics (its guessed
    buffer may hold dlogits for another upstream gradient: never read here)."""
    _, _, _, grad_loss, logits, labels, shift, log_norm = op.inputs
    d_logits, _, _, _, d_grad_loss = _sparse_grad_grad(logits, labels, shift, log_norm,
                                                       grad_loss, grad_dlogits)
    return None, None, None, d_grad_loss, d_logits, None, None, None


def _sparse_grad_grad(logits, labels, shift, log_norm, grad_loss, grad_dlogits):
    """SPARSE_GRAD_OP's input gradients (logits, labels, shift, log_norm,
    grad_loss) for upstream grad_dlogits."""
    p = _probabilities(logits, shift, log_norm)
    onehot = tf.one_hot(labels, tf.shape(logits)[1], dtype=p.dtype)
    d_logits, d_grad_loss = _sparse_second_order(p, p - onehot, grad_dlogits, grad_loss)
    return (tf.cast(d_logits, logits.dtype), None, None, None,
            tf.cast(d_grad_loss, grad_loss.dtype))


def _sparse_second_order(p, backprop, grad_dlogits, grad_loss):
    """(d logits, d grad_loss) of dlogits = g * backprop, backprop = p - onehot,
    p = softmax(logits), for upstream grad_dlogits; in p's dtype."""
    v = tf.cast(grad_dlogits, p.dtype)
    g = tf.cast(grad_loss, p.dtype)[:, None]
    pv = p * v
    d_logits = g * (pv - p * tf.reduce_sum(pv, axis=1, keepdims=True))
    return d_logits, tf.reduce_sum(v * backprop, axis=1)


@_tf_ops.RegisterGradient(SPARSE_SCALE_OP)
def _sparse_xent_scale_grad(op, grad_dlogits):
    """Second order of the fused path: dlogits = g * backprop, where backprop
    = softmax(logits) - onehot(labels) came from the fused op (whose own
    gradient is the scale op); the derivative goes to logits, as for
    SPARSE_GRAD_OP, and to grad_loss."""
    backprop, grad_loss, logits, labels = op.inputs
    p = backprop + tf.one_hot(labels, tf.shape(logits)[1], dtype=backprop.dtype)
    d_logits, d_grad_loss = _sparse_second_order(p, backprop, grad_dlogits, grad_loss)
    return (None, tf.cast(d_grad_loss, grad_loss.dtype), tf.cast(d_logits, logits.dtype),
            None)


# ---------------------------------------------------------------------------
# Dense labels.

def _move_axis_last(t: tf.Tensor, axis: int) -> tf.Tensor:
    rank = tf.rank(t)
    axis = tf.math.floormod(axis, rank)
    perm = tf.concat([tf.range(axis), tf.range(axis + 1, rank), [axis]], 0)
    return tf.transpose(t, perm)


def _broadcast_labels(labels: tf.Tensor, logits: tf.Tensor, fn: str) -> tf.Tensor:
    """labels broadcast to the logits' shape (NumPy rules), as TF's op does.

    TF accepts label rows ``[C]`` or ``[1, C]`` and label columns ``[B, 1]``
    against ``[B, C]`` logits; the logits are never broadcast (TF's reshape of
    the loss fails then). Raises ValueError when the static shapes say no.
    """
    x_shape, y_shape = logits.shape, labels.shape
    if x_shape.rank is not None and y_shape.rank is not None:
        try:
            joint = tf.broadcast_static_shape(y_shape, x_shape)
        except ValueError:
            joint = None
        widened = joint is None or joint.rank != x_shape.rank or any(
            j is not None and x is not None and j != x
            for j, x in zip(joint.as_list(), x_shape.as_list()))
        if widened:
            raise ValueError(
                f"{fn}: labels must have the shape of logits or broadcast to it (e.g. "
                f"[C] or [1, C] label rows, [B, 1] label columns); got "
                f"labels.shape={y_shape} and logits.shape={x_shape}.")
        if y_shape.is_fully_defined() and x_shape.is_fully_defined():
            return labels if y_shape == x_shape else tf.broadcast_to(labels, x_shape)
    return tf.broadcast_to(labels, tf.shape(logits))


@tf.autograph.experimental.do_not_convert  # as sparse_softmax_cross_entropy_with_logits
def softmax_cross_entropy_with_logits(labels=None, logits=None, axis=-1, name=None, *,
                                      exact_gradient: bool = False):
    """Per-example ``sum(labels * (logsumexp(logits) - logits))``, deterministic.

    Args:
      labels: class weights (usually a distribution per row), the shape of
        ``logits`` or broadcastable to it (``[C]``, ``[1, C]``, ``[B, 1]``);
        cast to the logits' dtype. Gradients flow into them (use
        ``tf.stop_gradient`` to prevent that), as with ``tf.nn``'s v2 op.
      logits: float16, bfloat16, float32 or float64, rank >= 1.
      axis: the class dimension (default: last).
      name: optional name scope.
      exact_gradient: False (default) gives TensorFlow's gradient with respect
        to the logits, ``softmax - labels``, which assumes each label row sums
        to 1. True gives ``sum(labels) * softmax - labels``, the derivative of
        the returned loss for any labels. Not part of ``tf.nn``'s signature.

    Returns:
      The loss, shaped like ``logits`` without ``axis``, in the logits' dtype.
    """
    fn = "softmax_cross_entropy_with_logits"
    _require_args(fn, labels, logits)
    if not isinstance(exact_gradient, bool):
        raise TypeError(f"{fn}: exact_gradient must be True or False, got {exact_gradient!r}.")
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{fn}: axis must be an int (the class dimension, e.g. -1), got {axis!r}.")
    axis = int(axis)
    with tf.name_scope(name or "equivtool_xent"):
        logits = tf.convert_to_tensor(logits, name="logits")
        _check_logits_dtype(logits, fn)
        labels = tf.convert_to_tensor(labels, name="labels")
        if labels.dtype != logits.dtype:
            if not (labels.dtype.is_floating or labels.dtype.is_integer or labels.dtype.is_bool):
                raise TypeError(f"{fn}: labels must be numeric, got {labels.dtype.name}.")
            labels = tf.cast(labels, logits.dtype)
        x_shape = logits.shape
        if x_shape.rank == 0:
            raise ValueError(f"{fn}: logits cannot be a scalar; got shape {x_shape}.")
        if x_shape.rank is not None and not -x_shape.rank <= axis < x_shape.rank:
            raise ValueError(f"{fn}: axis must be in [{-x_shape.rank}, {x_shape.rank}) for logits of "
                             f"rank {x_shape.rank}, got {axis}.")
        labels = _broadcast_labels(labels, logits, fn)
        static_shape = None
        if x_shape.rank is not None:
            dims = x_shape.as_list()
            del dims[axis]
            static_shape = tf.TensorShape(dims)
        if axis != -1 and axis != (x_shape.rank or 0) - 1:
            logits = _move_axis_last(logits, axis)
            labels = _move_axis_last(labels, axis)
        if logits.shape.rank == 2:
            loss = _dense_rows(logits, labels, exact_gradient)
        else:
            classes = tf.shape(logits)[-1]
            loss = _dense_rows(_flatten(logits, classes), _flatten(labels, classes),
                               exact_gradient)
            loss = tf.reshape(loss, tf.shape(logits)[:-1])
        if static_shape is not None:
            loss.set_shape(static_shape)
        return loss


@_tf_ops.RegisterGradient(DENSE_OP)
def _dense_xent_grad(op, grad_loss, *unused_stat_grads):
    if grad_loss is None:
        return None, None
    logits, labels = op.inputs
    _, shift, log_norm = op.outputs
    dlogits = load_library().equivtool_xent_grad(
        logits=logits, labels=labels, shift=shift, log_norm=log_norm, grad_loss=grad_loss,
        exact_gradient=op.get_attr("exact_gradient"))
    skip = getattr(op, "skip_input_indices", None) or ()
    if 1 in skip:  # eager: labels need no gradient
        return dlogits, None
    # d loss / d labels_j = logsumexp - logits_j = -(log softmax)_j
    acc = shift.dtype
    neg_log_p = (shift[:, None] + log_norm[:, None]) - tf.cast(logits, acc)
    dlabels = neg_log_p * tf.cast(grad_loss, acc)[:, None]
    return dlogits, tf.cast(dlabels, labels.dtype)


@_tf_ops.RegisterGradient(DENSE_GRAD_OP)
def _dense_xent_grad_grad(op, grad_dlogits):
    """Second order of dlogits = g * (s * p - y), p = softmax(logits), where s
    is sum(y) with exact_gradient and 1 (TensorFlow's gradient) without."""
    logits, labels, shift, log_norm, grad_loss = op.inputs
    exact = op.get_attr("exact_gradient")
    acc = shift.dtype
    p = _probabilities(logits, shift, log_norm)
    y = tf.cast(labels, acc)
    v = tf.cast(grad_dlogits, acc)
    g = tf.cast(grad_loss, acc)[:, None]
    ysum = tf.reduce_sum(y, axis=1, keepdims=True) if exact else tf.ones_like(g)
    pv = p * v
    spv = tf.reduce_sum(pv, axis=1, keepdims=True)
    d_logits = g * ysum * (pv - p * spv)
    d_labels = g * (spv - v) if exact else -g * v
    d_grad_loss = tf.reduce_sum(v * (ysum * p - y), axis=1)
    return (tf.cast(d_logits, logits.dtype), tf.cast(d_labels, labels.dtype), None, None,
            tf.cast(d_grad_loss, grad_loss.dtype))
