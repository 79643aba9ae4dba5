"""The GPU launch recipe (custom_ops/xent_launch.h), run on the host.

Both ways of launching the CUDA kernels (the driver API over NVRTC cubins,
the op's; the CUDA runtime, the GPU harness's nvcc build) run these recipes; a GPU runs them
only where one is at hand (benchmarks/gpu/). Here a recording backend
(tests/xent_recipe_probe.cc, built with g++) shows what each recipe
launches, with which plan and grid, and what workspace it asks for; and the
per-stream workspace pool runs over a fake allocator.
"""

import ctypes
import os
import re
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from equivtool.ops import _build
from xent_kernel_params import PARAM_SIZES

HERE = os.path.dirname(os.path.abspath(__file__))
DTYPES = {"float16": 0, "bfloat16": 1, "float32": 2, "float64": 3}
FUSED_MAX_ITEMS = 2048  # xent_launch.h: kFusedMergeMaxItems


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    out = tmp_path_factory.mktemp("probe") / "probe.so"
    subprocess.run([cxx, "-std=c++17", "-O1", "-shared", "-fPIC", "-Wno-psabi",
                    f"-I{_build.SOURCE_DIR}", os.path.join(HERE, "xent_recipe_probe.cc"),
                    "-o", str(out)], check=True, capture_output=True, text=True)
    lib = ctypes.CDLL(str(out))
    lib.probe_recipe.restype = ctypes.c_char_p
    lib.probe_recipe.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                                 ctypes.c_int, ctypes.c_int, ctypes.c_char_p]
    lib.probe_plan.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                               ctypes.POINTER(ctypes.c_int64)]
    lib.probe_pool.restype = ctypes.c_char_p
    return lib


def recipe(lib, name, dtype, rows, classes, exact=False, labels64=True, fail=None):
    text = lib.probe_recipe(name.encode(), DTYPES[dtype], rows, classes, int(exact),
                            int(labels64), fail.encode() if fail else None).decode()
    return text.splitlines()


def plan(lib, dtype, classes, rows=1, grad=False):
    out = (ctypes.c_int64 * 4)()
    lib.probe_plan(DTYPES[dtype], classes, rows, int(grad), out)
    return tuple(out)


def launches(lines):
    found = []
    for line in lines:
        m = re.match(r"launch (\S+) blocks=(\d+) grid=(\d+) params=(\d+)(?: plan=(\S+))?", line)
        if m:
            found.append((m.group(1), int(m.group(2)), int(m.group(4)), m.group(5)))
    return found


def test_a_long_row_forward_is_one_launch_with_its_counters(probe):
    # [1, 1048576] float32: 128 chunks of 8192; the last block merges them (no merge kernel)
    lines = recipe(probe, "sparse_forward", "float32", 1, 1 << 20)
    assert lines[0] == f"workspace counters=1 bytes={128 * 16}", lines
    assert launches(lines) == [("SparseForward:float32:int64:256", 128, 11, "256/8/8192/128")]
    dense = recipe(probe, "dense_forward", "bfloat16", 3, 40000)
    assert dense[0] == f"workspace counters=3 bytes={3 * 3 * 32}", dense  # 3 chunks of 16384
    assert launches(dense) == [("DenseForward:bfloat16:256", 9, 11, "256/8/16384/3")]


def test_many_chunks_in_all_are_merged_by_a_kernel_of_their_own(probe):
    # [1024, 32000] float32: 4 chunks a row, 4096 in all; a merge kernel, no counters
    lines = recipe(probe, "sparse_forward", "float32", 1024, 32000)
    assert lines[0] == f"workspace counters=0 bytes={4096 * 16}", lines
    assert launches(lines) == [("SparseForward:float32:int64:256", 4096, 11, "256/8/8192/4"),
                               ("SparseMerge:float32:int64", 128, 9, None)]
    assert launches(recipe(probe, "dense_forward", "float64", 1000, 20000))[1] == (
        "DenseMerge:float64", 125, 6, None)
    exact = launches(recipe(probe, "dense_grad", "float16", 1100, 20000, exact=True))  # 2200 chunks
    assert [k for k, *_ in exact] == ["LabelSum:float16", "LabelSumMerge:float16",
                                      "DenseGrad:float16:256"]


@settings(max_examples=200, deadline=None)
@given(dtype=st.sampled_from(sorted(DTYPES)), classes=st.integers(1, 600_000),
       rows=st.integers(1, 3000), dense=st.booleans())
def test_a_row_is_merged_once_in_kernel_or_by_a_merge_kernel(probe, dtype, classes, rows, dense):
    threads, u, chunk, chunks = plan(probe, dtype, classes)
    lines = recipe(probe, "dense_forward" if dense else "sparse_forward", dtype, rows, classes)
    found = launches(lines)
    workspace = [line for line in lines if line.startswith("workspace")]
    if chunks == 1:
        assert len(found) == 1 and workspace == []
    elif rows * chunks < FUSED_MAX_ITEMS:
        assert len(found) == 1 and workspace[0].startswith(f"workspace counters={rows} ")
    else:
        assert len(found) == 2 and "Merge" in found[1][0] and found[1][1] == -(-rows // 8)
        assert workspace[0].startswith("workspace counters=0 ")


def test_short_rows_need_no_workspace(probe):
    lines = recipe(probe, "sparse_forward", "float32", 100, 1000, labels64=False)
    assert launches(lines) == [("SparseForward:float32:int32:32", 13, 11, "32/8/1024/1")]
    assert not any(line.startswith("workspace") for line in lines)
    assert launches(recipe(probe, "sparse_forward", "float16", 5, 9000)) == [
        ("SparseForward:float16:int64:256", 5, 11, "256/5/10240/1")]


def test_the_gradient_of_few_long_rows_is_dealt_finer_and_of_many_is_not(probe):
    # 128 items: each chunk cut in four (512 blocks); bits cannot change (element-wise)
    assert launches(recipe(probe, "sparse_grad", "float32", 1, 1 << 20)) == [
        ("SparseGrad:float32:int64:256", 512, 10, "256/2/2048/512")]
    assert launches(recipe(probe, "sparse_grad", "float32", 64, 262144)) == [
        ("SparseGrad:float32:int64:256", 64 * 32, 10, "256/8/8192/32")]


def test_the_exact_dense_gradient_sums_labels_in_the_forwards_partition(probe):
    lines = recipe(probe, "dense_grad", "float32", 2, 100000, exact=True)
    # label sums: the forward's 13 chunks per row (their bits are the forward's);
    # then the gradient over 52 finer chunks per row
    assert lines[0] == f"workspace counters=2 bytes={8 * (2 * 13 + 2)}", lines
    assert launches(lines) == [("LabelSum:float32", 26, 8, "256/8/8192/13"),
                               ("DenseGrad:float32:256", 98, 12, "256/2/2048/49")]
    # TensorFlow's gradient (ysum = 1) needs no sums
    assert [k for k, *_ in launches(recipe(probe, "dense_grad", "float32", 2, 100000))] == [
        "DenseGrad:float32:256"]


def test_every_launch_passes_what_its_kernel_takes(probe):
    for name, exact in (("sparse_forward", False), ("sparse_grad", False),
                        ("dense_forward", False), ("dense_grad", True)):
        for dtype in DTYPES:
            for classes in (3, 1000, 5000, 70000):
                for kernel_key, _, params, _ in launches(recipe(probe, name, dtype, 4, classes, exact)):
                    assert params == len(PARAM_SIZES[kernel_key.split(":")[0]]), (name, dtype, classes)


def test_a_failed_workspace_launches_nothing_and_says_why(probe):
    lines = recipe(probe, "sparse_forward", "float32", 1, 1 << 20, fail="out of memory")
    assert lines[-1] == "error out of memory" and launches(lines) == []
    lines = recipe(probe, "dense_grad", "float16", 2, 100000, exact=True, fail="no memory")
    assert lines[-1] == "error no memory" and launches(lines) == []


def test_empty_inputs_launch_nothing(probe):
    assert recipe(probe, "sparse_forward", "float32", 0, 10) == []
    assert recipe(probe, "sparse_grad", "float32", 3, 0) == []
    assert recipe(probe, "dense_grad", "float32", 0, 10, exact=True) == []


@settings(max_examples=300, deadline=None)
@given(dtype=st.sampled_from(sorted(DTYPES)), classes=st.integers(1, 3_000_000),
       rows=st.integers(1, 5000))
def test_every_plan_deals_each_element_once(probe, dtype, classes, rows):
    width = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}[dtype]
    forward = plan(probe, dtype, classes)
    grad = plan(probe, dtype, classes, rows, grad=True)
    for threads, u, chunk, chunks in (forward, grad):
        assert chunk == threads * (16 // width) * u and u >= 1
        assert (chunks - 1) * chunk < classes <= chunks * chunk  # no element twice, none left out
    if grad != forward:  # only few long rows are dealt finer, and only by cutting chunks in four
        assert forward[3] > 1 and rows * forward[3] < 512
        assert grad[1] * 4 == forward[1] and grad[0] == forward[0]


def _pool(lib, requests):
    n = len(requests)
    keys = (ctypes.c_int * n)(*[r[0] for r in requests])
    counters = (ctypes.c_int64 * n)(*[r[1] for r in requests])
    sizes = (ctypes.c_int64 * n)(*[r[2] for r in requests])
    return lib.probe_pool(n, keys, counters, sizes).decode().splitlines()


def test_the_pool_zeroes_counters_once_and_grows_by_doubling(probe):
    log = _pool(probe, [(1, 10, 100), (1, 10, 100), (1, 2000, 100), (2, 5, 0), (1, 10, 9000)])
    assert log == [
        # first request of stream 1: counters allocated and zeroed, states only allocated
        "alloc key=1 bytes=4096", "zero key=1 bytes=4096", "alloc key=1 bytes=4096",
        "get key=1 counters_zero=1 states_fill=1",
        # the same again: nothing allocated, the states are what the last launch left
        "get key=1 counters_zero=1 states_fill=0",
        # more counters: a new zeroed buffer (the old one stays for launches in flight)
        "alloc key=1 bytes=8192", "zero key=1 bytes=8192",
        "get key=1 counters_zero=1 states_fill=0",
        # another stream never shares stream 1's buffers; no states asked, none made
        "alloc key=2 bytes=4096", "zero key=2 bytes=4096", "get key=2 counters_zero=1",
        # more states than twice the old size: exactly what is asked, rounded to 4 KiB
        "alloc key=1 bytes=12288", "get key=1 counters_zero=1 states_fill=1",
    ]
