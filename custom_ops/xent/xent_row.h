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
// two states merge associatively. The CPU code runs kLanes independent
// states over a row in blocks (the block maximum is taken first, so each
// element costs one exponential) and merges the lanes in a fixed tree; the
// CUDA kernel runs one state per thread and merges them in a fixed tree in
// shared memory. Both use the same update, merge and exponential below.
//
// Special values follow TensorFlow's fused kernels: a row holding +inf or
// NaN, or holding only -inf, gives NaN loss and NaN gradient row; a -inf
// logit elsewhere has probability 0 (and infinite loss if it is the label).

#ifndef EQUIVTOOL_CUSTOM_OPS_XENT_XENT_ROW_H_
#define EQUIVTOOL_CUSTOM_OPS_XENT_XENT_ROW_H_

#include <math.h>
#include <stdint.h>
#include <string.h>

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

// bfloat16 is the upper half of a float.
XENT_FN float bf16_to_float(uint16_t b) { return bits_float(uint32_t(b) << 16); }

// Round to nearest even; NaN stays a (quiet) NaN.
XENT_FN uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const bool is_nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return is_nan ? uint16_t((u >> 16) | 0x0040u) : uint16_t(rounded);
}

// IEEE binary16 -> float, exact, including subnormals, inf and NaN. Half
// subnormals are built as integer * 2^-24, which gives float normals and so
// stays exact when the CPU treats float denormals as zero.
XENT_FN float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t rest = uint32_t(h & 0x7FFFu) << 13;  // exponent and mantissa
  const uint32_t exponent = h & 0x7C00u;
  const uint32_t normal = rest + (uint32_t(127 - 15) << 23);
  const uint32_t special = rest | 0x7F800000u;        // inf, NaN
  const uint32_t subnormal = float_bits(float(h & 0x03FFu) * 5.9604644775390625e-8f);
  const uint32_t magnitude =
      exponent == 0x7C00u ? special : (exponent == 0 ? subnormal : normal);
  return bits_float(sign | magnitude);
}

// float -> IEEE binary16 with round to nearest even, overflow to inf,
// gradual underflow, NaN kept.
XENT_FN uint16_t float_to_half(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  uint16_t out;
  if (a >= 0x7F800000u) {                 // inf or NaN
    out = uint16_t(a > 0x7F800000u ? 0x7E00u : 0x7C00u);
  } else if (a >= 0x477FF000u) {          // rounds to >= 65520: inf
    out = 0x7C00u;
  } else if (a < 0x38800000u) {           // below the smallest half normal
    // Adding 0.5 aligns the half subnormal grid with the float mantissa's
    // last bits; the FPU rounds to nearest even for us.
    const float v = bits_float(a) + 0.5f;
    out = uint16_t(float_bits(v) - 0x3F000000u);
  } else {                                // normal range
    const uint32_t odd = (a >> 13) & 1u;
    const uint32_t r = a + (uint32_t(15 - 127) << 23) + 0xFFFu + odd;
    out = uint16_t(r >> 13);
  }
  return uint16_t(out | sign);
}

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
// it returns 0 (exp(-87) < 1.7e-38), above 88 +inf; NaN gives NaN. The op
// evaluates it only at x - shift <= 0.
XENT_FN float exp_acc(float x) {
  const float lo = -87.0f, hi = 88.0f;
  float xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  // round to nearest via the 1.5 * 2^23 trick (exact for |t| < 2^22)
  const float t = xc * 1.44269504088896341f + 12582912.0f;
  const float n = t - 12582912.0f;
  const int32_t ni = int32_t(float_bits(t)) - 0x4B400000;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = (p * r) * r + r + 1.0f;
  const float scale = bits_float(uint32_t(ni + 127) << 23);
  float y = er * scale;
  y = x < lo ? 0.0f : y;
  y = x > hi ? Limits<float>::infinity() : y;
  y = x != x ? x : y;
  return y;
}
XENT_FN double exp_acc(double x) { return exp(x); }

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

template <typename A> XENT_FN void dense_push(DenseState<A>& s, A x, A y) {
  const A m = max_keep(s.lse.m, x);
  s.yx = s.yx + s.ysum * wide(s.lse.m - m) + wide(y * (x - m));
  s.ysum = s.ysum + wide(y);
  s.lse.d = s.lse.d * wide(exp_acc(s.lse.m - m)) + wide(exp_acc(x - m));
  s.lse.m = m;
}

template <typename A> XENT_FN void dense_merge(DenseState<A>& a, const DenseState<A>& b) {
  const A m = max_keep(a.lse.m, b.lse.m);
  a.yx = (a.yx + a.ysum * wide(a.lse.m - m)) + (b.yx + b.ysum * wide(b.lse.m - m));
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
template <typename A> XENT_FN A dense_loss(const DenseState<A>& s) {
  return A(s.ysum * log(s.lse.d) - s.yx);
}

// Softmax probability of x.
template <typename A> XENT_FN A probability(A x, A shift, A log_norm) {
  return exp_acc((x - shift) - log_norm);
}

// ---------------------------------------------------------------------------
// CPU row reduction: kLanes independent states; element j of the row goes to
// lane j % kLanes. Blocks of kLanes * kUnroll elements first take the block
// maximum per lane, then sum one exponential per element into a per-lane
// partial, and fold the partial into the lane's double sum; the
// row's last, partial stretch is processed in kLanes-wide blocks padded with
// -inf, which adds exactly zero. Lanes merge in a fixed halving tree. All of
// it depends on C only.
constexpr int kLanes = 16;
constexpr int kUnroll = 8;

template <typename S, int U>
XENT_FN void lanes_block(const S* x, typename Storage<S>::acc* m, wide* d) {
  typedef typename Storage<S>::acc A;
  A bm[kLanes], part[kLanes];
  for (int l = 0; l < kLanes; ++l) { bm[l] = m[l]; part[l] = A(0); }
  for (int u = 0; u < U; ++u)
    for (int l = 0; l < kLanes; ++l)
      bm[l] = max_keep(bm[l], Storage<S>::load(x[u * kLanes + l]));
  for (int u = 0; u < U; ++u)
    for (int l = 0; l < kLanes; ++l)
      part[l] += exp_acc(Storage<S>::load(x[u * kLanes + l]) - bm[l]);
  for (int l = 0; l < kLanes; ++l) {
    d[l] = d[l] * wide(exp_acc(m[l] - bm[l])) + wide(part[l]);
    m[l] = bm[l];
  }
}

template <typename S>
XENT_FN LseState<typename Storage<S>::acc> row_lse_lanes(const S* x, int64_t C) {
  typedef typename Storage<S>::acc A;
  A m[kLanes];
  wide d[kLanes];
  for (int l = 0; l < kLanes; ++l) { m[l] = Limits<A>::lowest(); d[l] = 0.0; }
  int64_t j = 0;
  for (; j + kLanes * kUnroll <= C; j += kLanes * kUnroll)
    lanes_block<S, kUnroll>(x + j, m, d);
  for (; j + kLanes <= C; j += kLanes) lanes_block<S, 1>(x + j, m, d);
  if (j < C) {
    S pad[kLanes];
    const S minus_inf = Storage<S>::store(-Limits<A>::infinity());
    for (int l = 0; l < kLanes; ++l) pad[l] = j + l < C ? x[j + l] : minus_inf;
    lanes_block<S, 1>(pad, m, d);
  }
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) {
      LseState<A> a; a.m = m[l]; a.d = d[l];
      LseState<A> b; b.m = m[l + w]; b.d = d[l + w];
      lse_merge(a, b);
      m[l] = a.m; d[l] = a.d;
    }
  LseState<A> s; s.m = m[0]; s.d = d[0];
  return s;
}

// Dense rows: the same lanes, with ysum and yx. Padding is masked out of the
// label sums (0 * -inf would be NaN).
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
    yx[l] = yx[l] + ysum[l] * wide(m[l] - bm[l]);
    d[l] = d[l] * wide(exp_acc(m[l] - bm[l]));
    m[l] = bm[l];
  }
  for (int u = 0; u < U; ++u)
    for (int l = 0; l < kLanes; ++l) {
      const A xv = Storage<S>::load(x[u * kLanes + l]);
      const A yv = Storage<S>::load(y[u * kLanes + l]);
      const bool in = u * kLanes + l < valid;
      part[l] += exp_acc(xv - m[l]);
      yx[l] += in ? wide(yv * (xv - m[l])) : 0.0;
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
  for (int64_t j = 0; j < C; ++j)
    dx[j] = Storage<S>::store(g * probability(Storage<S>::load(x[j]), r.shift, r.log_norm));
  const A pl = probability(Storage<S>::load(x[label]), r.shift, r.log_norm);
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
  for (int64_t j = 0; j < C; ++j) {
    const auto p = probability(Storage<S>::load(x[j]), r.shift, r.log_norm);
    dx[j] = Storage<S>::store(g * (ysum * p - Storage<S>::load(y[j])));
  }
}

}  // namespace equivtool_xent

#endif  // EQUIVTOOL_CUSTOM_OPS_XENT_XENT_ROW_H_
