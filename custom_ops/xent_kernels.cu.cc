// Launchers of the CUDA kernels (xent_device.cuh) through the CUDA runtime:
// the ahead-of-time build with nvcc (equivtool/ops/_build.py, when nvcc is
// found) and the standalone harness (benchmarks/gpu/). The run-time path
// (NVRTC and the driver API, xent_ops.cc) launches the same kernels with the
// same plan (xent_plan.h) and needs none of this file.

#include <cuda_runtime.h>

#include <stdint.h>

#include "xent_device.cuh"
#include "xent_kernels.h"
#include "xent_plan.h"

namespace equivtool_xent {
namespace gpu {
namespace {

// Launching. Every launch goes through cudaLaunchKernelEx, whose return value
// is this launch's own result (cudaGetLastError would read a per-thread
// state that other code on the thread shares).
const char* ErrorString(cudaError_t e) { return e == cudaSuccess ? nullptr : cudaGetErrorString(e); }

template <typename... P, typename... Args>
cudaError_t Launch(cudaStream_t stream, int64_t blocks, void (*kernel)(P...), Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(GridFor(blocks));
  config.blockDim = dim3(kBlock);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = nullptr;
  config.numAttrs = 0;
  return cudaLaunchKernelEx(&config, kernel, static_cast<P>(args)...);
}

// Stream-ordered scratch for the chunk states of rows with several chunks.
class Scratch {
 public:
  explicit Scratch(cudaStream_t s) : stream_(s) {}
  ~Scratch() {
    if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream_);
  }
  cudaError_t Get(size_t bytes, void** out) {
    const cudaError_t e = cudaMallocAsync(&ptr_, bytes, stream_);
    *out = e == cudaSuccess ? ptr_ : nullptr;
    if (e != cudaSuccess) ptr_ = nullptr;
    return e;
  }

 private:
  cudaStream_t stream_;
  void* ptr_ = nullptr;
};

}  // namespace


template <typename S, typename L>
const char* LaunchSparseForward(void* stream, const S* logits, const L* labels,
                                int64_t rows, int64_t classes, S* loss,
                                typename Storage<S>::acc* shift,
                                typename Storage<S>::acc* log_norm) {
  typedef typename Storage<S>::acc A;
  if (rows <= 0) return nullptr;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const Plan plan = PlanFor<S>(classes);
  const bool aligned = Aligned(logits, logits, classes, Shape<S>::V);
  const int64_t items = rows * plan.chunks;
  LseState<A>* part = nullptr;
  Scratch scratch(s);
  if (plan.chunks > 1) {
    void* p;
    if (cudaError_t e = scratch.Get(sizeof(LseState<A>) * size_t(items), &p)) return ErrorString(e);
    part = static_cast<LseState<A>*>(p);
  }
  cudaError_t e;
  if (plan.threads == kWarp)
    e = Launch(s, BlocksFor(items, kWarp), SparseForwardKernel<S, L, kWarp>, logits, labels,
               rows, classes, plan, aligned, loss, shift, log_norm, part);
  else
    e = Launch(s, BlocksFor(items, kBlock), SparseForwardKernel<S, L, kBlock>, logits, labels,
               rows, classes, plan, aligned, loss, shift, log_norm, part);
  if (e == cudaSuccess && plan.chunks > 1)
    e = Launch(s, BlocksFor(rows, kWarp), SparseMergeKernel<S, L>, logits, labels, rows, classes,
               plan.chunks, part, loss, shift, log_norm);
  return ErrorString(e);
}

template <typename S, typename L>
const char* LaunchSparseGrad(void* stream, const S* logits, const L* labels,
                             int64_t rows, int64_t classes,
                             const typename Storage<S>::acc* shift,
                             const typename Storage<S>::acc* log_norm,
                             const S* grad_loss, S* dlogits) {
  if (rows <= 0 || classes <= 0) return nullptr;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const Plan plan = PlanFor<S>(classes);
  const bool aligned = Aligned(logits, dlogits, classes, Shape<S>::V);
  const int64_t items = rows * plan.chunks;
  cudaError_t e;
  if (plan.threads == kWarp)
    e = Launch(s, BlocksFor(items, kWarp), SparseGradKernel<S, L, kWarp>, logits, labels, rows,
               classes, plan, aligned, shift, log_norm, grad_loss, dlogits);
  else
    e = Launch(s, BlocksFor(items, kBlock), SparseGradKernel<S, L, kBlock>, logits, labels, rows,
               classes, plan, aligned, shift, log_norm, grad_loss, dlogits);
  return ErrorString(e);
}

template <typename S>
const char* LaunchDenseForward(void* stream, const S* logits, const S* labels,
                               int64_t rows, int64_t classes, S* loss,
                               typename Storage<S>::acc* shift,
                               typename Storage<S>::acc* log_norm) {
  typedef typename Storage<S>::acc A;
  if (rows <= 0) return nullptr;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const Plan plan = PlanFor<S>(classes);
  const bool aligned = Aligned(logits, labels, classes, Shape<S>::V);
  const int64_t items = rows * plan.chunks;
  DState<A>* part = nullptr;
  Scratch scratch(s);
  if (plan.chunks > 1) {
    void* p;
    if (cudaError_t e = scratch.Get(sizeof(DState<A>) * size_t(items), &p)) return ErrorString(e);
    part = static_cast<DState<A>*>(p);
  }
  cudaError_t e;
  if (plan.threads == kWarp)
    e = Launch(s, BlocksFor(items, kWarp), DenseForwardKernel<S, kWarp>, logits, labels, rows,
               classes, plan, aligned, loss, shift, log_norm, part);
  else
    e = Launch(s, BlocksFor(items, kBlock), DenseForwardKernel<S, kBlock>, logits, labels, rows,
               classes, plan, aligned, loss, shift, log_norm, part);
  if (e == cudaSuccess && plan.chunks > 1)
    e = Launch(s, BlocksFor(rows, kWarp), DenseMergeKernel<S>, rows, plan.chunks, part, loss,
               shift, log_norm);
  return ErrorString(e);
}

template <typename S>
const char* LaunchDenseGrad(void* stream, const S* logits, const S* labels,
                            int64_t rows, int64_t classes,
                            const typename Storage<S>::acc* shift,
                            const typename Storage<S>::acc* log_norm,
                            const S* grad_loss, bool exact_gradient, S* dlogits) {
  if (rows <= 0 || classes <= 0) return nullptr;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const Plan plan = PlanFor<S>(classes);
  const bool aligned = Aligned(logits, labels, classes, Shape<S>::V) &&
                       Aligned(dlogits, dlogits, classes, Shape<S>::V);
  const int64_t items = rows * plan.chunks;
  wide* ysums = nullptr;
  Scratch scratch(s);
  cudaError_t e = cudaSuccess;
  if (exact_gradient && plan.chunks > 1) {
    void* p;
    if ((e = scratch.Get(sizeof(wide) * size_t(items + rows), &p))) return ErrorString(e);
    wide* part = static_cast<wide*>(p);
    ysums = part + items;
    e = Launch(s, BlocksFor(items, kBlock), LabelSumKernel<S>, labels, rows, classes, plan,
               aligned, part);
    if (e == cudaSuccess)
      e = Launch(s, BlocksFor(rows, kWarp), LabelSumMergeKernel<S>, rows, plan.chunks,
                 static_cast<const wide*>(part), ysums);
  }
  if (e == cudaSuccess) {
    if (plan.threads == kWarp)
      e = Launch(s, BlocksFor(items, kWarp), DenseGradKernel<S, kWarp>, logits, labels, rows,
                 classes, plan, aligned, exact_gradient, static_cast<const wide*>(ysums), shift, log_norm,
                 grad_loss, dlogits);
    else
      e = Launch(s, BlocksFor(items, kBlock), DenseGradKernel<S, kBlock>, logits, labels, rows,
                 classes, plan, aligned, exact_gradient, static_cast<const wide*>(ysums), shift, log_norm,
                 grad_loss, dlogits);
  }
  return ErrorString(e);
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