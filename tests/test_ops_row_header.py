"""xent_row.h's per-element path (dense_push / dense_merge, what the CUDA
kernels run: one state per thread, merged in a tree) checked on the host.

The header needs neither TensorFlow nor CUDA, so a few lines of C++ compiled
with the host compiler drive the GPU's arithmetic here, on machines without a
GPU; the CPU kernels' blocked path is covered through the op itself.
"""

import math
import os
import shutil
import subprocess

import pytest

KERNELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "custom_ops")

_PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "xent_row.h"
using namespace equivtool_xent;

// Loss of one dense row, elements dealt to `threads` states (j % threads) and
// merged in order, as a CUDA block does; threads > C leaves states empty.
template <typename A> double row_loss(const std::vector<double>& x,
                                      const std::vector<double>& y, int threads) {
  std::vector<DenseState<A>> s(threads, dense_empty<A>());
  for (size_t j = 0; j < x.size(); ++j) dense_push(s[j % threads], A(x[j]), A(y[j]));
  for (int t = 1; t < threads; ++t) dense_merge(s[0], s[t]);
  return double(dense_loss(s[0]));
}

int main(int argc, char** argv) {
  // argv: dtype threads n x_1..x_n y_1..y_n
  const bool f64 = argv[1][0] == 'd';
  const int threads = atoi(argv[2]), n = atoi(argv[3]);
  std::vector<double> x(n), y(n);
  for (int j = 0; j < n; ++j) { x[j] = atof(argv[4 + j]); y[j] = atof(argv[4 + n + j]); }
  printf("%.17g\n", f64 ? row_loss<double>(x, y, threads) : row_loss<float>(x, y, threads));
  return 0;
}
"""


@pytest.fixture(scope="module")
def row_loss(tmp_path_factory):
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        pytest.skip(f"no host C++ compiler ({cxx}) to drive the header")
    folder = tmp_path_factory.mktemp("row")
    source, binary = folder / "row.cc", folder / "row"
    source.write_text(_PROGRAM)
    subprocess.run([cxx, "-O2", "-std=c++17", "-ffp-contract=off", f"-I{KERNELS}", str(source),
                    "-o", str(binary)], check=True, capture_output=True)

    def run(dtype, threads, x, y):
        args = [str(binary), dtype, str(threads), str(len(x)), *map(repr, x), *map(repr, y)]
        return float(subprocess.run(args, check=True, capture_output=True, text=True).stdout)

    return run


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("dtype,big", [("f", 1e32), ("f", 3e38), ("d", 1e300), ("d", 1.7e308)])
def test_huge_finite_logit_gives_a_finite_loss(row_loss, dtype, big, threads):
    # label on a small logit: loss = logsumexp - 0 = big
    got = row_loss(dtype, threads, [big, 0.0, 1.0], [0.0, 1.0, 0.0])
    assert math.isfinite(got) and math.isclose(got, big, rel_tol=1e-6), got
    # label on the huge logit: loss = log(1 + e^-big + e^(1-big)) = 0
    assert row_loss(dtype, threads, [big, 0.0, 1.0], [1.0, 0.0, 0.0]) == 0.0
    # a huge negative logit without label weight: the loss of the other two
    got = row_loss(dtype, threads, [-big, 0.0, 1.0], [0.0, 1.0, 0.0])
    assert math.isclose(got, math.log(1 + math.e), rel_tol=1e-6), got


@pytest.mark.parametrize("dtype", ["f", "d"])
def test_empty_row_is_zero_and_special_rows_stay_nan(row_loss, dtype):
    assert row_loss(dtype, 4, [], []) == 0.0
    assert math.isnan(row_loss(dtype, 2, [float("-inf"), float("-inf")], [1.0, 0.0]))
    assert math.isnan(row_loss(dtype, 2, [float("inf"), 0.0], [0.0, 1.0]))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype,big", [("f", 3e38), ("d", 1e307)])
def test_fractional_labels_on_logits_whose_difference_overflows(row_loss, dtype, big, threads):
    # The maximum reaches a state before -big does (elements j and j + threads
    # share a state), so that element's own term y * (x - max) is taken with
    # x - max = -2*big, which overflows the accumulation type; the term
    # 0.25 * -2*big does not. loss = logsumexp - sum(y*x) = big - (0.75*big - 0.25*big)
    # = big/2 (e^-2big vanishes). A term computed in acc before widening gives inf.
    x = [big] + [0.0] * (threads - 1) + [-big]
    y = [0.75] + [0.0] * (threads - 1) + [0.25]
    got = row_loss(dtype, threads, x, y)
    assert math.isfinite(got) and math.isclose(got, big / 2, rel_tol=1e-6), got
