// The launch recipe of the CUDA kernels (xent_device.cuh), written once for
// every way they are launched:
//
//   - the CUDA runtime (xent_kernels.cu.cc, built by nvcc: the standalone
//     harness's "runtime" library);
//   - the driver API with NVRTC cubins (xent_driver.h: the op library's
//     run-time GPU kernels in xent_ops.cc, and the harness's "driver" library,
//     benchmarks/gpu/xent_capi_driver.cc).
//
// A recipe is a function template over a Backend, which supplies two things:
//
//   std::string Workspace(int64_t counters, size_t bytes, unsigned** c, void** p)
//       `counters` uint32 that are zero when the launches start (the kernels
//       leave them zero again) and `bytes` of scratch, both alive until the
//       launches that follow on the backend's stream have finished;
//   template <KernelId K, typename S, typename L, int T, typename... P>
//   std::string Launch(int64_t blocks, P... params)
//       one launch of kernel K<S, L, T> over GridFor(blocks) blocks of kBlock
//       threads on the backend's stream.
//
// Each returns "" or the error. Kernels are named by KernelId and the same
// three template arguments (L = void and T = 0 where a kernel has none): the
// runtime backend maps them to the kernel functions (and static_asserts the
// parameter types below against the kernels' own), the driver backend to the
// keys NVRTC's cubins are looked up by (KernelKey; _nvrtc.kernel_names
// spells the same keys). The parameter lists below are the kernels' own, in
// order: a driver launch passes their addresses as they are.
//
// No CUDA or TensorFlow header: compiled by g++ and nvcc, never by NVRTC.

#ifndef EQUIVTOOL_CUSTOM_OPS_XENT_XENT_LAUNCH_H_
#define EQUIVTOOL_CUSTOM_OPS_XENT_XENT_LAUNCH_H_

#include <stddef.h>
#include <stdint.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "xent_plan.h"
#include "xent_row.h"

namespace equivtool_xent {
namespace gpu {

enum class KernelId {
  SparseForward, SparseMerge, SparseGrad, DenseForward, DenseMerge, DenseGrad, LabelSum,
  LabelSumMerge
};

template <typename S> const char* TypeName();
template <> inline const char* TypeName<half_bits>() { return "float16"; }
template <> inline const char* TypeName<bf16_bits>() { return "bfloat16"; }
template <> inline const char* TypeName<float>() { return "float32"; }
template <> inline const char* TypeName<double>() { return "float64"; }

template <typename L> inline const char* LabelName() { return sizeof(L) == 4 ? "int32" : "int64"; }
template <> inline const char* LabelName<void>() { return nullptr; }

inline const char* KernelName(KernelId k) {
  switch (k) {
    case KernelId::SparseForward: return "SparseForward";
    case KernelId::SparseMerge: return "SparseMerge";
    case KernelId::SparseGrad: return "SparseGrad";
    case KernelId::DenseForward: return "DenseForward";
    case KernelId::DenseMerge: return "DenseMerge";
    case KernelId::DenseGrad: return "DenseGrad";
    case KernelId::LabelSum: return "LabelSum";
    case KernelId::LabelSumMerge: return "LabelSumMerge";
  }
  return "?";
}

// "SparseForward:float32:int64:32", "DenseGrad:bfloat16:256", "LabelSum:float16".
template <KernelId K, typename S, typename L, int T> std::string KernelKey() {
  std::string key = std::string(KernelName(K)) + ":" + TypeName<S>();
  if (const char* label = LabelName<L>()) key += std::string(":") + label;
  if (T != 0) key += ":" + std::to_string(T);
  return key;
}

// nullptr, or the error kept for a C caller (per thread, until its next error).
inline const char* ErrorOrNull(const std::string& error) {
  if (error.empty()) return nullptr;
  thread_local std::string kept;
  kept = error;
  return kept.c_str();
}

// ---------------------------------------------------------------------------
// The recipes. Rows of several chunks (plan.chunks > 1) write per-chunk
// states, which are merged in a fixed order (xent_device.cuh, merge_chunks)
// either by the block that completes a row's last chunk, counted by per-row
// counters (last_chunk: no second launch), or by a merge kernel. Both give
// the same bits. Which is faster was measured (benchmarks/RESULTS.md, H200):
// a ticket keeps a block's slot about a microsecond longer, a launch costs
// a few; so the chunk pass merges itself when its chunks fill at most a
// couple of waves ([1, 1048576]: 128; [1024, 32000] float32: 4096 do not).
constexpr int64_t kFusedMergeMaxItems = 2048;
inline bool FusedMerge(int64_t items) { return items < kFusedMergeMaxItems; }

// The chunk pass of either forward (kernel K; LK its label type, void for
// dense): its plan, and the chunk states a merge kernel must finish, or
// nullptr when none must (one chunk a row, or the pass merges itself).
template <KernelId K, typename LK, typename St, typename B, typename S, typename Y>
std::string ChunkPass(B& b, const S* x, const Y* y, bool aligned, int64_t rows, int64_t C,
                      S* loss, typename Storage<S>::acc* shift,
                      typename Storage<S>::acc* log_norm, Plan* plan_out, const St** to_merge) {
  const Plan plan = PlanFor<S>(C);
  const int64_t items = rows * plan.chunks;
  const bool fused = FusedMerge(items);
  *plan_out = plan;
  *to_merge = nullptr;
  unsigned* counters = nullptr;
  St* part = nullptr;
  if (plan.chunks > 1) {
    void* p = nullptr;
    std::string e = b.Workspace(fused ? rows : 0, sizeof(St) * size_t(items), &counters, &p);
    if (!e.empty()) return e;
    part = static_cast<St*>(p);
    if (!fused) counters = nullptr;
  }
  std::string e =
      plan.threads == kWarp
          ? b.template Launch<K, S, LK, kWarp>(BlocksFor(items, kWarp), x, y, rows, C, plan,
                                               aligned, loss, shift, log_norm, part, counters)
          : b.template Launch<K, S, LK, kBlock>(BlocksFor(items, kBlock), x, y, rows, C, plan,
                                                aligned, loss, shift, log_norm, part, counters);
  if (e.empty() && plan.chunks > 1 && !fused) *to_merge = part;
  return e;
}

template <typename B, typename S, typename L>
std::string SparseForward(B& b, const S* x, const L* y, int64_t rows, int64_t C, S* loss,
                          typename Storage<S>::acc* shift, typename Storage<S>::acc* log_norm) {
  if (rows <= 0) return "";
  Plan plan;
  const LseState<typename Storage<S>::acc>* states = nullptr;
  std::string e = ChunkPass<KernelId::SparseForward, L>(
      b, x, y, Aligned(x, x, C, Shape<S>::V), rows, C, loss, shift, log_norm, &plan, &states);
  if (!e.empty() || states == nullptr) return e;
  return b.template Launch<KernelId::SparseMerge, S, L, 0>(
      BlocksFor(rows, kWarp), x, y, rows, C, plan.chunks, states, loss, shift, log_norm);
}

template <typename B, typename S, typename L>
std::string SparseGrad(B& b, const S* x, const L* y, int64_t rows, int64_t C,
                       const typename Storage<S>::acc* shift,
                       const typename Storage<S>::acc* log_norm, const S* grad_loss, S* dx) {
  if (rows <= 0 || C <= 0) return "";
  const Plan plan = GradPlanFor<S>(C, rows);
  const bool aligned = Aligned(x, dx, C, Shape<S>::V);
  const int64_t items = rows * plan.chunks;
  if (plan.threads == kWarp)
    return b.template Launch<KernelId::SparseGrad, S, L, kWarp>(
        BlocksFor(items, kWarp), x, y, rows, C, plan, aligned, shift, log_norm, grad_loss, dx);
  return b.template Launch<KernelId::SparseGrad, S, L, kBlock>(
      BlocksFor(items, kBlock), x, y, rows, C, plan, aligned, shift, log_norm, grad_loss, dx);
}

template <typename B, typename S>
std::string DenseForward(B& b, const S* x, const S* y, int64_t rows, int64_t C, S* loss,
                         typename Storage<S>::acc* shift, typename Storage<S>::acc* log_norm) {
  if (rows <= 0) return "";
  Plan plan;
  const DenseState<typename Storage<S>::acc>* states = nullptr;
  std::string e = ChunkPass<KernelId::DenseForward, void>(
      b, x, y, Aligned(x, y, C, Shape<S>::V), rows, C, loss, shift, log_norm, &plan, &states);
  if (!e.empty() || states == nullptr) return e;
  return b.template Launch<KernelId::DenseMerge, S, void, 0>(
      BlocksFor(rows, kWarp), rows, plan.chunks, states, loss, shift, log_norm);
}

// exact: the gradient g * (ysum p - y) with the row's label sum; rows of
// several chunks get their sums from LabelSum first (one launch, its chunks
// merged like the forward's).
template <typename B, typename S>
std::string DenseGrad(B& b, const S* x, const S* y, int64_t rows, int64_t C,
                      const typename Storage<S>::acc* shift,
                      const typename Storage<S>::acc* log_norm, const S* grad_loss, bool exact,
                      S* dx) {
  if (rows <= 0 || C <= 0) return "";
  const Plan plan = PlanFor<S>(C);
  const bool aligned = Aligned(x, y, C, Shape<S>::V) && Aligned(dx, dx, C, Shape<S>::V);
  const int64_t items = rows * plan.chunks;
  const wide* ysums_in = nullptr;
  if (exact && plan.chunks > 1) {
    const bool fused = FusedMerge(items);
    unsigned* counters = nullptr;
    void* p = nullptr;
    std::string e = b.Workspace(fused ? rows : 0, sizeof(wide) * size_t(items + rows), &counters, &p);
    if (!e.empty()) return e;
    if (!fused) counters = nullptr;
    wide* part = static_cast<wide*>(p);
    wide* ysums = part + items;
    e = b.template Launch<KernelId::LabelSum, S, void, 0>(BlocksFor(items, kBlock), y, rows, C,
                                                           plan, aligned, part, counters, ysums);
    if (e.empty() && !fused) {
      const wide* sums = part;
      e = b.template Launch<KernelId::LabelSumMerge, S, void, 0>(BlocksFor(rows, kWarp), rows,
                                                                 plan.chunks, sums, ysums);
    }
    if (!e.empty()) return e;
    ysums_in = ysums;
  }
  // the label sums above follow the forward's partition (their bits are the
  // forward's); the gradient's own elements may be dealt more finely
  const Plan grad = GradPlanFor<S>(C, rows);
  const int64_t grad_items = rows * grad.chunks;
  if (grad.threads == kWarp)
    return b.template Launch<KernelId::DenseGrad, S, void, kWarp>(
        BlocksFor(grad_items, kWarp), x, y, rows, C, grad, aligned, exact, ysums_in, shift,
        log_norm, grad_loss, dx);
  return b.template Launch<KernelId::DenseGrad, S, void, kBlock>(
      BlocksFor(grad_items, kBlock), x, y, rows, C, grad, aligned, exact, ysums_in, shift,
      log_norm, grad_loss, dx);
}

// ---------------------------------------------------------------------------
// Workspaces kept per stream: a counter buffer, zeroed once when allocated
// and left zero by the kernels, and a state buffer, never read before a
// launch writes it; so a launch needs no allocation, no memset and no free.
// One stream's launches run one after another, so they can share them; two
// streams never do. Growth allocates a larger buffer (at least twice the
// size) and keeps the old one, which launches in flight may still use, until
// the process ends: at most the final size again. A graph captured from a
// stream replays with that stream's buffers: two such graphs must not be
// replayed at once on different streams (their launches would share them).
//
// Mem supplies: typedef Key (the stream and what owns it); std::string
// Alloc(const Key&, size_t, void**) and std::string Zero(const Key&, void*,
// size_t), each safe while the stream is being captured into a graph, Zero
// done on return.
template <typename Mem>
class WorkspacePool {
 public:
  explicit WorkspacePool(Mem mem) : mem_(mem) {}

  // At least `counters` zero uint32 and `bytes` of state buffer for `key`
  // (no state buffer when bytes is 0).
  std::string Get(const typename Mem::Key& key, int64_t counters, size_t bytes, unsigned** c,
                  void** states) {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = entries_[key];
    void* p = nullptr;
    std::string err = Grow(key, &e.counters, sizeof(unsigned) * size_t(counters), true, &p);
    if (!err.empty()) return err;
    *c = static_cast<unsigned*>(p);
    if (bytes == 0) return "";
    return Grow(key, &e.states, bytes, false, states);
  }

 private:
  struct Buffer {
    void* ptr = nullptr;
    size_t size = 0;
  };
  struct Entry {
    Buffer counters, states;
  };

  std::string Grow(const typename Mem::Key& key, Buffer* b, size_t bytes, bool zero, void** out) {
    if (b->size < bytes) {
      size_t size = bytes < 2 * b->size ? 2 * b->size : bytes;
      size = (size + 4095) / 4096 * 4096;
      void* p = nullptr;
      std::string err = mem_.Alloc(key, size, &p);
      if (err.empty() && zero) err = mem_.Zero(key, p, size);
      if (!err.empty()) return err;
      if (b->ptr != nullptr) retired_.push_back(b->ptr);
      b->ptr = p;
      b->size = size;
    }
    *out = b->ptr;
    return "";
  }

  Mem mem_;
  std::mutex mu_;
  std::map<typename Mem::Key, Entry> entries_;
  std::vector<void*> retired_;
};

}  // namespace gpu
}  // namespace equivtool_xent

#endif  // EQUIVTOOL_CUSTOM_OPS_XENT_XENT_LAUNCH_H_
