// Launchers of the CUDA kernels (xent_device.cuh) through the CUDA runtime,
// for the standalone harness (benchmarks/gpu/: nvcc, a second compiler to
// agree with the op's NVRTC cubins; the op library itself builds no CUDA
// code since issue 39). What they launch, and
// in what order, is xent_launch.h's recipe, which the driver-API path (NVRTC
// cubins, xent_driver.h) runs too; this file only says how the runtime
// launches a kernel and where a stream's workspace comes from.

#include <cuda_runtime.h>

#include <stdint.h>

#include <string>
#include <type_traits>
#include <utility>

#include "xent_device.cuh"
#include "xent_kernels.h"
#include "xent_launch.h"
#include "xent_plan.h"

namespace equivtool_xent {
namespace gpu {
namespace {

std::string Error(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return "";
  return std::string(what) + ": " + cudaGetErrorString(e);
}

// The kernel functions behind the recipe's names.
template <KernelId K, typename S, typename L, int T> struct KernelFn;
template <typename S, typename L, int T> struct KernelFn<KernelId::SparseForward, S, L, T> {
  static auto get() { return &SparseForwardKernel<S, L, T>; }
};
template <typename S, typename L, int T> struct KernelFn<KernelId::SparseGrad, S, L, T> {
  static auto get() { return &SparseGradKernel<S, L, T>; }
};
template <typename S, int T> struct KernelFn<KernelId::DenseForward, S, void, T> {
  static auto get() { return &DenseForwardKernel<S, T>; }
};
template <typename S, int T> struct KernelFn<KernelId::DenseGrad, S, void, T> {
  static auto get() { return &DenseGradKernel<S, T>; }
};
template <typename S> struct KernelFn<KernelId::LabelSum, S, void, 0> {
  static auto get() { return &LabelSumKernel<S>; }
};
template <typename S, typename L> struct KernelFn<KernelId::SparseMerge, S, L, 0> {
  static auto get() { return &SparseMergeKernel<S, L>; }
};
template <typename S> struct KernelFn<KernelId::DenseMerge, S, void, 0> {
  static auto get() { return &DenseMergeKernel<S>; }
};
template <typename S> struct KernelFn<KernelId::LabelSumMerge, S, void, 0> {
  static auto get() { return &LabelSumMergeKernel<S>; }
};

// Lets this thread allocate while some stream is being captured into a
// graph (cudaMalloc is refused then in the default, global mode).
class RelaxedCapture {
 public:
  RelaxedCapture() : mode_(cudaStreamCaptureModeRelaxed) { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }

 private:
  cudaStreamCaptureMode mode_;
};

// Workspace memory for xent_launch.h's pool: keyed by (device, stream);
// zeroed on a stream of its own (never captured, ordered with nothing else)
// and waited for.
struct RuntimeMem {
  typedef std::pair<int, cudaStream_t> Key;
  std::string Alloc(const Key&, size_t bytes, void** p) const {
    RelaxedCapture relaxed;
    return Error(cudaMalloc(p, bytes), "cudaMalloc(workspace)");
  }
  std::string Zero(const Key&, void* p, size_t bytes) const {
    RelaxedCapture relaxed;
    cudaStream_t side;
    cudaError_t e = cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    if (e != cudaSuccess) return Error(e, "cudaStreamCreate(workspace)");
    e = cudaMemsetAsync(p, 0, bytes, side);
    if (e == cudaSuccess) e = cudaStreamSynchronize(side);
    cudaStreamDestroy(side);
    return Error(e, "zeroing the workspace");
  }
};

WorkspacePool<RuntimeMem>& Pool() {
  static WorkspacePool<RuntimeMem>* pool = new WorkspacePool<RuntimeMem>(RuntimeMem());
  return *pool;  // never destroyed: kernels may run at exit
}

// xent_launch.h's Backend on one stream of the current device.
class RuntimeBackend {
 public:
  explicit RuntimeBackend(void* stream) : stream_(static_cast<cudaStream_t>(stream)) {}

  std::string Workspace(int64_t counters, size_t bytes, unsigned** c, void** p) {
    int device = 0;
    if (cudaError_t e = cudaGetDevice(&device)) return Error(e, "cudaGetDevice");
    return Pool().Get({device, stream_}, counters, bytes, c, p);
  }

  // Every launch goes through cudaLaunchKernelEx, whose return value is this
  // launch's own result (cudaGetLastError would read a per-thread state that
  // other code on the thread shares).
  template <KernelId K, typename S, typename L, int T, typename... P>
  std::string Launch(int64_t blocks, P... params) {
    auto kernel = KernelFn<K, S, L, T>::get();
    static_assert(std::is_same<decltype(kernel), void (*)(P...)>::value,
                  "xent_launch.h passes other parameters than the kernel takes");
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(GridFor(blocks));
    config.blockDim = dim3(kBlock);
    config.dynamicSmemBytes = 0;
    config.stream = stream_;
    config.attrs = nullptr;
    config.numAttrs = 0;
    return Error(cudaLaunchKernelEx(&config, kernel, params...), KernelName(K));
  }

 private:
  cudaStream_t stream_;
};

}  // namespace

template <typename S, typename L>
const char* LaunchSparseForward(void* stream, const S* logits, const L* labels,
                                int64_t rows, int64_t classes, S* loss,
                                typename Storage<S>::acc* shift,
                                typename Storage<S>::acc* log_norm) {
  RuntimeBackend b(stream);
  return ErrorOrNull(SparseForward(b, logits, labels, rows, classes, loss, shift, log_norm));
}

template <typename S, typename L>
const char* LaunchSparseGrad(void* stream, const S* logits, const L* labels,
                             int64_t rows, int64_t classes,
                             const typename Storage<S>::acc* shift,
                             const typename Storage<S>::acc* log_norm,
                             const S* grad_loss, S* dlogits) {
  RuntimeBackend b(stream);
  return ErrorOrNull(SparseGrad(b, logits, labels, rows, classes, shift, log_norm, grad_loss, dlogits));
}

template <typename S>
const char* LaunchDenseForward(void* stream, const S* logits, const S* labels,
                               int64_t rows, int64_t classes, S* loss,
                               typename Storage<S>::acc* shift,
                               typename Storage<S>::acc* log_norm) {
  RuntimeBackend b(stream);
  return ErrorOrNull(DenseForward(b, logits, labels, rows, classes, loss, shift, log_norm));
}

template <typename S>
const char* LaunchDenseGrad(void* stream, const S* logits, const S* labels,
                            int64_t rows, int64_t classes,
                            const typename Storage<S>::acc* shift,
                            const typename Storage<S>::acc* log_norm,
                            const S* grad_loss, bool exact_gradient, S* dlogits) {
  RuntimeBackend b(stream);
  return ErrorOrNull(DenseGrad(b, logits, labels, rows, classes, shift, log_norm, grad_loss,
                          exact_gradient, dlogits));
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