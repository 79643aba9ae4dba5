// CUDA kernels of equivtool's softmax cross-entropy: device code only, no
// CUDA runtime, TensorFlow or absl headers, so that the same text compiles
// at run time with NVRTC (equivtool/ops/_nvrtc.py; xent_ops.cc launches the
// cubin through the driver API) and, in the GPU harness, with nvcc
// (xent_kernels.cu.cc, whose launchers use the CUDA runtime). Kernels are in a named
// namespace so that NVRTC can name each instantiation.
//
// Determinism. How a row is reduced depends on its length C (and the logits'
// type) only, never on the number of rows, the device or the launch: a
// row is cut into chunks of K elements (one chunk when C <= K), each chunk is
// read by T threads, thread t owning the u * V elements
//     chunk_start + (i * T + t) * V + v,   i < u, v < V
// (V = 16 bytes of logits; elements past C read as -inf, which adds exactly
// zero). PlanFor (xent_plan.h) picks T and u: a warp per row up to 1024 elements
// (2048 for 16-bit types), a 256-thread block up to 8192 (16384), chunks of
// that size beyond (float64: half), whose states the block that completes a
// row's last chunk merges (last_chunk) or, when there are many chunks in all,
// a merge kernel does, in the same order.
// A thread takes the maximum of its elements first and then sums one
// exponential per element in float (double for double logits); the T thread
// states merge in a fixed tree (warp shuffles, then across warps), the chunk
// states of a row in a fixed fold-then-tree. Merges and the final log are in
// double (xent_row.h). No atomics touch a value (a counter only says which
// block merges, never in what order), so every result is bitwise
// reproducible, whatever the stream, the concurrency or the launch order.
// Vector (16-byte) loads are only a way of reading the same elements: rows
// that are not 16-byte aligned read them one by one and give the same bits.
//
// Special values follow TensorFlow's fused kernels: a row holding +inf or
// NaN, or only -inf, gets NaN loss and NaN gradient; a -inf logit elsewhere
// has probability 0. Rows whose label is outside [0, C) get NaN loss and NaN
// gradient, as TensorFlow's GPU kernel gives.
//
// Denormals: built with -ftz=true, like the CPU kernels, which flush them in
// every shard. Exponentials in float paths use the hardware exp2 with a
// correction for the rounding of x * log2(e) (a few ulp; see exp_fast).

#ifndef EQUIVTOOL_CUSTOM_OPS_XENT_XENT_DEVICE_CUH_
#define EQUIVTOOL_CUSTOM_OPS_XENT_XENT_DEVICE_CUH_

#include "xent_plan.h"
#include "xent_row.h"

namespace equivtool_xent {
namespace gpu {

constexpr unsigned kFull = 0xFFFFFFFFu;

// ---------------------------------------------------------------------------
// Exponentials. exp(y) for y <= 0 (or NaN): 2^(y log2 e), with the rounding
// error of the product y * log2(e) put back by one multiply-add. Below
// -87.3 the result would be subnormal and is flushed to zero (as on the CPU).
__device__ __forceinline__ float ex2_approx_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

#if defined(EQUIVTOOL_XENT_GPU_HOST_EXP)
// A measurement build only (benchmarks/gpu, issue 39's CPU-equals-GPU
// question): the CPU kernels' exponential (xent_row.h's exp_nonpos_g; every
// argument here is <= 0 or NaN) in place of the hardware one.
__device__ __forceinline__ float exp_fast(float y) { return exp_nonpos_g<float>(y); }
#else
__device__ __forceinline__ float exp_fast(float y) {
  const float kLog2eHi = 1.44269502162933349609375f;   // float(log2 e)
  const float kLog2eLo = 1.925963033500011079e-8f;    // log2 e - kLog2eHi
  const float kLn2 = 0.693147180559945309f;
  y = y < -104.0f ? -104.0f : y;  // a comparison: NaN stays NaN
  const float t = y * kLog2eHi;
  float lo = __fmaf_rn(y, kLog2eHi, -t);
  lo = __fmaf_rn(y, kLog2eLo, lo);
  const float r = ex2_approx_ftz(t);
  return __fmaf_rn(r, lo * kLn2, r);
}
#endif  // EQUIVTOOL_XENT_GPU_HOST_EXP
__device__ __forceinline__ double exp_fast(double y) { return exp(y); }


// ---------------------------------------------------------------------------
// A thread's elements stay in registers in their storage type (16 bytes per
// group; 16-bit values are widened when used, so a thread can hold 64 of
// them); indices are compile-time constants after unrolling, so nothing goes
// to local memory.
template <typename S> struct Group {
  typedef typename Storage<S>::acc A;
  S s[Shape<S>::V];
  __device__ __forceinline__ A at(int v) const { return Storage<S>::load(s[v]); }
};

template <typename S>
__device__ __forceinline__ void load_group(const S* __restrict__ row, int64_t j, int64_t C,
                                           bool aligned, S pad, Group<S>& g) {
  constexpr int V = Shape<S>::V;
  if (aligned && j + V <= C) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(row + j));
    memcpy(g.s, &raw, sizeof raw);
  } else {
#pragma unroll
    for (int v = 0; v < V; ++v) g.s[v] = j + v < C ? row[j + v] : pad;
  }
}

template <typename S>
__device__ __forceinline__ void store_group(S* __restrict__ row, int64_t j, int64_t C,
                                            bool aligned, const Group<S>& g) {
  constexpr int V = Shape<S>::V;
  if (aligned && j + V <= C) {
    uint4 raw;
    memcpy(&raw, g.s, sizeof raw);
    *reinterpret_cast<uint4*>(row + j) = raw;
  } else {
#pragma unroll
    for (int v = 0; v < V; ++v)
      if (j + v < C) row[j + v] = g.s[v];
  }
}

template <typename S> __device__ __forceinline__ S minus_inf_s() {
  return Storage<S>::store(-Limits<typename Storage<S>::acc>::infinity());
}
template <typename S> __device__ __forceinline__ S zero_s() {
  return Storage<S>::store(typename Storage<S>::acc(0));
}

// ---------------------------------------------------------------------------
// States and their merges. LseState (m, d) comes from xent_row.h; its merge
// is lse_merge's with the GPU exponential (the factors are exp(<= 0); one of
// them is exactly 1). The dense merge widens the maximum's change before
// taking it (an empty state's m = lowest minus a huge finite logit overflows
// in float) and skips it for an empty label sum (0 * -inf would be NaN), so
// a padding thread never turns a row with huge logits into NaN.
template <typename A> using DState = DenseState<A>;  // lse, ysum, yx = sum y (x - m)

template <typename A>
__device__ __forceinline__ void merge(LseState<A>& a, const LseState<A>& b) {
  const A m = max_keep(a.m, b.m);
  a.d = a.d * wide(exp_fast(a.m - m)) + b.d * wide(exp_fast(b.m - m));
  a.m = m;
}

template <typename A>
__device__ __forceinline__ void merge(DState<A>& a, const DState<A>& b) {
  const A m = max_keep(a.lse.m, b.lse.m);
  a.yx = (a.yx + yx_rescale(a.ysum, a.lse.m, m)) + (b.yx + yx_rescale(b.ysum, b.lse.m, m));
  a.ysum = a.ysum + b.ysum;
  merge<A>(a.lse, b.lse);
}

template <typename A> __device__ __forceinline__ void merge(wide& a, const wide& b) { a = a + b; }

template <typename A> __device__ __forceinline__ void empty(LseState<A>& s) { s = lse_empty<A>(); }
template <typename A> __device__ __forceinline__ void empty(DState<A>& s) {
  s.lse = lse_empty<A>(); s.ysum = 0.0; s.yx = 0.0;
}
template <typename A> __device__ __forceinline__ void empty(wide& s) { s = 0.0; }

template <typename A>
__device__ __forceinline__ LseState<A> shfl_down(const LseState<A>& s, int off) {
  LseState<A> o;
  o.m = __shfl_down_sync(kFull, s.m, off);
  o.d = __shfl_down_sync(kFull, s.d, off);
  return o;
}
template <typename A>
__device__ __forceinline__ DState<A> shfl_down(const DState<A>& s, int off) {
  DState<A> o;
  o.lse = shfl_down(s.lse, off);
  o.ysum = __shfl_down_sync(kFull, s.ysum, off);
  o.yx = __shfl_down_sync(kFull, s.yx, off);
  return o;
}
__device__ __forceinline__ wide shfl_down(const wide& s, int off) {
  return __shfl_down_sync(kFull, s, off);
}

// Lane 0 gets the fixed tree ((0,16),(8,24),...) of the warp's states;
// other lanes get values nobody reads.
template <typename A, typename St>
__device__ __forceinline__ void warp_tree(St& s) {
#pragma unroll
  for (int off = kWarp / 2; off > 0; off >>= 1) {
    const St o = shfl_down(s, off);
    merge<A>(s, o);
  }
}

// Threads of one chunk: T = 32 (the warp's lane 0 gets the result) or T =
// 256 (thread 0 of the block gets it). All threads of the group must call.
template <typename A, int T, typename St>
__device__ __forceinline__ void group_tree(St& s) {
  warp_tree<A>(s);
  if constexpr (T == kBlock) {
  __shared__ St warps[kBlock / kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  __syncthreads();  // warps[] may still be read by an earlier call
  if (lane == 0) warps[warp] = s;
  __syncthreads();
  if (warp == 0) {
    if (lane < kBlock / kWarp) s = warps[lane]; else empty<A>(s);
#pragma unroll
    for (int off = kBlock / kWarp / 2; off > 0; off >>= 1) {
      const St o = shfl_down(s, off);
      merge<A>(s, o);
    }
  }
  }
}

// Which (row, chunk) work items a thread serves: T = 32 puts 8 items in a
// block (one per warp), T = 256 one.
template <int T> struct Items {
  static constexpr int kPerBlock = kBlock / T;
  __device__ static int64_t first() { return int64_t(blockIdx.x) * kPerBlock + threadIdx.x / T; }
  __device__ static int64_t stride() { return int64_t(gridDim.x) * kPerBlock; }
  __device__ static int thread() { return threadIdx.x % T; }
};

template <typename L>
__device__ __forceinline__ bool ValidLabel(L label, int64_t classes) {
  return label >= 0 && int64_t(label) < classes;
}

// ---------------------------------------------------------------------------
// One thread's state over its elements of one chunk.
template <typename S, int T>
__device__ __forceinline__ LseState<typename Storage<S>::acc> thread_lse(
    const S* __restrict__ xr, int64_t C, int64_t start, int u, bool aligned) {
  typedef typename Storage<S>::acc A;
  constexpr int V = Shape<S>::V, U = Shape<S>::kMaxU;
  const int t = Items<T>::thread();
  Group<S> g[U];
#pragma unroll
  for (int i = 0; i < U; ++i)
    if (i < u)
      load_group<S>(xr, start + (int64_t(i) * T + t) * V, C, aligned, minus_inf_s<S>(), g[i]);
  A m = Limits<A>::lowest();
#pragma unroll
  for (int i = 0; i < U; ++i)
    if (i < u)
#pragma unroll
      for (int v = 0; v < V; ++v) m = max_keep(m, g[i].at(v));
  A part = A(0);
#pragma unroll
  for (int i = 0; i < U; ++i)
    if (i < u)
#pragma unroll
      for (int v = 0; v < V; ++v) part += exp_fast(g[i].at(v) - m);
  LseState<A> s;
  s.m = m;
  s.d = wide(part);
  return s;
}

template <typename S, int T>
__device__ __forceinline__ DState<typename Storage<S>::acc> thread_dense(
    const S* __restrict__ xr, const S* __restrict__ yr, int64_t C, int64_t start, int u,
    bool aligned) {
  typedef typename Storage<S>::acc A;
  constexpr int V = Shape<S>::V, U = Shape<S>::kMaxU;
  const int t = Items<T>::thread();
  Group<S> g[U], y[U];
#pragma unroll
  for (int i = 0; i < U; ++i)
    if (i < u) {
      const int64_t j = start + (int64_t(i) * T + t) * V;
      load_group<S>(xr, j, C, aligned, minus_inf_s<S>(), g[i]);
      load_group<S>(yr, j, C, aligned, zero_s<S>(), y[i]);
    }
  A m = Limits<A>::lowest();
#pragma unroll
  for (int i = 0; i < U; ++i)
    if (i < u)
#pragma unroll
      for (int v = 0; v < V; ++v) m = max_keep(m, g[i].at(v));
  A part = A(0);
  wide ysum = 0.0, yx = 0.0;
#pragma unroll
  for (int i = 0; i < U; ++i)
    if (i < u) {
      const int64_t j = start + (int64_t(i) * T + t) * V;
#pragma unroll
      for (int v = 0; v < V; ++v) {
        part += exp_fast(g[i].at(v) - m);
        // widened before subtracting (xent_row.h); padding is skipped
        // (0 * -inf would be NaN)
        const bool in = j + v < C;
        yx += in ? yx_term(y[i].at(v), g[i].at(v), m) : 0.0;
        ysum += wide(y[i].at(v));
      }
    }
  DState<A> s;
  s.lse.m = m;
  s.lse.d = wide(part);
  s.ysum = ysum;
  s.yx = yx;
  return s;
}

// The label sum alone, in the forward pass's order (the same per-thread
// order and trees, so it equals the forward's ysum bit for bit).
template <typename S, int T>
__device__ __forceinline__ wide thread_ysum(const S* __restrict__ yr, int64_t C,
                                            int64_t start, int u, bool aligned) {
  typedef typename Storage<S>::acc A;
  constexpr int V = Shape<S>::V, U = Shape<S>::kMaxU;
  const int t = Items<T>::thread();
  Group<S> y[U];
#pragma unroll
  for (int i = 0; i < U; ++i)
    if (i < u) load_group<S>(yr, start + (int64_t(i) * T + t) * V, C, aligned, zero_s<S>(), y[i]);
  wide ysum = 0.0;
#pragma unroll
  for (int i = 0; i < U; ++i)
    if (i < u)
#pragma unroll
      for (int v = 0; v < V; ++v) ysum += wide(y[i].at(v));
  return ysum;
}

// ---------------------------------------------------------------------------
// Row results from a row's merged state.
template <typename S, typename L>
__device__ __forceinline__ void finish_sparse(const S* __restrict__ xr, const L* __restrict__ y,
                                              int64_t row, int64_t C,
                                              const LseState<typename Storage<S>::acc>& s,
                                              S* loss, typename Storage<S>::acc* shift,
                                              typename Storage<S>::acc* log_norm) {
  typedef typename Storage<S>::acc A;
  const RowStats<A> r = finish(s);
  const L label = y[row];
  const A l = ValidLabel(label, C) ? sparse_loss(s, Storage<S>::load(xr[label]))
                                   : Limits<A>::quiet_nan();
  loss[row] = Storage<S>::store(l);
  shift[row] = r.shift;
  log_norm[row] = r.log_norm;
}

template <typename S>
__device__ __forceinline__ void finish_dense(int64_t row, const DState<typename Storage<S>::acc>& s,
                                             S* loss, typename Storage<S>::acc* shift,
                                             typename Storage<S>::acc* log_norm) {
  typedef typename Storage<S>::acc A;
  const RowStats<A> r = finish(s.lse);
  loss[row] = Storage<S>::store(dense_loss(s));
  shift[row] = r.shift;
  log_norm[row] = r.log_norm;
}

// ---------------------------------------------------------------------------
// Rows of several chunks. Each chunk's block writes its state to `part` and
// takes a ticket from the row's counter; the block that takes the last one
// merges the row's states, all of them, in a fixed order: lane l of its first
// warp folds chunks l, l + 32, ... in order, then the warp tree. So the
// merged state depends on the chunk count only, never on which block came
// last, and a forward is one launch. The counter goes back to zero for the
// next launch on the stream (xent_launch.h keeps counters per stream).
// States are read back through L2 (__ldcg): other blocks wrote them during
// this launch, and only the tickets order them.
template <typename A> __device__ __forceinline__ LseState<A> load_cg(const LseState<A>* p) {
  LseState<A> o;
  o.m = __ldcg(&p->m);
  o.d = __ldcg(&p->d);
  return o;
}
template <typename A> __device__ __forceinline__ DState<A> load_cg(const DState<A>* p) {
  DState<A> o;
  o.lse = load_cg<A>(&p->lse);
  o.ysum = __ldcg(&p->ysum);
  o.yx = __ldcg(&p->yx);
  return o;
}
template <typename A> __device__ __forceinline__ wide load_cg(const wide* p) { return __ldcg(p); }

// The fold reads kAhead of a lane's states before merging any (their L2
// round trips overlap: a [1, 1048576] float32 row has 4 per lane); the order
// of the merges is the same.
template <typename A, typename St>
__device__ __forceinline__ St merge_chunks(const St* part, int64_t row, int64_t chunks) {
  constexpr int kAhead = 4;
  const int lane = threadIdx.x % kWarp;
  const St* base = part + row * chunks;
  St s;
  empty<A>(s);
  bool first = true;
  for (int64_t c0 = lane; c0 < chunks; c0 += int64_t(kWarp) * kAhead) {
    St o[kAhead];
#pragma unroll
    for (int k = 0; k < kAhead; ++k) {
      const int64_t c = c0 + int64_t(k) * kWarp;
      if (c < chunks) o[k] = load_cg<A>(base + c); else empty<A>(o[k]);
    }
#pragma unroll
    for (int k = 0; k < kAhead; ++k) {
      if (c0 + int64_t(k) * kWarp >= chunks) break;
      if (first) s = o[k]; else merge<A>(s, o[k]);
      first = false;
    }
  }
  warp_tree<A>(s);
  return s;
}

// A ticket from the row's counter that publishes the state written before it
// and, for the block that takes the last one, sees every other block's
// (acquire-release at GPU scope: sm_70 and later; older GPUs fence fully).
__device__ __forceinline__ unsigned take_ticket(unsigned* counter) {
#if __CUDA_ARCH__ >= 700
  unsigned old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
  return old;
#else
  __threadfence();
  return atomicAdd(counter, 1u);
#endif
}

__device__ __forceinline__ void acquire_fence() {
#if __CUDA_ARCH__ >= 700
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
#else
  __threadfence();
#endif
}

// Called by every thread of a 256-thread block after group_tree, once thread
// 0 has written the chunk's state s to part[item]. True, in every thread, in
// the block that completed the row; its thread 0 then holds the row's merged
// state in s.
template <typename A, typename St>
__device__ __forceinline__ bool last_chunk(St* part, unsigned* counters, int64_t item,
                                           int64_t row, int64_t chunks, St& s) {
  __shared__ unsigned ticket;
  if (threadIdx.x == 0) ticket = take_ticket(counters + row);  // publishes part[item]
  __syncthreads();
  const bool last = ticket == unsigned(chunks - 1);
  __syncthreads();  // ticket is rewritten by the block's next item
  if (!last) return false;
  acquire_fence();  // every other chunk's state, published before its ticket, is seen
  if (threadIdx.x < kWarp) {
    const St merged = merge_chunks<A>(part, row, chunks);
    if (threadIdx.x == 0) {
      s = merged;
      counters[row] = 0u;
    }
  }
  return true;
}

// ---------------------------------------------------------------------------
// Forward: one work item per (row, chunk). With one chunk the item finishes
// the row; otherwise the block completing the row's last chunk does (given
// counters), or SparseMergeKernel / DenseMergeKernel (counters == nullptr).
template <typename S, typename L, int T>
__global__ void __launch_bounds__(kBlock, Shape<S>::kMinBlocksForward)
SparseForwardKernel(const S* __restrict__ x, const L* __restrict__ y, int64_t rows,
                    int64_t C, Plan plan, bool aligned, S* __restrict__ loss,
                    typename Storage<S>::acc* __restrict__ shift,
                    typename Storage<S>::acc* __restrict__ log_norm,
                    LseState<typename Storage<S>::acc>* part, unsigned* counters) {
  typedef typename Storage<S>::acc A;
  const int64_t items = rows * plan.chunks;
  for (int64_t item = Items<T>::first(); item < items; item += Items<T>::stride()) {
    const int64_t row = item / plan.chunks, chunk = item % plan.chunks;
    const S* xr = x + row * C;
    LseState<A> s = thread_lse<S, T>(xr, C, chunk * plan.chunk, plan.u, aligned);
    group_tree<A, T>(s);
    bool done = plan.chunks == 1;
    if constexpr (T == kBlock) {
      if (!done) {  // the row is finished by its last chunk's block, or by SparseMergeKernel
        if (threadIdx.x == 0) part[item] = s;
        if (counters != nullptr) done = last_chunk<A>(part, counters, item, row, plan.chunks, s);
      }
    }
    if (done && Items<T>::thread() == 0) finish_sparse<S, L>(xr, y, row, C, s, loss, shift, log_norm);
  }
}

template <typename S, int T>
__global__ void __launch_bounds__(kBlock)
DenseForwardKernel(const S* __restrict__ x, const S* __restrict__ y, int64_t rows, int64_t C,
                   Plan plan, bool aligned, S* __restrict__ loss,
                   typename Storage<S>::acc* __restrict__ shift,
                   typename Storage<S>::acc* __restrict__ log_norm,
                   DState<typename Storage<S>::acc>* part, unsigned* counters) {
  typedef typename Storage<S>::acc A;
  const int64_t items = rows * plan.chunks;
  for (int64_t item = Items<T>::first(); item < items; item += Items<T>::stride()) {
    const int64_t row = item / plan.chunks, chunk = item % plan.chunks;
    DState<A> s = thread_dense<S, T>(x + row * C, y + row * C, C, chunk * plan.chunk, plan.u,
                                     aligned);
    group_tree<A, T>(s);
    bool done = plan.chunks == 1;
    if constexpr (T == kBlock) {
      if (!done) {  // the row is finished by its last chunk's block, or by DenseMergeKernel
        if (threadIdx.x == 0) part[item] = s;
        if (counters != nullptr) done = last_chunk<A>(part, counters, item, row, plan.chunks, s);
      }
    }
    if (done && Items<T>::thread() == 0) finish_dense<S>(row, s, loss, shift, log_norm);
  }
}

// The label sums of dense rows with several chunks (the exact gradient),
// merged like the forward's states.
template <typename S>
__global__ void __launch_bounds__(kBlock)
LabelSumKernel(const S* __restrict__ y, int64_t rows, int64_t C, Plan plan, bool aligned,
               wide* part, unsigned* counters, wide* __restrict__ ysums) {
  typedef typename Storage<S>::acc A;
  const int64_t items = rows * plan.chunks;
  for (int64_t item = Items<kBlock>::first(); item < items; item += Items<kBlock>::stride()) {
    const int64_t row = item / plan.chunks, chunk = item % plan.chunks;
    wide s = thread_ysum<S, kBlock>(y + row * C, C, chunk * plan.chunk, plan.u, aligned);
    group_tree<A, kBlock>(s);
    if (threadIdx.x == 0) part[item] = s;  // summed here by the last chunk, or by LabelSumMergeKernel
    if (counters != nullptr && last_chunk<A>(part, counters, item, row, plan.chunks, s) &&
        threadIdx.x == 0)
      ysums[row] = s;
  }
}

// The merges as kernels of their own, one warp per row, for rows of several
// chunks when there are many chunks in all (xent_launch.h: FusedMerge): the
// same fold and tree as last_chunk's, so the same bits.
template <typename S, typename L>
__global__ void __launch_bounds__(kBlock)
SparseMergeKernel(const S* __restrict__ x, const L* __restrict__ y, int64_t rows, int64_t C,
                  int64_t chunks, const LseState<typename Storage<S>::acc>* part,
                  S* __restrict__ loss, typename Storage<S>::acc* __restrict__ shift,
                  typename Storage<S>::acc* __restrict__ log_norm) {
  typedef typename Storage<S>::acc A;
  for (int64_t row = Items<kWarp>::first(); row < rows; row += Items<kWarp>::stride()) {
    const LseState<A> s = merge_chunks<A>(part, row, chunks);
    if (threadIdx.x % kWarp == 0) finish_sparse<S, L>(x + row * C, y, row, C, s, loss, shift, log_norm);
  }
}

template <typename S>
__global__ void __launch_bounds__(kBlock)
DenseMergeKernel(int64_t rows, int64_t chunks, const DState<typename Storage<S>::acc>* part,
                 S* __restrict__ loss, typename Storage<S>::acc* __restrict__ shift,
                 typename Storage<S>::acc* __restrict__ log_norm) {
  typedef typename Storage<S>::acc A;
  for (int64_t row = Items<kWarp>::first(); row < rows; row += Items<kWarp>::stride()) {
    const DState<A> s = merge_chunks<A>(part, row, chunks);
    if (threadIdx.x % kWarp == 0) finish_dense<S>(row, s, loss, shift, log_norm);
  }
}

template <typename S>
__global__ void __launch_bounds__(kBlock)
LabelSumMergeKernel(int64_t rows, int64_t chunks, const wide* part, wide* __restrict__ ysums) {
  typedef typename Storage<S>::acc A;
  for (int64_t row = Items<kWarp>::first(); row < rows; row += Items<kWarp>::stride()) {
    const wide s = merge_chunks<A>(part, row, chunks);
    if (threadIdx.x % kWarp == 0) ysums[row] = s;
  }
}

// ---------------------------------------------------------------------------
// Gradients: element-wise over the same work items.
//   sparse: dx_j = g * (p_j - [j == label]),  dense: dx_j = g * (ysum * p_j - y_j)
// with p_j = exp((x_j - shift) - log_norm). An invalid label makes the row NaN.
template <typename S, typename L, int T>
__global__ void __launch_bounds__(kBlock, Shape<S>::kMinBlocksGrad)
SparseGradKernel(const S* __restrict__ x, const L* __restrict__ y, int64_t rows, int64_t C,
                 Plan plan, bool aligned, const typename Storage<S>::acc* __restrict__ shift,
                 const typename Storage<S>::acc* __restrict__ log_norm,
                 const S* __restrict__ grad_loss, S* __restrict__ dx) {
  typedef typename Storage<S>::acc A;
  constexpr int V = Shape<S>::V, U = Shape<S>::kMaxU;
  const int t = Items<T>::thread();
  const int64_t items = rows * plan.chunks;
  for (int64_t item = Items<T>::first(); item < items; item += Items<T>::stride()) {
    const int64_t row = item / plan.chunks, chunk = item % plan.chunks;
    const L label = y[row];
    const bool valid = ValidLabel(label, C);
    const A g = Storage<S>::load(grad_loss[row]);
    const A sh = shift[row], ln = log_norm[row];
    const S* xr = x + row * C;
    S* out = dx + row * C;
    const int64_t start = chunk * plan.chunk;
    Group<S> v[U];
#pragma unroll
    for (int i = 0; i < U; ++i)
      if (i < plan.u)
        load_group<S>(xr, start + (int64_t(i) * T + t) * V, C, aligned, zero_s<S>(), v[i]);
#pragma unroll
    for (int i = 0; i < U; ++i)
      if (i < plan.u) {
        const int64_t j = start + (int64_t(i) * T + t) * V;
        if (j >= C) continue;
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const A p = exp_fast((v[i].at(e) - sh) - ln);
          const A d = j + e == int64_t(label) ? g * (p - A(1)) : g * p;
          v[i].s[e] = Storage<S>::store(valid ? d : Limits<A>::quiet_nan());
        }
        store_group<S>(out, j, C, aligned, v[i]);
      }
  }
}

// TensorFlow's gradient uses ysum = 1 (softmax - labels); with exact_gradient
// ysum is the row's label sum: from LabelSumKernel (ysums), or, when
// the row is one chunk (ysums == nullptr), summed by the item itself in the
// same order.
template <typename S, int T>
__global__ void __launch_bounds__(kBlock)
DenseGradKernel(const S* __restrict__ x, const S* __restrict__ y, int64_t rows, int64_t C,
                Plan plan, bool aligned, bool exact_gradient, const wide* __restrict__ ysums,
                const typename Storage<S>::acc* __restrict__ shift,
                const typename Storage<S>::acc* __restrict__ log_norm,
                const S* __restrict__ grad_loss, S* __restrict__ dx) {
  typedef typename Storage<S>::acc A;
  constexpr int V = Shape<S>::V, U = Shape<S>::kMaxU;
  const int t = Items<T>::thread();
  const int64_t items = rows * plan.chunks;
  for (int64_t item = Items<T>::first(); item < items; item += Items<T>::stride()) {
    const int64_t row = item / plan.chunks, chunk = item % plan.chunks;
    const S* xr = x + row * C;
    const S* yr = y + row * C;
    S* out = dx + row * C;
    const int64_t start = chunk * plan.chunk;
    A ysum;
    if (!exact_gradient) {
      ysum = A(1);
    } else if (ysums != nullptr) {
      ysum = A(ysums[row]);
    } else {
      wide s = thread_ysum<S, T>(yr, C, start, plan.u, aligned);
      group_tree<A, T>(s);
      if constexpr (T == kWarp) {
        s = __shfl_sync(kFull, s, 0);
      } else {
        __shared__ wide total;
        if (threadIdx.x == 0) total = s;
        __syncthreads();
        s = total;
        __syncthreads();  // total is rewritten by the next item
      }
      ysum = A(s);
    }
    const A g = Storage<S>::load(grad_loss[row]);
    const A sh = shift[row], ln = log_norm[row];
    Group<S> v[U], w[U];
#pragma unroll
    for (int i = 0; i < U; ++i)
      if (i < plan.u) {
        const int64_t j = start + (int64_t(i) * T + t) * V;
        load_group<S>(xr, j, C, aligned, zero_s<S>(), v[i]);
        load_group<S>(yr, j, C, aligned, zero_s<S>(), w[i]);
      }
#pragma unroll
    for (int i = 0; i < U; ++i)
      if (i < plan.u) {
        const int64_t j = start + (int64_t(i) * T + t) * V;
        if (j >= C) continue;
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const A p = exp_fast((v[i].at(e) - sh) - ln);
          v[i].s[e] = Storage<S>::store(g * (ysum * p - w[i].at(e)));
        }
        store_group<S>(out, j, C, aligned, v[i]);
      }
  }
}


}  // namespace gpu
}  // namespace equivtool_xent

#endif  // EQUIVTOOL_CUSTOM_OPS_XENT_XENT_DEVICE_CUH_
