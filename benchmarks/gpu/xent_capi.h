// The standalone harness's C ABI (benchmarks/gpu/xent_gpu.py drives it with
// ctypes on PyTorch device buffers; no TensorFlow) over one family of
// launchers, named by the namespace XENT_CAPI_LAUNCH, whose
// LaunchSparseForward / LaunchSparseGrad / LaunchDenseForward /
// LaunchDenseGrad have xent_kernels.h's signatures. Included by
// xent_capi.cu (the CUDA-runtime launchers, built by nvcc) and
// xent_capi_driver.cc (the driver API over NVRTC cubins, built by g++).
// Pointers are device pointers; `stream` is a cudaStream_t. Each function
// returns NULL or the launcher's error string.
//
// dtype: 0 float16, 1 bfloat16, 2 float32, 3 float64; label_type: 0 int32, 1 int64.
// shift and log_norm are float32 (float64 for float64 logits).

#ifndef EQUIVTOOL_BENCHMARKS_GPU_XENT_CAPI_H_
#define EQUIVTOOL_BENCHMARKS_GPU_XENT_CAPI_H_

#ifndef XENT_CAPI_LAUNCH
#error "define XENT_CAPI_LAUNCH as the launchers' namespace before including xent_capi.h"
#endif

#include <stdint.h>

namespace ex = ::equivtool_xent;

namespace {

template <typename F>
const char* ByType(int dtype, F f) {
  switch (dtype) {
    case 0: return f(ex::half_bits());
    case 1: return f(ex::bf16_bits());
    case 2: return f(float());
    case 3: return f(double());
  }
  return "unknown dtype code";
}

template <typename S> using Acc = typename ex::Storage<S>::acc;

}  // namespace

extern "C" {

const char* xent_sparse_forward(int dtype, int label_type, void* stream, const void* logits,
                                const void* labels, int64_t rows, int64_t classes, void* loss,
                                void* shift, void* log_norm) {
  return ByType(dtype, [&](auto s) -> const char* {
    typedef decltype(s) S;
    if (label_type == 0)
      return XENT_CAPI_LAUNCH::LaunchSparseForward<S, int32_t>(
          stream, static_cast<const S*>(logits), static_cast<const int32_t*>(labels), rows,
          classes, static_cast<S*>(loss), static_cast<Acc<S>*>(shift), static_cast<Acc<S>*>(log_norm));
    if (label_type == 1)
      return XENT_CAPI_LAUNCH::LaunchSparseForward<S, int64_t>(
          stream, static_cast<const S*>(logits), static_cast<const int64_t*>(labels), rows,
          classes, static_cast<S*>(loss), static_cast<Acc<S>*>(shift), static_cast<Acc<S>*>(log_norm));
    return "unknown label type code";
  });
}

const char* xent_sparse_grad(int dtype, int label_type, void* stream, const void* logits,
                             const void* labels, int64_t rows, int64_t classes, const void* shift,
                             const void* log_norm, const void* grad_loss, void* dlogits) {
  return ByType(dtype, [&](auto s) -> const char* {
    typedef decltype(s) S;
    if (label_type == 0)
      return XENT_CAPI_LAUNCH::LaunchSparseGrad<S, int32_t>(
          stream, static_cast<const S*>(logits), static_cast<const int32_t*>(labels), rows,
          classes, static_cast<const Acc<S>*>(shift), static_cast<const Acc<S>*>(log_norm),
          static_cast<const S*>(grad_loss), static_cast<S*>(dlogits));
    if (label_type == 1)
      return XENT_CAPI_LAUNCH::LaunchSparseGrad<S, int64_t>(
          stream, static_cast<const S*>(logits), static_cast<const int64_t*>(labels), rows,
          classes, static_cast<const Acc<S>*>(shift), static_cast<const Acc<S>*>(log_norm),
          static_cast<const S*>(grad_loss), static_cast<S*>(dlogits));
    return "unknown label type code";
  });
}

const char* xent_dense_forward(int dtype, void* stream, const void* logits, const void* labels,
                               int64_t rows, int64_t classes, void* loss, void* shift,
                               void* log_norm) {
  return ByType(dtype, [&](auto s) -> const char* {
    typedef decltype(s) S;
    return XENT_CAPI_LAUNCH::LaunchDenseForward<S>(stream, static_cast<const S*>(logits),
                                      static_cast<const S*>(labels), rows, classes,
                                      static_cast<S*>(loss), static_cast<Acc<S>*>(shift),
                                      static_cast<Acc<S>*>(log_norm));
  });
}

const char* xent_dense_grad(int dtype, void* stream, const void* logits, const void* labels,
                            int64_t rows, int64_t classes, const void* shift,
                            const void* log_norm, const void* grad_loss, int exact_gradient,
                            void* dlogits) {
  return ByType(dtype, [&](auto s) -> const char* {
    typedef decltype(s) S;
    return XENT_CAPI_LAUNCH::LaunchDenseGrad<S>(stream, static_cast<const S*>(logits),
                                   static_cast<const S*>(labels), rows, classes,
                                   static_cast<const Acc<S>*>(shift),
                                   static_cast<const Acc<S>*>(log_norm),
                                   static_cast<const S*>(grad_loss), exact_gradient != 0,
                                   static_cast<S*>(dlogits));
  });
}

}  // extern "C"

#endif  // EQUIVTOOL_BENCHMARKS_GPU_XENT_CAPI_H_
