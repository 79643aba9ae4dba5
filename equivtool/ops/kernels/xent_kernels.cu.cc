// CUDA kernels of equivtool's softmax cross-entropy; compiled by nvcc with no
// TensorFlow or absl headers (the OpKernels that call these launchers are in
// xent_ops.cc).
//
// One thread block per row. Each thread folds the elements j = t, t + T, ...
// of its row into one online log-sum-exp state (xent_row.h), then the T
// states merge in a fixed halving tree in shared memory. T depends only on
// C; there are no atomics and no cross-block reductions, so every result is
// bitwise reproducible. Rows whose label is outside [0, C) get NaN loss and
// NaN gradient, as TensorFlow's GPU kernel gives.

#include <cuda_runtime.h>

#include <type_traits>

#include "xent_kernels.h"
#include "xent_row.h"

namespace equivtool_xent {
namespace gpu {
namespace {

// Block width from the row length only.
inline int ThreadsFor(int64_t classes) {
  if (classes <= 256) return 32;
  if (classes <= 4096) return 128;
  return 256;
}

inline int BlocksFor(int64_t rows) {
  const int64_t cap = int64_t(1) << 20;  // rows beyond this loop in-kernel
  return int(rows < cap ? rows : cap);
}

// Merge T shared-memory states into states[0]; all threads must call it.
template <int T, typename State, typename Merge>
__device__ __forceinline__ void TreeMerge(State* states, Merge merge) {
  __syncthreads();
#pragma unroll
  for (int w = T / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) merge(states[threadIdx.x], states[threadIdx.x + w]);
    __syncthreads();
  }
}

template <typename L>
__device__ __forceinline__ bool ValidLabel(L label, int64_t classes) {
  return label >= 0 && int64_t(label) < classes;
}

template <typename S, typename L, int T>
__global__ void __launch_bounds__(T)
SparseForwardKernel(const S* __restrict__ x, const L* __restrict__ y, int64_t rows,
                    int64_t classes, S* __restrict__ loss,
                    typename Storage<S>::acc* __restrict__ shift,
                    typename Storage<S>::acc* __restrict__ log_norm) {
  typedef typename Storage<S>::acc A;
  __shared__ LseState<A> states[T];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const S* xr = x + row * classes;
    LseState<A> s = lse_empty<A>();
    for (int64_t j = threadIdx.x; j < classes; j += T)
      lse_push(s, Storage<S>::load(xr[j]));
    states[threadIdx.x] = s;
    TreeMerge<T>(states, [](LseState<A>& a, const LseState<A>& b) { lse_merge(a, b); });
    if (threadIdx.x == 0) {
      const RowStats<A> r = finish(states[0]);
      const L label = y[row];
      const A l = ValidLabel(label, classes)
                      ? sparse_loss(states[0], Storage<S>::load(xr[label]))
                      : Limits<A>::quiet_nan();
      loss[row] = Storage<S>::store(l);
      shift[row] = r.shift;
      log_norm[row] = r.log_norm;
    }
    __syncthreads();  // states[] is reused by the next row
  }
}

template <typename S, typename L, int T>
__global__ void __launch_bounds__(T)
SparseGradKernel(const S* __restrict__ x, const L* __restrict__ y, int64_t rows,
                 int64_t classes, const typename Storage<S>::acc* __restrict__ shift,
                 const typename Storage<S>::acc* __restrict__ log_norm,
                 const S* __restrict__ grad_loss, S* __restrict__ dx) {
  typedef typename Storage<S>::acc A;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const S* xr = x + row * classes;
    S* out = dx + row * classes;
    const L label = y[row];
    const bool valid = ValidLabel(label, classes);
    const A g = Storage<S>::load(grad_loss[row]);
    const A sh = shift[row], ln = log_norm[row];
    for (int64_t j = threadIdx.x; j < classes; j += T) {
      const A p = probability(Storage<S>::load(xr[j]), sh, ln);
      const A v = !valid ? Limits<A>::quiet_nan()
                         : (j == int64_t(label) ? g * (p - A(1)) : g * p);
      out[j] = Storage<S>::store(v);
    }
  }
}

template <typename S, int T>
__global__ void __launch_bounds__(T)
DenseForwardKernel(const S* __restrict__ x, const S* __restrict__ y, int64_t rows,
                   int64_t classes, S* __restrict__ loss,
                   typename Storage<S>::acc* __restrict__ shift,
                   typename Storage<S>::acc* __restrict__ log_norm) {
  typedef typename Storage<S>::acc A;
  __shared__ DenseState<A> states[T];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const S* xr = x + row * classes;
    const S* yr = y + row * classes;
    DenseState<A> s = dense_empty<A>();
    for (int64_t j = threadIdx.x; j < classes; j += T)
      dense_push(s, Storage<S>::load(xr[j]), Storage<S>::load(yr[j]));
    states[threadIdx.x] = s;
    TreeMerge<T>(states, [](DenseState<A>& a, const DenseState<A>& b) { dense_merge(a, b); });
    if (threadIdx.x == 0) {
      const RowStats<A> r = finish(states[0].lse);
      loss[row] = Storage<S>::store(dense_loss(states[0]));
      shift[row] = r.shift;
      log_norm[row] = r.log_norm;
    }
    __syncthreads();
  }
}

template <typename S, int T>
__global__ void __launch_bounds__(T)
DenseGradKernel(const S* __restrict__ x, const S* __restrict__ y, int64_t rows,
                int64_t classes, const typename Storage<S>::acc* __restrict__ shift,
                const typename Storage<S>::acc* __restrict__ log_norm,
                const S* __restrict__ grad_loss, bool exact_gradient,
                S* __restrict__ dx) {
  typedef typename Storage<S>::acc A;
  __shared__ A sums[T];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const S* xr = x + row * classes;
    const S* yr = y + row * classes;
    S* out = dx + row * classes;
    A part = A(0);
    for (int64_t j = threadIdx.x; j < classes; j += T) part += Storage<S>::load(yr[j]);
    sums[threadIdx.x] = part;
    TreeMerge<T>(sums, [](A& a, const A& b) { a = a + b; });
    // TensorFlow's gradient is softmax - labels; sum(labels) * softmax - labels
    // only on request (exact_gradient).
    const A ysum = exact_gradient ? sums[0] : A(1);
    const A g = Storage<S>::load(grad_loss[row]);
    const A sh = shift[row], ln = log_norm[row];
    for (int64_t j = threadIdx.x; j < classes; j += T) {
      const A p = probability(Storage<S>::load(xr[j]), sh, ln);
      out[j] = Storage<S>::store(g * (ysum * p - Storage<S>::load(yr[j])));
    }
    __syncthreads();  // sums[0] is read above before the next row overwrites it
  }
}

const char* LastError() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

// Calls launch.template operator()<T>() with the block width for `classes`.
template <typename Launch>
const char* WithThreads(int64_t classes, Launch launch) {
  switch (ThreadsFor(classes)) {
    case 32: launch(std::integral_constant<int, 32>()); break;
    case 128: launch(std::integral_constant<int, 128>()); break;
    default: launch(std::integral_constant<int, 256>()); break;
  }
  return LastError();
}

}  // namespace

template <typename S, typename L>
const char* LaunchSparseForward(void* stream, const S* logits, const L* labels,
                                int64_t rows, int64_t classes, S* loss,
                                typename Storage<S>::acc* shift,
                                typename Storage<S>::acc* log_norm) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  return WithThreads(classes, [&](auto t) {
    SparseForwardKernel<S, L, decltype(t)::value>
        <<<BlocksFor(rows), decltype(t)::value, 0, s>>>(logits, labels, rows, classes,
                                                        loss, shift, log_norm);
  });
}

template <typename S, typename L>
const char* LaunchSparseGrad(void* stream, const S* logits, const L* labels,
                             int64_t rows, int64_t classes,
                             const typename Storage<S>::acc* shift,
                             const typename Storage<S>::acc* log_norm,
                             const S* grad_loss, S* dlogits) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  return WithThreads(classes, [&](auto t) {
    SparseGradKernel<S, L, decltype(t)::value>
        <<<BlocksFor(rows), decltype(t)::value, 0, s>>>(
            logits, labels, rows, classes, shift, log_norm, grad_loss, dlogits);
  });
}

template <typename S>
const char* LaunchDenseForward(void* stream, const S* logits, const S* labels,
                               int64_t rows, int64_t classes, S* loss,
                               typename Storage<S>::acc* shift,
                               typename Storage<S>::acc* log_norm) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  return WithThreads(classes, [&](auto t) {
    DenseForwardKernel<S, decltype(t)::value>
        <<<BlocksFor(rows), decltype(t)::value, 0, s>>>(logits, labels, rows, classes,
                                                        loss, shift, log_norm);
  });
}

template <typename S>
const char* LaunchDenseGrad(void* stream, const S* logits, const S* labels,
                            int64_t rows, int64_t classes,
                            const typename Storage<S>::acc* shift,
                            const typename Storage<S>::acc* log_norm,
                            const S* grad_loss, bool exact_gradient, S* dlogits) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  return WithThreads(classes, [&](auto t) {
    DenseGradKernel<S, decltype(t)::value>
        <<<BlocksFor(rows), decltype(t)::value, 0, s>>>(
            logits, labels, rows, classes, shift, log_norm, grad_loss, exact_gradient,
            dlogits);
  });
}

#define INSTANTIATE_SPARSE(S, L)                                                   \
  template const char* LaunchSparseForward<S, L>(                                  \
      void*, const S*, const L*, int64_t, int64_t, S*, Storage<S>::acc*,           \
      Storage<S>::acc*);                                                           \
  template const char* LaunchSparseGrad<S, L>(                                     \
      void*, const S*, const L*, int64_t, int64_t, const Storage<S>::acc*,         \
      const Storage<S>::acc*, const S*, S*);
#define INSTANTIATE(S)                                                             \
  INSTANTIATE_SPARSE(S, int32_t)                                                   \
  INSTANTIATE_SPARSE(S, int64_t)                                                   \
  template const char* LaunchDenseForward<S>(void*, const S*, const S*, int64_t,   \
                                             int64_t, S*, Storage<S>::acc*,        \
                                             Storage<S>::acc*);                    \
  template const char* LaunchDenseGrad<S>(void*, const S*, const S*, int64_t,      \
                                          int64_t, const Storage<S>::acc*,         \
                                          const Storage<S>::acc*, const S*, bool, S*);
INSTANTIATE(float)
INSTANTIATE(double)
INSTANTIATE(half_bits)
INSTANTIATE(bf16_bits)
#undef INSTANTIATE
#undef INSTANTIATE_SPARSE

}  // namespace gpu
}  // namespace equivtool_xent
