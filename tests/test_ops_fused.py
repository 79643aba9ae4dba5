"""The sparse op's fused training-step path on the CPU (issue 38).

Under a gradient tape the loss comes from EquivtoolSparseXentFused, which
writes softmax - onehot while it has the exponentials, and the gradient from
EquivtoolSparseXentScale; without a tape from the loss-only op, which must
hold no B x C buffer. The two paths must give the same bits: a result may not
depend on whether the caller's tape happened to be open while the loss was
built (eager tape and tf.function: fused; TF1 tf.gradients: separate).
"""

import equivtool  # noqa: F401  (must precede TensorFlow)

import numpy as np
import pytest
import tensorflow as tf

from equivtool import ops
from equivtool.ops import xent
from equivtool.ops._cpu_path import cpu_path, path_state
from equivtool.ops._load import load_library

FLOATS = [tf.float16, tf.bfloat16, tf.float32, tf.float64]
B, C = 48, 1000


def _bits(a):
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _case(dtype, shape, seed=0, label_dtype=tf.int64):
    rng = np.random.default_rng(seed)
    x = tf.cast(rng.standard_normal(shape) * 4, dtype)
    y = tf.constant(rng.integers(0, shape[1], shape[0]), label_dtype)
    g = tf.cast(rng.standard_normal(shape[0]), dtype)
    return x, y, g


def _separate(x, y, g):
    """Loss-only op, then the gradient op that recomputes the exponentials."""
    lib = load_library()
    loss, shift, log_norm = lib.equivtool_sparse_xent(logits=x, labels=y,
                                                      Tacc=xent._acc_dtype(x.dtype))
    grad = lib.equivtool_sparse_xent_grad(logits=x, labels=y, shift=shift, log_norm=log_norm,
                                          grad_loss=g)
    return loss.numpy(), grad.numpy()


def _fused(x, y, g):
    lib = load_library()
    loss, backprop = lib.equivtool_sparse_xent_fused(logits=x, labels=y,
                                                     Tacc=xent._acc_dtype(x.dtype))
    grad = lib.equivtool_sparse_xent_scale(backprop=backprop, grad_loss=g, logits=x, labels=y)
    return loss.numpy(), grad.numpy()


def _differing(a, b):
    """Number of elements whose bits differ; a and b must be non-empty, of one shape."""
    a, b = _bits(a), _bits(b)
    assert a.size > 0 and a.shape == b.shape, (a.shape, b.shape)
    return int(np.count_nonzero(a != b))


# ---------------------------------------------------------------------------
# Bit for bit: fused == separate.

@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", [(5, 1), (7, 37), (B, C), (3, 2053)])
def test_fused_loss_and_gradient_equal_the_separate_path_bit_for_bit(dtype, shape):
    x, y, g = _case(dtype, shape)
    sep_loss, sep_grad = _separate(x, y, g)
    fused_loss, fused_grad = _fused(x, y, g)
    assert _differing(fused_loss, sep_loss) == 0
    assert _differing(fused_grad, sep_grad) == 0
    # something was compared: finite losses, and a gradient that is not all
    # zeros (one class: loss and gradient are exactly zero)
    assert np.all(np.isfinite(sep_loss.astype(np.float64)))
    if shape[1] == 1:
        assert not np.any(sep_loss.astype(np.float64)) and not np.any(sep_grad.astype(np.float64))
    else:
        assert np.count_nonzero(sep_grad.astype(np.float64)) > sep_grad.size // 2


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64], ids=lambda d: d.name)
def test_rows_too_long_for_the_next_row_prefetch_agree_too(dtype):
    # 140000 classes: the next row and its output exceed the kernels' 1 MiB
    # prefetch limit for these dtypes, so the rows run without prefetching
    x, y, g = _case(dtype, (3, 140000), seed=9)
    sep_loss, sep_grad = _separate(x, y, g)
    fused_loss, fused_grad = _fused(x, y, g)
    assert _differing(fused_loss, sep_loss) == 0 and _differing(fused_grad, sep_grad) == 0
    assert np.all(np.isfinite(sep_loss)) and np.count_nonzero(sep_grad) > sep_grad.size // 2


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_the_bitwise_comparison_sees_a_one_ulp_change(dtype):
    # the planted fault: the fused path scaled by a grad_loss one ulp away
    x, y, g = _case(dtype, (B, C))
    _, sep_grad = _separate(x, y, g)
    bits = _bits(g.numpy()).copy()
    bits[0] += 1  # one ulp larger in magnitude (a standard normal is never inf)
    _, fused_grad = _fused(x, y, tf.constant(bits.view(g.numpy().dtype)))
    assert _differing(fused_grad, sep_grad) > 0


def test_special_rows_agree_between_the_paths():
    inf, nan = np.inf, np.nan
    rows = np.array([[0.0, 1.0, 2.0, 3.0], [-inf, 1.0, 2.0, 3.0], [inf, 1.0, 2.0, 3.0],
                     [nan, 1.0, 2.0, 3.0], [-inf, -inf, -inf, -inf], [1e32, 0.0, 1.0, -1e32]],
                    np.float32)
    x = tf.constant(rows)
    y = tf.constant([1, 0, 1, 1, 2, 0], tf.int64)
    g = tf.constant(np.linspace(0.5, 2.0, 6), tf.float32)
    sep_loss, sep_grad = _separate(x, y, g)
    fused_loss, fused_grad = _fused(x, y, g)
    assert _differing(fused_loss, sep_loss) == 0
    assert _differing(fused_grad, sep_grad) == 0
    # TF's semantics: inf loss for a -inf label logit, NaN rows for +inf/NaN/all -inf
    assert sep_loss[1] == np.inf and np.all(np.isnan(sep_loss[2:5]))
    assert sep_grad[1, 0] == -g.numpy()[1] and np.all(np.isnan(sep_grad[2:5]))


# ---------------------------------------------------------------------------
# Which path runs.

def _op_types(fn, *args):
    return [o.type for o in fn.get_concrete_function(*args).graph.get_operations()]


def _bxc_outputs(graph_fn, x):
    """Ops of the traced graph with a B x C output, other than the logits' own."""
    graph = graph_fn.get_concrete_function(x).graph
    found = []
    for op in graph.get_operations():
        if op.type in ("Placeholder", "Const", "Identity", "StopGradient"):  # no buffer of their own
            continue
        for out in op.outputs:
            # a dimension known only at run time may be the logits' (the step
            # op's buffer is [B, C] or [0, C])
            if out.shape.rank == 2 and all(d is None or d == e for d, e in
                                           zip(out.shape.as_list(), x.shape)):
                found.append(op.type)
    return found


def _loss_only(x, y):
    return tf.function(lambda t: tf.reduce_sum(
        ops.sparse_softmax_cross_entropy_with_logits(labels=y, logits=t)))


def _stopped(x, y):
    @tf.function
    def fn(t):
        with tf.GradientTape() as tape:
            tape.watch(t)
            loss = ops.sparse_softmax_cross_entropy_with_logits(labels=y, logits=tf.stop_gradient(t))
        return tf.reduce_sum(loss)
    return fn


def _step(x, y):
    @tf.function
    def fn(t):
        with tf.GradientTape() as tape:
            tape.watch(t)
            loss = tf.reduce_mean(ops.sparse_softmax_cross_entropy_with_logits(labels=y, logits=t))
        return loss, tape.gradient(loss, t)
    return fn


def _tape_function(y, g):
    """A tf.function of the logits: per-row loss and its gradient for upstream g."""
    @tf.function
    def fn(t):
        with tf.GradientTape() as tape:
            tape.watch(t)
            loss = ops.sparse_softmax_cross_entropy_with_logits(labels=y, logits=t)
        return loss, tape.gradient(loss, t, output_gradients=g)
    return fn


@pytest.mark.parametrize("make", [_loss_only, _stopped], ids=["no_tape", "stop_gradient"])
def test_the_loss_only_path_holds_no_batch_by_class_buffer(make):
    x, y, _ = _case(tf.float32, (B, C))
    fn = make(x, y)
    types = _op_types(fn, x)
    assert xent.SPARSE_OP in types and xent.SPARSE_STEP_OP not in types, types
    assert _bxc_outputs(fn, x) == []


def test_the_buffer_check_sees_the_fused_ops_buffer(monkeypatch):
    # the planted fault: the fused op taken without a tape
    monkeypatch.setattr(xent, "_fused_step", lambda logits: True)
    x, y, _ = _case(tf.float32, (B, C))
    assert xent.SPARSE_STEP_OP in _bxc_outputs(_loss_only(x, y), x)


def test_a_training_step_runs_the_fused_op_and_no_separate_gradient():
    x, y, _ = _case(tf.float32, (B, C))
    types = _op_types(_step(x, y), x)
    assert xent.SPARSE_STEP_OP in types and xent.SPARSE_STEP_GRAD_OP in types, types
    assert xent.SPARSE_OP not in types and xent.SPARSE_GRAD_OP not in types, types


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_tape_step_equals_tf1_gradients_bit_for_bit(dtype):
    # eager tape and tf.function: fused; TF1 tf.gradients: the separate path
    x, y, g = _case(dtype, (B, C), seed=3, label_dtype=tf.int32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = ops.sparse_softmax_cross_entropy_with_logits(labels=y, logits=x)
    eager = tape.gradient(loss, x, output_gradients=g).numpy()

    in_function = _tape_function(y, g)
    assert xent.SPARSE_STEP_OP in _op_types(in_function, x)
    fn_loss, fn_grad = (t.numpy() for t in in_function(x))
    graph = tf.Graph()
    with graph.as_default():
        xp = tf.compat.v1.placeholder(dtype, x.shape)
        loss1 = ops.sparse_softmax_cross_entropy_with_logits(labels=y.numpy(), logits=xp)
        (grad1,) = tf.compat.v1.gradients(loss1, [xp], grad_ys=g.numpy())
        assert xent.SPARSE_STEP_OP not in [o.type for o in graph.get_operations()]
        with tf.compat.v1.Session(graph=graph) as sess:
            tf1_loss, tf1_grad = sess.run([loss1, grad1], {xp: x.numpy()})
    assert _differing(fn_loss, tf1_loss) == 0 and _differing(loss.numpy(), tf1_loss) == 0
    assert _differing(eager, tf1_grad) == 0 and _differing(fn_grad, tf1_grad) == 0


def test_fused_path_checks_labels_like_the_loss_only_path():
    x = tf.zeros([2, 3])
    with tf.GradientTape() as tape:
        tape.watch(x)
        with pytest.raises(tf.errors.InvalidArgumentError, match="label value of 3 at batch index 1"):
            ops.sparse_softmax_cross_entropy_with_logits(labels=[0, 3], logits=x)


# ---------------------------------------------------------------------------
# Determinism of the fused kernels: thread counts and batch splits.

def run_on_threads(graph, fetches, feed, threads):
    """``sess.run(fetches, feed)`` with every sharded loop of the op run by
    exactly ``threads`` threads (``cpu_path(threads=...)``), checking the rows
    that threads other than the op's caller computed meanwhile. A session's
    ``intra_op_parallelism_threads`` would not do it: TensorFlow's CPU device
    keeps the global pool its first session or eager context made. The inputs
    are fed, not constants, which Grappler would fold before the run. On more
    than one thread, helpers must have computed rows (the library lets a
    helper take the first block when the count is forced); on one, none."""
    rows = next(iter(feed.values())).shape[0]
    with tf.compat.v1.Session(graph=graph) as sess, cpu_path(threads=threads):
        before = path_state().helper_rows
        out = sess.run(fetches, feed)
        helped = path_state().helper_rows - before
    assert (helped > 0) == (threads > 1 and rows > 1), (threads, rows, helped)
    return out


def _fused_session(x, y, g, threads):
    graph = tf.Graph()
    with graph.as_default():
        xp, yp, gp = (tf.compat.v1.placeholder(tf.as_dtype(a.dtype), a.shape) for a in (x, y, g))
        lib = load_library()
        loss, backprop = lib.equivtool_sparse_xent_fused(logits=xp, labels=yp, Tacc=tf.float32)
        grad = lib.equivtool_sparse_xent_scale(backprop=backprop, grad_loss=gp, logits=xp, labels=yp)
    return run_on_threads(graph, [loss, grad], {xp: x, yp: y, gp: g}, threads)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16], ids=lambda d: d.name)
def test_fused_kernels_bitwise_equal_across_threads_and_batch_splits(dtype):
    x, y, g = (t.numpy() for t in _case(dtype, (512, 1000), seed=5))
    ref_loss, ref_grad = _fused_session(x, y, g, 1)
    for threads in (2, 4):
        loss, grad = _fused_session(x, y, g, threads)
        assert _differing(loss, ref_loss) == 0 and _differing(grad, ref_grad) == 0
    parts = [_fused_session(x[a:b], y[a:b], g[a:b], 2) for a, b in ((0, 1), (1, 200), (200, 512))]
    assert _differing(np.concatenate([p[0] for p in parts]), ref_loss) == 0
    assert _differing(np.concatenate([p[1] for p in parts]), ref_grad) == 0


# ---------------------------------------------------------------------------
# The scale op writes in place only into a backprop nobody else holds.

@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_the_scale_op_leaves_a_backprop_its_caller_holds_unchanged(dtype):
    # an eager backprop is held by Python, so TensorFlow must not hand its
    # buffer to the scale op's output (float32 and float64 could forward it)
    x, y, g = _case(dtype, (B, C), seed=7)
    lib = load_library()
    _, backprop = lib.equivtool_sparse_xent_fused(logits=x, labels=y, Tacc=xent._acc_dtype(dtype))
    before = backprop.numpy().copy()
    grad = lib.equivtool_sparse_xent_scale(backprop=backprop, grad_loss=g, logits=x, labels=y)
    _, sep_grad = _separate(x, y, g)
    assert _differing(grad.numpy(), sep_grad) == 0
    assert _differing(backprop.numpy(), before) == 0
    # the check can fail: had the result been written into backprop's buffer,
    # backprop would now read as the result, which differs from it here
    written = grad.numpy().astype(before.dtype)
    assert _differing(written, before) > before.size // 2


def test_a_training_step_in_a_function_equals_the_separate_path_when_scaled_in_place():
    # in a tf.function the backprop has no other reader, so float32's scale
    # may reuse its buffer; the result must still be the separate path's
    x, y, g = _case(tf.float32, (B, C), seed=8)
    step = _tape_function(y, g)
    assert xent.SPARSE_STEP_GRAD_OP in _op_types(step, x)
    x_before = x.numpy().copy()
    loss, grad = (t.numpy() for t in step(x))
    sep_loss, sep_grad = _separate(x, y, g)
    assert _differing(loss, sep_loss) == 0 and _differing(grad, sep_grad) == 0
    assert _differing(x.numpy(), x_before) == 0  # the logits are never written
