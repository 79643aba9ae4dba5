"""Tests of equivtool's softmax cross-entropy op: numerics against NumPy,
TensorFlow parity on special values and bad input, gradients, determinism."""

import functools
import os
import subprocess
import sys
import textwrap

import equivtool  # noqa: F401  (must precede TensorFlow)

import numpy as np
import pytest
import tensorflow as tf

from equivtool import ops
from equivtool.ops import xent
from tests.test_ops_fused import run_on_threads

FLOATS = [tf.float16, tf.bfloat16, tf.float32, tf.float64]
LABELS = [tf.int32, tf.int64]
# max |error| allowed against the float64 reference, per logits dtype:
# a few ulps of the output format.
TOL = {tf.float16: 2e-2, tf.bfloat16: 1.5e-1, tf.float32: 5e-6, tf.float64: 1e-12}


def _f64(t):
    return tf.cast(t, tf.float64).numpy()


def _lse(x):
    m = x.max(axis=-1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))[..., 0]


def _sparse_reference(x, y, g=None):
    """Loss and (softmax - onehot) * g in float64."""
    lse = _lse(x)
    loss = lse - np.take_along_axis(x, y[..., None], -1)[..., 0]
    p = np.exp(x - lse[..., None])
    onehot = np.eye(x.shape[-1])[y]
    g = np.ones_like(loss) if g is None else g
    return loss, (p - onehot) * g[..., None]


def _dense_reference(x, y, g, exact=False):
    """Loss and TF's gradient (softmax - labels) * g, or with exact the
    derivative (sum(labels) * softmax - labels) * g, in float64."""
    lse = _lse(x)
    loss = (y * (lse[..., None] - x)).sum(-1)
    p = np.exp(x - lse[..., None])
    scale = y.sum(-1, keepdims=True) if exact else 1.0
    return loss, (scale * p - y) * g[..., None]


def _sparse_and_grad(fn, logits, labels, g=None):
    with tf.GradientTape() as tape:
        tape.watch(logits)
        loss = fn(labels=labels, logits=logits)
    grad = tape.gradient(loss, logits, output_gradients=g)
    return loss, grad


def _inputs(seed, shape, dtype, scale=4.0):
    rng = np.random.default_rng(seed)
    x = tf.cast(rng.standard_normal(shape) * scale, dtype)
    y = rng.integers(0, shape[-1], shape[:-1])
    return x, y


def _bits(t):
    a = t.numpy()
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


# ---------------------------------------------------------------------------
# Numerics.

@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("label_dtype", LABELS, ids=lambda d: d.name)
@pytest.mark.parametrize("classes", [1, 7, 16, 129, 1000])
def test_sparse_matches_float64_reference(dtype, label_dtype, classes):
    x, y = _inputs(0, (37, classes), dtype)
    g = tf.cast(np.random.default_rng(1).standard_normal(37), dtype)
    loss, grad = _sparse_and_grad(ops.sparse_softmax_cross_entropy_with_logits, x,
                                  tf.constant(y, label_dtype), g)
    assert loss.dtype == dtype and grad.dtype == dtype and grad.shape == x.shape
    ref_loss, ref_grad = _sparse_reference(_f64(x), y, _f64(g))
    np.testing.assert_allclose(_f64(loss), ref_loss, rtol=0, atol=TOL[dtype] * 10)
    np.testing.assert_allclose(_f64(grad), ref_grad, rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("exact", [False, True], ids=["tf_gradient", "exact_gradient"])
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_dense_matches_float64_reference(dtype, exact):
    rng = np.random.default_rng(2)
    x = tf.cast(rng.standard_normal((41, 300)) * 4, dtype)
    y = tf.cast(rng.dirichlet(np.ones(300) * 0.3, 41) * 1.5, dtype)  # rows sum to 1.5
    g = tf.cast(rng.standard_normal(41), dtype)
    with tf.GradientTape() as tape:
        tape.watch([x, y])
        loss = ops.softmax_cross_entropy_with_logits(labels=y, logits=x, exact_gradient=exact)
    dx, dy = tape.gradient(loss, [x, y], output_gradients=g)
    ref_loss, ref_dx = _dense_reference(_f64(x), _f64(y), _f64(g), exact)
    ref_dy = (_lse(_f64(x))[:, None] - _f64(x)) * _f64(g)[:, None]
    np.testing.assert_allclose(_f64(loss), ref_loss, rtol=0, atol=TOL[dtype] * 10)
    np.testing.assert_allclose(_f64(dx), ref_dx, rtol=0, atol=TOL[dtype])
    np.testing.assert_allclose(_f64(dy), ref_dy, rtol=TOL[dtype] * 2, atol=TOL[dtype] * 10)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.float16], ids=lambda d: d.name)
def test_error_no_larger_than_tf_op(dtype):
    """Max |error| against a long-double reference, for loss and gradient, measured for both ops.

    The reference must be far finer than what is judged: a float64 reference
    (numpy's own exp/log rounding, which changed between numpy 1.26 and 2.x by
    up to 3e-15) is at the float64 ops' own error level. x86-64's long double
    (64-bit mantissa) is ~2000x finer. ``resolution`` bounds the reference's
    own error; a platform whose long double is float64 gets a coarser, stated
    resolution instead of a verdict at the reference's noise level.
    """
    x, y = _inputs(3, (512, 1000), dtype, scale=6.0)
    y = tf.constant(y)
    wide = _f64(x).astype(np.longdouble)
    ref_loss, ref_grad = _sparse_reference(wide, y.numpy())
    assert ref_loss.dtype == np.longdouble and ref_grad.dtype == np.longdouble
    ours = _sparse_and_grad(ops.sparse_softmax_cross_entropy_with_logits, x, y)
    theirs = _sparse_and_grad(tf.nn.sparse_softmax_cross_entropy_with_logits, x, y)
    for ours_t, theirs_t, ref in zip(ours, theirs, (ref_loss, ref_grad)):
        resolution = 64 * float(np.finfo(np.longdouble).eps) * float(np.abs(ref).max() + 1)
        ours_err = float(np.abs(_f64(ours_t).astype(np.longdouble) - ref).max())
        theirs_err = float(np.abs(_f64(theirs_t).astype(np.longdouble) - ref).max())
        assert ours_err > 0 and theirs_err > 0  # both were measured, not compared to themselves
        if dtype == tf.float64 and np.finfo(np.longdouble).eps < np.finfo(np.float64).eps / 1000:
            assert resolution < ours_err / 10, (resolution, ours_err)  # the reference is fine enough
        assert ours_err <= theirs_err + resolution, (ours_err, theirs_err, resolution)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_huge_logits_give_the_same_softmax_and_loss(dtype):
    # the largest offset whose row the dtype holds exactly
    offset = {tf.float16: 1000.0, tf.bfloat16: 252.0}.get(dtype, 10000.0)
    x = tf.cast([[0.0, 1.0, 2.0, 3.0], [offset, offset + 1, offset + 2, offset + 3]], dtype)
    y = tf.constant([3, 3])
    loss, grad = _sparse_and_grad(ops.sparse_softmax_cross_entropy_with_logits, x, y)
    softmax = _f64(grad) + np.eye(4)[[3, 3]]
    expected = [0.0320586, 0.0871443, 0.2368828, 0.6439143]
    atol = 1e-7 if dtype in (tf.float32, tf.float64) else 1e-2
    np.testing.assert_allclose(softmax, [expected, expected], rtol=0, atol=atol)
    np.testing.assert_array_equal(loss.numpy()[0], loss.numpy()[1])


def _special_rows():
    inf, nan = np.inf, np.nan
    return np.array([[0, inf, 1, 2], [0, -inf, 1, 2], [-inf, 0, 1, 2], [-inf] * 4,
                     [0, nan, 1, 2], [inf, inf, 0, 0], [1, 2, 3, 4]], np.float32)


def test_inf_and_nan_logits_behave_like_tf_sparse():
    x = tf.constant(_special_rows())
    y = tf.zeros([7], tf.int32)
    ours = _sparse_and_grad(ops.sparse_softmax_cross_entropy_with_logits, x, y)
    theirs = _sparse_and_grad(tf.nn.sparse_softmax_cross_entropy_with_logits, x, y)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)  # NaN == NaN here
    assert np.isnan(ours[0].numpy()[[0, 3, 4, 5]]).all() and ours[0].numpy()[2] == np.inf


def test_inf_and_nan_logits_behave_like_tf_dense():
    x = tf.constant(_special_rows())
    y = tf.constant(np.tile([[1.0, 0, 0, 0]], (7, 1)), tf.float32)
    results = []
    for fn in (ops.softmax_cross_entropy_with_logits, tf.nn.softmax_cross_entropy_with_logits):
        with tf.GradientTape() as tape:
            tape.watch([x, y])
            loss = fn(labels=y, logits=x)
        results.append([loss, *tape.gradient(loss, [x, y])])
    for a, b in zip(*results):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)
    assert np.isnan(results[0][0].numpy()[1])  # 0 * -inf, as TF


# ---------------------------------------------------------------------------
# Drop-in parity: differences TensorFlow's own suite and a trial run found.

def _fwd_bwd(fn, labels, logits, **kwargs):
    logits = tf.convert_to_tensor(logits)
    with tf.GradientTape() as tape:
        tape.watch(logits)
        loss = fn(labels=labels, logits=logits, **kwargs)
    return loss, tape.gradient(loss, logits)


def _assert_like_tf(ours, theirs, tol):
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape and a.dtype == b.dtype, (a, b)
        np.testing.assert_allclose(_f64(a), _f64(b), rtol=tol, atol=tol)  # NaN == NaN here


@pytest.mark.parametrize("labels_shape", [[1, 5], [5], [3, 1], [1, 1]])
def test_dense_labels_broadcast_like_tf(labels_shape):
    rng = np.random.default_rng(12)
    x = tf.constant(rng.standard_normal((3, 5)), tf.float32)
    y = tf.constant(rng.uniform(size=labels_shape), tf.float32)
    _assert_like_tf(_fwd_bwd(ops.softmax_cross_entropy_with_logits, y, x),
                    _fwd_bwd(tf.nn.softmax_cross_entropy_with_logits, y, x), tol=1e-6)


def test_dense_labels_broadcast_when_shapes_are_known_only_at_run_time():
    spec = tf.TensorSpec(None, tf.float32)
    fn = tf.function(lambda y, x: ops.softmax_cross_entropy_with_logits(labels=y, logits=x),
                     input_signature=[spec, spec])
    x = tf.constant([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    y = tf.constant([[0.0, 1.0, 0.0]])
    expected = tf.nn.softmax_cross_entropy_with_logits(labels=y, logits=x)
    np.testing.assert_allclose(fn(y, x).numpy(), expected.numpy(), rtol=1e-6)


@functools.lru_cache(maxsize=None)
def _tf_dense_xent_survives_zero_classes() -> bool:
    """TensorFlow 2.16's own dense kernel crashes the process (SIGSEGV) on zero classes; probe it in a child."""
    code = "import tensorflow as tf; x = tf.zeros([3, 0]); tf.nn.softmax_cross_entropy_with_logits(labels=x, logits=x)"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=600).returncode == 0


@pytest.mark.parametrize("shape", [[3, 0], [2, 2, 0]])
def test_dense_zero_classes_give_a_zero_loss_like_tf(shape):
    x = tf.zeros(shape)
    ours = _fwd_bwd(ops.softmax_cross_entropy_with_logits, x, x)
    if _tf_dense_xent_survives_zero_classes():
        theirs = _fwd_bwd(tf.nn.softmax_cross_entropy_with_logits, x, x)
    else:  # what TensorFlow's kernel returns in 2.18 and 2.21, where 2.16's crashes
        theirs = (tf.zeros(shape[:-1]), tf.zeros(shape))
    _assert_like_tf(ours, theirs, tol=0)
    assert ours[0].shape == shape[:-1] and not np.any(ours[0].numpy())


def test_sparse_zero_classes_are_an_error_like_tf():
    for fn in (ops.sparse_softmax_cross_entropy_with_logits,
               tf.nn.sparse_softmax_cross_entropy_with_logits):
        with pytest.raises(tf.errors.InvalidArgumentError, match="at least one class"):
            fn(labels=tf.zeros([3], tf.int32), logits=tf.zeros([3, 0]))


def test_dense_gradient_is_tfs_softmax_minus_labels_unless_exact_is_asked():
    x = tf.constant([[1.0, 1.0], [0.0, 2.0]])
    y = tf.constant([[0.0, 0.0], [1.0, 2.0]])  # rows sum to 0 and 3
    ours = _fwd_bwd(ops.softmax_cross_entropy_with_logits, y, x)
    _assert_like_tf(ours, _fwd_bwd(tf.nn.softmax_cross_entropy_with_logits, y, x), tol=1e-6)
    np.testing.assert_allclose(ours[1].numpy()[0], [0.5, 0.5])
    _, exact = _fwd_bwd(ops.softmax_cross_entropy_with_logits, y, x, exact_gradient=True)
    p = tf.nn.softmax(x).numpy()
    np.testing.assert_allclose(exact.numpy(), [[0.0, 0.0], 3 * p[1] - [1.0, 2.0]], rtol=1e-6)


def test_exact_gradient_must_be_a_bool():
    with pytest.raises(TypeError, match="exact_gradient must be True or False"):
        ops.softmax_cross_entropy_with_logits(labels=[[1.0]], logits=[[1.0]], exact_gradient=1)


# A huge finite logit per dtype: near the largest finite value, and 1e32 in
# float32 (the value a trial run found NaN for).
HUGE = {tf.float16: [6e4], tf.bfloat16: [1e38, 3e38], tf.float32: [1e32, 3e38],
        tf.float64: [1e300, 1.7e308]}


@pytest.mark.parametrize("dense", [False, True], ids=["sparse", "dense"])
@pytest.mark.parametrize("sign", [1, -1], ids=["positive", "negative"])
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_huge_finite_logits_give_tfs_values(dtype, sign, dense):
    for big in HUGE[dtype]:
        # the huge logit is the label in row 1, another class in rows 0 and 2
        x = tf.cast(np.array([[sign * big, 0.0, 1.0], [0.0, sign * big, 1.0],
                              [1.0, 0.0, sign * big]]), dtype)
        y = tf.constant([1, 1, 1])
        if dense:
            y = tf.one_hot(y, 3, dtype=dtype)
            pair = (ops.softmax_cross_entropy_with_logits, tf.nn.softmax_cross_entropy_with_logits)
        else:
            pair = (ops.sparse_softmax_cross_entropy_with_logits,
                    tf.nn.sparse_softmax_cross_entropy_with_logits)
        ours, theirs = (_fwd_bwd(fn, y, x) for fn in pair)
        assert np.isfinite(_f64(ours[0])).all() and np.isfinite(_f64(ours[1])).all(), (big, ours)
        _assert_like_tf(ours, theirs, tol=TOL[dtype])


# ---------------------------------------------------------------------------
# Bad input.

def test_invalid_label_cpu_names_batch_index_value_and_classes():
    x = tf.zeros([3, 4])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"label value of 7 at batch index 1 .*\[0, 4\)"):
        ops.sparse_softmax_cross_entropy_with_logits(labels=[0, 7, 1], logits=x)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"value of -1 at batch index 2"):
        ops.sparse_softmax_cross_entropy_with_logits(labels=[0, 1, -1], logits=x)


def test_invalid_label_cpu_in_gradient_op_raises():
    lib = equivtool.ops._load.load_library()
    with pytest.raises(tf.errors.InvalidArgumentError, match="batch index 0"):
        lib.equivtool_sparse_xent_grad(logits=tf.zeros([1, 2]), labels=[5], shift=[0.0],
                                       log_norm=[0.0], grad_loss=[1.0])


def test_rank_mismatch_raises_at_graph_construction():
    with pytest.raises(ValueError, match="`labels.shape.rank` must equal `logits.shape.rank - 1`"):
        ops.sparse_softmax_cross_entropy_with_logits(labels=tf.zeros([2, 3], tf.int32),
                                                     logits=tf.zeros([2, 3]))


def test_batch_size_mismatch_raises_at_graph_construction():
    with pytest.raises(ValueError, match="`labels.shape` must equal `logits.shape` except"):
        ops.sparse_softmax_cross_entropy_with_logits(labels=tf.zeros([3], tf.int32),
                                                     logits=tf.zeros([2, 5]))
    with pytest.raises(ValueError, match=r"labels\.shape=\(3, 5\).*logits\.shape=\(2, 5\)"):
        ops.softmax_cross_entropy_with_logits(labels=tf.zeros([3, 5]), logits=tf.zeros([2, 5]))
    with pytest.raises(ValueError, match="broadcast"):  # TF never broadcasts the logits
        ops.softmax_cross_entropy_with_logits(labels=tf.zeros([2, 5]), logits=tf.zeros([1, 5]))


@pytest.mark.parametrize("rank", [2, 3])
def test_batch_size_mismatch_raises_at_run_time_when_shapes_are_dynamic(rank):
    spec_x = tf.TensorSpec([None] * rank, tf.float32)
    spec_y = tf.TensorSpec([None] * (rank - 1), tf.int32)
    fn = tf.function(lambda y, x: ops.sparse_softmax_cross_entropy_with_logits(labels=y, logits=x),
                     input_signature=[spec_y, spec_x])
    x = tf.zeros([2] * (rank - 1) + [5])
    with pytest.raises(tf.errors.InvalidArgumentError):
        fn(tf.zeros([3] * (rank - 1), tf.int32), x)
    assert fn(tf.zeros([2] * (rank - 1), tf.int32), x).shape == [2] * (rank - 1)


@pytest.mark.parametrize("dense", [False, True])
def test_empty_batch_gives_empty_outputs(dense):
    x = tf.zeros([0, 5])
    y = tf.zeros([0, 5]) if dense else tf.zeros([0], tf.int64)
    fn = ops.softmax_cross_entropy_with_logits if dense else ops.sparse_softmax_cross_entropy_with_logits
    loss, grad = _sparse_and_grad(fn, x, y)
    assert loss.shape == [0] and grad.shape == [0, 5]


def test_non_integer_labels_raise_type_error():
    with pytest.raises(TypeError, match="int32 or int64"):
        ops.sparse_softmax_cross_entropy_with_logits(labels=[0.0, 1.0], logits=tf.zeros([2, 3]))


def test_non_float_logits_raise_type_error():
    with pytest.raises(TypeError, match="logits must be"):
        ops.sparse_softmax_cross_entropy_with_logits(labels=[0], logits=tf.zeros([1, 3], tf.int32))


def test_high_rank_and_rank_one_logits():
    x, y = _inputs(4, (2, 3, 6), tf.float32)
    loss = ops.sparse_softmax_cross_entropy_with_logits(labels=y, logits=x)
    np.testing.assert_allclose(loss.numpy(), _sparse_reference(_f64(x), y)[0], atol=5e-6)
    one = ops.sparse_softmax_cross_entropy_with_logits(labels=y[0, 0], logits=x[0, 0])
    assert one.shape == [] and np.isclose(one.numpy(), loss.numpy()[0, 0])
    dense = ops.softmax_cross_entropy_with_logits(labels=tf.one_hot(y, 6), logits=x)
    np.testing.assert_allclose(dense.numpy(), loss.numpy(), atol=5e-6)


def test_dense_axis_argument_moves_the_class_dimension():
    x, y = _inputs(5, (4, 7), tf.float32)
    labels = tf.one_hot(y, 7)
    by_rows = ops.softmax_cross_entropy_with_logits(labels=labels, logits=x)
    by_cols = ops.softmax_cross_entropy_with_logits(labels=tf.transpose(labels),
                                                    logits=tf.transpose(x), axis=0)
    np.testing.assert_allclose(by_cols.numpy(), by_rows.numpy(), atol=1e-6)


def test_forward_op_outputs_hold_no_batch_by_class_buffer():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [64, 1000])
        ops.sparse_softmax_cross_entropy_with_logits(labels=tf.zeros([64], tf.int32), logits=x)
    (op,) = [o for o in graph.get_operations() if o.type == xent.SPARSE_OP]
    assert [out.shape.as_list() for out in op.outputs] == [[64], [64], [64]]


# ---------------------------------------------------------------------------
# Gradients.

def test_first_order_gradients_pass_compute_gradient_float64():
    x, y = _inputs(6, (5, 9), tf.float64, scale=1.0)
    labels = tf.constant(np.random.default_rng(7).dirichlet(np.ones(9), 5))
    checks = [
        (lambda t: ops.sparse_softmax_cross_entropy_with_logits(labels=y, logits=t), [x]),
        (lambda a, b: ops.softmax_cross_entropy_with_logits(labels=b, logits=a), [x, labels]),
    ]
    for fn, args in checks:
        theoretical, numerical = tf.test.compute_gradient(fn, args)
        for t, n in zip(theoretical, numerical):
            np.testing.assert_allclose(t, n, rtol=1e-6, atol=1e-8)


def test_second_order_gradients_pass_compute_gradient_float64():
    x, y = _inputs(8, (4, 6), tf.float64, scale=1.0)
    labels = tf.constant(np.random.default_rng(9).dirichlet(np.ones(6), 4) * 1.3)
    w = tf.constant(np.random.default_rng(10).standard_normal((4, 6)))

    def sparse_grad(t):
        t = tf.convert_to_tensor(t)  # the numerical pass calls with NumPy arrays
        with tf.GradientTape() as tape:
            tape.watch(t)
            loss = ops.sparse_softmax_cross_entropy_with_logits(labels=y, logits=t)
            weighted = loss * tf.range(1.0, 5.0, dtype=tf.float64)
        return tape.gradient(weighted, t) * w

    def dense_grad(t, lab, exact=True):
        t = tf.convert_to_tensor(t)
        with tf.GradientTape() as tape:
            tape.watch(t)
            loss = ops.softmax_cross_entropy_with_logits(labels=lab, logits=t,
                                                         exact_gradient=exact)
            weighted = loss * tf.range(1.0, 5.0, dtype=tf.float64)
        return tape.gradient(weighted, t) * w

    def tf_style_dense_grad(t, lab):  # TF's gradient, softmax - labels, is a function too
        return dense_grad(t, lab, exact=False)

    for fn, args in [(sparse_grad, [x]), (dense_grad, [x, labels]),
                     (tf_style_dense_grad, [x, labels])]:
        theoretical, numerical = tf.test.compute_gradient(fn, args)
        for t, n in zip(theoretical, numerical):
            np.testing.assert_allclose(t, n, rtol=1e-5, atol=1e-7)


def test_gradients_in_tf_function_and_tf1_graph_match_eager():
    x, y = _inputs(11, (16, 50), tf.float32)
    eager = _sparse_and_grad(ops.sparse_softmax_cross_entropy_with_logits, x, y)[1]

    @tf.function
    def in_function(t):
        return _sparse_and_grad(ops.sparse_softmax_cross_entropy_with_logits, t, y)[1]

    graph = tf.Graph()
    with graph.as_default():
        t = tf.compat.v1.placeholder(tf.float32, [None, 50])
        loss = ops.sparse_softmax_cross_entropy_with_logits(labels=y, logits=t)
        (grad,) = tf.compat.v1.gradients(loss, [t])
        with tf.compat.v1.Session(graph=graph) as sess:
            in_graph = sess.run(grad, {t: x.numpy()})
    np.testing.assert_array_equal(_bits(in_function(x)), _bits(eager))
    np.testing.assert_array_equal(in_graph.view(np.uint32), _bits(eager))


# ---------------------------------------------------------------------------
# Determinism: bitwise equal across runs, intra-op thread counts and batch splits.

def _session_results(dtype, label_dtype, dense, x, y, g, threads):
    graph = tf.Graph()
    with graph.as_default():
        xp = tf.compat.v1.placeholder(dtype, x.shape)
        yp = tf.compat.v1.placeholder(dtype if dense else label_dtype, y.shape)
        gp = tf.compat.v1.placeholder(dtype, g.shape)
        fn = ops.softmax_cross_entropy_with_logits if dense else ops.sparse_softmax_cross_entropy_with_logits
        loss = fn(labels=yp, logits=xp)
        (grad,) = tf.compat.v1.gradients(loss, [xp], grad_ys=gp)
    feed = {xp: x, yp: y, gp: g}
    return [run_on_threads(graph, [loss, grad], feed, threads) for _ in range(2)]


def _as_bits(a):
    return np.asarray(a).view({2: np.uint16, 4: np.uint32, 8: np.uint64}[np.asarray(a).itemsize])


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("labels", ["int32", "int64", "dense"])
def test_bitwise_deterministic_across_runs_threads_and_batch_splits(dtype, labels):
    dense = labels == "dense"
    label_dtype = tf.int32 if labels == "int32" else tf.int64
    for seed in (0, 1):
        rng = np.random.default_rng(seed)
        x = (rng.standard_normal((1024, 1000)) * 5).astype(dtype.as_numpy_dtype)
        if dense:
            y = rng.dirichlet(np.ones(1000), 1024).astype(dtype.as_numpy_dtype)
        else:
            y = rng.integers(0, 1000, 1024).astype(label_dtype.as_numpy_dtype)
        g = rng.standard_normal(1024).astype(dtype.as_numpy_dtype)
        reference = None
        for threads in (1, 2, 4):
            for loss, grad in _session_results(dtype, label_dtype, dense, x, y, g, threads):
                if reference is None:
                    reference = (_as_bits(loss), _as_bits(grad))
                np.testing.assert_array_equal(_as_bits(loss), reference[0])
                np.testing.assert_array_equal(_as_bits(grad), reference[1])
        # any batch split: each row's result depends on that row alone
        parts = [_session_results(dtype, label_dtype, dense, x[a:b], y[a:b], g[a:b], 2)[0]
                 for a, b in ((0, 1), (1, 333), (333, 1024))]
        np.testing.assert_array_equal(_as_bits(np.concatenate([p[0] for p in parts])), reference[0])
        np.testing.assert_array_equal(_as_bits(np.concatenate([p[1] for p in parts])), reference[1])


# ---------------------------------------------------------------------------
# GPU (the `gpu` marker, tests/conftest.py, skips these without a device).

def _assert_ran_on_gpu(*tensors):
    """TensorFlow falls back to the CPU silently when a GPU kernel is missing:
    check the device each result was computed on."""
    for t in tensors:
        assert "GPU" in t.device, f"computed on {t.device}, not on the GPU"


def test_device_check_rejects_a_result_computed_on_the_cpu():
    with tf.device("/CPU:0"):
        loss = ops.sparse_softmax_cross_entropy_with_logits(labels=[0], logits=[[1.0, 2.0]])
    with pytest.raises(AssertionError, match="not on the GPU"):
        _assert_ran_on_gpu(loss)


@pytest.mark.gpu
@pytest.mark.parametrize("dense", [False, True], ids=["sparse", "dense"])
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_gpu_bitwise_deterministic_and_close_to_reference(dtype, dense):
    x, y = _inputs(12, (1024, 1000), dtype)
    fn = ops.sparse_softmax_cross_entropy_with_logits
    if dense:
        y = tf.cast(np.random.default_rng(13).dirichlet(np.ones(1000), 1024), dtype)
        fn = ops.softmax_cross_entropy_with_logits
    with tf.device("/GPU:0"):
        first = _sparse_and_grad(fn, x, y)
        second = _sparse_and_grad(fn, x, y)
    _assert_ran_on_gpu(*first, *second)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(_bits(a), _bits(b))
    if dense:
        ref_loss, ref_grad = _dense_reference(_f64(x), _f64(y), np.ones(1024))
    else:
        ref_loss, ref_grad = _sparse_reference(_f64(x), y)
    np.testing.assert_allclose(_f64(first[1]), ref_grad, rtol=0, atol=TOL[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("dense", [False, True], ids=["sparse", "dense"])
@pytest.mark.parametrize("sign", [1, -1], ids=["positive", "negative"])
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_gpu_huge_finite_logits_give_tfs_values(dtype, sign, dense):
    with tf.device("/GPU:0"):
        test_huge_finite_logits_give_tfs_values(dtype, sign, dense)
        big = HUGE[dtype][0]
        x = tf.cast([[sign * big, 0.0, 1.0]], dtype)
        fn = ops.softmax_cross_entropy_with_logits if dense \
            else ops.sparse_softmax_cross_entropy_with_logits
        y = tf.cast([[0.0, 1.0, 0.0]], dtype) if dense else tf.constant([1])
        _assert_ran_on_gpu(*_fwd_bwd(fn, y, x))


@pytest.mark.gpu
def test_gpu_dense_zero_classes_and_tf_gradient():
    with tf.device("/GPU:0"):
        empty = tf.zeros([3, 0])
        loss, grad = _fwd_bwd(ops.softmax_cross_entropy_with_logits, empty, empty)
        ours = _fwd_bwd(ops.softmax_cross_entropy_with_logits, tf.constant([[0.0, 0.0]]),
                        tf.constant([[1.0, 1.0]]))
    _assert_ran_on_gpu(loss, *ours)
    assert loss.numpy().tolist() == [0.0, 0.0, 0.0] and grad.shape == [3, 0]
    np.testing.assert_allclose(ours[1].numpy(), [[0.5, 0.5]])


@pytest.mark.gpu
def test_invalid_label_gpu_gives_nan_loss_and_gradient_row():
    x = tf.zeros([3, 4])
    with tf.device("/GPU:0"):
        loss, grad = _sparse_and_grad(ops.sparse_softmax_cross_entropy_with_logits, x,
                                      tf.constant([0, 7, 1]))
    _assert_ran_on_gpu(loss, grad)
    assert np.isnan(loss.numpy()[1]) and np.isnan(grad.numpy()[1]).all()
    assert not np.isnan(loss.numpy()[[0, 2]]).any()


@pytest.mark.parametrize("axis,error,match", [
    (2, ValueError, r"axis must be in \[-2, 2\) for logits of rank 2, got 2"),
    (-3, ValueError, r"axis must be in \[-2, 2\)"),
    (1.0, TypeError, "axis must be an int"),
    (True, TypeError, "axis must be an int"),
    ("1", TypeError, "axis must be an int"),
])
def test_dense_axis_is_checked_and_named(axis, error, match):
    # before: IndexError from a list (out of range) or TypeError from list indexing
    x = np.zeros([2, 3], np.float32)
    with pytest.raises(error, match=match):
        ops.softmax_cross_entropy_with_logits(labels=x, logits=x, axis=axis)
    assert ops.softmax_cross_entropy_with_logits(labels=x, logits=x, axis=np.int64(0)).shape == (3,)


def test_first_call_inside_a_tf_function_warns_nothing(tmp_path):
    # A fresh process, whose first call of each route is inside a tf.function
    # (the op library loads then): AutoGraph converts a caller's code, and it
    # converted ours too, warning "AutoGraph could not transform <function
    # isfile>" as the library loaded. The caller is a file: AutoGraph leaves
    # code it has no source for (python -c) alone.
    code = textwrap.dedent("""
        import equivtool
        import tensorflow as tf
        from equivtool import ops
        from equivtool.ops.swap import deterministic_xent
        x = tf.constant([[1.0, 2.0, 3.0], [0.5, 0.0, -1.0]])
        y = tf.constant([2, 0])

        @tf.function
        def losses():
            with tf.GradientTape() as tape:
                tape.watch(x)
                sparse = ops.sparse_softmax_cross_entropy_with_logits(labels=y, logits=x)
                dense = ops.softmax_cross_entropy_with_logits(labels=tf.one_hot(y, 3), logits=x)
                total = tf.reduce_sum(sparse + dense)
            return sparse, dense, tape.gradient(total, x)

        @tf.function
        def swapped():
            return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=x)

        sparse, dense, grad = losses()  # the library loads in this trace
        with deterministic_xent():
            routed = swapped()
        ref = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=x)
        for loss in (sparse, dense, routed):
            tf.debugging.assert_near(loss, ref)
        tf.debugging.assert_near(grad, 2 * (tf.nn.softmax(x) - tf.one_hot(y, 3)))
        assert "Equivtool" in str(swapped.get_concrete_function().graph.as_graph_def())
        print("checked")
        """)
    script = tmp_path / "first_call.py"
    script.write_text(code)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "checked", done.stderr[-3000:]
    assert "AutoGraph" not in done.stderr, done.stderr[-3000:]
