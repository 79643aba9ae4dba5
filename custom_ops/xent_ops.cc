// equivtool's softmax cross-entropy ops: registrations, CPU kernels, and the
// host side of the GPU kernels (the CUDA code is xent_device.cuh, compiled by
// NVRTC at run time and launched through the driver API: xent_driver.h).
//
//   EquivtoolSparseXent(logits [B,C], labels [B])    -> loss [B], shift [B], log_norm [B]
//   EquivtoolSparseXentGrad(logits, labels, shift, log_norm, grad_loss [B]) -> dlogits [B,C]
//   EquivtoolXent(logits [B,C], labels [B,C])        -> loss [B], shift [B], log_norm [B]
//   EquivtoolXentGrad(logits, labels, shift, log_norm, grad_loss [B])       -> dlogits [B,C]
//     dlogits = (softmax(logits) - labels) * grad_loss, TensorFlow's gradient,
//     or with exact_gradient=true (sum(labels) * softmax(logits) - labels) *
//     grad_loss, the derivative of the loss when label rows do not sum to 1.
//   EquivtoolSparseXentFused(logits [B,C], labels [B]) -> loss [B], backprop [B,C] (CPU)
//   EquivtoolSparseXentScale(backprop, grad_loss [B], logits, labels) -> dlogits [B,C] (CPU)
//     The training step's path on the CPU: one exponential per element. The
//     fused forward writes backprop = softmax(logits) - onehot(labels) in Tacc
//     while it has the exponentials (as TensorFlow's fused kernel writes its
//     backprop); the scale op multiplies each row by its grad_loss, giving the
//     bits EquivtoolSparseXentGrad gives (logits and labels are its inputs only
//     for the second-order gradient). equivtool/ops/xent.py runs them when a
//     gradient tape records the logits; otherwise the loss-only op above.
//   EquivtoolSparseXentStep(logits, labels) -> loss, dlogits_guess, guess, site, shift, log_norm (CPU)
//   EquivtoolSparseXentStepGrad(dlogits_guess, guess, site, grad_loss, logits, labels, shift,
//                               log_norm) -> dlogits (CPU)
//     The training step in one B x C pass (issue 38): the forward writes the
//     final dlogits for the upstream gradient it expects (guess: 1/B, a mean's,
//     or what the step's gradient op saw last time, see StepGuess), and the
//     gradient op hands them on when every grad_loss is that value; otherwise it
//     scales them in place (float/double written for 1) or recomputes them.
//     Every way gives EquivtoolSparseXentGrad's bits. xent.py runs these
//     instead of Fused/Scale, which stay for tests and direct callers.
//   EquivtoolXentBuildInfo()                         -> build description (string)
//
// The forward ops read the logits once and allocate nothing of size B x C;
// the gradient ops read the logits (and dense labels) once and write dlogits
// once. shift and log_norm (see xent_row.h) are in Tacc: float for half,
// bfloat16 and float logits, double for double logits.
//
// CPU: rows are handed out in blocks to the intra-op pool's threads
// (ForEachRow); every row is reduced by xent_row.h in an order fixed by C
// alone, with denormals flushed on every thread, so results are bitwise
// independent of the thread count and the partition. Labels outside [0, C)
// are an InvalidArgument error on the CPU; the GPU kernels write NaN for such
// rows instead, as TensorFlow's do.

#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <type_traits>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/platform/threadpool.h"

#include "xent_driver.h"
#include "xent_plan.h"
#include "xent_row.h"
#include "xla/stream_executor/stream.h"

// _build.py defines these; TensorFlow's headers carry no version string.
#ifndef EQUIVTOOL_XENT_TF_VERSION
#error "compile with -DEQUIVTOOL_XENT_TF_VERSION=\"<tf.__version__>\" (see equivtool/ops/_build.py)"
#endif
// No kernel is compiled ahead of time for the GPU: NVRTC compiles them at
// run time (equivtool/ops/_nvrtc.py), whatever compilers the build machine has.
#define EQUIVTOOL_XENT_CUDA_FIELDS "cuda=0;gpu=nvrtc"

// The build stamp: which TensorFlow this library was compiled against. equivtool/ops/_load.py finds it in the file's bytes *before*
// loading the library (loading one built for another TensorFlow may fail or
// crash), and the EquivtoolXentBuildInfo op returns the same text.
extern "C" __attribute__((visibility("default"), used))
const char equivtool_xent_build_stamp[] =
    "EQUIVTOOL_XENT_BUILD{tensorflow=" EQUIVTOOL_XENT_TF_VERSION
    ";" EQUIVTOOL_XENT_CUDA_FIELDS "}";

namespace tensorflow {
namespace {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

namespace ex = ::equivtool_xent;

// ---------------------------------------------------------------------------
// Registrations.

Status ForwardShape(InferenceContext* c, bool dense) {
  ShapeHandle logits;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &logits));
  DimensionHandle batch = c->Dim(logits, 0);
  if (dense) {
    ShapeHandle labels;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &labels));
    TF_RETURN_IF_ERROR(c->Merge(logits, labels, &logits));
    batch = c->Dim(logits, 0);
  } else {
    ShapeHandle labels;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &labels));
    TF_RETURN_IF_ERROR(c->Merge(batch, c->Dim(labels, 0), &batch));
  }
  for (int i = 0; i < 3; ++i) c->set_output(i, c->Vector(batch));
  return OkStatus();
}

Status GradShape(InferenceContext* c, bool dense) {
  ShapeHandle logits;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &logits));
  DimensionHandle batch = c->Dim(logits, 0);
  ShapeHandle labels;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), dense ? 2 : 1, &labels));
  if (dense) {
    TF_RETURN_IF_ERROR(c->Merge(logits, labels, &logits));
    batch = c->Dim(logits, 0);
  } else {
    TF_RETURN_IF_ERROR(c->Merge(batch, c->Dim(labels, 0), &batch));
  }
  for (int i = 2; i < 5; ++i) {
    ShapeHandle v;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &v));
    TF_RETURN_IF_ERROR(c->Merge(batch, c->Dim(v, 0), &batch));
  }
  c->set_output(0, c->Matrix(batch, c->Dim(logits, 1)));
  return OkStatus();
}

REGISTER_OP("EquivtoolSparseXent")
    .Input("logits: T")
    .Input("labels: Tlabels")
    .Output("loss: T")
    .Output("shift: Tacc")
    .Output("log_norm: Tacc")
    .Attr("T: {half, bfloat16, float, double}")
    .Attr("Tlabels: {int32, int64} = DT_INT64")
    .Attr("Tacc: {float, double}")
    .SetShapeFn([](InferenceContext* c) { return ForwardShape(c, false); })
    .Doc("Sparse softmax cross-entropy, loss only; deterministic.");

REGISTER_OP("EquivtoolSparseXentGrad")
    .Input("logits: T")
    .Input("labels: Tlabels")
    .Input("shift: Tacc")
    .Input("log_norm: Tacc")
    .Input("grad_loss: T")
    .Output("dlogits: T")
    .Attr("T: {half, bfloat16, float, double}")
    .Attr("Tlabels: {int32, int64} = DT_INT64")
    .Attr("Tacc: {float, double}")
    .SetShapeFn([](InferenceContext* c) { return GradShape(c, false); })
    .Doc("(softmax(logits) - onehot(labels)) * grad_loss; deterministic.");

REGISTER_OP("EquivtoolSparseXentFused")
    .Input("logits: T")
    .Input("labels: Tlabels")
    .Output("loss: T")
    .Output("backprop: Tacc")
    .Attr("T: {half, bfloat16, float, double}")
    .Attr("Tlabels: {int32, int64} = DT_INT64")
    .Attr("Tacc: {float, double}")
    .SetShapeFn([](InferenceContext* c) {
      // ForwardShape's checks; outputs [B] and [B, C] (it sets three outputs)
      ShapeHandle logits, labels;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &logits));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &labels));
      DimensionHandle batch = c->Dim(logits, 0);
      TF_RETURN_IF_ERROR(c->Merge(batch, c->Dim(labels, 0), &batch));
      c->set_output(0, c->Vector(batch));
      c->set_output(1, c->Matrix(batch, c->Dim(logits, 1)));
      return OkStatus();
    })
    .Doc("Sparse softmax cross-entropy and softmax(logits) - onehot(labels), one "
         "exponential per element; deterministic.");

REGISTER_OP("EquivtoolSparseXentScale")
    .Input("backprop: Tacc")
    .Input("grad_loss: T")
    .Input("logits: T")
    .Input("labels: Tlabels")
    .Output("dlogits: T")
    .Attr("T: {half, bfloat16, float, double}")
    .Attr("Tlabels: {int32, int64} = DT_INT64")
    .Attr("Tacc: {float, double}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle bp, logits, v;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &bp));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &logits));
      TF_RETURN_IF_ERROR(c->Merge(bp, logits, &bp));
      DimensionHandle batch = c->Dim(bp, 0);
      for (int i : {1, 3}) {
        TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &v));
        TF_RETURN_IF_ERROR(c->Merge(batch, c->Dim(v, 0), &batch));
      }
      c->set_output(0, c->Matrix(batch, c->Dim(bp, 1)));
      return OkStatus();
    })
    .Doc("backprop * grad_loss[:, None] in T: the fused path's gradient; deterministic.");

REGISTER_OP("EquivtoolSparseXentStep")
    .Input("logits: T")
    .Input("labels: Tlabels")
    .Output("loss: T")
    .Output("dlogits_guess: T")
    .Output("guess: T")
    .Output("site: int64")
    .Output("shift: Tacc")
    .Output("log_norm: Tacc")
    .Attr("T: {half, bfloat16, float, double}")
    .Attr("Tlabels: {int32, int64} = DT_INT64")
    .Attr("Tacc: {float, double}")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ForwardShape(c, false));  // loss [B] (its outputs 1, 2 reset below)
      const ShapeHandle loss = c->output(0);
      // [B, C] when a guess was made, [0, C] when not (16-bit logits only)
      c->set_output(1, c->Matrix(c->UnknownDim(), c->Dim(c->input(0), 1)));
      c->set_output(2, c->Vector(c->UnknownDim()));
      c->set_output(3, c->Scalar());
      c->set_output(4, loss);
      c->set_output(5, loss);
      return OkStatus();
    })
    .Doc("Sparse softmax cross-entropy and the gradient for the upstream gradient it "
         "guesses, one exponential per element; deterministic.");

REGISTER_OP("EquivtoolSparseXentStepGrad")
    .Input("dlogits_guess: T")
    .Input("guess: T")
    .Input("site: int64")
    .Input("grad_loss: T")
    .Input("logits: T")
    .Input("labels: Tlabels")
    .Input("shift: Tacc")
    .Input("log_norm: Tacc")
    .Output("dlogits: T")
    .Attr("T: {half, bfloat16, float, double}")
    .Attr("Tlabels: {int32, int64} = DT_INT64")
    .Attr("Tacc: {float, double}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle logits, v;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 2, &logits));
      DimensionHandle batch = c->Dim(logits, 0);
      for (int i : {3, 5, 6, 7}) {
        TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &v));
        TF_RETURN_IF_ERROR(c->Merge(batch, c->Dim(v, 0), &batch));
      }
      c->set_output(0, c->Matrix(batch, c->Dim(logits, 1)));
      return OkStatus();
    })
    .Doc("(softmax(logits) - onehot(labels)) * grad_loss[:, None]: the step's gradient, "
         "dlogits_guess itself when grad_loss is guess in every row; deterministic.");

REGISTER_OP("EquivtoolXent")
    .Input("logits: T")
    .Input("labels: T")
    .Output("loss: T")
    .Output("shift: Tacc")
    .Output("log_norm: Tacc")
    .Attr("T: {half, bfloat16, float, double}")
    .Attr("Tacc: {float, double}")
    .Attr("exact_gradient: bool = false")
    .SetShapeFn([](InferenceContext* c) { return ForwardShape(c, true); })
    .Doc("Softmax cross-entropy with dense labels, loss only; deterministic. "
         "exact_gradient is read by the registered gradient, not by the kernel.");

REGISTER_OP("EquivtoolXentGrad")
    .Input("logits: T")
    .Input("labels: T")
    .Input("shift: Tacc")
    .Input("log_norm: Tacc")
    .Input("grad_loss: T")
    .Output("dlogits: T")
    .Attr("T: {half, bfloat16, float, double}")
    .Attr("Tacc: {float, double}")
    .Attr("exact_gradient: bool = false")
    .SetShapeFn([](InferenceContext* c) { return GradShape(c, true); })
    .Doc("(softmax(logits) - labels) * grad_loss, or with exact_gradient "
         "(sum(labels) * softmax(logits) - labels) * grad_loss; deterministic.");

REGISTER_OP("EquivtoolXentBuildInfo")
    .Output("info: string")
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc("The build stamp: TensorFlow version and CUDA build of this library.");

// ---------------------------------------------------------------------------
// Shared checks.

template <typename T> struct StorageOf { typedef T type; };
template <> struct StorageOf<Eigen::half> { typedef ex::half_bits type; };
template <> struct StorageOf<bfloat16> { typedef ex::bf16_bits type; };

template <typename T>
const typename StorageOf<T>::type* AsStorage(const Tensor& t) {
  return reinterpret_cast<const typename StorageOf<T>::type*>(t.flat<T>().data());
}
template <typename T>
typename StorageOf<T>::type* AsStorage(Tensor* t) {
  return reinterpret_cast<typename StorageOf<T>::type*>(t->flat<T>().data());
}

static_assert(sizeof(Eigen::half) == 2 && sizeof(bfloat16) == 2,
              "16-bit types must be raw 16-bit storage");

Status CheckLogitsAndLabels(const Tensor& logits, const Tensor& labels, bool dense) {
  if (!TensorShapeUtils::IsMatrix(logits.shape()))
    return errors::InvalidArgument("logits must be 2-D, but got shape ",
                                   logits.shape().DebugString());
  if (dense) {
    if (logits.shape() != labels.shape())
      return errors::InvalidArgument(
          "logits and labels must have the same shape, got logits shape ",
          logits.shape().DebugString(), " and labels shape ",
          labels.shape().DebugString());
  } else {
    if (!TensorShapeUtils::IsVector(labels.shape()))
      return errors::InvalidArgument("labels must be 1-D, but got shape ",
                                     labels.shape().DebugString());
    if (logits.dim_size(0) != labels.dim_size(0))
      return errors::InvalidArgument(
          "logits and labels must have the same first dimension, got logits "
          "shape ",
          logits.shape().DebugString(), " and labels shape ",
          labels.shape().DebugString());
  }
  // Dense labels accept zero classes (the loss is an empty sum, 0), as
  // TensorFlow's SoftmaxCrossEntropyWithLogits does; sparse labels cannot
  // index an empty row.
  if (!dense && logits.dim_size(1) <= 0)
    return errors::InvalidArgument(
        "Must have at least one class, but got logits shape ",
        logits.shape().DebugString());
  return OkStatus();
}

Status CheckRowVector(const Tensor& t, int64_t batch, const char* name) {
  if (!TensorShapeUtils::IsVector(t.shape()) || t.dim_size(0) != batch)
    return errors::InvalidArgument(name, " must have shape [", batch,
                                   "], but got shape ", t.shape().DebugString());
  return OkStatus();
}

template <typename L>
Status CheckLabelRange(const Tensor& labels, int64_t num_classes) {
  const L* v = labels.flat<L>().data();
  const int64_t n = labels.NumElements();
  for (int64_t b = 0; b < n; ++b) {
    if (v[b] < 0 || static_cast<int64_t>(v[b]) >= num_classes)
      return absl::InvalidArgumentError(absl::StrCat(
          "Received a label value of ", static_cast<int64_t>(v[b]),
          " at batch index ", b, " which is outside the valid range of [0, ",
          num_classes, "). Labels must be class indices in [0, ", num_classes,
          ") for logits with ", num_classes, " classes."));
  }
  return OkStatus();
}

// ---------------------------------------------------------------------------
// CPU row functions. Each is compiled for several instruction sets and picked
// once at load time; -ffp-contract=off and the explicit lane layout make all
// versions produce the same bits.

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define XENT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define XENT_CLONES
#endif

#define XENT_ROW_FUNCTIONS(S, SUFFIX)                                            \
  XENT_CLONES ex::LseState<ex::Storage<S>::acc> RowLse_##SUFFIX(               \
      const S* x, int64_t c, const ex::RowPrefetch& pf) {                       \
    return ex::row_lse_two_pass<S>(x, c, pf);                                   \
  }                                                                             \
  XENT_CLONES ex::LseState<ex::Storage<S>::acc> SparseFusedRow_##SUFFIX(        \
      const S* x, int64_t c, int64_t label, ex::Storage<S>::acc* bp,            \
      const ex::RowPrefetch& pf) {                                              \
    return ex::sparse_fused_row<S>(x, c, label, bp, pf);                        \
  }                                                                             \
  XENT_CLONES void ScaleRow_##SUFFIX(const ex::Storage<S>::acc* bp, int64_t c,  \
                                     ex::Storage<S>::acc g, S* dx) {            \
    ex::scale_row<S>(bp, c, g, dx);                                             \
  }                                                                             \
  XENT_CLONES ex::LseState<ex::Storage<S>::acc> SparseStepRow_##SUFFIX(         \
      const S* x, int64_t c, int64_t label, ex::Storage<S>::acc s, S* dx,       \
      const ex::RowPrefetch& pf, ex::Storage<S>::acc* scratch) {                \
    return ex::sparse_step_row<S>(x, c, label, s, dx, pf, scratch);             \
  }                                                                             \
  XENT_CLONES ex::DenseState<ex::Storage<S>::acc> DenseRow_##SUFFIX(            \
      const S* x, const S* y, int64_t c) {                                      \
    return ex::dense_row_lanes<S>(x, y, c);                                     \
  }                                                                             \
  XENT_CLONES void SparseGradRow_##SUFFIX(const S* x, int64_t c, int64_t label, \
                                          ex::RowStats<ex::Storage<S>::acc> r,  \
                                          ex::Storage<S>::acc g, S* dx) {       \
    ex::sparse_grad_row<S>(x, c, label, r, g, dx);                              \
  }                                                                             \
  XENT_CLONES void DenseGradRow_##SUFFIX(const S* x, const S* y, int64_t c,     \
                                         ex::RowStats<ex::Storage<S>::acc> r,   \
                                         ex::Storage<S>::acc g, bool exact,     \
                                         S* dx) {                               \
    const ex::Storage<S>::acc ysum =                                            \
        exact ? ex::label_sum<S>(y, c) : ex::Storage<S>::acc(1);                \
    ex::dense_grad_row<S>(x, y, c, r, ysum, g, dx);                             \
  }                                                                             \
  template <> struct RowFns<S> {                                                \
    static ex::LseState<ex::Storage<S>::acc> Lse(const S* x, int64_t c,         \
                                                 const ex::RowPrefetch& pf) {   \
      return RowLse_##SUFFIX(x, c, pf);                                         \
    }                                                                           \
    static ex::LseState<ex::Storage<S>::acc> SparseFused(                       \
        const S* x, int64_t c, int64_t label, ex::Storage<S>::acc* bp,          \
        const ex::RowPrefetch& pf) {                                            \
      return SparseFusedRow_##SUFFIX(x, c, label, bp, pf);                      \
    }                                                                           \
    static void Scale(const ex::Storage<S>::acc* bp, int64_t c,                 \
                      ex::Storage<S>::acc g, S* dx) {                           \
      ScaleRow_##SUFFIX(bp, c, g, dx);                                          \
    }                                                                           \
    static ex::LseState<ex::Storage<S>::acc> SparseStep(                        \
        const S* x, int64_t c, int64_t label, ex::Storage<S>::acc s, S* dx,     \
        const ex::RowPrefetch& pf, ex::Storage<S>::acc* scratch) {              \
      return SparseStepRow_##SUFFIX(x, c, label, s, dx, pf, scratch);           \
    }                                                                           \
    static ex::DenseState<ex::Storage<S>::acc> Dense(const S* x, const S* y,    \
                                                     int64_t c) {               \
      return DenseRow_##SUFFIX(x, y, c);                                        \
    }                                                                           \
    static void SparseGrad(const S* x, int64_t c, int64_t label,                \
                           ex::RowStats<ex::Storage<S>::acc> r,                 \
                           ex::Storage<S>::acc g, S* dx) {                      \
      SparseGradRow_##SUFFIX(x, c, label, r, g, dx);                            \
    }                                                                           \
    static void DenseGrad(const S* x, const S* y, int64_t c,                    \
                          ex::RowStats<ex::Storage<S>::acc> r,                  \
                          ex::Storage<S>::acc g, bool exact, S* dx) {           \
      DenseGradRow_##SUFFIX(x, y, c, r, g, exact, dx);                          \
    }                                                                           \
  };

template <typename S> struct RowFns;
XENT_ROW_FUNCTIONS(float, f32)
XENT_ROW_FUNCTIONS(double, f64)
XENT_ROW_FUNCTIONS(ex::half_bits, f16)
XENT_ROW_FUNCTIONS(ex::bf16_bits, bf16)
#undef XENT_ROW_FUNCTIONS

// Flush denormals to zero (inputs and results) for the scope, whatever the
// calling thread's mode: the same inputs then give the same bits on every
// thread.
class ScopedFlushDenormals {
 public:
  ScopedFlushDenormals() {
#if defined(__x86_64__) || defined(__i386__)
    saved_ = _mm_getcsr();
    _mm_setcsr(saved_ | 0x8040u);  // FTZ | DAZ
#endif
  }
  ~ScopedFlushDenormals() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr(saved_);
#endif
  }

 private:
  unsigned int saved_ = 0;
};

// Prefetch of the row after one of x (and of its output row out), none after
// a block's last row, and none for rows so long that the next one would push
// the current one out of a core's L2 before its second pass reads it.
constexpr int64_t kPrefetchBytes = 1 << 20;

template <typename S, typename O>
ex::RowPrefetch NextRow(const S* x, const O* out, int64_t C, bool last) {
  ex::RowPrefetch pf;
  const int64_t bytes = C * int64_t(sizeof(S) + (out != nullptr ? sizeof(O) : 0));
  if (last || bytes > kPrefetchBytes) return pf;
  pf.x = x + C;
  pf.x_size = sizeof(S);
  if (out != nullptr) {
    pf.out = out + C;
    pf.out_size = sizeof(O);
  }
  return pf;
}

template <typename T> struct AccOf { typedef float type; };
template <> struct AccOf<double> { typedef double type; };

// ---------------------------------------------------------------------------
// The training step's AVX-512 rows, picked at run time. On a CPU with
// AVX-512F/BW/VL and F16C (and unless turned off, see CpuPath), the fused
// forward and the scale op run the same row templates as the portable
// functions above, with two things the portable code cannot spell:
//   - float16 logits are converted by the hardware (half_f16c) instead of by
//     integer arithmetic, both ways;
//   - when the fused forward's backprop is far larger than L2 (CpuPath's
//     stream_min_bytes), its exponentials go to a per-thread scratch row that
//     stays in cache and backprop is written once, by streaming stores: no
//     read-for-ownership of a line the step never reads back before the scale
//     op (a smaller backprop keeps ordinary stores, so that the scale op finds
//     it in cache); likewise the scale op's 16-bit output (see StepRows for
//     which dtypes stream, as measured).
// The arithmetic is the portable functions', in the same order: the same bits
// (tests/test_ops_cpu_paths.py compares the two paths).
#if XENT_HOST_AVX512 && defined(__GNUC__)
#define XENT_AVX512_ROWS 1
#define XENT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,f16c")))

bool CpuHasAvx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c");
}

template <typename S> struct HardwareStorage { typedef S type; };
template <> struct HardwareStorage<ex::half_bits> { typedef ex::half_f16c type; };

template <typename S, bool kStream>
XENT_AVX512 ex::LseState<float> SparseFusedRowAvx512(const S* x, int64_t c, int64_t label,
                                                     float* bp, const ex::RowPrefetch& pf,
                                                     float* scratch) {
  typedef typename HardwareStorage<S>::type H;
  return ex::sparse_fused_row<H, kStream>(reinterpret_cast<const H*>(x), c, label, bp, pf,
                                          scratch);
}

template <typename S, bool kStream>
XENT_AVX512 void ScaleRowAvx512(const float* bp, int64_t c, float g, S* dx) {
  typedef typename HardwareStorage<S>::type H;
  ex::scale_row<H, kStream>(bp, c, g, reinterpret_cast<H*>(dx));
}

template <typename S, bool kStream>
XENT_AVX512 ex::LseState<float> SparseStepRowAvx512(const S* x, int64_t c, int64_t label, float s,
                                                    S* dx, const ex::RowPrefetch& pf,
                                                    float* scratch) {
  typedef typename HardwareStorage<S>::type H;
  return ex::sparse_step_row<H, kStream>(reinterpret_cast<const H*>(x), c, label, s,
                                         reinterpret_cast<H*>(dx), pf, scratch);
}

XENT_AVX512 void StoreFenceAvx512() { ex::store_fence(); }
#else
bool CpuHasAvx512() { return false; }
#endif

// The run-time choice, process-wide: whether the AVX-512 rows are used (only
// where the CPU has them) and from which backprop size on the fused forward
// streams. Changed only through equivtool_xent_cpu_path (tests, benchmarks);
// rows counts the rows each AVX-512 variant wrote, so a test can tell that
// the path it compares was taken.
struct CpuPath {
  static std::atomic<bool>& Avx512() {
    static std::atomic<bool> on{CpuHasAvx512()};
    return on;
  }
  // 8 x a core's L2 (2 MiB where sysconf does not say): far beyond what the
  // scale op that reads backprop next could find in cache.
  static std::atomic<int64_t>& StreamMinBytes() {
    static std::atomic<int64_t> bytes{8 * L2Bytes()};
    return bytes;
  }
  static int64_t L2Bytes() {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? int64_t(l2) : int64_t(2) << 20;
  }
  // 0: streamed fused rows, 1: F16C rows, 2: rows a helper thread computed
  // (ForEachRow: any row function, not the caller's rows)
  static std::atomic<int64_t>& Rows(int which) {
    static std::atomic<int64_t> rows[3];
    return rows[which];
  }
  // Tests only: > 0 runs every ForEachRow with exactly this many threads
  // (the caller and Threads() - 1 helpers queued on the pool, however many
  // threads it has and however little the work), so that a test can compare
  // thread counts in one process: TensorFlow's CPU device keeps the pool its
  // first session or eager context made (the global pool), whatever a later
  // session's intra_op_parallelism_threads says.
  static std::atomic<int>& Threads() {
    static std::atomic<int> n{0};
    return n;
  }
  // Tests only: fill the step's [B, C] outputs with 0xFF bytes (a NaN no
  // arithmetic here produces) before the rows are written, so that an element
  // a row function fails to write cannot pass for the value a reused buffer
  // held from an earlier run.
  static std::atomic<bool>& Poison() {
    static std::atomic<bool> on{false};
    return on;
  }
  template <typename V> static void MaybePoison(V* data, int64_t n) {
    if (Poison().load(std::memory_order_relaxed)) memset(static_cast<void*>(data), 0xFF, n * sizeof(V));
  }
};

// Shards rows over the intra-op pool. cost: rough cycles per row (work of
// less than kParallelMinCycles in all runs inline, and no more threads work
// than about one per kParallelMinCycles). fn(b) per row, or fn(b, last) with
// last = whether b ends its block (the row functions prefetch row b + 1 while
// they work on row b, not past a block: the next block may be another
// thread's).
//
// Rows are handed out in blocks from a shared counter to the calling thread
// and to num_threads - 1 helpers scheduled on the pool, not split in fixed
// halves as ParallelFor splits them: a helper that wakes late (tens of
// microseconds on a virtual machine) takes fewer rows instead of holding the
// caller at a barrier, and no more threads work than the pool has. Blocks
// are guided: each takes a share of the rows still left (long runs of
// consecutive rows first, whose next row the row functions prefetch), down
// to about kBlockCycles of work at the end, where the threads finish within
// a small block of each other. The caller waits only for rows that were
// taken, never for a helper that has not started (one that starts after the
// last block finds none and touches nothing but the shared state it
// co-owns). Each row's result depends on the row alone, so which thread
// computes it changes no bit.
constexpr int64_t kParallelMinCycles = 100000;  // less work than this runs inline
constexpr int64_t kBlockCycles = 200000;        // about the smallest block's work
constexpr int64_t kWaitSpinMicros = 100;        // how long the caller spins before it sleeps

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

struct RowBlocks {
  RowBlocks(int64_t rows, int64_t threads, int64_t min_block)
      : rows(rows), threads(threads), min_block(min_block) {}
  const int64_t rows, threads, min_block;
  std::atomic<int64_t> next{0};  // first row not yet taken
  std::atomic<int64_t> done{0};  // rows done
  std::atomic<int64_t> started{0};  // helpers that have begun
  std::mutex mu;
  std::condition_variable all_done;

  // Takes the next block, [begin, end); false when no row is left.
  bool Take(int64_t* begin, int64_t* end) {
    int64_t first = next.load(std::memory_order_relaxed);
    int64_t size;
    do {
      if (first >= rows) return false;
      size = threads == 1 ? rows - first
                          : std::min(rows - first, std::max(min_block, (rows - first) / (2 * threads)));
    } while (!next.compare_exchange_weak(first, first + size, std::memory_order_relaxed));
    *begin = first;
    *end = first + size;
    return true;
  }

  // Takes blocks and runs fn on their rows until none is left.
  template <typename Fn> void Run(Fn& fn, bool helper) {
    ScopedFlushDenormals flush;
    int64_t begin, end;
    while (Take(&begin, &end)) {
      for (int64_t b = begin; b < end; ++b) {
        if constexpr (std::is_invocable_v<Fn&, int64_t, bool>) fn(b, b + 1 == end);
        else fn(b);
      }
      if (helper) CpuPath::Rows(2).fetch_add(end - begin, std::memory_order_relaxed);
      if (done.fetch_add(end - begin, std::memory_order_acq_rel) + (end - begin) == rows) {
        std::lock_guard<std::mutex> lock(mu);
        all_done.notify_all();
      }
    }
  }

  // The caller, out of blocks, waits for the helpers' last ones: spinning
  // first for up to about a block's work, then asleep until the last block
  // is counted. (Asleep at once, it woke 25 to 45 us after the last block in
  // about half the calls on this project's virtual machines: 18 us a call on
  // average, 0.6% of a 3 ms step; spinning, 1.3 us.)
  void Wait() {
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(kWaitSpinMicros);
    for (int i = 1; done.load(std::memory_order_acquire) != rows; ++i) {
      CpuRelax();
      if (i % 64 == 0 && std::chrono::steady_clock::now() >= spin_until) break;
    }
    std::unique_lock<std::mutex> lock(mu);
    all_done.wait(lock, [this] { return done.load(std::memory_order_acquire) == rows; });
  }
};

template <typename Fn>
void ForEachRow(OpKernelContext* ctx, int64_t rows, int64_t cost, Fn fn) {
  const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  const int forced = CpuPath::Threads().load(std::memory_order_relaxed);
  const int64_t threads =
      forced > 0 ? std::min<int64_t>(forced, rows)
                 : std::min<int64_t>({int64_t(workers->num_threads), rows,
                                      1 + rows * cost / kParallelMinCycles});
  const int64_t min_block =
      forced > 0 ? 1 : std::max<int64_t>(1, kBlockCycles / std::max<int64_t>(cost, 1));
  auto shared = std::make_shared<RowBlocks>(rows, std::max<int64_t>(threads, 1), min_block);
  for (int64_t t = 1; t < threads; ++t)
    workers->workers->Schedule([shared, &fn] {
      shared->started.fetch_add(1, std::memory_order_release);
      // a helper that finds no block left never calls fn: fn (the caller's)
      // may be gone by then, the shared state is not
      if (shared->next.load(std::memory_order_relaxed) < shared->rows) shared->Run(fn, true);
    });
  // With a forced count (tests), the caller takes its first block only once
  // every helper runs and one of them has taken a block (at most 1 s, and not
  // when the caller is itself one of the pool's threads): then the threads
  // really compete for blocks, and a test can count on helpers having rows.
  if (forced > 0 && threads > 1 && workers->workers->CurrentThreadId() < 0) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while ((shared->started.load(std::memory_order_acquire) < threads - 1 ||
            shared->next.load(std::memory_order_relaxed) == 0) &&
           std::chrono::steady_clock::now() < give_up)
      std::this_thread::yield();
  }
  shared->Run(fn, false);
  if (threads > 1) shared->Wait();
}

// Per-thread scratch row of the streaming fused forward (at most
// kScratchBytes, kept between calls: no allocation per step).
constexpr int64_t kScratchBytes = 1 << 20;

float* ScratchRow(int64_t C) {
  thread_local std::vector<float> scratch;
  if (int64_t(scratch.size()) < C) scratch.resize(C);
  return scratch.data();
}

// The one-pass step's scratch row for 16-bit logits (their exponentials, in
// acc) or a streamed float row: per thread, kept between calls.
template <typename A> A* StepScratch(int64_t C) {
  thread_local std::vector<A> scratch;
  if (int64_t(scratch.size()) < C) scratch.resize(C);
  return scratch.data();
}

// The training step's rows of one call (the fused forward's and the scale
// op's): RowFns, or the AVX-512 variants above.
template <typename S> struct StepRows {
  typedef typename ex::Storage<S>::acc A;
  bool avx512 = false;        // any AVX-512 variant
  bool stream_fused = false;  // the fused forward streams backprop
  bool stream_scale = false;  // the scale op streams dlogits (16-bit only)

  // Streaming as measured (interleaved A/B in one process, one thread,
  // [8192, 1000]): the fused forward's backprop for float32 and bfloat16
  // (step 8% to 13% faster), not for float16, whose forward converts with
  // F16C (10% slower: its backprop is better left in the cache hierarchy for
  // the scale op); the scale op's 16-bit output (about 5% faster).
  StepRows(int64_t B, int64_t C) {
#if XENT_AVX512_ROWS
    if constexpr (std::is_same<A, float>::value) {
      const bool on = CpuPath::Avx512().load(std::memory_order_relaxed);
      const bool half = std::is_same<S, ex::half_bits>::value;
      const bool big = on && B * C * int64_t(sizeof(A)) >=
                                 CpuPath::StreamMinBytes().load(std::memory_order_relaxed);
      stream_fused = big && !half && C * int64_t(sizeof(A)) <= kScratchBytes;
      stream_scale = big && sizeof(S) == 2;
      avx512 = stream_fused || stream_scale || (on && half);
    }
#else
    (void)B; (void)C;
#endif
  }

  ex::LseState<A> Fused(const S* row, int64_t C, int64_t label, A* bp, bool last) const {
#if XENT_AVX512_ROWS
    if constexpr (std::is_same<A, float>::value) {
      if (stream_fused)
        return SparseFusedRowAvx512<S, true>(row, C, label, bp, NextRow<S, A>(row, nullptr, C, last),
                                             ScratchRow(C));
      if (avx512)
        return SparseFusedRowAvx512<S, false>(row, C, label, bp, NextRow(row, bp, C, last), nullptr);
    }
#endif
    return RowFns<S>::SparseFused(row, C, label, bp, NextRow(row, bp, C, last));
  }

  // The one-pass step's row (sparse_step_row): float streams as the fused
  // forward's backprop does; 16-bit rows are written by ordinary stores from a
  // scratch row of their exponentials.
  ex::LseState<A> Step(const S* row, int64_t C, int64_t label, A s, S* dx, bool last) const {
    constexpr bool kHalf = sizeof(S) < sizeof(A);
#if XENT_AVX512_ROWS
    if constexpr (std::is_same<A, float>::value) {
      if constexpr (!kHalf) {
        if (stream_fused)
          return SparseStepRowAvx512<S, true>(row, C, label, s, dx,
                                              NextRow<S, S>(row, nullptr, C, last),
                                              StepScratch<A>(C));
      }
      if (avx512)
        return SparseStepRowAvx512<S, false>(row, C, label, s, dx, NextRow(row, dx, C, last),
                                             kHalf ? StepScratch<A>(C) : nullptr);
    }
#endif
    return RowFns<S>::SparseStep(row, C, label, s, dx, NextRow(row, dx, C, last),
                                 kHalf ? StepScratch<A>(C) : nullptr);
  }

  // (a 16-bit dx is a fresh buffer, never bp, so it can be streamed)
  void Scale(const A* bp, int64_t C, A g, S* dx) const {
#if XENT_AVX512_ROWS
    if constexpr (std::is_same<A, float>::value && sizeof(S) == 2) {
      if (stream_scale) return ScaleRowAvx512<S, true>(bp, C, g, dx);
      if (avx512) return ScaleRowAvx512<S, false>(bp, C, g, dx);
    }
#endif
    RowFns<S>::Scale(bp, C, g, dx);
  }

  // After a block's last row (ForEachRow's last = true): fence its streaming
  // stores (before the block is counted done, which the caller waits for)
  // and count the rows of each AVX-512 variant.
  void EndShard(bool last, int64_t* rows, bool fused) const {
    if (!avx512) return;
    ++*rows;
    if (!last) return;
#if XENT_AVX512_ROWS
    if (fused ? stream_fused : stream_scale) StoreFenceAvx512();
#endif
    if (fused ? stream_fused : stream_scale)
      CpuPath::Rows(0).fetch_add(*rows, std::memory_order_relaxed);
    if (std::is_same<S, ex::half_bits>::value)
      CpuPath::Rows(1).fetch_add(*rows, std::memory_order_relaxed);
    *rows = 0;
  }
};

// ---------------------------------------------------------------------------
// Kernels. Each op is one OpKernel class template over the device: Compute
// validates the inputs, allocates the outputs and returns on an empty batch,
// the same on every device, then hands the rows to Device, a policy with one
// static function per op: CpuImpl below, DriverImpl on a GPU.

// A forward op's inputs, checked, and its three [B] outputs, allocated.
struct ForwardArgs {
  const Tensor* logits;
  const Tensor* labels;
  int64_t B, C;
  Tensor *loss, *shift, *log_norm;
};

// A gradient op's inputs, checked, and its [B, C] output, allocated.
struct GradArgs {
  const Tensor* logits;
  const Tensor* labels;
  const Tensor *shift, *log_norm, *grad_loss;
  int64_t B, C;
  bool exact_gradient = false;  // dense only: sum(labels) * softmax instead of softmax
  Tensor* dlogits;
};

Status PrepareForward(OpKernelContext* ctx, bool dense, ForwardArgs* a) {
  a->logits = &ctx->input(0);
  a->labels = &ctx->input(1);
  TF_RETURN_IF_ERROR(CheckLogitsAndLabels(*a->logits, *a->labels, dense));
  a->B = a->logits->dim_size(0);
  a->C = a->logits->dim_size(1);
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({a->B}), &a->loss));
  TF_RETURN_IF_ERROR(ctx->allocate_output(1, TensorShape({a->B}), &a->shift));
  TF_RETURN_IF_ERROR(ctx->allocate_output(2, TensorShape({a->B}), &a->log_norm));
  return OkStatus();
}

Status PrepareGrad(OpKernelContext* ctx, bool dense, GradArgs* a) {
  a->logits = &ctx->input(0);
  a->labels = &ctx->input(1);
  TF_RETURN_IF_ERROR(CheckLogitsAndLabels(*a->logits, *a->labels, dense));
  a->B = a->logits->dim_size(0);
  a->C = a->logits->dim_size(1);
  a->shift = &ctx->input(2);
  a->log_norm = &ctx->input(3);
  a->grad_loss = &ctx->input(4);
  TF_RETURN_IF_ERROR(CheckRowVector(*a->shift, a->B, "shift"));
  TF_RETURN_IF_ERROR(CheckRowVector(*a->log_norm, a->B, "log_norm"));
  TF_RETURN_IF_ERROR(CheckRowVector(*a->grad_loss, a->B, "grad_loss"));
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, a->logits->shape(), &a->dlogits));
  return OkStatus();
}

template <typename Device, typename T, typename L>
class SparseXentOp : public OpKernel {
 public:
  explicit SparseXentOp(OpKernelConstruction* c) : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    ForwardArgs a;
    OP_REQUIRES_OK(ctx, PrepareForward(ctx, /*dense=*/false, &a));
    if (a.B == 0) return;
    OP_REQUIRES_OK(ctx, (Device::template SparseForward<T, L>(ctx, a)));
  }
};

template <typename Device, typename T, typename L>
class SparseXentGradOp : public OpKernel {
 public:
  explicit SparseXentGradOp(OpKernelConstruction* c) : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    GradArgs a;
    OP_REQUIRES_OK(ctx, PrepareGrad(ctx, /*dense=*/false, &a));
    if (a.B == 0) return;
    OP_REQUIRES_OK(ctx, (Device::template SparseGrad<T, L>(ctx, a)));
  }
};

template <typename Device, typename T>
class XentOp : public OpKernel {
 public:
  explicit XentOp(OpKernelConstruction* c) : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    ForwardArgs a;
    OP_REQUIRES_OK(ctx, PrepareForward(ctx, /*dense=*/true, &a));
    if (a.B == 0) return;
    OP_REQUIRES_OK(ctx, Device::template DenseForward<T>(ctx, a));
  }
};

template <typename Device, typename T>
class XentGradOp : public OpKernel {
 public:
  explicit XentGradOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("exact_gradient", &exact_gradient_));
  }
  void Compute(OpKernelContext* ctx) override {
    GradArgs a;
    OP_REQUIRES_OK(ctx, PrepareGrad(ctx, /*dense=*/true, &a));
    a.exact_gradient = exact_gradient_;
    if (a.B == 0 || a.C == 0) return;
    OP_REQUIRES_OK(ctx, Device::template DenseGrad<T>(ctx, a));
  }

 private:
  bool exact_gradient_ = false;
};

// The fused training-step forward (CPU): loss and backprop = softmax - onehot.
template <typename T, typename L>
class SparseXentFusedOp : public OpKernel {
 public:
  explicit SparseXentFusedOp(OpKernelConstruction* c) : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    typedef typename StorageOf<T>::type S;
    typedef typename AccOf<T>::type A;
    const Tensor& logits = ctx->input(0);
    const Tensor& labels = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckLogitsAndLabels(logits, labels, /*dense=*/false));
    const int64_t B = logits.dim_size(0), C = logits.dim_size(1);
    OP_REQUIRES_OK(ctx, CheckLabelRange<L>(labels, C));
    Tensor *loss, *backprop;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({B}), &loss));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, logits.shape(), &backprop));
    if (B == 0) return;
    const S* x = AsStorage<T>(logits);
    const L* y = labels.flat<L>().data();
    S* out = AsStorage<T>(loss);
    A* bp = backprop->flat<A>().data();
    CpuPath::MaybePoison(bp, B * C);
    const StepRows<S> rows(B, C);
    ForEachRow(ctx, B, 6 * C, [&](int64_t b, bool last) {
      thread_local int64_t done = 0;
      const S* row = x + b * C;
      const ex::LseState<A> s = rows.Fused(row, C, static_cast<int64_t>(y[b]), bp + b * C, last);
      out[b] = ex::Storage<S>::store(ex::sparse_loss(s, ex::Storage<S>::load(row[y[b]])));
      rows.EndShard(last, &done, /*fused=*/true);
    });
  }
};

// dx = bp * g[:, None], row by row (the scale op's and the step gradient's).
template <typename S>
void ScaleRows(OpKernelContext* ctx, const StepRows<S>& rows, const typename StepRows<S>::A* bp,
               const S* g, S* dx, int64_t B, int64_t C) {
  ForEachRow(ctx, B, 2 * C, [&](int64_t b, bool last) {
    thread_local int64_t done = 0;
    rows.Scale(bp + b * C, C, ex::Storage<S>::load(g[b]), dx + b * C);
    rows.EndShard(last, &done, /*fused=*/false);
  });
}

// dlogits = backprop * grad_loss[:, None] (CPU), in place when backprop has
// the logits' type and no other reader.
template <typename T, typename L>
class SparseXentScaleOp : public OpKernel {
 public:
  explicit SparseXentScaleOp(OpKernelConstruction* c) : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    typedef typename StorageOf<T>::type S;
    typedef typename AccOf<T>::type A;
    const Tensor& backprop = ctx->input(0);
    const Tensor& grad_loss = ctx->input(1);
    const Tensor& logits = ctx->input(2);
    OP_REQUIRES(ctx, TensorShapeUtils::IsMatrix(backprop.shape()) &&
                         backprop.shape() == logits.shape(),
                errors::InvalidArgument("backprop must have the logits' shape ",
                                        logits.shape().DebugString(), ", but got shape ",
                                        backprop.shape().DebugString()));
    const int64_t B = backprop.dim_size(0), C = backprop.dim_size(1);
    OP_REQUIRES_OK(ctx, CheckRowVector(grad_loss, B, "grad_loss"));
    OP_REQUIRES_OK(ctx, CheckRowVector(ctx->input(3), B, "labels"));
    Tensor* dlogits = nullptr;
    if (std::is_same<T, A>::value) {
      OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 0, backprop.shape(),
                                                                &dlogits));
    } else {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, backprop.shape(), &dlogits));
    }
    if (B == 0 || C == 0) return;
    const A* bp = backprop.flat<A>().data();
    const S* g = AsStorage<T>(grad_loss);
    S* dx = AsStorage<T>(dlogits);
    if (dx != reinterpret_cast<const void*>(bp)) CpuPath::MaybePoison(dx, B * C);
    ScaleRows(ctx, StepRows<S>(B, C), bp, g, dx, B, C);
  }
};

class BuildInfoOp : public OpKernel {
 public:
  explicit BuildInfoOp(OpKernelConstruction* c) : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    const std::string info = equivtool_xent_build_stamp;
    out->scalar<tstring>()() = info;
  }
};

// ---------------------------------------------------------------------------
// CPU rows: sharded by ForEachRow, each row reduced by RowFns. Only the CPU
// checks the label range (the GPU writes NaN for such rows, see the top).

struct CpuImpl {
  template <typename T, typename L>
  static Status SparseForward(OpKernelContext* ctx, const ForwardArgs& a) {
    typedef typename StorageOf<T>::type S;
    typedef typename AccOf<T>::type A;
    const int64_t C = a.C;
    TF_RETURN_IF_ERROR(CheckLabelRange<L>(*a.labels, C));
    const S* x = AsStorage<T>(*a.logits);
    const L* y = a.labels->flat<L>().data();
    S* out = AsStorage<T>(a.loss);
    A* sh = a.shift->flat<A>().data();
    A* ln = a.log_norm->flat<A>().data();
    ForEachRow(ctx, a.B, 4 * C, [&](int64_t b, bool last) {
      const S* row = x + b * C;
      const ex::LseState<A> s =
          RowFns<S>::Lse(row, C, NextRow<S, A>(row, nullptr, C, last));
      out[b] = ex::Storage<S>::store(
          ex::sparse_loss(s, ex::Storage<S>::load(row[y[b]])));
      const ex::RowStats<A> r = ex::finish(s);
      sh[b] = r.shift;
      ln[b] = r.log_norm;
    });
    return OkStatus();
  }

  template <typename T, typename L>
  static Status SparseGrad(OpKernelContext* ctx, const GradArgs& a) {
    typedef typename StorageOf<T>::type S;
    typedef typename AccOf<T>::type A;
    const int64_t C = a.C;
    TF_RETURN_IF_ERROR(CheckLabelRange<L>(*a.labels, C));
    const S* x = AsStorage<T>(*a.logits);
    const L* y = a.labels->flat<L>().data();
    const A* sh = a.shift->flat<A>().data();
    const A* ln = a.log_norm->flat<A>().data();
    const S* g = AsStorage<T>(*a.grad_loss);
    S* dx = AsStorage<T>(a.dlogits);
    ForEachRow(ctx, a.B, 4 * C, [&](int64_t b) {
      ex::RowStats<A> r;
      r.shift = sh[b];
      r.log_norm = ln[b];
      RowFns<S>::SparseGrad(x + b * C, C, static_cast<int64_t>(y[b]), r,
                            ex::Storage<S>::load(g[b]), dx + b * C);
    });
    return OkStatus();
  }

  template <typename T>
  static Status DenseForward(OpKernelContext* ctx, const ForwardArgs& a) {
    typedef typename StorageOf<T>::type S;
    typedef typename AccOf<T>::type A;
    const int64_t C = a.C;
    const S* x = AsStorage<T>(*a.logits);
    const S* y = AsStorage<T>(*a.labels);
    S* out = AsStorage<T>(a.loss);
    A* sh = a.shift->flat<A>().data();
    A* ln = a.log_norm->flat<A>().data();
    ForEachRow(ctx, a.B, 6 * C, [&](int64_t b) {
      const ex::DenseState<A> s = RowFns<S>::Dense(x + b * C, y + b * C, C);
      out[b] = ex::Storage<S>::store(ex::dense_loss(s));
      const ex::RowStats<A> r = ex::finish(s.lse);
      sh[b] = r.shift;
      ln[b] = r.log_norm;
    });
    return OkStatus();
  }

  template <typename T>
  static Status DenseGrad(OpKernelContext* ctx, const GradArgs& a) {
    typedef typename StorageOf<T>::type S;
    typedef typename AccOf<T>::type A;
    const int64_t C = a.C;
    const S* x = AsStorage<T>(*a.logits);
    const S* y = AsStorage<T>(*a.labels);
    const A* sh = a.shift->flat<A>().data();
    const A* ln = a.log_norm->flat<A>().data();
    const S* g = AsStorage<T>(*a.grad_loss);
    S* dx = AsStorage<T>(a.dlogits);
    ForEachRow(ctx, a.B, 6 * C, [&](int64_t b) {
      ex::RowStats<A> r;
      r.shift = sh[b];
      r.log_norm = ln[b];
      RowFns<S>::DenseGrad(x + b * C, y + b * C, C, r,
                           ex::Storage<S>::load(g[b]), a.exact_gradient, dx + b * C);
    });
    return OkStatus();
  }
};

// ---------------------------------------------------------------------------
// The training step in one B x C pass (EquivtoolSparseXentStep, then
// EquivtoolSparseXentStepGrad). The upstream gradient of a row's loss is
// known only in the backward, but in a training step it is nearly always one
// value for every row: fl(1 / B) for a mean (tf.reduce_mean, Keras'
// sum_over_batch_size), 1 for a sum, a loss scale over B. So the forward
// guesses it and writes the final dlogits while it has the exponentials; the
// gradient op checks the guess against every row's grad_loss (B values) and
// hands the buffer on when it holds, which makes a step one read of the
// logits and one write of B x C, as tf.exp. When the guess fails, the
// gradient op still gives the same bits: float and double buffers written for
// 1 (softmax - onehot itself) are scaled in place, anything else is
// recomputed from the logits and the forward's shift and log_norm (the
// separate gradient op's rows). The guess never changes a result, only the
// work: each forward kernel (a site) remembers what its gradient op last saw.
struct StepGuess {
  enum Kind { kMean, kConst, kMixed };  // fl(1/B) | one value | rows differ
  struct Seen { Kind kind; uint64_t bits; };

  static int64_t NewSite() {
    static std::atomic<int64_t> next{0};
    return ++next;
  }
  static bool Lookup(int64_t site, Seen* seen) {
    std::lock_guard<std::mutex> lock(Mu());
    auto it = Map().find(site);
    if (it == Map().end()) return false;
    *seen = it->second;
    return true;
  }
  static void Record(int64_t site, Seen seen) {
    std::lock_guard<std::mutex> lock(Mu());
    if (Map().size() >= 4096 && Map().count(site) == 0) Map().clear();  // bounded
    Map()[site] = seen;
  }
  // The mean's upstream gradient as TensorFlow's Mean gradient computes it:
  // 1 / B in T (16-bit: B and the quotient rounded to T, the quotient in float).
  template <typename S> static S Mean(int64_t B) {
    typedef typename ex::Storage<S>::acc A;
    const A b = ex::Storage<S>::load(ex::Storage<S>::store(A(B)));
    return ex::Storage<S>::store(A(1) / b);
  }
  // 0: the forward's buffer handed on; 1: scaled in place; 2: recomputed.
  static std::atomic<int64_t>& Calls(int which) {
    static std::atomic<int64_t> calls[3];
    return calls[which];
  }

 private:
  static std::mutex& Mu() {
    static std::mutex mu;
    return mu;
  }
  static std::unordered_map<int64_t, Seen>& Map() {
    static std::unordered_map<int64_t, Seen> map;
    return map;
  }
};

template <typename S> uint64_t BitsOf(S v) {
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof v);
  return bits;
}
template <typename S> S FromBits(uint64_t bits) {
  S v;
  memcpy(&v, &bits, sizeof v);
  return v;
}

template <typename T, typename L>
class SparseXentStepOp : public OpKernel {
 public:
  explicit SparseXentStepOp(OpKernelConstruction* c) : OpKernel(c), site_(StepGuess::NewSite()) {}
  void Compute(OpKernelContext* ctx) override {
    typedef typename StorageOf<T>::type S;
    typedef typename AccOf<T>::type A;
    constexpr bool kExact = std::is_same<T, A>::value;  // S holds softmax - onehot exactly
    const Tensor& logits = ctx->input(0);
    const Tensor& labels = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckLogitsAndLabels(logits, labels, /*dense=*/false));
    const int64_t B = logits.dim_size(0), C = logits.dim_size(1);
    OP_REQUIRES_OK(ctx, CheckLabelRange<L>(labels, C));
    // the guess: what this site's gradient last saw, else a mean's; where the
    // rows differed, 1 for float/double (then scaled in place), none for 16-bit
    StepGuess::Seen seen{StepGuess::kMean, 0};
    StepGuess::Lookup(site_, &seen);
    bool guessed = true;
    S s = StepGuess::Mean<S>(B);
    if (seen.kind == StepGuess::kConst) s = FromBits<S>(seen.bits);
    if (seen.kind == StepGuess::kMixed) {
      s = ex::Storage<S>::store(A(1));
      guessed = kExact;
    }
    Tensor *loss, *dx_t, *guess, *site, *shift, *log_norm;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({B}), &loss));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({guessed ? B : 0, C}), &dx_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({guessed ? 1 : 0}), &guess));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({}), &site));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({B}), &shift));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(5, TensorShape({B}), &log_norm));
    site->scalar<int64_t>()() = site_;
    if (guessed) AsStorage<T>(guess)[0] = s;
    if (B == 0) return;
    const S* x = AsStorage<T>(logits);
    const L* y = labels.flat<L>().data();
    S* out = AsStorage<T>(loss);
    A* sh = shift->flat<A>().data();
    A* ln = log_norm->flat<A>().data();
    S* dx = guessed ? AsStorage<T>(dx_t) : nullptr;
    if (guessed) CpuPath::MaybePoison(dx, B * C);
    StepRows<S> rows(B, C);
    if (!kExact) rows.stream_fused = false;  // 16-bit step rows are not streamed
    const A sa = ex::Storage<S>::load(s);
    ForEachRow(ctx, B, 6 * C, [&](int64_t b, bool last) {
      thread_local int64_t done = 0;
      const S* row = x + b * C;
      const int64_t label = static_cast<int64_t>(y[b]);
      const ex::LseState<A> st =
          guessed ? rows.Step(row, C, label, sa, dx + b * C, last)
                  : RowFns<S>::Lse(row, C, NextRow<S, A>(row, nullptr, C, last));
      out[b] = ex::Storage<S>::store(ex::sparse_loss(st, ex::Storage<S>::load(row[label])));
      const ex::RowStats<A> r = ex::finish(st);
      sh[b] = r.shift;
      ln[b] = r.log_norm;
      if (guessed) rows.EndShard(last, &done, /*fused=*/true);
    });
  }

 private:
  const int64_t site_;
};

template <typename T, typename L>
class SparseXentStepGradOp : public OpKernel {
 public:
  explicit SparseXentStepGradOp(OpKernelConstruction* c) : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    typedef typename StorageOf<T>::type S;
    typedef typename AccOf<T>::type A;
    constexpr bool kExact = std::is_same<T, A>::value;
    const Tensor& buffer = ctx->input(0);
    const Tensor& guess = ctx->input(1);
    const Tensor& site = ctx->input(2);
    const Tensor& grad_loss = ctx->input(3);
    const Tensor& logits = ctx->input(4);
    const Tensor& labels = ctx->input(5);
    OP_REQUIRES_OK(ctx, CheckLogitsAndLabels(logits, labels, /*dense=*/false));
    const int64_t B = logits.dim_size(0), C = logits.dim_size(1);
    OP_REQUIRES_OK(ctx, CheckRowVector(grad_loss, B, "grad_loss"));
    OP_REQUIRES_OK(ctx, CheckRowVector(ctx->input(6), B, "shift"));
    OP_REQUIRES_OK(ctx, CheckRowVector(ctx->input(7), B, "log_norm"));
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(site.shape()),
                errors::InvalidArgument("site must be a scalar, got shape ",
                                        site.shape().DebugString()));
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(guess.shape()) && guess.NumElements() <= 1,
                errors::InvalidArgument("guess must have shape [0] or [1], got ",
                                        guess.shape().DebugString()));
    const bool guessed = guess.NumElements() == 1;
    OP_REQUIRES(ctx, !guessed || buffer.shape() == logits.shape(),
                errors::InvalidArgument("dlogits_guess must have the logits' shape ",
                                        logits.shape().DebugString(), ", but got shape ",
                                        buffer.shape().DebugString()));
    const S* g = AsStorage<T>(grad_loss);
    // what the upstream gradient was: one value (whose bits) or rows differ
    bool uniform = true;
    const uint64_t g0 = B > 0 ? BitsOf(g[0]) : 0;
    for (int64_t b = 1; b < B && uniform; ++b) uniform = BitsOf(g[b]) == g0;
    if (B > 0) {
      StepGuess::Seen seen{StepGuess::kMixed, 0};
      if (uniform) {
        const bool mean = g0 == BitsOf(StepGuess::Mean<S>(B));
        seen = StepGuess::Seen{mean ? StepGuess::kMean : StepGuess::kConst, g0};
      }
      StepGuess::Record(site.scalar<int64_t>()(), seen);
    }
    const uint64_t s = guessed ? BitsOf(AsStorage<T>(guess)[0]) : 0;
    if (guessed && (B == 0 || C == 0 || (uniform && g0 == s))) {
      ctx->set_output(0, buffer);  // the forward wrote exactly these
      StepGuess::Calls(0).fetch_add(1, std::memory_order_relaxed);
      return;
    }
    Tensor* dlogits = nullptr;
    if (kExact && guessed && s == BitsOf(ex::Storage<S>::store(A(1)))) {
      // buffer = softmax - onehot exactly: scale it (in place when no one else reads it)
      OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 0, logits.shape(), &dlogits));
      const A* bp = reinterpret_cast<const A*>(AsStorage<T>(buffer));
      S* dx = AsStorage<T>(dlogits);
      if (dx != reinterpret_cast<const void*>(bp)) CpuPath::MaybePoison(dx, B * C);
      ScaleRows(ctx, StepRows<S>(B, C), bp, g, dx, B, C);
      StepGuess::Calls(1).fetch_add(1, std::memory_order_relaxed);
      return;
    }
    // recompute: the separate gradient op's rows
    GradArgs a;
    a.logits = &logits;
    a.labels = &labels;
    a.shift = &ctx->input(6);
    a.log_norm = &ctx->input(7);
    a.grad_loss = &grad_loss;
    a.B = B;
    a.C = C;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, logits.shape(), &a.dlogits));
    if (B == 0 || C == 0) return;
    CpuPath::MaybePoison(AsStorage<T>(a.dlogits), B * C);
    OP_REQUIRES_OK(ctx, (CpuImpl::SparseGrad<T, L>(ctx, a)));
    StepGuess::Calls(2).fetch_add(1, std::memory_order_relaxed);
  }
};

void* CudaStream(OpKernelContext* ctx) {
  return ctx->op_device_context()->stream()->platform_specific_handle().stream;
}

// ---------------------------------------------------------------------------
// GPU rows, compiled at run time: the kernels of xent_device.cuh compiled by
// NVRTC (equivtool/ops/_nvrtc.py) and launched through the driver API
// (xent_driver.h) on TensorFlow's stream, by xent_launch.h's recipe (the
// GPU harness's nvcc-built launchers run it too); chunk states come from
// TensorFlow's allocator, the per-row counters from the stream's workspace.
// Registered for DEVICE_GPU at run time, by equivtool_xent_enable_gpu below,
// once the cubins are in.

namespace gk = ::equivtool_xent::gpu;
namespace drv = ::equivtool_xent::driver;

// Chunk states in a temporary tensor, alive until the op returns (TensorFlow
// reuses it only for work queued after ours on the stream).
struct TempStates {
  OpKernelContext* ctx;
  Tensor tensor;
};

std::string AllocateStates(void* arg, size_t bytes, void** out) {
  TempStates* t = static_cast<TempStates*>(arg);
  Status s = t->ctx->allocate_temp(DT_INT8, TensorShape({static_cast<int64_t>(bytes)}), &t->tensor);
  if (!s.ok()) return s.ToString();
  *out = t->tensor.flat<int8>().data();
  return "";
}

Status DriverStatus(const std::string& error, const char* op) {
  if (error.empty()) return OkStatus();
  return errors::Internal(op, ": ", error);
}

struct DriverImpl {
  template <typename T, typename L>
  static Status SparseForward(OpKernelContext* ctx, const ForwardArgs& a) {
    typedef typename AccOf<T>::type A;
    TempStates temp{ctx, Tensor()};
    auto* loss = AsStorage<T>(a.loss);
    drv::DriverBackend b(CudaStream(ctx), loss, &AllocateStates, &temp);
    return DriverStatus(
        gk::SparseForward(b, AsStorage<T>(*a.logits), a.labels->flat<L>().data(), a.B, a.C, loss,
                          a.shift->flat<A>().data(), a.log_norm->flat<A>().data()),
        "EquivtoolSparseXent");
  }

  template <typename T, typename L>
  static Status SparseGrad(OpKernelContext* ctx, const GradArgs& a) {
    typedef typename AccOf<T>::type A;
    auto* dx = AsStorage<T>(a.dlogits);
    drv::DriverBackend b(CudaStream(ctx), dx);
    return DriverStatus(
        gk::SparseGrad(b, AsStorage<T>(*a.logits), a.labels->flat<L>().data(), a.B, a.C,
                       static_cast<const A*>(a.shift->flat<A>().data()),
                       static_cast<const A*>(a.log_norm->flat<A>().data()),
                       AsStorage<T>(*a.grad_loss), dx),
        "EquivtoolSparseXentGrad");
  }

  template <typename T>
  static Status DenseForward(OpKernelContext* ctx, const ForwardArgs& a) {
    typedef typename AccOf<T>::type A;
    TempStates temp{ctx, Tensor()};
    auto* loss = AsStorage<T>(a.loss);
    drv::DriverBackend b(CudaStream(ctx), loss, &AllocateStates, &temp);
    return DriverStatus(
        gk::DenseForward(b, AsStorage<T>(*a.logits), AsStorage<T>(*a.labels), a.B, a.C, loss,
                         a.shift->flat<A>().data(), a.log_norm->flat<A>().data()),
        "EquivtoolXent");
  }

  template <typename T>
  static Status DenseGrad(OpKernelContext* ctx, const GradArgs& a) {
    typedef typename AccOf<T>::type A;
    TempStates temp{ctx, Tensor()};
    auto* dx = AsStorage<T>(a.dlogits);
    drv::DriverBackend b(CudaStream(ctx), dx, &AllocateStates, &temp);
    return DriverStatus(
        gk::DenseGrad(b, AsStorage<T>(*a.logits), AsStorage<T>(*a.labels), a.B, a.C,
                      static_cast<const A*>(a.shift->flat<A>().data()),
                      static_cast<const A*>(a.log_norm->flat<A>().data()),
                      AsStorage<T>(*a.grad_loss), a.exact_gradient, dx),
        "EquivtoolXentGrad");
  }
};

// ---------------------------------------------------------------------------
// Kernel registrations: every op for every T (and Tlabels) on DEV with IMPL.

#define REGISTER_SPARSE(DEV, IMPL, T, L)                                   \
  REGISTER_KERNEL_BUILDER(Name("EquivtoolSparseXent")                      \
                              .Device(DEV)                                 \
                              .TypeConstraint<T>("T")                      \
                              .TypeConstraint<L>("Tlabels")                \
                              .TypeConstraint<AccOf<T>::type>("Tacc"),     \
                          SparseXentOp<IMPL, T, L>);                       \
  REGISTER_KERNEL_BUILDER(Name("EquivtoolSparseXentGrad")                  \
                              .Device(DEV)                                 \
                              .TypeConstraint<T>("T")                      \
                              .TypeConstraint<L>("Tlabels")                \
                              .TypeConstraint<AccOf<T>::type>("Tacc"),     \
                          SparseXentGradOp<IMPL, T, L>);
#define REGISTER_DENSE(DEV, IMPL, T)                                       \
  REGISTER_KERNEL_BUILDER(Name("EquivtoolXent")                            \
                              .Device(DEV)                                 \
                              .TypeConstraint<T>("T")                      \
                              .TypeConstraint<AccOf<T>::type>("Tacc"),     \
                          XentOp<IMPL, T>);                                \
  REGISTER_KERNEL_BUILDER(Name("EquivtoolXentGrad")                        \
                              .Device(DEV)                                 \
                              .TypeConstraint<T>("T")                      \
                              .TypeConstraint<AccOf<T>::type>("Tacc"),     \
                          XentGradOp<IMPL, T>);
#define REGISTER_T(DEV, IMPL, T)         \
  REGISTER_SPARSE(DEV, IMPL, T, int32)   \
  REGISTER_SPARSE(DEV, IMPL, T, int64_t) \
  REGISTER_DENSE(DEV, IMPL, T)
#define REGISTER_DEVICE(DEV, IMPL)         \
  REGISTER_T(DEV, IMPL, Eigen::half)       \
  REGISTER_T(DEV, IMPL, bfloat16)          \
  REGISTER_T(DEV, IMPL, float)             \
  REGISTER_T(DEV, IMPL, double)

REGISTER_DEVICE(DEVICE_CPU, CpuImpl)

#define REGISTER_CPU_STEP(NAME, KERNEL, T, L)                              \
  REGISTER_KERNEL_BUILDER(Name(NAME)                                       \
                              .Device(DEVICE_CPU)                          \
                              .TypeConstraint<T>("T")                      \
                              .TypeConstraint<L>("Tlabels")                \
                              .TypeConstraint<AccOf<T>::type>("Tacc"),     \
                          KERNEL<T, L>);
#define REGISTER_FUSED(T, L)                                                  \
  REGISTER_CPU_STEP("EquivtoolSparseXentFused", SparseXentFusedOp, T, L)      \
  REGISTER_CPU_STEP("EquivtoolSparseXentScale", SparseXentScaleOp, T, L)      \
  REGISTER_CPU_STEP("EquivtoolSparseXentStep", SparseXentStepOp, T, L)        \
  REGISTER_CPU_STEP("EquivtoolSparseXentStepGrad", SparseXentStepGradOp, T, L)
#define REGISTER_FUSED_T(T) REGISTER_FUSED(T, int32) REGISTER_FUSED(T, int64_t)
REGISTER_FUSED_T(Eigen::half)
REGISTER_FUSED_T(bfloat16)
REGISTER_FUSED_T(float)
REGISTER_FUSED_T(double)
#undef REGISTER_FUSED_T
#undef REGISTER_FUSED
#undef REGISTER_CPU_STEP
#undef REGISTER_DEVICE
#undef REGISTER_T
#undef REGISTER_DENSE
#undef REGISTER_SPARSE

REGISTER_KERNEL_BUILDER(Name("EquivtoolXentBuildInfo").Device(DEVICE_CPU),
                        BuildInfoOp);

// The driver-API kernels for DEVICE_GPU, registered at run time (the
// registrars live for the process, as REGISTER_KERNEL_BUILDER's statics do).
template <typename Op> OpKernel* Create(OpKernelConstruction* c) { return new Op(c); }

template <typename Op>
void RegisterGpu(KernelDefBuilder& builder, const char* name) {
  new kernel_factory::OpKernelRegistrar(builder.Device(DEVICE_GPU).Build(), name, &Create<Op>);
}

template <typename T, typename L>
void RegisterSparseGpu() {
  typedef typename AccOf<T>::type A;
  KernelDefBuilder fwd("EquivtoolSparseXent"), grad("EquivtoolSparseXentGrad");
  for (KernelDefBuilder* b : {&fwd, &grad}) {
    b->template TypeConstraint<T>("T");
    b->template TypeConstraint<L>("Tlabels");
    b->template TypeConstraint<A>("Tacc");
  }
  RegisterGpu<SparseXentOp<DriverImpl, T, L>>(fwd, "SparseXentOp");
  RegisterGpu<SparseXentGradOp<DriverImpl, T, L>>(grad, "SparseXentGradOp");
}

template <typename T>
void RegisterGpuType() {
  typedef typename AccOf<T>::type A;
  RegisterSparseGpu<T, int32>();
  RegisterSparseGpu<T, int64_t>();
  KernelDefBuilder fwd("EquivtoolXent"), grad("EquivtoolXentGrad");
  for (KernelDefBuilder* b : {&fwd, &grad}) {
    b->template TypeConstraint<T>("T");
    b->template TypeConstraint<A>("Tacc");
  }
  RegisterGpu<XentOp<DriverImpl, T>>(fwd, "XentOp");
  RegisterGpu<XentGradOp<DriverImpl, T>>(grad, "XentGradOp");
}

}  // namespace
}  // namespace tensorflow

// The C entry points equivtool/ops/_gpu.py calls through ctypes.
extern "C" {

// A cubin of NVRTC-compiled kernels for sm_<arch>; `names` holds "key=lowered"
// lines. Returns the number of kernels, or -1 for a malformed call.
__attribute__((visibility("default"))) int equivtool_xent_add_cubin(int arch, const void* data,
                                                                    size_t size,
                                                                    const char* names) {
  if (data == nullptr || names == nullptr) return -1;
  return ::equivtool_xent::driver::AddImage(arch, data, size, names);
}

// "" when the driver loads and initialises, else why not.
__attribute__((visibility("default"))) const char* equivtool_xent_driver_error() {
  return ::equivtool_xent::driver::GetApi().error.c_str();
}

// The driver's CUDA version (12040 for 12.4), or 0.
__attribute__((visibility("default"))) int equivtool_xent_driver_version() {
  return ::equivtool_xent::driver::GetApi().version;
}

// Registers the driver-API kernels for DEVICE_GPU, once. Returns 1 when they
// were registered now, 0 when they already were, -1 without a usable driver.
__attribute__((visibility("default"))) int equivtool_xent_enable_gpu() {
  if (!::equivtool_xent::driver::GetApi().error.empty()) return -1;
  static std::once_flag once;
  int result = 0;
  std::call_once(once, [&result] {
    ::tensorflow::RegisterGpuType<Eigen::half>();
    ::tensorflow::RegisterGpuType<::tensorflow::bfloat16>();
    ::tensorflow::RegisterGpuType<float>();
    ::tensorflow::RegisterGpuType<double>();
    result = 1;
  });
  return result;
}

// The CPU training step's path (see CpuPath): avx512 = 0 or 1 turns the
// AVX-512 rows off or on (on only where the CPU has them), -1 leaves it;
// stream_min_bytes >= 0 sets the backprop size from which the fused forward
// streams, -1 leaves it; poison = 0 or 1 (tests), -1 leaves it; threads >= 0
// sets CpuPath::Threads (0: the pool's; tests), -1 leaves it. Writes the
// settings in force before the call, the CPU's support, and the rows each
// variant wrote so far into out[0..7]: avx512, stream_min_bytes, supported,
// streamed rows, F16C rows, poison, threads, rows helper threads computed.
__attribute__((visibility("default"))) void equivtool_xent_cpu_path(int avx512,
                                                                    int64_t stream_min_bytes,
                                                                    int poison, int threads,
                                                                    int64_t* out) {
  using ::tensorflow::CpuPath;
  if (out != nullptr) {
    out[0] = CpuPath::Avx512().load() ? 1 : 0;
    out[1] = CpuPath::StreamMinBytes().load();
    out[2] = ::tensorflow::CpuHasAvx512() ? 1 : 0;
    out[3] = CpuPath::Rows(0).load();
    out[4] = CpuPath::Rows(1).load();
    out[5] = CpuPath::Poison().load() ? 1 : 0;
    out[6] = CpuPath::Threads().load();
    out[7] = CpuPath::Rows(2).load();
  }
  if (poison >= 0) CpuPath::Poison().store(poison != 0);
  if (threads >= 0) CpuPath::Threads().store(threads);
  if (avx512 >= 0) CpuPath::Avx512().store(avx512 != 0 && ::tensorflow::CpuHasAvx512());
  if (stream_min_bytes >= 0) CpuPath::StreamMinBytes().store(stream_min_bytes);
}

// The one-pass step's gradient calls so far (see StepGuess), into out[0..2]:
// the forward's buffer handed on, scaled in place, recomputed.
__attribute__((visibility("default"))) void equivtool_xent_step_calls(int64_t* out) {
  for (int i = 0; i < 3; ++i) out[i] = ::tensorflow::StepGuess::Calls(i).load();
}

}  // extern "C"
