"""Property-based tests of ``compare`` (hypothesis): random nested structures with NaN, +-inf,
empty arrays, and shape, dtype, value and key changes.

* Two structures that differ never compare as passed (either way round).
* A structure compared with its copy passes exactly when every leaf holds a
  finite element: a leaf with none (zero-size, all NaN/inf) is inconclusive,
  and a comparison with zero finite elements is never passed.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from equivtool.comparison import compare

DTYPES = (np.float32, np.float64, np.int32)
SPECIALS = (np.nan, np.inf, -np.inf)


@st.composite
def leaves(draw):
    """An array: float32/float64/int32, 0 to 3 dimensions of 0 to 3 elements, floats with NaN and +-inf."""
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3))
    if dtype.kind == "i":
        elements = st.integers(-1000, 1000)
    else:
        finite = st.floats(-1000.0, 1000.0, allow_nan=False, allow_infinity=False, width=32)
        elements = st.one_of(finite, finite, st.sampled_from(SPECIALS))
    return draw(hnp.arrays(dtype, shape, elements=elements))


def structures(max_leaves: int = 6):
    """Nested dicts (str keys, insertion order), lists and tuples of arrays."""
    return st.recursive(
        leaves(),
        lambda children: st.one_of(
            st.dictionaries(st.sampled_from("abcdef"), children, min_size=1, max_size=3),
            st.lists(children, min_size=1, max_size=3),
            st.lists(children, min_size=1, max_size=3).map(tuple),
        ),
        max_leaves=max_leaves,
    )


def _paths(x, path=()):
    """(path, leaf) for every array leaf."""
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _paths(v, (*path, k))
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            yield from _paths(v, (*path, i))
    else:
        yield path, x


def _get(x, path):
    for p in path:
        x = x[p]
    return x


def _replace(x, path, new):
    """A copy of ``x`` with the node at ``path`` replaced by ``new``."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(x, dict):
        out = dict(x)
        out[head] = _replace(x[head], rest, new)
        return out
    items = list(x)
    items[head] = _replace(x[head], rest, new)
    return type(x)(items) if isinstance(x, tuple) else items


def _containers(x, path=()):
    """Paths of every dict, list and tuple."""
    if isinstance(x, (dict, list, tuple)):
        yield path, x
        children = x.items() if isinstance(x, dict) else enumerate(x)
        for k, v in children:
            yield from _containers(v, (*path, k))


# -- mutations: each returns a structure that really differs from ``x`` ---------------------


def _change_value(draw, x):
    candidates = [(p, a) for p, a in _paths(x) if a.size]
    assume(candidates)
    path, leaf = draw(st.sampled_from(candidates))
    index = draw(st.integers(0, leaf.size - 1))
    new = leaf.copy().reshape(-1)
    old = new[index]
    if leaf.dtype.kind == "i":
        new[index] = old + draw(st.integers(1, 5))
    else:
        choices = [v for v in (old + 1.0, np.nan, np.inf, -np.inf, 0.5) if not _same_value(v, old)]
        new[index] = draw(st.sampled_from(choices))
    return _replace(x, path, new.reshape(leaf.shape))


def _same_value(a, b) -> bool:
    a, b = np.float64(a), np.float64(b)
    return bool((np.isnan(a) and np.isnan(b)) or a == b)


def _change_shape(draw, x):
    path, leaf = draw(st.sampled_from(list(_paths(x))))
    how = draw(st.sampled_from(["add_axis", "grow", "shrink"]))
    if how == "add_axis":
        new = leaf.reshape((1, *leaf.shape))
    elif how == "grow" or leaf.size == 0:
        new = np.concatenate([leaf.reshape(-1), np.zeros(1, leaf.dtype)])
    else:
        new = leaf.reshape(-1)[1:]
        assume(new.shape != leaf.shape)
    return _replace(x, path, new)


def _change_dtype(draw, x):
    path, leaf = draw(st.sampled_from(list(_paths(x))))
    other = draw(st.sampled_from([d for d in DTYPES if np.dtype(d) != leaf.dtype]))
    with np.errstate(invalid="ignore"):
        new = np.nan_to_num(leaf).astype(other) if np.dtype(other).kind == "i" else leaf.astype(other)
    return _replace(x, path, new)


def _change_keys(draw, x):
    containers = list(_containers(x))
    assume(containers)
    path, node = draw(st.sampled_from(containers))
    if isinstance(node, dict):
        if draw(st.booleans()) and len(node) > 1:
            key = draw(st.sampled_from(sorted(node)))
            new = {k: v for k, v in node.items() if k != key}
        else:
            new = {**node, "zz": np.zeros(2, np.float32)}
    elif draw(st.booleans()) and len(node) > 1:
        new = type(node)(list(node)[:-1])
    else:
        new = type(node)([*node, np.zeros(2, np.float32)])
    return _replace(x, path, new)


def _change_container(draw, x):
    containers = list(_containers(x))
    assume(containers)
    path, node = draw(st.sampled_from(containers))
    if isinstance(node, dict):
        new = list(node.values())
    else:
        new = {str(i): v for i, v in enumerate(node)}
    return _replace(x, path, new)


MUTATIONS = {"value": _change_value, "shape": _change_shape, "dtype": _change_dtype,
             "keys": _change_keys, "container": _change_container}


@st.composite
def different_pairs(draw):
    x = draw(structures())
    kind = draw(st.sampled_from(sorted(MUTATIONS)))
    return kind, x, MUTATIONS[kind](draw, copy.deepcopy(x))


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                             HealthCheck.filter_too_much])


@SETTINGS
@given(different_pairs())
def test_two_different_structures_never_compare_as_passed(pair):
    kind, expected, actual = pair
    for a, b in ((expected, actual), (actual, expected)):
        c = compare(a, b)
        assert c.status != "passed", (kind, str(c))
        assert not c.ok
        with pytest.raises(AssertionError):
            c.raise_for_failure()


def _finite_count(leaf: np.ndarray) -> int:
    return int(leaf.size) if leaf.dtype.kind == "i" else int(np.count_nonzero(np.isfinite(leaf)))


@SETTINGS
@given(structures())
def test_a_structure_against_its_copy_passes_exactly_when_every_leaf_holds_a_finite_element(x):
    c = compare(x, copy.deepcopy(x))
    counts = [_finite_count(leaf) for _, leaf in _paths(x)]
    assert c.status != "failed", str(c)
    assert c.status == ("passed" if all(counts) else "inconclusive"), (counts, str(c))
    assert [leaf.compared for leaf in c.leaves] == counts
    if sum(counts) == 0:
        assert not c.ok


@SETTINGS
@given(st.lists(leaves().filter(lambda a: _finite_count(a) == 0), min_size=1, max_size=4))
def test_a_comparison_with_zero_finite_elements_is_never_passed(arrays):
    c = compare({"x": arrays}, copy.deepcopy({"x": arrays}))
    assert c.status == "inconclusive" and not c.ok


# --------------------------------------------------------------------------
# The chunked summary of agreeing leaves (equivtool.comparison._agree) is the
# full comparison's answer, found another way: for any pair of arrays, the leaf
# compare() gives with it equals the leaf the full path gives alone.
# --------------------------------------------------------------------------

FLOAT_DTYPES = (np.float16, np.float32, np.float64)


@st.composite
def near_pairs(draw):
    """(expected, actual, Tolerance): floats of one or two dtypes, the actual
    side equal, nudged by a few ULPs, zeros' signs flipped or NaN/inf moved at
    random positions, so that both agreeing and failing pairs occur."""
    from equivtool.comparison import Tolerance

    e_dtype = np.dtype(draw(st.sampled_from(FLOAT_DTYPES)))
    a_dtype = e_dtype if draw(st.booleans()) else np.dtype(draw(st.sampled_from(FLOAT_DTYPES)))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=5))
    finite = st.floats(-100.0, 100.0, allow_nan=False, allow_infinity=False, width=16)
    elements = st.one_of(finite, finite, finite, st.just(0.0), st.just(-0.0), st.sampled_from(SPECIALS))
    expected = draw(hnp.arrays(e_dtype, shape, elements=elements))
    actual = expected.astype(a_dtype)
    if draw(st.booleans()):  # every element one ULP up: agreeing leaves with nonzero differences
        actual = np.nextafter(actual, actual.dtype.type(np.inf))
    flat = actual.reshape(-1)
    for _ in range(draw(st.integers(0, 3))):
        if flat.size == 0:
            break
        i = draw(st.integers(0, flat.size - 1))
        how = draw(st.sampled_from(("ulp", "ulps", "sign", "special")))
        if how == "ulp":
            flat[i] = np.nextafter(flat[i], flat.dtype.type(np.inf))
        elif how == "ulps":
            with np.errstate(over="ignore", invalid="ignore"):
                flat[i] = flat[i] * flat.dtype.type(1.001) + flat.dtype.type(1e-3)
        elif how == "sign":
            flat[i] = -flat[i]
        else:
            flat[i] = draw(st.sampled_from(SPECIALS))
    rtol = draw(st.sampled_from((0.0, 1e-6, 1e-3)))
    atol = draw(st.sampled_from((0.0, 1e-5, 1e-2, 1e3)))
    return expected, actual, Tolerance(rtol, atol, allow_nonfinite=draw(st.booleans()))


@settings(SETTINGS, max_examples=400)
@given(near_pairs(), st.sampled_from((1, 2, 3, 1 << 15)))
def test_an_agreeing_leaf_summarised_in_chunks_equals_the_full_comparison(pair, chunk):
    from unittest import mock

    from equivtool.comparison import _agree

    expected, actual, tol = pair
    with mock.patch.object(_agree, "CHUNK", chunk):
        fast = compare({"x": expected}, {"x": actual}, tol, check_dtype=False).leaves[0]
    with mock.patch("equivtool.comparison.agreement", return_value=None):
        full = compare({"x": expected}, {"x": actual}, tol, check_dtype=False).leaves[0]
    assert repr(fast) == repr(full)  # repr: a NaN field (first_actual) equals itself


def test_the_chunked_summary_declines_a_leaf_with_a_mismatch():
    """A planted mismatch in the last chunk: the summary gives no answer, so the
    full comparison reports the failure with its first mismatch."""
    from unittest import mock

    from equivtool.comparison import Tolerance, _agree

    expected = np.linspace(-1, 1, 10, dtype=np.float32)
    actual = expected.copy()
    actual[-1] += 1e-3
    with mock.patch.object(_agree, "CHUNK", 3):
        assert _agree.agreement(expected, actual, Tolerance(1e-6, 1e-5)) is None
        leaf = compare(expected, actual, Tolerance(1e-6, 1e-5)).leaves[0]
    assert not leaf.ok and leaf.mismatched == 1 and leaf.first_mismatch == (9,)
    same = _agree.agreement(expected, expected.copy(), Tolerance(1e-6, 1e-5))
    assert same is not None and same.compared == 10 and same.max_abs == 0.0
    nothing = _agree.agreement(np.full(4, np.nan, np.float32), np.full(4, np.nan, np.float32), Tolerance())
    assert nothing is not None and nothing.compared == 0
    assert compare(np.full(4, np.nan, np.float32), np.full(4, np.nan, np.float32)).status == "inconclusive"
