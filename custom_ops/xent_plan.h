// The work partition of the CUDA kernels: how a row of C elements is cut
// into chunks and dealt to threads, as a function of C and the logits' type
// only (see xent_device.cuh). Shared by the kernels (compiled by nvcc or
// NVRTC) and by the launch recipe (xent_launch.h). No CUDA or TensorFlow
// headers.

#ifndef EQUIVTOOL_CUSTOM_OPS_XENT_XENT_PLAN_H_
#define EQUIVTOOL_CUSTOM_OPS_XENT_XENT_PLAN_H_

#include "xent_row.h"

namespace equivtool_xent {
namespace gpu {

constexpr int kBlock = 256;  // threads of every launch
constexpr int kWarp = 32;
constexpr int64_t kMaxGrid = int64_t(1) << 20;  // more work items loop inside the kernels

template <typename S> struct Shape {
  static constexpr int V = 16 / int(sizeof(S));             // elements per 16 bytes
  // elements a thread holds per chunk: 128 bytes in flight per thread for
  // 2- and 4-byte types (the loads are issued before any is used)
  static constexpr int kMaxPerThread = sizeof(S) == 8 ? 16 : (sizeof(S) == 4 ? 32 : 64);
  static constexpr int kMaxU = kMaxPerThread / V;            // 16-byte loads per thread
  // resident blocks per SM the sparse kernels are compiled for (register caps
  // of 64 and 80 without spills; float64 uncapped)
  static constexpr int kMinBlocksForward = sizeof(S) == 8 ? 1 : 4;
  static constexpr int kMinBlocksGrad = sizeof(S) == 8 ? 1 : (sizeof(S) == 4 ? 4 : 3);
};

struct Plan {
  int threads;     // T: threads per chunk (32: a warp; 256: a block)
  int u;           // 16-byte groups per thread and chunk
  int64_t chunk;   // K = T * V * u elements
  int64_t chunks;  // chunks per row
};

#if !defined(__CUDACC_RTC__)
template <typename S> Plan PlanFor(int64_t C) {
  typedef Shape<S> Sh;
  Plan p;
  const int64_t warp_cap = int64_t(kWarp) * Sh::V * Sh::kMaxU;
  const int64_t block_cap = int64_t(kBlock) * Sh::V * Sh::kMaxU;
  if (C <= warp_cap) {
    p.threads = kWarp;
    p.u = int((C + kWarp * Sh::V - 1) / (kWarp * Sh::V));
    if (p.u == 0) p.u = 1;
    p.chunks = 1;
  } else if (C <= block_cap) {
    p.threads = kBlock;
    p.u = int((C + kBlock * Sh::V - 1) / (kBlock * Sh::V));
    p.chunks = 1;
  } else {
    p.threads = kBlock;
    p.u = Sh::kMaxU;
    p.chunks = (C + block_cap - 1) / block_cap;
  }
  p.chunk = int64_t(p.threads) * Sh::V * p.u;
  return p;
}

// The gradient's partition. A gradient element depends on its logit and its
// row's statistics only, so any partition gives the same bits; the forward's
// is kept except where a few long rows would leave most multiprocessors idle
// ([1, 1048576] float32: 128 chunks of 8192): there each chunk is cut in
// four (a quarter of the elements per thread, four times the blocks).
constexpr int64_t kFewItems = 512;
template <typename S> Plan GradPlanFor(int64_t C, int64_t rows) {
  Plan p = PlanFor<S>(C);
  if (p.chunks > 1 && rows * p.chunks < kFewItems && p.u >= 4) {
    p.u /= 4;
    p.chunk = int64_t(p.threads) * Shape<S>::V * p.u;
    p.chunks = (C + p.chunk - 1) / p.chunk;
  }
  return p;
}
#endif  // !__CUDACC_RTC__

#if !defined(__CUDACC_RTC__)
inline int64_t BlocksFor(int64_t items, int threads) {
  const int64_t per_block = kBlock / threads;
  return (items + per_block - 1) / per_block;
}

inline unsigned GridFor(int64_t blocks) {
  return unsigned(blocks < 1 ? 1 : (blocks < kMaxGrid ? blocks : kMaxGrid));
}

inline bool Aligned(const void* a, const void* b, int64_t C, int V) {
  return reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0 &&
         C % V == 0;
}
#endif  // !__CUDACC_RTC__

}  // namespace gpu
}  // namespace equivtool_xent

#endif  // EQUIVTOOL_CUSTOM_OPS_XENT_XENT_PLAN_H_
