// Row arithmetic of equivtool's softmax cross-entropy, shared by the CPU
// kernels (xent_ops.cc) and the CUDA kernels (xent_kernels.cu.cc).
//
// Everything here is a plain function of one row of logits and depends on
// nothing but the row and its length C: no threads, no work partition, no
// TensorFlow or CUDA headers. That is what makes the op deterministic: the
// order in which a row's partial sums are combined is fixed by C alone.
//
// Vocabulary
//   acc      the accumulation type: float for half, bfloat16 and float
//            logits, double for double logits.
//   shift    the row's maximum (a finite floor of -max_finite stands in for a
//            row without finite values); kept exactly, in acc.
//   log_norm log(sum_j exp(x_j - shift)); logsumexp = shift + log_norm.
//   Keeping shift and log_norm apart (instead of one logsumexp) lets the
//   gradient evaluate exp((x - shift) - log_norm) without the cancellation
//   that exp(x - logsumexp) suffers for logits of large magnitude.
//
// The single-pass log-sum-exp is the online normaliser of Milakov and
// Gimelshein (arXiv:1805.02867): a state (m, d) with d = sum exp(x - m);
// two states merge associatively. The CPU's dense rows run kLanes
// independent states over a row in blocks (the block maximum is taken first,
// so each element costs one exponential) and merge the lanes in a fixed tree;
// the CUDA kernel runs one state per thread and merges them in a fixed tree in
// shared memory. The CPU's sparse rows need no online state: they take the
// row's maximum in a first pass and sum the exponentials in a second (see
// "CPU sparse rows" below), which lets a training step keep the exponentials.
//
// Special values follow TensorFlow's fused kernels: a row holding +inf or
// NaN, or holding only -inf, gives NaN loss and NaN gradient row; a -inf
// logit elsewhere has probability 0 (and infinite loss if it is the label).

#ifndef EQUIVTOOL_CUSTOM_OPS_XENT_XENT_ROW_H_
#define EQUIVTOOL_CUSTOM_OPS_XENT_XENT_ROW_H_

#if defined(__CUDACC_RTC__)
// NVRTC compiles without a C library: the fixed-width integers used here
// (exp, log and memcpy are NVRTC built-ins).
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long int64_t;  // LP64, as on the host: kernel names mangle alike
typedef unsigned long uint64_t;
typedef unsigned long uintptr_t;
#else
#include <math.h>
#include <stdint.h>
#include <string.h>
#endif

#if defined(__CUDACC__)
#define XENT_FN __host__ __device__ __forceinline__
#else
#define XENT_FN inline __attribute__((always_inline))
#endif

namespace equivtool_xent {

// ---------------------------------------------------------------------------
// Storage types. 16-bit logits travel as raw bits so that this header needs
// neither Eigen's nor CUDA's half types; TensorFlow's Eigen::half and
// bfloat16 have exactly this layout.
struct half_bits { uint16_t bits; };
struct bf16_bits { uint16_t bits; };

XENT_FN uint32_t float_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
XENT_FN float bits_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

// The conversions and the exponential below are written once for a scalar
// (F = float, U = uint32_t) and, on the host, for a GCC vector of kLanes
// floats: the same operations in the same order, so a lane of the vector
// code gives the bits the scalar code gives.
template <typename To, typename From> XENT_FN To bit_cast(const From& f) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast needs equal sizes");
  To t; memcpy(&t, &f, sizeof(To)); return t;
}
template <typename F> struct Lanes;  // F's unsigned and signed integer twins
template <> struct Lanes<float> { typedef uint32_t U; typedef int32_t I; };
template <typename F> XENT_FN F splat(float c) { return F{} + c; }
template <typename U> XENT_FN U splat_u(uint32_t c) { return U{} + c; }

// The CPU kernels run kLanes independent accumulators (see row_lse_lanes).
constexpr int kLanes = 16;
constexpr int kUnroll = 8;

#if !defined(__CUDACC__)
#define XENT_HOST_VECTORS 1
typedef float vfloat __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t vint __attribute__((vector_size(kLanes * sizeof(int32_t))));
typedef uint32_t vuint __attribute__((vector_size(kLanes * sizeof(uint32_t))));
typedef uint16_t vu16 __attribute__((vector_size(kLanes * sizeof(uint16_t))));
typedef double vwide __attribute__((vector_size(kLanes * sizeof(double))));
template <> struct Lanes<vfloat> { typedef vuint U; typedef vint I; };
// element-wise conversions (GCC 12 has no __builtin_convert_vector)
template <typename To, typename From> XENT_FN To convert_lanes(const From& v) {
  To r;
  for (int l = 0; l < kLanes; ++l) r[l] = v[l];
  return r;
}
#endif

// bfloat16 is the upper half of a float.
template <typename F, typename U> XENT_FN F bf16_to_float_g(U b) { return bit_cast<F>(b << 16); }

// Round to nearest even; NaN stays a (quiet) NaN.
template <typename F, typename U> XENT_FN U float_to_bf16_g(F f) {
  const U u = bit_cast<U>(f);
  const U rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const U quiet = (u >> 16) | 0x0040u;  // (rounded, quiet: both U)
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? quiet : rounded;
}

// IEEE binary16 -> float, exact, including subnormals, inf and NaN. Half
// subnormals are built as integer * 2^-24, which gives float normals and so
// stays exact when the CPU treats float denormals as zero.
template <typename F, typename U> XENT_FN F half_to_float_g(U h) {
  const U sign = (h & 0x8000u) << 16;
  const U rest = (h & 0x7FFFu) << 13;  // exponent and mantissa
  const U exponent = h & 0x7C00u;
  const U normal = rest + 0x38000000u;  // exponent + (127 - 15)
  const U special = rest | 0x7F800000u;  // inf, NaN
  // (mantissa m: 0.5 + m * 2^-24 is exact in float, so is taking 0.5 away;
  // bit operations and one subtraction, no integer conversion)
  const U subnormal = bit_cast<U>(bit_cast<F>((h & 0x03FFu) | 0x3F000000u) - splat<F>(0.5f));
  const U magnitude = exponent == 0x7C00u ? special : (exponent == 0u ? subnormal : normal);
  return bit_cast<F>(sign | magnitude);
}

// float -> IEEE binary16 with round to nearest even, overflow to inf,
// gradual underflow, NaN kept. Every case is computed, then selected.
template <typename F, typename U> XENT_FN U float_to_half_g(F f) {
  const U u = bit_cast<U>(f);
  const U sign = (u >> 16) & 0x8000u;
  const U a = u & 0x7FFFFFFFu;
  // normal range: rebias the exponent, round at bit 13
  const U normal = (a + 0xC8000000u + 0xFFFu + ((a >> 13) & 1u)) >> 13;  // exponent - 112
  // below the smallest half normal: adding 0.5 aligns the half subnormal
  // grid with the float mantissa's last bits; the FPU rounds to nearest even
  const U subnormal = bit_cast<U>(bit_cast<F>(a) + splat<F>(0.5f)) - 0x3F000000u;
  const U inf = splat_u<U>(0x7C00u);
  const U nan_or_inf = a > 0x7F800000u ? splat_u<U>(0x7E00u) : inf;
  const U finite = a >= 0x477FF000u ? inf : (a < 0x38800000u ? subnormal : normal);
  return sign | (a >= 0x7F800000u ? nan_or_inf : finite);
}

XENT_FN float bf16_to_float(uint16_t b) { return bf16_to_float_g<float, uint32_t>(b); }
XENT_FN uint16_t float_to_bf16(float f) { return uint16_t(float_to_bf16_g<float, uint32_t>(f)); }
XENT_FN float half_to_float(uint16_t h) { return half_to_float_g<float, uint32_t>(h); }
XENT_FN uint16_t float_to_half(float f) { return uint16_t(float_to_half_g<float, uint32_t>(f)); }

template <typename S> struct Storage;
template <> struct Storage<float> {
  typedef float acc;
  static XENT_FN float load(float v) { return v; }
  static XENT_FN float store(float v) { return v; }
};
template <> struct Storage<double> {
  typedef double acc;
  static XENT_FN double load(double v) { return v; }
  static XENT_FN double store(double v) { return v; }
};
template <> struct Storage<half_bits> {
  typedef float acc;
  static XENT_FN float load(half_bits v) { return half_to_float(v.bits); }
  static XENT_FN half_bits store(float v) { half_bits h; h.bits = float_to_half(v); return h; }
};
template <> struct Storage<bf16_bits> {
  typedef float acc;
  static XENT_FN float load(bf16_bits v) { return bf16_to_float(v.bits); }
  static XENT_FN bf16_bits store(float v) { bf16_bits b; b.bits = float_to_bf16(v); return b; }
};

// ---------------------------------------------------------------------------
// Scalars.
template <typename A> struct Limits;
template <> struct Limits<float> {
  static XENT_FN float lowest() { return -3.40282347e+38f; }
  static XENT_FN float infinity() { return bits_float(0x7F800000u); }
  static XENT_FN float quiet_nan() { return bits_float(0x7FC00000u); }
};
template <> struct Limits<double> {
  static XENT_FN double lowest() { return -1.7976931348623157e+308; }
  static XENT_FN double infinity() { return double(Limits<float>::infinity()); }
  static XENT_FN double quiet_nan() { return double(Limits<float>::quiet_nan()); }
};

// max that never returns a NaN coming from b: the running maximum stays a
// number, and NaN reaches the sum through the exponential instead.
template <typename A> XENT_FN A max_keep(A a, A b) { return b > a ? b : a; }

// exp for float, written out so that compilers vectorise it and CPU and GPU
// evaluate the same polynomial: exp(x) = 2^n * exp(r), n = round(x / ln 2),
// r = x - n ln 2 in two pieces, exp(r) by a degree-6 minimax polynomial
// (Cephes' coefficients), within 2 ulp of exp for x in [-87, 88]. Below -87
// it returns 0 (exp(-87) < 1.7e-38; the result is never subnormal), above
// 88 +inf; NaN gives NaN. The op evaluates it only at x - shift <= 0.
// kOverflow = false (exp_nonpos_g) leaves out the overflow side.
template <bool kOverflow, typename F> XENT_FN F exp_core(F x) {
  typedef typename Lanes<F>::I I;
  const F lo = splat<F>(-87.0f), hi = splat<F>(88.0f);
  F xc = x < lo ? lo : x;
  if (kOverflow) xc = xc > hi ? hi : xc;
  // round to nearest via the 1.5 * 2^23 trick (exact for |t| < 2^22)
  const F t = xc * splat<F>(1.44269504088896341f) + splat<F>(12582912.0f);
  const F n = t - splat<F>(12582912.0f);
  const I ni = bit_cast<I>(t) - 0x4B400000;
  F r = xc - n * splat<F>(0.693359375f);
  r = r - n * splat<F>(-2.12194440e-4f);
  F p = splat<F>(1.9875691500e-4f);
  p = p * r + splat<F>(1.3981999507e-3f);
  p = p * r + splat<F>(8.3334519073e-3f);
  p = p * r + splat<F>(4.1665795894e-2f);
  p = p * r + splat<F>(1.6666665459e-1f);
  p = p * r + splat<F>(5.0000001201e-1f);
  const F er = (p * r) * r + r + splat<F>(1.0f);
  const F scale = bit_cast<F>((ni + 127) << 23);
  F y = er * scale;
  y = x < lo ? splat<F>(0.0f) : y;
  if (kOverflow) y = x > hi ? splat<F>(Limits<float>::infinity()) : y;
  y = x != x ? x : y;
  return y;
}
template <typename F> XENT_FN F exp_g(F x) { return exp_core<true, F>(x); }
XENT_FN float exp_acc(float x) { return exp_g<float>(x); }
XENT_FN double exp_acc(double x) { return exp(x); }

// exp_g for arguments that are <= 0 or NaN, as x - max is in a row whose max
// was taken first: the clamp at 88 and the +inf select can never fire there,
// so they are left out (4 of about 35 vector operations per exponential),
// and the bits are exp_g's for every such argument.
template <typename F> XENT_FN F exp_nonpos_g(F x) { return exp_core<false, F>(x); }

// ---------------------------------------------------------------------------
// The online log-sum-exp state and its two operations.
// Sums are carried in double whatever the logits' type: a float sum of
// thousands of terms would lose more accuracy than TensorFlow's op does.
// Exponentials and per-block partial sums stay in acc (fast); only the
// per-block update, the merges and the final log are in double.
typedef double wide;

template <typename A> struct LseState {
  A m;     // running maximum (finite floor: lowest())
  wide d;  // sum of exp(x - m) over the elements seen
};

template <typename A> XENT_FN LseState<A> lse_empty() {
  LseState<A> s; s.m = Limits<A>::lowest(); s.d = 0.0; return s;
}

// One element. Costs two exponentials; the blocked CPU path avoids that.
template <typename A> XENT_FN void lse_push(LseState<A>& s, A x) {
  const A m = max_keep(s.m, x);
  s.d = s.d * wide(exp_acc(s.m - m)) + wide(exp_acc(x - m));
  s.m = m;
}

// Merge b into a. Associative up to rounding, so the order is fixed by the
// callers (a tree whose shape depends only on the lane count).
template <typename A> XENT_FN void lse_merge(LseState<A>& a, const LseState<A>& b) {
  const A m = max_keep(a.m, b.m);
  a.d = a.d * wide(exp_acc(a.m - m)) + b.d * wide(exp_acc(b.m - m));
  a.m = m;
}

// Dense labels add two sums to the state: ysum = sum y and
// yx = sum y * (x - m), rescaled when m moves.
template <typename A> struct DenseState {
  LseState<A> lse;
  wide ysum;
  wide yx;
};

template <typename A> XENT_FN DenseState<A> dense_empty() {
  DenseState<A> s; s.lse = lse_empty<A>(); s.ysum = 0.0; s.yx = 0.0; return s;
}

// The two label terms.
//   ysum * (m_old - m): yx's rescale when the maximum moves from m_old to m.
//     The operands are widened before they are subtracted: in acc the
//     difference of two finite values can overflow (x = 1e32 against an
//     empty state's floor -3.4e38 in float), and -inf times a zero label sum
//     is NaN. It is exactly zero when ysum is zero, because in double even the
//     widened difference overflows (the floor -1.8e308 against x = 1e308).
//     Once per block on the CPU, so the double arithmetic costs nothing.
//   y * (x - m): one element's term, also widened before subtracting. With a
//     fractional label the term is finite where x - m overflows acc (bfloat16
//     logits -3e38 and 3e38, labels 0.5: the difference -6e38 is -inf in float
//     but half of it is not), so computing it in acc turns a finite loss into
//     inf (seen on the GPU harness's "huge" cases). Costs about 5% of the CPU
//     dense forward, measured.
template <typename A> XENT_FN wide yx_rescale(wide ysum, A m_old, A m) {
  return ysum == 0.0 ? 0.0 : ysum * (wide(m_old) - wide(m));
}
template <typename A> XENT_FN wide yx_term(A y, A x, A m) {
  return wide(y) * (wide(x) - wide(m));
}

template <typename A> XENT_FN void dense_push(DenseState<A>& s, A x, A y) {
  const A m = max_keep(s.lse.m, x);
  s.yx = s.yx + yx_rescale(s.ysum, s.lse.m, m) + yx_term(y, x, m);
  s.ysum = s.ysum + wide(y);
  s.lse.d = s.lse.d * wide(exp_acc(s.lse.m - m)) + wide(exp_acc(x - m));
  s.lse.m = m;
}

template <typename A> XENT_FN void dense_merge(DenseState<A>& a, const DenseState<A>& b) {
  const A m = max_keep(a.lse.m, b.lse.m);
  a.yx = (a.yx + yx_rescale(a.ysum, a.lse.m, m)) + (b.yx + yx_rescale(b.ysum, b.lse.m, m));
  a.ysum = a.ysum + b.ysum;
  lse_merge(a.lse, b.lse);
}

// ---------------------------------------------------------------------------
// Results of one row.
template <typename A> struct RowStats {
  A shift;
  A log_norm;
};

template <typename A> XENT_FN RowStats<A> finish(const LseState<A>& s) {
  RowStats<A> r; r.shift = s.m; r.log_norm = A(log(s.d)); return r;
}

// Loss of a row whose label logit is x_label: logsumexp - x_label, in double
// and rounded once.
template <typename A> XENT_FN A sparse_loss(const LseState<A>& s, A x_label) {
  return A(log(s.d) - (wide(x_label) - wide(s.m)));
}

// Loss of a dense row: sum_j y_j (logsumexp - x_j) = ysum * log_norm - yx.
// A row of zero classes (TensorFlow accepts them) is an empty sum: 0. Only
// the empty state has d == 0 with both label sums exactly 0: a row of -inf
// logits has d == 0 too, but its yx is NaN (y * -inf) or -inf.
template <typename A> XENT_FN A dense_loss(const DenseState<A>& s) {
  if (s.lse.d == 0.0 && s.ysum == 0.0 && s.yx == 0.0) return A(0);
  return A(s.ysum * log(s.lse.d) - s.yx);
}

// Softmax probability of x: exp(x - shift) * scale, scale = norm_scale(log_norm).
// Written as a product (not exp((x - shift) - log_norm)) so that the CPU's
// fused forward, which has exp(x - shift) in hand once it knows the row's
// sum, gives the bits the separate gradient pass gives (see sparse_fused_row).
template <typename A> XENT_FN A norm_scale(A log_norm) { return A(exp(-wide(log_norm))); }
template <typename A> XENT_FN A probability(A x, A shift, A scale) {
  return exp_acc(x - shift) * scale;
}

// ---------------------------------------------------------------------------
// CPU rows. The host code loads kLanes elements at a time as GCC vectors
// (VecIO): each vector element is one lane and performs exactly the scalar
// code's operations, so vector and scalar agree bit for bit.
#if XENT_HOST_VECTORS
template <typename S> struct VecIO;
template <> struct VecIO<float> {
  static XENT_FN vfloat load(const float* x) { vfloat v; memcpy(&v, x, sizeof v); return v; }
  static XENT_FN void store(float* p, vfloat v) { memcpy(p, &v, sizeof v); }
};
template <> struct VecIO<half_bits> {
  static XENT_FN vfloat load(const half_bits* x) {
    vu16 h; memcpy(&h, x, sizeof h);
    return half_to_float_g<vfloat, vuint>(convert_lanes<vuint>(h));
  }
  static XENT_FN void store(half_bits* p, vfloat v) {
    const vu16 h = convert_lanes<vu16>(float_to_half_g<vfloat, vuint>(v));
    memcpy(p, &h, sizeof h);
  }
};
template <> struct VecIO<bf16_bits> {
  static XENT_FN vfloat load(const bf16_bits* x) {
    vu16 h; memcpy(&h, x, sizeof h);
    return bf16_to_float_g<vfloat, vuint>(convert_lanes<vuint>(h));
  }
  static XENT_FN void store(bf16_bits* p, vfloat v) {
    const vu16 h = convert_lanes<vu16>(float_to_bf16_g<vfloat, vuint>(v));
    memcpy(p, &h, sizeof h);
  }
};

// AVX-512F instructions the portable code has no spelling for: F16C's
// 512-bit half <-> float conversions and the non-temporal (streaming) store.
// Written as inline assembly, not intrinsics, so that the shared row
// templates can be instantiated with them (S = half_f16c, kStream = true)
// inside functions compiled for AVX-512F (xent_ops.cc's *Avx512 row
// functions, picked at run time when the CPU has it); intrinsics would have to
// be inlined into every template on the way, each needing the target too.
// Never instantiate them elsewhere: the assembler needs zmm registers.
#if defined(__x86_64__)
#define XENT_HOST_AVX512 1
// Half logits converted by the hardware. The bits are half_bits' (the
// conversions are exact; vcvtps2ph rounds to nearest even and, unlike the
// float arithmetic, neither it nor vcvtph2ps flushes half subnormals), with
// one difference kept out of every result: vcvtph2ps quiets a signalling
// NaN, which the arithmetic after every load does anyway.
struct half_f16c { uint16_t bits; };
template <> struct Storage<half_f16c> {
  typedef float acc;
  static XENT_FN float load(half_f16c v) { return half_to_float(v.bits); }
  static XENT_FN half_f16c store(float v) { half_f16c h; h.bits = float_to_half(v); return h; }
};
template <> struct VecIO<half_f16c> {
  static XENT_FN vfloat load(const half_f16c* x) {
    vu16 h; memcpy(&h, x, sizeof h);
    vfloat f;
    asm("vcvtph2ps %1, %0" : "=v"(f) : "v"(h));
    return f;
  }
  static XENT_FN void store(half_f16c* p, vfloat v) {
    // float_to_half_g turns every NaN into the quiet NaN 0x7E00 with its sign;
    // vcvtps2ph would keep the payload's top bits, so NaN lanes become the
    // float NaN whose conversion is exactly that
    const vfloat nan = bit_cast<vfloat>((bit_cast<vuint>(v) & 0x80000000u) | 0x7FC00000u);
    const vfloat w = v != v ? nan : v;
    vu16 h;
    asm("vcvtps2ph $8, %1, %0" : "=v"(h) : "v"(w));  // 8: nearest even, no exceptions
    memcpy(p, &h, sizeof h);
  }
};
// 16 floats to a 64-byte aligned p, bypassing the caches (no
// read-for-ownership of the line); weakly ordered: store_fence() after them.
XENT_FN void stream_store(float* p, vfloat v) {
  asm volatile("vmovntps %1, (%0)" : : "r"(p), "v"(v) : "memory");
}
// 16 16-bit values to a 32-byte aligned p, likewise.
template <typename S> XENT_FN void stream_store(S* p, vu16 v) {
  static_assert(sizeof(S) == 2, "16-bit storage only");
  asm volatile("vmovntdq %1, (%0)" : : "r"(p), "v"(v) : "memory");
}
XENT_FN void store_fence() { asm volatile("sfence" : : : "memory"); }
#endif  // __x86_64__

#endif  // XENT_HOST_VECTORS
#ifndef XENT_HOST_AVX512
#define XENT_HOST_AVX512 0
#endif

// Dense rows: kLanes online states (element j to lane j % kLanes); blocks of
// kLanes * kUnroll elements take the block maximum per lane first, so each
// element costs one exponential, and carry ysum and yx; the last partial
// stretch is padded with -inf logits, masked out of the label sums (0 * -inf
// would be NaN); lanes merge in a fixed halving tree. All of it depends on C
// only.
template <typename S, int U>
XENT_FN void dense_lanes_block(const S* x, const S* y, int valid,
                               typename Storage<S>::acc* m, wide* d, wide* ysum,
                               wide* yx) {
  typedef typename Storage<S>::acc A;
  A bm[kLanes], part[kLanes];
  for (int l = 0; l < kLanes; ++l) { bm[l] = m[l]; part[l] = A(0); }
  for (int u = 0; u < U; ++u)
    for (int l = 0; l < kLanes; ++l)
      bm[l] = max_keep(bm[l], Storage<S>::load(x[u * kLanes + l]));
  for (int l = 0; l < kLanes; ++l) {
    yx[l] = yx[l] + yx_rescale(ysum[l], m[l], bm[l]);
    d[l] = d[l] * wide(exp_acc(m[l] - bm[l]));
    m[l] = bm[l];
  }
  for (int u = 0; u < U; ++u)
    for (int l = 0; l < kLanes; ++l) {
      const A xv = Storage<S>::load(x[u * kLanes + l]);
      const A yv = Storage<S>::load(y[u * kLanes + l]);
      const bool in = u * kLanes + l < valid;
      part[l] += exp_acc(xv - m[l]);
      yx[l] += in ? yx_term(yv, xv, m[l]) : 0.0;
      ysum[l] += in ? wide(yv) : 0.0;
    }
  for (int l = 0; l < kLanes; ++l) d[l] += wide(part[l]);
}

template <typename S>
XENT_FN DenseState<typename Storage<S>::acc> dense_row_lanes(const S* x, const S* y,
                                                             int64_t C) {
  typedef typename Storage<S>::acc A;
  A m[kLanes];
  wide d[kLanes], ysum[kLanes], yx[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    m[l] = Limits<A>::lowest(); d[l] = 0.0; ysum[l] = 0.0; yx[l] = 0.0;
  }
  int64_t j = 0;
  for (; j + kLanes * kUnroll <= C; j += kLanes * kUnroll)
    dense_lanes_block<S, kUnroll>(x + j, y + j, kLanes * kUnroll, m, d, ysum, yx);
  for (; j + kLanes <= C; j += kLanes)
    dense_lanes_block<S, 1>(x + j, y + j, kLanes, m, d, ysum, yx);
  if (j < C) {
    S xpad[kLanes], ypad[kLanes];
    const S minus_inf = Storage<S>::store(-Limits<A>::infinity());
    const S zero = Storage<S>::store(A(0));
    for (int l = 0; l < kLanes; ++l) {
      xpad[l] = j + l < C ? x[j + l] : minus_inf;
      ypad[l] = j + l < C ? y[j + l] : zero;
    }
    dense_lanes_block<S, 1>(xpad, ypad, int(C - j), m, d, ysum, yx);
  }
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) {
      DenseState<A> a, b;
      a.lse.m = m[l]; a.lse.d = d[l]; a.ysum = ysum[l]; a.yx = yx[l];
      b.lse.m = m[l + w]; b.lse.d = d[l + w]; b.ysum = ysum[l + w]; b.yx = yx[l + w];
      dense_merge(a, b);
      m[l] = a.lse.m; d[l] = a.lse.d; ysum[l] = a.ysum; yx[l] = a.yx;
    }
  DenseState<A> s;
  s.lse.m = m[0]; s.lse.d = d[0]; s.ysum = ysum[0]; s.yx = yx[0];
  return s;
}

// Gradient rows: one read of x (and y), one write of dx.
//   sparse: dx_j = g * (p_j - [j == label])
//   dense:  dx_j = g * (ysum * p_j - y_j)
// An invalid label (possible only on the GPU, where it is not checked
// up front) makes the whole row NaN, as TensorFlow's GPU kernel does.
template <typename S>
XENT_FN void sparse_grad_row(const S* x, int64_t C, int64_t label,
                             RowStats<typename Storage<S>::acc> r,
                             typename Storage<S>::acc g, S* dx) {
  typedef typename Storage<S>::acc A;
  if (label < 0 || label >= C) {
    const S nan = Storage<S>::store(Limits<A>::quiet_nan());
    for (int64_t j = 0; j < C; ++j) dx[j] = nan;
    return;
  }
  const A scale = norm_scale(r.log_norm);
  int64_t j = 0;
#if XENT_HOST_VECTORS
  if constexpr (sizeof(A) == sizeof(float)) {
    for (; j + kLanes <= C; j += kLanes) {
      const vfloat p = exp_g(VecIO<S>::load(x + j) - r.shift) * scale;
      VecIO<S>::store(dx + j, g * p);
    }
  }
#endif
  for (; j < C; ++j)
    dx[j] = Storage<S>::store(g * probability(Storage<S>::load(x[j]), r.shift, scale));
  const A pl = probability(Storage<S>::load(x[label]), r.shift, scale);
  dx[label] = Storage<S>::store(g * (pl - A(1)));
}

template <typename S>
XENT_FN typename Storage<S>::acc label_sum(const S* y, int64_t C) {
  // Same lane layout and order as the forward pass, so both see the same ysum.
  typedef typename Storage<S>::acc A;
  wide lanes[kLanes];
  for (int l = 0; l < kLanes; ++l) lanes[l] = 0.0;
  int64_t j = 0;
  for (; j + kLanes <= C; j += kLanes)
    for (int l = 0; l < kLanes; ++l) lanes[l] += wide(Storage<S>::load(y[j + l]));
  for (int l = 0; j + l < C; ++l) lanes[l] += wide(Storage<S>::load(y[j + l]));
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) lanes[l] = lanes[l] + lanes[l + w];
  return A(lanes[0]);
}

template <typename S>
XENT_FN void dense_grad_row(const S* x, const S* y, int64_t C,
                            RowStats<typename Storage<S>::acc> r,
                            typename Storage<S>::acc ysum,
                            typename Storage<S>::acc g, S* dx) {
  const auto scale = norm_scale(r.log_norm);
  for (int64_t j = 0; j < C; ++j) {
    const auto p = probability(Storage<S>::load(x[j]), r.shift, scale);
    dx[j] = Storage<S>::store(g * (ysum * p - Storage<S>::load(y[j])));
  }
}

// ---------------------------------------------------------------------------
// CPU sparse rows in two passes over a row (it stays in L1/L2 between them):
// first the row's maximum M (no exponential), then sum_j exp(x_j - M) in
// kLanes lanes, float partials over blocks of kLanes * kUnroll elements
// folded into per-lane double sums, the last partial stretch padded with
// -inf (adds exactly 0), lanes summed in a fixed halving tree. One
// exponential per element and no rescaling; the order depends on C only.
//
// The loss-only forward (row_lse_two_pass) and the fused forward of a
// training step (sparse_fused_row) run the same passes, so they give the same
// shift, sum and loss; the fused one also keeps exp(x_j - M) in its B x C
// output and turns it into softmax - onehot there.
//
// Prefetch: the exponential pass is compute-bound and the maximum pass
// memory-bound, so while a row's exponentials are computed, the next row's
// cache lines (its logits, and the fused forward's output row) are asked for
// (RowPrefetch); the next maximum pass then reads from cache, and the
// output's read-for-ownership is out of the way. It changes no arithmetic.
struct RowPrefetch {
  const void* x = nullptr;    // the next row's logits, or nullptr
  const void* out = nullptr;  // the next row's output row (written next), or nullptr
  int x_size = 0, out_size = 0;  // their element sizes in bytes
};

// One prefetch per 64-byte line of the next rows' elements [j, j + n) (the
// next row has the same length C), issued while the current row's elements
// [j, j + n) are worked on.
XENT_FN void prefetch_slice(const RowPrefetch& pf, int64_t j, int64_t n) {
#if XENT_HOST_VECTORS
  const int64_t kLine = 64;
  if (pf.x != nullptr)
    for (int64_t o = j * pf.x_size & -kLine; o < (j + n) * pf.x_size; o += kLine)
      __builtin_prefetch(static_cast<const char*>(pf.x) + o, 0, 3);
  if (pf.out != nullptr)
    for (int64_t o = j * pf.out_size & -kLine; o < (j + n) * pf.out_size; o += kLine)
      __builtin_prefetch(static_cast<const char*>(pf.out) + o, 1, 3);
#else
  (void)pf; (void)j; (void)n;
#endif
}

// The row's maximum; with kStore, also e[j] = x_j converted to acc (16-bit
// logits are then converted once per row, and the exponential pass reads e).
template <typename S, bool kStore = false>
XENT_FN typename Storage<S>::acc row_max(const S* x, int64_t C,
                                         typename Storage<S>::acc* e = nullptr) {
  typedef typename Storage<S>::acc A;
  A m = Limits<A>::lowest();
  int64_t j = 0;
#if XENT_HOST_VECTORS
  if constexpr (sizeof(A) == sizeof(float)) {
    vfloat mv = splat<vfloat>(Limits<float>::lowest());
    for (; j + kLanes <= C; j += kLanes) {
      const vfloat v = VecIO<S>::load(x + j);
      if constexpr (kStore) VecIO<float>::store(e + j, v);
      mv = v > mv ? v : mv;  // max_keep
    }
    for (int l = 0; l < kLanes; ++l) m = max_keep(m, A(mv[l]));
  }
#endif
  for (; j < C; ++j) {
    const A v = Storage<S>::load(x[j]);
    if constexpr (kStore) e[j] = v;
    m = max_keep(m, v);
  }
  return m;
}

// sum_j exp(x_j - m) as described above; with kStore, also e[j] = exp(x_j - m)
// (e may be x itself when S is acc). Every argument is <= 0 or NaN (m is the
// row's maximum), so the vector lanes use exp_nonpos_g, exp_g's bits there.
template <typename S, bool kStore>
XENT_FN wide row_exp_sum(const S* x, int64_t C, typename Storage<S>::acc m,
                         typename Storage<S>::acc* e, const RowPrefetch& pf = RowPrefetch()) {
  typedef typename Storage<S>::acc A;
  wide d[kLanes];
  int64_t j = 0;
#if XENT_HOST_VECTORS
  if constexpr (sizeof(A) == sizeof(float)) {
    const vfloat mv = splat<vfloat>(m);
    vwide dv = vwide{} + 0.0;
    for (; j + kLanes * kUnroll <= C; j += kLanes * kUnroll) {
      vfloat part = splat<vfloat>(0.0f);
      for (int u = 0; u < kUnroll; ++u) {
        prefetch_slice(pf, j + u * kLanes, kLanes);
        const vfloat ev = exp_nonpos_g(VecIO<S>::load(x + j + u * kLanes) - mv);
        if constexpr (kStore) VecIO<float>::store(e + j + u * kLanes, ev);
        part += ev;
      }
      dv += convert_lanes<vwide>(part);
    }
    prefetch_slice(pf, j, C - j);
    for (; j < C; j += kLanes) {
      vfloat v;
      if (j + kLanes <= C) {
        v = VecIO<S>::load(x + j);
      } else {
        v = splat<vfloat>(-Limits<float>::infinity());
        for (int l = 0; j + l < C; ++l) v[l] = Storage<S>::load(x[j + l]);
      }
      const vfloat ev = exp_nonpos_g(v - mv);
      if constexpr (kStore) {
        if (j + kLanes <= C) VecIO<float>::store(e + j, ev);
        else for (int l = 0; j + l < C; ++l) e[j + l] = ev[l];
      }
      dv += convert_lanes<vwide>(ev);
    }
    for (int l = 0; l < kLanes; ++l) d[l] = dv[l];
  } else
#endif
  {
    for (int l = 0; l < kLanes; ++l) d[l] = 0.0;
    for (; j < C; j += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        const A ev = j + l < C ? exp_acc(Storage<S>::load(x[j + l]) - m) : A(0);
        if (kStore && j + l < C) e[j + l] = ev;
        d[l] += wide(ev);
      }
  }
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) d[l] = d[l] + d[l + w];
  return d[0];
}

template <typename S>
XENT_FN LseState<typename Storage<S>::acc> row_lse_two_pass(const S* x, int64_t C,
                                                            const RowPrefetch& pf = RowPrefetch()) {
  LseState<typename Storage<S>::acc> s;
  s.m = row_max<S>(x, C);
  s.d = row_exp_sum<S, false>(x, C, s.m, nullptr, pf);
  return s;
}

// The first two passes of the fused forward of one sparse row: returns the
// row's state and writes e[j] = exp(x_j - shift) in acc. 16-bit logits are
// converted once, into e, which the exponential pass then rewrites in place:
// the same values as converting in each pass.
template <typename S>
XENT_FN LseState<typename Storage<S>::acc> sparse_fused_exps(const S* x, int64_t C,
                                                              typename Storage<S>::acc* e,
                                                              const RowPrefetch& pf) {
  typedef typename Storage<S>::acc A;
  LseState<A> s;
  if constexpr (sizeof(S) < sizeof(A)) {
    s.m = row_max<S, true>(x, C, e);
    s.d = row_exp_sum<A, true>(e, C, s.m, e, pf);
  } else {
    s.m = row_max<S>(x, C);
    s.d = row_exp_sum<S, true>(x, C, s.m, e, pf);
  }
  return s;
}

// The last pass: bp[j] = e[j] * scale - [j == label] (e may be bp). With
// kStream (host AVX-512 only; e is then a scratch row in cache, not bp), the
// 64-byte lines wholly inside the row are written by streaming stores, the
// partial lines at its ends by ordinary ones; the caller fences. Same
// arithmetic, same bits, either way.
template <bool kStream, typename A>
XENT_FN void fused_backprop_row(const A* e, int64_t C, A scale, int64_t label, A* bp) {
  int64_t j = 0;
#if XENT_HOST_VECTORS
  if constexpr (sizeof(A) == sizeof(float)) {
#if XENT_HOST_AVX512
    if constexpr (kStream) {
      const int64_t head = (-reinterpret_cast<uintptr_t>(bp) & 63) / sizeof(A);
      for (; j < head && j < C; ++j) bp[j] = e[j] * scale;
      for (; j + kLanes <= C; j += kLanes) {
        vfloat v = VecIO<float>::load(e + j) * scale;
        if (label >= j && label < j + kLanes) v[label - j] = v[label - j] - A(1);
        stream_store(bp + j, v);
      }
      const bool streamed = label >= head && label < j;
      for (; j < C; ++j) bp[j] = e[j] * scale;
      if (!streamed) bp[label] = bp[label] - A(1);
      return;
    }
#endif
    for (; j + kLanes <= C; j += kLanes)
      VecIO<float>::store(bp + j, VecIO<float>::load(e + j) * scale);
  }
#endif
  static_assert(!kStream || XENT_HOST_AVX512, "streaming stores need the host's AVX-512");
  for (; j < C; ++j) bp[j] = e[j] * scale;
  bp[label] = bp[label] - A(1);
}

// The fused forward of one sparse row: returns the row's state and writes
// bp[j] = p_j - [j == label] in acc, p_j = exp(x_j - shift) * scale with the
// scale sparse_grad_row derives from the same log_norm, so g * bp[j] is
// bit for bit what sparse_grad_row writes for upstream gradient g. With a
// scratch row (kStream), the exponentials go there and bp is written once, by
// streaming stores.
template <typename S, bool kStream = false>
XENT_FN LseState<typename Storage<S>::acc> sparse_fused_row(const S* x, int64_t C,
                                                             int64_t label,
                                                             typename Storage<S>::acc* bp,
                                                             const RowPrefetch& pf = RowPrefetch(),
                                                             typename Storage<S>::acc* scratch = nullptr) {
  typedef typename Storage<S>::acc A;
  A* e = kStream ? scratch : bp;
  const LseState<A> s = sparse_fused_exps<S>(x, C, e, pf);
  fused_backprop_row<kStream>(e, C, norm_scale(finish(s).log_norm), label, bp);
  return s;
}

// dx[j] = g * bp[j], stored in S: the gradient of the fused path. With
// kStream (host AVX-512 only, 16-bit S: dx is then a fresh buffer, not bp),
// the 64-byte lines wholly inside the row are written by streaming stores,
// two vectors of kLanes elements each; the caller fences.
template <typename S, bool kStream = false>
XENT_FN void scale_row(const typename Storage<S>::acc* bp, int64_t C,
                       typename Storage<S>::acc g, S* dx) {
  int64_t j = 0;
#if XENT_HOST_VECTORS
  if constexpr (sizeof(typename Storage<S>::acc) == sizeof(float)) {
#if XENT_HOST_AVX512
    if constexpr (kStream) {
      static_assert(sizeof(S) == 2, "the scale op streams 16-bit rows only");
      const int64_t head = (-reinterpret_cast<uintptr_t>(dx) & 63) / sizeof(S);
      for (; j < head && j < C; ++j) dx[j] = Storage<S>::store(g * bp[j]);
      for (; j + 2 * kLanes <= C; j += 2 * kLanes)
        for (int half = 0; half < 2; ++half) {
          S packed[kLanes];
          VecIO<S>::store(packed, g * VecIO<float>::load(bp + j + half * kLanes));
          vu16 bits; memcpy(&bits, packed, sizeof bits);
          stream_store(dx + j + half * kLanes, bits);
        }
    }
#endif
    for (; j + kLanes <= C; j += kLanes) VecIO<S>::store(dx + j, g * VecIO<float>::load(bp + j));
  }
#endif
  static_assert(!kStream || XENT_HOST_AVX512, "streaming stores need the host's AVX-512");
  for (; j < C; ++j) dx[j] = Storage<S>::store(g * bp[j]);
}

// The training step's one-pass gradient (issue 38): the fused forward of a
// step whose upstream gradient it expects to be s for every row writes the
// final dlogits itself, dx[j] = s * (e[j] * scale - [j == label]) stored in
// S: the bits scale_row writes from sparse_fused_row's backprop for g = s, and
// so the separate gradient pass's. The step's gradient op then only checks
// that the upstream gradient was s and hands dx on: one read of the logits
// and one write of B x C in all, as tf.exp. e may be dx itself when S is
// acc; with kStream (host AVX-512, float only; e is then a scratch row) the
// 64-byte lines wholly inside the row are streamed, as fused_backprop_row.
template <bool kStream, typename S>
XENT_FN void step_grad_row(const typename Storage<S>::acc* e, int64_t C,
                           typename Storage<S>::acc scale, int64_t label,
                           typename Storage<S>::acc s, S* dx) {
  typedef typename Storage<S>::acc A;
  int64_t j = 0;
#if XENT_HOST_VECTORS
  if constexpr (sizeof(A) == sizeof(float)) {
#if XENT_HOST_AVX512
    if constexpr (kStream) {
      static_assert(sizeof(S) == sizeof(float), "the step streams float rows only");
      const int64_t head = (-reinterpret_cast<uintptr_t>(dx) & 63) / sizeof(S);
      for (; j < head && j < C; ++j) {
        const A t = e[j] * scale;
        dx[j] = Storage<S>::store(s * (j == label ? t - A(1) : t));
      }
      for (; j + kLanes <= C; j += kLanes) {
        vfloat t = VecIO<float>::load(e + j) * scale;
        if (label >= j && label < j + kLanes) t[label - j] = t[label - j] - A(1);
        stream_store(reinterpret_cast<float*>(dx + j), s * t);
      }
    }
#endif
    for (; j + kLanes <= C; j += kLanes) {
      vfloat t = VecIO<float>::load(e + j) * scale;
      if (label >= j && label < j + kLanes) t[label - j] = t[label - j] - A(1);
      VecIO<S>::store(dx + j, s * t);
    }
  }
#endif
  static_assert(!kStream || XENT_HOST_AVX512, "streaming stores need the host's AVX-512");
  for (; j < C; ++j) {
    const A t = e[j] * scale;
    dx[j] = Storage<S>::store(s * (j == label ? t - A(1) : t));
  }
}

// The fused forward of one sparse row of a step (see step_grad_row): returns
// the row's state (the loss-only forward's) and writes dx for upstream
// gradient s. The exponentials go to dx itself when S is acc and nothing is
// streamed, else to scratch (C elements of acc, in cache).
template <typename S, bool kStream = false>
XENT_FN LseState<typename Storage<S>::acc> sparse_step_row(const S* x, int64_t C, int64_t label,
                                                            typename Storage<S>::acc s, S* dx,
                                                            const RowPrefetch& pf,
                                                            typename Storage<S>::acc* scratch) {
  typedef typename Storage<S>::acc A;
  A* e = scratch;
  if constexpr (sizeof(S) == sizeof(A) && !kStream) e = reinterpret_cast<A*>(dx);
  const LseState<A> st = sparse_fused_exps<S>(x, C, e, pf);
  step_grad_row<kStream, S>(e, C, norm_scale(finish(st).log_norm), label, s, dx);
  return st;
}

}  // namespace equivtool_xent

#endif  // EQUIVTOOL_CUSTOM_OPS_XENT_XENT_ROW_H_
