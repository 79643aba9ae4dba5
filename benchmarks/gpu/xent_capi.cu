// The harness's C ABI (xent_capi.h) over the CUDA-runtime launchers of
// custom_ops/xent_kernels.cu.cc, which nvcc compiles into the same library.

#include "xent_kernels.h"

#define XENT_CAPI_LAUNCH ::equivtool_xent::gpu
#include "xent_capi.h"
