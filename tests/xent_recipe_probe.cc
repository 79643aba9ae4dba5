// The GPU launch recipe (custom_ops/xent_launch.h) run on the host against a
// recording backend: what each recipe launches, with which plan and grid,
// and what workspace it asks for; and the per-stream workspace pool over a
// fake allocator. Built by tests/test_ops_launch_recipe.py with g++; no GPU.

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "xent_launch.h"

namespace gk = ::equivtool_xent::gpu;
namespace ex = ::equivtool_xent;

namespace {

void Describe(std::string* out, const gk::Plan& p) {
  *out += " plan=" + std::to_string(p.threads) + "/" + std::to_string(p.u) + "/" +
          std::to_string(p.chunk) + "/" + std::to_string(p.chunks);
}
template <typename P> void Describe(std::string*, const P&) {}

struct Recorder {
  std::string log;
  std::string fail_workspace;
  std::vector<unsigned> counters;
  std::vector<char> states;

  std::string Workspace(int64_t n, size_t bytes, unsigned** c, void** p) {
    log += "workspace counters=" + std::to_string(n) + " bytes=" + std::to_string(bytes) + "\n";
    if (!fail_workspace.empty()) return fail_workspace;
    counters.assign(size_t(n), 0u);
    states.assign(bytes, 0);
    *c = counters.data();
    *p = states.data();
    return "";
  }

  template <gk::KernelId K, typename S, typename L, int T, typename... P>
  std::string Launch(int64_t blocks, P... params) {
    log += "launch " + gk::KernelKey<K, S, L, T>() + " blocks=" + std::to_string(blocks) +
           " grid=" + std::to_string(gk::GridFor(blocks)) +
           " params=" + std::to_string(sizeof...(P));
    (Describe(&log, params), ...);
    log += "\n";
    return "";
  }
};

template <typename S> std::string Run(const char* recipe, int64_t rows, int64_t C, int exact,
                                      int labels64, const char* fail) {
  typedef typename ex::Storage<S>::acc A;
  Recorder r;
  if (fail != nullptr) r.fail_workspace = fail;
  // 16-byte aligned stand-ins: the recipes never dereference them
  S* x = reinterpret_cast<S*>(uintptr_t(0x100000));
  S* out = reinterpret_cast<S*>(uintptr_t(0x200000));
  A* stats = reinterpret_cast<A*>(uintptr_t(0x300000));
  const std::string name(recipe);
  std::string error;
  if (name == "sparse_forward")
    error = labels64 ? gk::SparseForward(r, x, reinterpret_cast<const int64_t*>(x), rows, C, out, stats, stats)
                     : gk::SparseForward(r, x, reinterpret_cast<const int32_t*>(x), rows, C, out, stats, stats);
  else if (name == "sparse_grad")
    error = gk::SparseGrad(r, x, reinterpret_cast<const int64_t*>(x), rows, C, stats, stats, x, out);
  else if (name == "dense_forward")
    error = gk::DenseForward(r, x, x, rows, C, out, stats, stats);
  else if (name == "dense_grad")
    error = gk::DenseGrad(r, x, x, rows, C, stats, stats, x, exact != 0, out);
  else
    return "unknown recipe " + name;
  return r.log + (error.empty() ? "" : "error " + error + "\n");
}

// The pool over a fake allocator that hands out 0xAB-filled memory and logs.
struct FakeMem {
  typedef int Key;
  std::string* log;
  std::string Alloc(const Key& key, size_t bytes, void** p) const {
    *p = malloc(bytes);
    memset(*p, 0xAB, bytes);
    *log += "alloc key=" + std::to_string(key) + " bytes=" + std::to_string(bytes) + "\n";
    return "";
  }
  std::string Zero(const Key& key, void* p, size_t bytes) const {
    memset(p, 0, bytes);
    *log += "zero key=" + std::to_string(key) + " bytes=" + std::to_string(bytes) + "\n";
    return "";
  }
};

thread_local std::string kept;

}  // namespace

extern "C" {

// dtype: 0 float16, 1 bfloat16, 2 float32, 3 float64. Returns the log.
const char* probe_recipe(const char* recipe, int dtype, int64_t rows, int64_t C, int exact,
                         int labels64, const char* fail_workspace) {
  switch (dtype) {
    case 0: kept = Run<ex::half_bits>(recipe, rows, C, exact, labels64, fail_workspace); break;
    case 1: kept = Run<ex::bf16_bits>(recipe, rows, C, exact, labels64, fail_workspace); break;
    case 2: kept = Run<float>(recipe, rows, C, exact, labels64, fail_workspace); break;
    case 3: kept = Run<double>(recipe, rows, C, exact, labels64, fail_workspace); break;
    default: kept = "unknown dtype";
  }
  return kept.c_str();
}

// threads, u, chunk, chunks of the forward plan (grad = 0) or the gradient's.
void probe_plan(int dtype, int64_t C, int64_t rows, int grad, int64_t out[4]) {
  gk::Plan p;
  switch (dtype) {
    case 0: p = grad ? gk::GradPlanFor<ex::half_bits>(C, rows) : gk::PlanFor<ex::half_bits>(C); break;
    case 1: p = grad ? gk::GradPlanFor<ex::bf16_bits>(C, rows) : gk::PlanFor<ex::bf16_bits>(C); break;
    case 2: p = grad ? gk::GradPlanFor<float>(C, rows) : gk::PlanFor<float>(C); break;
    default: p = grad ? gk::GradPlanFor<double>(C, rows) : gk::PlanFor<double>(C); break;
  }
  out[0] = p.threads;
  out[1] = p.u;
  out[2] = p.chunk;
  out[3] = p.chunks;
}

// Requests (key counters bytes) against one pool; after each, whether the
// counters read zero and whether the states still hold the allocator's fill.
const char* probe_pool(int n, const int* keys, const int64_t* counters, const int64_t* bytes) {
  std::string log;
  gk::WorkspacePool<FakeMem> pool(FakeMem{&log});
  for (int i = 0; i < n; ++i) {
    unsigned* c = nullptr;
    void* s = nullptr;
    const std::string e = pool.Get(keys[i], counters[i], size_t(bytes[i]), &c, &s);
    bool zero = true;
    for (int64_t j = 0; j < counters[i]; ++j) zero = zero && c[j] == 0u;
    log += "get key=" + std::to_string(keys[i]) + " counters_zero=" + (zero ? "1" : "0");
    if (bytes[i] > 0)
      log += std::string(" states_fill=") +
             (static_cast<unsigned char*>(s)[0] == 0xAB ? "1" : "0");
    log += e.empty() ? "\n" : " error " + e + "\n";
    // a launch would leave the counters zero; dirty the states as a launch would
    if (bytes[i] > 0) memset(s, 0x11, size_t(bytes[i]));
  }
  kept = log;
  return kept.c_str();
}

}  // extern "C"
