// The harness's C ABI (xent_capi.h) over the op library's run-time GPU path:
// NVRTC cubins (equivtool/ops/_nvrtc.py compiles them; xent_gpu.py hands
// them over with xent_add_cubin) launched through the CUDA driver API
// (custom_ops/xent_driver.h) by xent_launch.h's recipe, with the backend the
// op uses. Built by a C++ compiler alone, like the op library: no CUDA header,
// no CUDA runtime; libcuda is opened at run time.

#include <stddef.h>
#include <stdint.h>

#include "xent_driver.h"
#include "xent_launch.h"

namespace xent_harness_driver {

namespace gk = ::equivtool_xent::gpu;
namespace drv = ::equivtool_xent::driver;
template <typename S> using A = typename ::equivtool_xent::Storage<S>::acc;

// Each launches in the context owning its first output (which has elements
// whenever the recipe launches anything); workspaces come from the stream's pool.
template <typename S, typename L>
const char* LaunchSparseForward(void* stream, const S* logits, const L* labels, int64_t rows,
                                int64_t classes, S* loss, A<S>* shift, A<S>* log_norm) {
  drv::DriverBackend b(stream, loss);
  return gk::ErrorOrNull(gk::SparseForward(b, logits, labels, rows, classes, loss, shift, log_norm));
}

template <typename S, typename L>
const char* LaunchSparseGrad(void* stream, const S* logits, const L* labels, int64_t rows,
                             int64_t classes, const A<S>* shift, const A<S>* log_norm,
                             const S* grad_loss, S* dlogits) {
  drv::DriverBackend b(stream, dlogits);
  return gk::ErrorOrNull(
      gk::SparseGrad(b, logits, labels, rows, classes, shift, log_norm, grad_loss, dlogits));
}

template <typename S>
const char* LaunchDenseForward(void* stream, const S* logits, const S* labels, int64_t rows,
                               int64_t classes, S* loss, A<S>* shift, A<S>* log_norm) {
  drv::DriverBackend b(stream, loss);
  return gk::ErrorOrNull(gk::DenseForward(b, logits, labels, rows, classes, loss, shift, log_norm));
}

template <typename S>
const char* LaunchDenseGrad(void* stream, const S* logits, const S* labels, int64_t rows,
                            int64_t classes, const A<S>* shift, const A<S>* log_norm,
                            const S* grad_loss, bool exact_gradient, S* dlogits) {
  drv::DriverBackend b(stream, dlogits);
  return gk::ErrorOrNull(gk::DenseGrad(b, logits, labels, rows, classes, shift, log_norm,
                                       grad_loss, exact_gradient, dlogits));
}

}  // namespace xent_harness_driver

#define XENT_CAPI_LAUNCH ::xent_harness_driver
#include "xent_capi.h"

extern "C" {

// A cubin for sm_<arch> with its "key=lowered name" lines (_nvrtc's
// kernel_images); returns the number of kernels, or -1.
int xent_add_cubin(int arch, const void* data, size_t size, const char* names) {
  return ::equivtool_xent::driver::AddImage(arch, data, size, names);
}

// "" when libcuda loaded and initialised, else why not.
const char* xent_driver_error() { return ::equivtool_xent::driver::GetApi().error.c_str(); }

}  // extern "C"
