// Plain launchers of the CUDA kernels in xent_kernels.cu.cc. No TensorFlow
// or CUDA types: pointers are device pointers, the stream is a cudaStream_t
// passed as void*. Each returns nullptr on success or a CUDA error string.
// S is float, double, equivtool_xent::half_bits or equivtool_xent::bf16_bits;
// A is its accumulation type (double for double, float otherwise); L is the
// label type (int32_t or int64_t).

#ifndef EQUIVTOOL_CUSTOM_OPS_XENT_XENT_KERNELS_H_
#define EQUIVTOOL_CUSTOM_OPS_XENT_XENT_KERNELS_H_

#include <stdint.h>

#include "xent_row.h"

namespace equivtool_xent {
namespace gpu {

template <typename S, typename L>
const char* LaunchSparseForward(void* stream, const S* logits, const L* labels,
                                int64_t rows, int64_t classes, S* loss,
                                typename Storage<S>::acc* shift,
                                typename Storage<S>::acc* log_norm);

template <typename S, typename L>
const char* LaunchSparseGrad(void* stream, const S* logits, const L* labels,
                             int64_t rows, int64_t classes,
                             const typename Storage<S>::acc* shift,
                             const typename Storage<S>::acc* log_norm,
                             const S* grad_loss, S* dlogits);

template <typename S>
const char* LaunchDenseForward(void* stream, const S* logits, const S* labels,
                               int64_t rows, int64_t classes, S* loss,
                               typename Storage<S>::acc* shift,
                               typename Storage<S>::acc* log_norm);

template <typename S>
const char* LaunchDenseGrad(void* stream, const S* logits, const S* labels,
                            int64_t rows, int64_t classes,
                            const typename Storage<S>::acc* shift,
                            const typename Storage<S>::acc* log_norm,
                            const S* grad_loss, bool exact_gradient, S* dlogits);

}  // namespace gpu
}  // namespace equivtool_xent

#endif  // EQUIVTOOL_CUSTOM_OPS_XENT_XENT_KERNELS_H_
