"""The training step's AVX-512 rows on the CPU (issue 38).

On a CPU with AVX-512F/BW/VL and F16C the fused forward and the scale op run
row functions the portable build cannot spell: float16 converted by the
hardware (vcvtph2ps / vcvtps2ph) instead of by integer arithmetic, and, for a
backprop far larger than L2, the fused forward's exponentials kept in a scratch
row and backprop written once by streaming stores (whole 64-byte lines only;
the partial lines at a row's ends by ordinary stores). Each must give the
portable rows' bits, for every dtype, row length and label position, NaN,
inf and subnormals included, on any number of threads.

Every comparison here runs with the step's outputs poisoned (filled with 0xFF
bytes before the rows are written), so an element a variant fails to write
cannot pass for a value left in a reused buffer, and checks the library's
row counters, so a comparison of the portable path with itself cannot pass
for one of the variants.
"""

import equivtool  # noqa: F401  (must precede TensorFlow)

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from equivtool.ops import xent
from equivtool.ops._cpu_path import cpu_path, path_state
from equivtool.ops._load import load_library
from tests.test_ops_fused import _bits, _differing, _fused_session

pytestmark = pytest.mark.skipif(not path_state().supported,
                                reason="this CPU lacks AVX-512F/BW/VL or F16C: only the "
                                       "portable rows exist")

NEVER = 1 << 62  # a stream_min_bytes no backprop reaches
PATHS = {"portable": dict(avx512=False), "f16c": dict(avx512=True, stream_min_bytes=NEVER),
         "stream": dict(avx512=True, stream_min_bytes=0)}
POISON = 0xFFFFFFFF


def _step(x, y, g, path):
    """Loss, backprop and gradient of the fused path on ``path``, outputs
    poisoned; and the rows each AVX-512 variant wrote meanwhile."""
    lib = load_library()
    with cpu_path(poison=True, **PATHS[path]):
        before = path_state()
        loss, backprop = lib.equivtool_sparse_xent_fused(logits=x, labels=y,
                                                         Tacc=xent._acc_dtype(x.dtype))
        grad = lib.equivtool_sparse_xent_scale(backprop=backprop, grad_loss=g, logits=x, labels=y)
        out = loss.numpy(), backprop.numpy(), grad.numpy()
        after = path_state()
    return out, {"streamed": after.streamed_rows - before.streamed_rows,
                 "f16c": after.f16c_rows - before.f16c_rows}


def _labels(B, C, rng):
    """Labels at a row's first and last class, its middle and at random:
    in the partial lines at either end and in the streamed lines between."""
    fixed = np.array([0, C - 1, C // 2, min(C - 1, 17), max(0, C - 3)])
    return np.concatenate([fixed, rng.integers(0, C, B)])[:B]


def _case(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    x = tf.cast(rng.standard_normal(shape) * 4, dtype)
    y = tf.constant(_labels(shape[0], shape[1], rng), tf.int64)
    g = tf.cast(rng.standard_normal(shape[0]), dtype)
    return x, y, g


def _expected_rows(path, dtype, B):
    # the fused forward streams float32 and bfloat16 backprops (not float16's,
    # as measured); the scale op a 16-bit gradient (a float32 one is written
    # in place or into a copy)
    fused = dtype != tf.float16
    scale = dtype in (tf.float16, tf.bfloat16)
    streamed = (fused + scale) * B if path == "stream" else 0
    f16c = 2 * B if path != "portable" and dtype == tf.float16 else 0  # forward and scale
    return {"streamed": streamed, "f16c": f16c}


# ---------------------------------------------------------------------------
# The variants give the portable rows' bits.

@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32], ids=lambda d: d.name)
@pytest.mark.parametrize("shape", [(5, 1), (6, 15), (6, 16), (7, 17), (9, 37), (8, 1000), (3, 1003)])
def test_each_variant_gives_the_portable_bits(dtype, shape):
    # row lengths below, at and off a multiple of 16 lanes; C = 1000 and 1003
    # start most rows off a 64-byte line, so heads and tails are partial
    x, y, g = _case(dtype, shape)
    ref, rows = _step(x, y, g, "portable")
    assert rows == _expected_rows("portable", dtype, shape[0])
    for path in ("f16c", "stream"):
        out, rows = _step(x, y, g, path)
        assert rows == _expected_rows(path, dtype, shape[0]), path
        for got, want in zip(out, ref):
            assert _differing(got, want) == 0, path
    # something was compared: finite losses, a backprop holding no poison and,
    # with more than one class, mostly non-zero gradients
    loss, backprop, grad = ref
    assert np.all(np.isfinite(loss.astype(np.float64)))
    assert not np.any(_bits(backprop) == POISON)
    if shape[1] > 1:
        assert np.count_nonzero(grad.astype(np.float64)) > grad.size // 2


@pytest.mark.parametrize("dtype", [tf.float16, tf.float32], ids=lambda d: d.name)
def test_the_comparison_sees_an_element_a_variant_left_unwritten(dtype):
    # the planted fault: the last element of a row's tail (C = 1003 is not a
    # multiple of 16) keeps the poison, as it would had the streaming row
    # skipped its tail
    x, y, g = _case(dtype, (3, 1003), seed=1)
    ref, _ = _step(x, y, g, "portable")
    (loss, backprop, grad), _ = _step(x, y, g, "stream")
    backprop = backprop.copy()
    _bits(backprop)[1, -1] = POISON
    assert _differing(backprop, ref[1]) == 1


def test_special_rows_agree_between_the_paths():
    inf, nan = np.inf, np.nan
    rows = np.array([[0.0, 1.0, 2.0, 3.0] * 5, [-inf, 1.0, 2.0, 3.0] * 5,
                     [inf, 1.0, 2.0, 3.0] * 5, [nan, 1.0, 2.0, 3.0] * 5,
                     [-inf, -inf, -inf, -inf] * 5, [1e4, 0.0, 1.0, -1e4] * 5,
                     [6e-8, -6e-8, 1e-7, 0.0] * 5], np.float32)
    y = tf.constant([1, 0, 17, 19, 2, 0, 18], tf.int64)
    for dtype in (tf.float16, tf.float32):
        x = tf.cast(rows, dtype)
        g = tf.cast(np.linspace(0.5, 2.0, len(rows)), dtype)
        ref, _ = _step(x, y, g, "portable")
        for path in ("f16c", "stream"):
            out, _ = _step(x, y, g, path)
            assert all(_differing(a, b) == 0 for a, b in zip(out, ref)), (dtype, path)
        assert ref[0][1] == np.inf and np.all(np.isnan(ref[2][2:5].astype(np.float32)))


# Arbitrary float16 bits: NaN with any payload and sign, +-inf, subnormals,
# zeros of both signs, in the logits and in the upstream gradient (whose
# products with backprop reach every case of the float -> half conversion:
# overflow, subnormal results, NaN payloads).
_half_rows = st.integers(1, 4).flatmap(lambda B: st.integers(1, 70).flatmap(
    lambda C: st.tuples(
        st.lists(st.integers(0, 0xFFFF), min_size=B * C, max_size=B * C),
        st.lists(st.integers(0, C - 1), min_size=B, max_size=B),
        st.lists(st.integers(0, 0xFFFF), min_size=B, max_size=B),
        st.just((B, C)))))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_half_rows)
def test_float16_rows_of_any_bits_agree_between_the_paths(case):
    logits, labels, grads, shape = case
    x = tf.constant(np.array(logits, np.uint16).view(np.float16).reshape(shape))
    y = tf.constant(labels, tf.int64)
    g = tf.constant(np.array(grads, np.uint16).view(np.float16))
    ref, _ = _step(x, y, g, "portable")
    for path in ("f16c", "stream"):
        out, rows = _step(x, y, g, path)
        assert rows == _expected_rows(path, tf.float16, shape[0])
        for got, want in zip(out, ref):
            assert _differing(got, want) == 0, path


# ---------------------------------------------------------------------------
# When the fused forward streams, and on any number of threads.

def test_a_backprop_streams_from_the_size_set_on():
    x, y, g = _case(tf.float32, (48, 1000), seed=2)
    size = 48 * 1000 * 4
    _step(x, y, g, "portable")  # warm
    lib = load_library()
    counts = {}
    for name, limit in (("at", size), ("above", size + 1), ("default", None)):
        with cpu_path(avx512=True, stream_min_bytes=limit):
            before = path_state().streamed_rows
            lib.equivtool_sparse_xent_fused(logits=x, labels=y, Tacc=tf.float32)[0].numpy()
            counts[name] = path_state().streamed_rows - before
    # a backprop of 192 KiB is far below the default (8 x L2): ordinary stores
    assert counts == {"at": 48, "above": 0, "default": 0}
    assert path_state().stream_min_bytes > size


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16], ids=lambda d: d.name)
def test_streamed_rows_are_bitwise_equal_across_threads_and_batch_splits(dtype):
    x, y, g = (t.numpy() for t in _case(dtype, (512, 1003), seed=5))
    with cpu_path(avx512=False, poison=True):
        ref_loss, ref_grad = _fused_session(x, y, g, 1)
    with cpu_path(avx512=True, stream_min_bytes=0, poison=True):
        before = path_state().streamed_rows
        for threads in (1, 2, 4):
            loss, grad = _fused_session(x, y, g, threads)
            assert _differing(loss, ref_loss) == 0 and _differing(grad, ref_grad) == 0
        parts = [_fused_session(x[a:b], y[a:b], g[a:b], 2) for a, b in ((0, 1), (1, 200), (200, 512))]
        streamed = path_state().streamed_rows - before
    assert _differing(np.concatenate([p[0] for p in parts]), ref_loss) == 0
    assert _differing(np.concatenate([p[1] for p in parts]), ref_grad) == 0
    assert streamed == 4 * 512  # float32: the forward's rows; float16: the scale op's


# ---------------------------------------------------------------------------
# The switch itself.

def test_helper_rows_count_only_rows_other_threads_computed():
    # the counter the thread-count tests rely on: none on one thread, and on
    # a forced three, some rows (helpers may take them all: the caller waits
    # until one has a block)
    x, y, _ = _case(tf.float32, (96, 1000), seed=4)
    lib = load_library()
    counts = {}
    for threads in (1, 3):
        with cpu_path(threads=threads):
            before = path_state().helper_rows
            lib.equivtool_sparse_xent(logits=x, labels=y, Tacc=tf.float32)[0].numpy()
            counts[threads] = path_state().helper_rows - before
    assert counts[1] == 0 and 0 < counts[3] <= 96, counts


def test_cpu_path_restores_the_settings_after_an_exception():
    start = path_state()
    with pytest.raises(RuntimeError, match="inside"):
        with cpu_path(avx512=not start.avx512, stream_min_bytes=123, poison=True,
                      threads=3) as inside:
            assert (inside.avx512, inside.stream_min_bytes, inside.poison, inside.threads) == (
                not start.avx512, 123, True, 3)
            raise RuntimeError("inside")
    end = path_state()
    assert (end.avx512, end.stream_min_bytes, end.poison, end.threads) == (
        start.avx512, start.stream_min_bytes, start.poison, start.threads) == (
        start.avx512, start.stream_min_bytes, start.poison, 0)


def test_cpu_path_nests_and_restores_in_order():
    start = path_state()
    with cpu_path(stream_min_bytes=1):
        with cpu_path(stream_min_bytes=2, avx512=False):
            assert (path_state().stream_min_bytes, path_state().avx512) == (2, False)
        assert (path_state().stream_min_bytes, path_state().avx512) == (1, start.avx512)
    assert path_state().stream_min_bytes == start.stream_min_bytes


@pytest.mark.parametrize("kwargs, error", [
    (dict(avx512=1), TypeError), (dict(poison="yes"), TypeError),
    (dict(stream_min_bytes=-1), ValueError), (dict(stream_min_bytes=1.5), ValueError),
    (dict(stream_min_bytes=True), ValueError), (dict(threads=-1), ValueError),
    (dict(threads=257), ValueError), (dict(threads=2.0), ValueError)])
def test_cpu_path_checks_its_arguments_before_changing_anything(kwargs, error):
    start = path_state()
    with pytest.raises(error, match=next(iter(kwargs))):
        with cpu_path(**kwargs):
            pass
    assert path_state() == start
