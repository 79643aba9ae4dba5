// The CUDA driver API, opened at run time, for the kernels NVRTC compiled
// (equivtool/ops/_nvrtc.py hands their cubins over; xent_ops.cc launches).
//
// No CUDA header and no CUDA runtime: the op library links nothing of CUDA,
// so it builds with a C++ compiler alone and loads on machines without a
// driver; Api().error then says why the GPU kernels are not enabled. The
// declarations below are the driver's stable C ABI (cuda.h, CUDA 12).
//
// What is launched, and in what order, is xent_launch.h's recipe (the same as
// the CUDA-runtime launchers'); DriverBackend below is how this API launches
// one kernel and where a stream's workspace comes from.
//
// Contexts: a kernel runs in the context that owns its operands, found from
// the logits' device pointer (CU_POINTER_ATTRIBUTE_CONTEXT): TensorFlow's
// primary context of the op's device, whatever context is current on the
// calling thread. It is pushed for the module load and the launch, then
// popped. Modules are loaded once per (context, cubin) and kept for the
// process's life, as TensorFlow keeps its own.

#ifndef EQUIVTOOL_CUSTOM_OPS_XENT_XENT_DRIVER_H_
#define EQUIVTOOL_CUSTOM_OPS_XENT_XENT_DRIVER_H_

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "xent_launch.h"

namespace equivtool_xent {
namespace driver {

typedef int CUresult;  // 0: CUDA_SUCCESS
typedef int CUdevice;
typedef struct CUctx_st* CUcontext;
typedef struct CUmod_st* CUmodule;
typedef struct CUfunc_st* CUfunction;
typedef struct CUstream_st* CUstream;
typedef unsigned long long CUdeviceptr;  // NOLINT: the driver's own type

constexpr int kPointerAttributeContext = 1;        // CU_POINTER_ATTRIBUTE_CONTEXT
constexpr int kComputeCapabilityMajor = 75;        // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kComputeCapabilityMinor = 76;        // ..._MINOR
constexpr unsigned kStreamNonBlocking = 1;         // CU_STREAM_NON_BLOCKING
constexpr int kCaptureModeRelaxed = 2;             // CU_STREAM_CAPTURE_MODE_RELAXED

struct Api {
  std::string error;  // empty when every entry point below was found
  int version = 0;    // cuDriverGetVersion: 12040 for CUDA 12.4
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuPointerGetAttribute)(void*, int, CUdeviceptr);
  CUresult (*cuCtxPushCurrent)(CUcontext);
  CUresult (*cuCtxPopCurrent)(CUcontext*);
  CUresult (*cuCtxGetDevice)(CUdevice*);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void**, void**);
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*cuStreamCreate)(CUstream*, unsigned);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuStreamDestroy)(CUstream);
  CUresult (*cuThreadExchangeStreamCaptureMode)(int*);
};

template <typename F>
bool Resolve(void* lib, const char* name, F* out, std::string* error) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  if (*out == nullptr && error->empty()) error->assign(std::string("libcuda has no ") + name);
  return *out != nullptr;
}

// libcuda.so.1 (EQUIVTOOL_LIBCUDA names another file, for tests), opened once.
inline const Api& GetApi() {
  static const Api* api = [] {
    Api* a = new Api();
    const char* path = std::getenv("EQUIVTOOL_LIBCUDA");
    if (path == nullptr || *path == '\0') path = "libcuda.so.1";
    void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      a->error = std::string("no NVIDIA driver: cannot open ") + path + " (" +
                 (why ? why : "unknown error") + ")";
      return a;
    }
    Resolve(lib, "cuInit", &a->cuInit, &a->error);
    Resolve(lib, "cuDriverGetVersion", &a->cuDriverGetVersion, &a->error);
    Resolve(lib, "cuGetErrorString", &a->cuGetErrorString, &a->error);
    Resolve(lib, "cuPointerGetAttribute", &a->cuPointerGetAttribute, &a->error);
    Resolve(lib, "cuCtxPushCurrent_v2", &a->cuCtxPushCurrent, &a->error);
    Resolve(lib, "cuCtxPopCurrent_v2", &a->cuCtxPopCurrent, &a->error);
    Resolve(lib, "cuCtxGetDevice", &a->cuCtxGetDevice, &a->error);
    Resolve(lib, "cuDeviceGetAttribute", &a->cuDeviceGetAttribute, &a->error);
    Resolve(lib, "cuModuleLoadData", &a->cuModuleLoadData, &a->error);
    Resolve(lib, "cuModuleGetFunction", &a->cuModuleGetFunction, &a->error);
    Resolve(lib, "cuLaunchKernel", &a->cuLaunchKernel, &a->error);
    Resolve(lib, "cuMemAlloc_v2", &a->cuMemAlloc, &a->error);
    Resolve(lib, "cuMemsetD8Async", &a->cuMemsetD8Async, &a->error);
    Resolve(lib, "cuStreamCreate", &a->cuStreamCreate, &a->error);
    Resolve(lib, "cuStreamSynchronize", &a->cuStreamSynchronize, &a->error);
    Resolve(lib, "cuStreamDestroy_v2", &a->cuStreamDestroy, &a->error);
    Resolve(lib, "cuThreadExchangeStreamCaptureMode", &a->cuThreadExchangeStreamCaptureMode,
            &a->error);
    if (a->error.empty() && a->cuInit(0) != 0) a->error = "cuInit failed: no usable NVIDIA GPU";
    if (a->error.empty() && a->cuDriverGetVersion(&a->version) != 0)
      a->error = "cuDriverGetVersion failed";
    return a;
  }();
  return *api;
}

inline std::string ErrorText(CUresult r, const char* what) {
  const char* text = nullptr;
  if (GetApi().cuGetErrorString == nullptr || GetApi().cuGetErrorString(r, &text) != 0)
    text = nullptr;
  return std::string(what) + " failed: " + (text ? text : "CUDA error " + std::to_string(r));
}

// The cubins handed over by Python, by architecture (major * 10 + minor).
struct Image {
  std::string cubin;
  std::map<std::string, std::string> names;  // kernel key -> lowered name
};

struct Registry {
  std::mutex mu;
  std::map<int, std::vector<std::unique_ptr<Image>>> images;
  std::map<std::pair<CUcontext, const Image*>, CUmodule> modules;
  std::map<std::pair<CUcontext, std::string>, CUfunction> functions;
};

inline Registry& GetRegistry() {
  static Registry* r = new Registry();  // never destroyed: kernels may run at exit
  return *r;
}

// `names` is "key=lowered\n" lines. Returns the number of kernels, or -1.
inline int AddImage(int arch, const void* data, size_t size, const char* names) {
  std::unique_ptr<Image> image(new Image());
  image->cubin.assign(static_cast<const char*>(data), size);
  const std::string text(names);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    const size_t eq = line.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == line.size()) return -1;
    image->names[line.substr(0, eq)] = line.substr(eq + 1);
    pos = end + 1;
  }
  if (image->names.empty() || size == 0) return -1;
  const int count = static_cast<int>(image->names.size());
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.images[arch].push_back(std::move(image));
  return count;
}

// Pushes `ctx` for the scope; pops it on every exit.
class ScopedContext {
 public:
  explicit ScopedContext(CUcontext ctx) : ok_(GetApi().cuCtxPushCurrent(ctx) == 0) {}
  ~ScopedContext() {
    CUcontext popped;
    if (ok_) GetApi().cuCtxPopCurrent(&popped);
  }
  bool ok() const { return ok_; }

 private:
  bool ok_;
};

// The kernel `key` in the context owning `device_ptr`. Returns "" or the error.
inline std::string Function(const void* device_ptr, const std::string& key, CUcontext* ctx,
                            CUfunction* out) {
  const Api& api = GetApi();
  if (!api.error.empty()) return api.error;
  CUresult e = api.cuPointerGetAttribute(ctx, kPointerAttributeContext,
                                         reinterpret_cast<CUdeviceptr>(device_ptr));
  if (e != 0) return ErrorText(e, "cuPointerGetAttribute(CONTEXT)");
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto found = r.functions.find({*ctx, key});
  if (found != r.functions.end()) {
    *out = found->second;
    return "";
  }
  ScopedContext scope(*ctx);
  if (!scope.ok()) return "cuCtxPushCurrent failed";
  CUdevice device;
  int major = 0, minor = 0;
  if ((e = api.cuCtxGetDevice(&device)) != 0) return ErrorText(e, "cuCtxGetDevice");
  if ((e = api.cuDeviceGetAttribute(&major, kComputeCapabilityMajor, device)) != 0 ||
      (e = api.cuDeviceGetAttribute(&minor, kComputeCapabilityMinor, device)) != 0)
    return ErrorText(e, "cuDeviceGetAttribute(COMPUTE_CAPABILITY)");
  const int arch = major * 10 + minor;
  for (const auto& image : r.images[arch]) {
    auto name = image->names.find(key);
    if (name == image->names.end()) continue;
    CUmodule& module = r.modules[{*ctx, image.get()}];
    if (module == nullptr && (e = api.cuModuleLoadData(&module, image->cubin.data())) != 0) {
      module = nullptr;
      return ErrorText(e, "cuModuleLoadData");
    }
    if ((e = api.cuModuleGetFunction(out, module, name->second.c_str())) != 0)
      return ErrorText(e, ("cuModuleGetFunction(" + key + ")").c_str());
    r.functions[{*ctx, key}] = *out;
    return "";
  }
  return "no compiled kernel " + key + " for sm_" + std::to_string(arch) +
         " (equivtool compiles the kernels for the GPUs visible when the op library loads)";
}

// One launch of `threads` per block and `grid` blocks on `stream`.
inline std::string Launch(CUcontext ctx, CUfunction f, unsigned grid, unsigned threads,
                          void* stream, void** params) {
  ScopedContext scope(ctx);
  if (!scope.ok()) return "cuCtxPushCurrent failed";
  const CUresult e = GetApi().cuLaunchKernel(f, grid, 1, 1, threads, 1, 1, 0,
                                             static_cast<CUstream>(stream), params, nullptr);
  return e == 0 ? "" : ErrorText(e, "cuLaunchKernel");
}

// Lets this thread allocate while some stream is being captured into a graph.
class RelaxedCapture {
 public:
  RelaxedCapture() : mode_(kCaptureModeRelaxed) { GetApi().cuThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCapture() { GetApi().cuThreadExchangeStreamCaptureMode(&mode_); }

 private:
  int mode_;
};

// Workspace memory for xent_launch.h's pool, keyed by (context, stream):
// allocated in that context, zeroed on a stream of its own and waited for.
struct DriverMem {
  typedef std::pair<CUcontext, CUstream> Key;
  std::string Alloc(const Key& key, size_t bytes, void** p) const {
    ScopedContext scope(key.first);
    if (!scope.ok()) return "cuCtxPushCurrent failed";
    RelaxedCapture relaxed;
    CUdeviceptr ptr = 0;
    const CUresult e = GetApi().cuMemAlloc(&ptr, bytes);
    if (e != 0) return ErrorText(e, "cuMemAlloc(workspace)");
    *p = reinterpret_cast<void*>(ptr);
    return "";
  }
  std::string Zero(const Key& key, void* p, size_t bytes) const {
    const Api& api = GetApi();
    ScopedContext scope(key.first);
    if (!scope.ok()) return "cuCtxPushCurrent failed";
    RelaxedCapture relaxed;
    CUstream side = nullptr;
    CUresult e = api.cuStreamCreate(&side, kStreamNonBlocking);
    if (e != 0) return ErrorText(e, "cuStreamCreate(workspace)");
    e = api.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(p), 0, bytes, side);
    if (e == 0) e = api.cuStreamSynchronize(side);
    api.cuStreamDestroy(side);
    return e == 0 ? "" : ErrorText(e, "zeroing the workspace");
  }
};

inline gpu::WorkspacePool<DriverMem>& Pool() {
  static gpu::WorkspacePool<DriverMem>* pool = new gpu::WorkspacePool<DriverMem>(DriverMem());
  return *pool;  // never destroyed: kernels may run at exit
}

// xent_launch.h's Backend: launches on `stream` in the context owning
// `operand` (a device buffer of the call with at least one element). State
// buffers come from the pool, or from `states` when one is given (the op
// takes them from TensorFlow's allocator); counters always from the pool.
class DriverBackend {
 public:
  typedef std::string (*StatesFn)(void* arg, size_t bytes, void** out);

  DriverBackend(void* stream, const void* operand, StatesFn states = nullptr,
                void* states_arg = nullptr)
      : stream_(stream), operand_(operand), states_(states), states_arg_(states_arg) {}

  std::string Workspace(int64_t counters, size_t bytes, unsigned** c, void** p) {
    const Api& api = GetApi();
    if (!api.error.empty()) return api.error;
    CUcontext ctx = nullptr;
    const CUresult e = api.cuPointerGetAttribute(&ctx, kPointerAttributeContext,
                                                 reinterpret_cast<CUdeviceptr>(operand_));
    if (e != 0) return ErrorText(e, "cuPointerGetAttribute(CONTEXT)");
    const DriverMem::Key key(ctx, static_cast<CUstream>(stream_));
    if (states_ == nullptr) return Pool().Get(key, counters, bytes, c, p);
    std::string error = Pool().Get(key, counters, 0, c, nullptr);
    return error.empty() ? states_(states_arg_, bytes, p) : error;
  }

  template <gpu::KernelId K, typename S, typename L, int T, typename... P>
  std::string Launch(int64_t blocks, P... params) {
    void* args[] = {static_cast<void*>(&params)...};
    const std::string key = gpu::KernelKey<K, S, L, T>();
    CUcontext ctx = nullptr;
    CUfunction f = nullptr;
    std::string error = Function(operand_, key, &ctx, &f);
    if (error.empty())
      error = driver::Launch(ctx, f, gpu::GridFor(blocks), gpu::kBlock, stream_, args);
    return error.empty() ? error : "launching " + key + " failed: " + error;
  }

 private:
  void* stream_;
  const void* operand_;
  StatesFn states_;
  void* states_arg_;
};

}  // namespace driver
}  // namespace equivtool_xent

#endif  // EQUIVTOOL_CUSTOM_OPS_XENT_XENT_DRIVER_H_
