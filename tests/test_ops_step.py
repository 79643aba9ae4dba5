"""The one-pass training step on the CPU (issue 38): EquivtoolSparseXentStep
writes the final gradient for the upstream gradient it guesses, and
EquivtoolSparseXentStepGrad hands that buffer on only when every row's
upstream gradient is the guess; otherwise it scales the buffer in place
(float/double written for 1) or recomputes the gradient. Whichever way a call
finishes, loss and gradient must be the separate path's bits; the tests know
which way ran from the library's counters (``_cpu_path.step_calls``), and
run with the step's outputs poisoned (0xFF bytes), so that an element a path
leaves unwritten cannot pass for a value left from an earlier run.
"""

import equivtool  # noqa: F401  (must precede TensorFlow)

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import tensorflow as tf
import tf_keras

from equivtool import ops
from equivtool.ops import xent
from equivtool.ops._cpu_path import cpu_path, path_state, step_calls
from equivtool.ops._load import load_library
from tests.test_ops_fused import FLOATS, _case, _differing, _separate, run_on_threads

# row lengths not a multiple of the 16 lanes (a skipped tail would show), one
# class, and a row longer than the 1 MiB prefetch limit for float32
SHAPES = [(7, 37), (48, 1000), (3, 2053), (5, 1)]


def _mean_step():
    """A tf.function: mean loss and its gradient (the step bench_xent times)."""
    @tf.function
    def fn(x, y):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_mean(ops.sparse_softmax_cross_entropy_with_logits(labels=y, logits=x))
        return loss, tape.gradient(loss, x)
    return fn


def _tape_step():
    """A tf.function: per-row loss and its gradient for an upstream gradient g."""
    @tf.function
    def fn(x, y, g):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = ops.sparse_softmax_cross_entropy_with_logits(labels=y, logits=x)
        return loss, tape.gradient(loss, x, output_gradients=g)
    return fn


def _mean_grad(x):
    """The upstream gradient TensorFlow's reduce_mean gives each row: 1/B in the loss dtype."""
    x_in = tf.Variable(tf.zeros([x.shape[0]], x.dtype))
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(x_in)
    return tape.gradient(loss, x_in)


def _delta(before, after):
    return (after.handed_on - before.handed_on, after.scaled - before.scaled,
            after.recomputed - before.recomputed)


def _nonzero(grad):
    return np.count_nonzero(np.asarray(grad).astype(np.float64))


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_a_mean_step_hands_the_forwards_gradient_on_with_the_separate_paths_bits(dtype, shape):
    x, y, _ = _case(dtype, shape, seed=1)
    sep_loss, sep_grad = _separate(x, y, _mean_grad(x))
    step = _mean_step()
    with cpu_path(poison=True):
        before = step_calls()
        loss, grad = step(x, y)
        after = step_calls()
    assert _delta(before, after) == (1, 0, 0)  # the guess held: no B x C pass in the gradient
    assert _differing(grad.numpy(), sep_grad) == 0
    assert _differing(np.atleast_1d(loss.numpy()),
                      np.atleast_1d(tf.reduce_mean(tf.constant(sep_loss)).numpy())) == 0
    if shape[1] > 1:  # something was compared: every row has a non-zero gradient
        assert all(_nonzero(row) > 0 for row in grad.numpy())


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_one_row_off_the_guess_is_not_handed_on(dtype):
    # the planted fault for a wrong "same value in every row" shortcut: every
    # row's upstream gradient is the mean's except the last (a check that
    # skipped it would hand on a wrong last row)
    x, y, _ = _case(dtype, (48, 1000), seed=2)
    g = _mean_grad(x).numpy().copy()
    g[-1] = g[-1] * 2
    g = tf.constant(g)
    _, sep_grad = _separate(x, y, g)
    step = _tape_step()
    with cpu_path(poison=True):
        before = step_calls()
        _, grad = step(x, y, g)
        after = step_calls()
    handed_on, scaled, recomputed = _delta(before, after)
    assert handed_on == 0 and scaled + recomputed == 1
    assert _differing(grad.numpy(), sep_grad) == 0
    # the fault would have shown: the forward's rows (for the mean) differ in the last row
    _, mean_grad = _separate(x, y, _mean_grad(x))
    assert _differing(mean_grad[-1:], sep_grad[-1:]) > 0
    assert _differing(mean_grad[:-1], sep_grad[:-1]) == 0


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_mixed_upstream_gradients_are_learned_and_keep_the_bits(dtype):
    # rows with different upstream gradients: the first call's mean guess
    # fails (recomputed); from then on this site writes softmax - onehot for
    # float/double (scaled in place) and nothing for 16-bit (recomputed)
    x, y, g = _case(dtype, (7, 37), seed=3)
    _, sep_grad = _separate(x, y, g)
    step = _tape_step()
    exact = dtype in (tf.float32, tf.float64)
    with cpu_path(poison=True):
        ways = []
        for _ in range(3):
            before = step_calls()
            _, grad = step(x, y, g)
            ways.append(_delta(before, step_calls()))
            assert _differing(grad.numpy(), sep_grad) == 0
    assert ways[0] == (0, 0, 1)
    assert ways[1:] == [(0, 1, 0)] * 2 if exact else [(0, 0, 1)] * 2, ways
    assert _nonzero(sep_grad) > sep_grad.size // 2


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_a_sum_step_learns_its_upstream_gradient_and_then_hands_on(dtype):
    # a summed loss: every upstream gradient is 1, not the mean's 1/B; the
    # first call recomputes, later ones find the buffer written for 1
    x, y, _ = _case(dtype, (48, 1000), seed=4)
    _, sep_grad = _separate(x, y, tf.ones([48], dtype))

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(ops.sparse_softmax_cross_entropy_with_logits(labels=y, logits=x))
        return tape.gradient(loss, x)

    with cpu_path(poison=True):
        ways = []
        for _ in range(2):
            before = step_calls()
            grad = step(x, y)
            ways.append(_delta(before, step_calls()))
            assert _differing(grad.numpy(), sep_grad) == 0
    assert ways == [(0, 0, 1), (1, 0, 0)], ways


def test_a_mean_guess_that_is_never_made_cannot_pass_for_one():
    # the check cannot pass when nothing was compared: a 16-bit site whose
    # rows differed makes no guess (an empty guess and an empty buffer), and
    # the gradient op must then recompute, never hand that buffer on
    x, y, g = _case(tf.float16, (7, 37), seed=5)
    lib = load_library()
    _, _, _, site, shift, log_norm = lib.equivtool_sparse_xent_step(
        logits=x, labels=y, Tacc=tf.float32)
    empty = tf.zeros([0], tf.float16)
    before = step_calls()
    grad = lib.equivtool_sparse_xent_step_grad(
        dlogits_guess=tf.zeros([0, 37], tf.float16), guess=empty, site=site,
        grad_loss=g, logits=x, labels=y, shift=shift, log_norm=log_norm)
    assert _delta(before, step_calls()) == (0, 0, 1)
    assert _differing(grad.numpy(), _separate(x, y, g)[1]) == 0


def test_the_gradient_op_rejects_a_buffer_of_the_wrong_shape_for_its_guess():
    x, y, g = _case(tf.float32, (7, 37), seed=6)
    lib = load_library()
    _, _, guess, site, shift, log_norm = lib.equivtool_sparse_xent_step(
        logits=x, labels=y, Tacc=tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="dlogits_guess must have the logits"):
        lib.equivtool_sparse_xent_step_grad(
            dlogits_guess=tf.zeros([6, 37]), guess=tf.ones([1]), site=site, grad_loss=g,
            logits=x, labels=y, shift=shift, log_norm=log_norm)


# ---------------------------------------------------------------------------
# Row variants (AVX-512, streaming) and thread counts.

def _step_session(x, y, threads):
    graph = tf.Graph()
    with graph.as_default():
        xp = tf.compat.v1.placeholder(tf.as_dtype(x.dtype), x.shape)
        yp = tf.compat.v1.placeholder(tf.as_dtype(y.dtype), y.shape)
        loss = tf.reduce_mean(ops.sparse_softmax_cross_entropy_with_logits(labels=yp, logits=xp))
        assert xent.SPARSE_STEP_OP not in [o.type for o in graph.get_operations()]
        lib = load_library()
        acc = xent._acc_dtype(xp.dtype)
        per_row, buf, guess, site, shift, log_norm = lib.equivtool_sparse_xent_step(
            logits=xp, labels=yp, Tacc=acc)
        g = tf.fill([x.shape[0]], tf.cast(1.0, xp.dtype) / tf.cast(x.shape[0], xp.dtype))
        grad = lib.equivtool_sparse_xent_step_grad(
            dlogits_guess=buf, guess=guess, site=site, grad_loss=g, logits=xp, labels=yp,
            shift=shift, log_norm=log_norm)
    return run_on_threads(graph, [per_row, grad, loss], {xp: x, yp: y}, threads)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16, tf.bfloat16], ids=lambda d: d.name)
def test_step_rows_are_bitwise_equal_across_threads_batch_splits_and_row_variants(dtype):
    x, y, _ = (t.numpy() for t in _case(dtype, (512, 1000), seed=7))
    variants = [dict(avx512=False)]
    if path_state().supported:
        variants += [dict(avx512=True, stream_min_bytes=1 << 62), dict(avx512=True, stream_min_bytes=0)]
    _, ref_grad = _separate(tf.constant(x), tf.constant(y),
                            tf.fill([512], tf.cast(1.0, dtype) / tf.cast(512, dtype)))
    for variant in variants:
        with cpu_path(poison=True, **variant):
            rows_before = path_state().streamed_rows
            for threads in (1, 2, 4):
                before = step_calls()
                _, grad, _ = _step_session(x, y, threads)
                assert _delta(before, step_calls()) == (1, 0, 0)
                assert _differing(grad, ref_grad) == 0
            streamed = path_state().streamed_rows - rows_before
        # only float32 rows stream (the step writes 16-bit rows by ordinary stores)
        expect = 3 * 512 if variant.get("stream_min_bytes") == 0 and dtype == tf.float32 else 0
        assert streamed == expect, (variant, streamed)
    # batch splits: each part's mean is another 1/B, so compare against its own reference
    for a, b in ((0, 1), (1, 200)):
        _, grad, _ = _step_session(x[a:b], y[a:b], 2)
        _, part = _separate(tf.constant(x[a:b]), tf.constant(y[a:b]),
                            tf.fill([b - a], tf.cast(1.0, dtype) / tf.cast(b - a, dtype)))
        assert _differing(grad, part) == 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.integers(1, 300), classes=st.sampled_from([37, 1000, 4100]),
       threads=st.integers(2, 6), seed=st.integers(0, 2**16))
def test_every_row_is_written_once_whatever_blocks_the_threads_take(rows, classes, threads, seed):
    # ForEachRow hands rows out in guided blocks to the caller and helpers that
    # may start late or never; with the outputs poisoned, a row no thread took
    # would show as NaN bytes, and one computed differently as other bits,
    # against the run on one thread (one block, no helper)
    x, y, _ = (t.numpy() for t in _case(tf.float32, (rows, classes), seed=seed))
    with cpu_path(poison=True):
        one = _step_session(x, y, 1)
        many = _step_session(x, y, threads)
    assert np.isfinite(one[1]).all() and np.isfinite(one[0]).all()
    assert _differing(many[1], one[1]) == 0
    np.testing.assert_array_equal(many[0].view(np.uint32), one[0].view(np.uint32))


def test_the_comparison_sees_a_gradient_handed_on_for_another_upstream_gradient():
    # the planted fault for the hand-on itself: the forward's buffer is written
    # for the mean (1/48); were it handed on for an upstream gradient of 1/47,
    # the bitwise comparison must see it
    x, y, _ = _case(tf.float32, (48, 1000), seed=8)
    lib = load_library()
    # in a graph of its own: a new kernel, so a site whose gradient has seen nothing yet
    # (eager calls share one cached kernel per attrs, whose site earlier tests have taught)
    step = tf.function(lambda x, y: lib.equivtool_sparse_xent_step(logits=x, labels=y,
                                                                   Tacc=tf.float32))
    _, buf, guess, _, _, _ = step(x, y)
    assert guess.numpy().tolist() == [np.float32(1) / np.float32(48)]
    _, other = _separate(x, y, tf.fill([48], np.float32(1) / np.float32(47)))
    assert _differing(buf.numpy(), other) > buf.numpy().size // 2


# ---------------------------------------------------------------------------
# Second order: the step's gradient op differentiates like the separate one.

@pytest.mark.parametrize("dtype", [tf.float32, tf.float64], ids=lambda d: d.name)
def test_second_order_of_the_step_equals_the_separate_paths(dtype):
    x, y, g = _case(dtype, (5, 11), seed=9)
    v = tf.cast(np.random.default_rng(1).standard_normal((5, 11)), dtype)

    def hvp(use_step):
        with tf.GradientTape(persistent=True) as outer:
            outer.watch([x, g])
            if use_step:
                with tf.GradientTape() as inner:
                    inner.watch(x)
                    loss = ops.sparse_softmax_cross_entropy_with_logits(labels=y, logits=x)
                dx = inner.gradient(loss, x, output_gradients=g)
            else:
                lib = load_library()
                _, shift, log_norm = lib.equivtool_sparse_xent(logits=x, labels=y,
                                                               Tacc=xent._acc_dtype(dtype))
                dx = lib.equivtool_sparse_xent_grad(logits=x, labels=y, shift=shift,
                                                    log_norm=log_norm, grad_loss=g)
            inner_product = tf.reduce_sum(dx * v)
        return [t.numpy() for t in outer.gradient(inner_product, [x, g])]

    before = step_calls()
    dx_step, dg_step = hvp(True)
    assert sum(_delta(before, step_calls())) == 1  # the step's gradient op ran
    dx_sep, dg_sep = hvp(False)
    assert _differing(dg_step, dg_sep) == 0 and _differing(dx_step, dx_sep) == 0
    assert _nonzero(dx_sep) > dx_sep.size // 2 and _nonzero(dg_sep) == 5


def test_a_keras_fit_step_hands_the_forwards_gradient_on():
    # tf-keras' default reduction (sum over batch size) gives every row the
    # upstream gradient 1/B: each batch's gradient op finds the guess
    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.layers.Dense(5, input_shape=(3,))])
    model.compile(optimizer="sgd",
                  loss=lambda y, logits: ops.sparse_softmax_cross_entropy_with_logits(
                      labels=tf.cast(tf.reshape(y, [-1]), tf.int64), logits=logits))
    x = np.random.default_rng(0).standard_normal((24, 3)).astype("float32")
    before = step_calls()
    model.fit(x, np.arange(24) % 5, batch_size=8, epochs=1, verbose=0)
    assert _delta(before, step_calls()) == (3, 0, 0)  # 3 batches, none fell back


def test_a_library_built_before_the_step_op_runs_the_fused_pair(monkeypatch):
    # an op library compiled from the sources before the step op (still
    # loadable: same TensorFlow) has no equivtool_sparse_xent_step; a training
    # step then runs the fused op and the scale op, with the same bits
    lib = load_library()

    class Older:
        def __getattr__(self, name):
            if name.startswith("equivtool_sparse_xent_step"):
                raise AttributeError(name)
            return getattr(lib, name)

    monkeypatch.setattr(xent, "load_library", Older)
    x, y, g = _case(tf.float32, (7, 37), seed=10)
    step = _tape_step()
    types = [o.type for o in step.get_concrete_function(x, y, g).graph.get_operations()]
    assert xent.SPARSE_FUSED_OP in types and xent.SPARSE_STEP_OP not in types, types
    _, grad = step(x, y, g)
    assert _differing(grad.numpy(), _separate(x, y, g)[1]) == 0
