// rows.h: what the CPU kernels that write activation rows share: storing a row in any activation
// format with the twins' rounding (core/numerics.py pack_blocks / packed_values), the RMS norm's scale
// in the twins' order, the activations in float64 as the twins compute them, and the split of rows over
// the pool's threads.
//
// Packing a row (pack_row): q8_0 / q8_1: per 32 values amax = max |x| (NaN if any value is: NumPy's max),
// d = amax / 127, q = rint(x * (127 / amax)) (0 where amax is 0), d stored as f16, q8_1's s = f16(d * sum q);
// q8_k: per 256 values the first value of largest magnitude mx (a NaN first, as np.argmax), iscale =
// -127 / mx, d = 1 / iscale, q = min(127, rint(iscale * x)), the 16-value sums; f16 round to nearest even;
// bf16 through fused.cuh's lp_f2bf; f32 as is. The row lands in the field planes of a [rows, k] buffer
// (common.cuh lp_q8_rows) or at row `row` of a plain [rows, k] array.
#pragma once
#include <math.h>

#include "fused.cuh"
#include "pool.h"
#include "simd.h"

namespace lp_cpu {

#if LP_CPU_ISA >= 1
// 8-lane helpers of the packers: whether any of n values is NaN, their largest magnitude (no NaN), and
// rint(x * s) of 32 values as int8 with their sum
inline bool any_nan(const float* x, int n) {
  __m256 u = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 8) u = _mm256_or_ps(u, _mm256_cmp_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(x + i), _CMP_UNORD_Q));
  return _mm256_movemask_ps(u) != 0;
}
inline float max_abs(const float* x, int n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}
inline int round32(const float* x, float s, int8_t* q) {  // the same float product and rounding as rint
  const __m256 sv = _mm256_set1_ps(s);
  __m256i v[4];
  for (int j = 0; j < 4; ++j) v[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * j), sv));
  const __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
  const __m256i ordered = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256((__m256i*)q, ordered);
  const __m256i s16 = _mm256_madd_epi16(_mm256_add_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3])),
                                        _mm256_set1_epi16(1));
  const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s16), _mm256_extracti128_si256(s16, 1));
  const __m128i s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0xB1)));
}
#endif

// FMT: an activation format (formats.h LP_ACT_*)
template <int FMT> inline void pack_row(const float* v, int k, void* out, int rows, int row) {
  if constexpr (FMT == LP_ACT_Q8_0 || FMT == LP_ACT_Q8_1) {
    const Q8Rows q = lp_q8_rows(out, rows, k, FMT);
    for (int b = 0; b < k / 32; ++b) {
      const float* x = v + 32 * b;
      int8_t* qs = q.qs + (size_t)row * k + 32 * b;
      float amax = 0.0f;
      int sum = 0;
#if LP_CPU_ISA >= 1
      const bool vector = !any_nan(x, 32);
      if (vector) amax = max_abs(x, 32);
#else
      const bool vector = false;
#endif
      if (!vector)
        for (int i = 0; i < 32; ++i) {
          const float a = lp_abs(x[i]);
          if (a > amax || a != a) amax = a != a || amax != amax ? __builtin_nanf("") : a;
        }
      const float d = amax / 127.0f;
      const float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
#if LP_CPU_ISA >= 1
      if (vector) sum = round32(x, inv, qs);
#endif
      if (!vector)
        for (int i = 0; i < 32; ++i) {
          const float r = lp_rint(x[i] * inv);
          qs[i] = r == r ? (int8_t)r : 0;
          sum += qs[i];
        }
      const size_t blk = (size_t)row * (k / 32) + b;
      ((lp_half*)q.d)[blk] = lp_f2h(d);
      if constexpr (FMT == LP_ACT_Q8_1) q.s[blk] = lp_f2h(d * (float)sum);
    }
  } else if constexpr (FMT == LP_ACT_Q8_K) {
    const Q8Rows q = lp_q8_rows(out, rows, k, 2);
    for (int b = 0; b < k / 256; ++b) {
      const float* x = v + 256 * b;
      float best = -1.0f, mx = 0.0f;
      int i0 = 0;
#if LP_CPU_ISA >= 1
      if (!any_nan(x, 256)) {  // the largest magnitude, then the first value that has it
        best = max_abs(x, 256);
        while (lp_abs(x[i0]) != best) ++i0;
        mx = x[i0];
        i0 = 256;
      }
#endif
      for (int i = i0; i < 256; ++i) {
        const float a = lp_abs(x[i]);
        if (best != best) break;  // a NaN came first: it is the argmax
        if (a > best || a != a) best = a, mx = x[i];
      }
      const float iscale = mx != 0.0f ? -127.0f / mx : 0.0f;
      const float d = mx != 0.0f ? 1.0f / iscale : 0.0f;
      int8_t* qs = q.qs + (size_t)row * k + 256 * b;
      int16_t* bsums = q.bsums + ((size_t)row * (k / 256) + b) * 16;
      int i = 0;
#if LP_CPU_ISA >= 1
      if (mx == mx) {  // no NaN: rint(iscale x) <= 127 already, as the scalar loop's min leaves it
        for (; i < 256; i += 32) {
          const int total = round32(x + i, iscale, qs + i);
          int lo = 0;
          for (int t = 0; t < 16; ++t) lo += qs[i + t];
          bsums[i / 16] = (int16_t)lo;
          bsums[i / 16 + 1] = (int16_t)(total - lo);
        }
      }
#endif
      if (i == 0) {
        for (; i < 256; ++i) {
          const float r = lp_rint(iscale * x[i]);
          qs[i] = r == r ? (int8_t)lp_min(127.0f, r) : 0;
        }
        for (int j = 0; j < 16; ++j) {
          int sum = 0;
          for (int t = 0; t < 16; ++t) sum += qs[16 * j + t];
          bsums[j] = (int16_t)sum;
        }
      }
      ((float*)q.d)[(size_t)row * (k / 256) + b] = d;
    }
  } else {
    const size_t at = (size_t)row * k;
    for (int i = 0; i < k; ++i) {
      if constexpr (FMT == LP_ACT_F16) ((lp_half*)out)[at + i] = lp_f2h(v[i]);
      else if constexpr (FMT == LP_ACT_BF16) ((uint16_t*)out)[at + i] = lp_f2bf(v[i]);
      else ((float*)out)[at + i] = v[i];
    }
  }
}

// 1 / sqrt(mean(x^2) + eps) over n values: squares in float summed in double, mean and the rest in
// float (core/numerics.py rmsnorm; norm.cu lp_rms_scale)
inline float rms_scale(const float* x, int n, float eps) {
  double acc = 0.0;
  for (int i = 0; i < n; ++i) acc += (double)(x[i] * x[i]);
  const float mean = (float)(acc / n);
  return 1.0f / lp_sqrt(mean + eps);
}

// The activations as core/numerics.py computes them: in float64, rounded once. silu = x / (1 + exp(-x));
// gelu_tanh = 0.5 x (1 + tanh(y)), y = sqrt(2 / pi) (x + 0.044715 x^3), computed as x / (1 + exp(-2y)),
// the same function without the cancellation of 1 + tanh(y) below x = -5 (where the twin's float64
// values, under 1e-9 in magnitude, carry an error of about |x| 2^-53 and these are the closer ones).
// The SIMD paths take exp from vexpd (within an ulp of float64's), the scalar path from libm.
constexpr double GELU_C = 0.7978845608028654;  // sqrt(2 / pi), as NumPy rounds it
inline float silu(float x) {
  const double v = x;
  return (float)(v / (1.0 + exp(-v)));
}
inline float gelu_tanh(float x) {
  const double v = x;
  return (float)(v / (1.0 + exp(-2.0 * (GELU_C * (v + 0.044715 * (v * v * v))))));
}
enum { ACT_SILU = 0, ACT_GELU_TANH = 1 };
template <int ACT> inline float activation(float x) { return ACT == ACT_SILU ? silu(x) : gelu_tanh(x); }

#if LP_CPU_ISA >= 1
#if LP_CPU_ISA >= 2
using Vd = __m512d;
constexpr int VD = 8;
inline Vd dset(double x) { return _mm512_set1_pd(x); }
inline Vd dload(const float* p) { return _mm512_cvtps_pd(_mm256_loadu_ps(p)); }
inline void dstore(float* p, Vd v) { _mm256_storeu_ps(p, _mm512_cvtpd_ps(v)); }
inline Vd dfma(Vd a, Vd b, Vd c) { return _mm512_fmadd_pd(a, b, c); }
inline Vd dround(Vd x) { return _mm512_roundscale_pd(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline Vd dclamp(Vd x, double lo, double hi) { return _mm512_min_pd(dset(hi), _mm512_max_pd(dset(lo), x)); }
inline Vd dscale2(Vd y, Vd n) { return _mm512_scalef_pd(y, n); }
#else
using Vd = __m256d;
constexpr int VD = 4;
inline Vd dset(double x) { return _mm256_set1_pd(x); }
inline Vd dload(const float* p) { return _mm256_cvtps_pd(_mm_loadu_ps(p)); }
inline void dstore(float* p, Vd v) { _mm_storeu_ps(p, _mm256_cvtpd_ps(v)); }
inline Vd dfma(Vd a, Vd b, Vd c) { return _mm256_fmadd_pd(a, b, c); }
inline Vd dround(Vd x) { return _mm256_round_pd(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline Vd dclamp(Vd x, double lo, double hi) { return _mm256_min_pd(dset(hi), _mm256_max_pd(dset(lo), x)); }
inline Vd dscale2(Vd y, Vd n) {  // y 2^n, n integral in [-1075, 1025]: in two steps, each a normal power
  const __m256i n1 = _mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(_mm256_mul_pd(n, dset(0.5))));
  const __m256i n2 = _mm256_sub_epi64(_mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(n)), n1);
  auto pow2 = [](__m256i e) { return _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(e, _mm256_set1_epi64x(1023)), 52)); };
  return _mm256_mul_pd(_mm256_mul_pd(y, pow2(n1)), pow2(n2));
}
#endif

// exp(x) in float64: x = n ln2 + r (ln2 in two parts), |r| <= ln2 / 2, exp(r) from its Taylor series to
// r^13 / 13! (error under 1e-17), times 2^n; +-inf and NaN as exp's (x is clamped to [-746, 710],
// where exp is 0 and inf; a NaN passes the clamp)
inline Vd vexpd(Vd x) {
  x = dclamp(x, -746.0, 710.0);
  const Vd n = dround(dfma(x, dset(1.4426950408889634), dset(0.0)));
  Vd r = dfma(n, dset(-0.6931471803691238), x);
  r = dfma(n, dset(-1.9082149292705877e-10), r);
  static constexpr double INV_FACT[14] = {1.0, 1.0, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040,
                                          1.0 / 40320, 1.0 / 362880, 1.0 / 3628800, 1.0 / 39916800,
                                          1.0 / 479001600, 1.0 / 6227020800};
  Vd p = dset(INV_FACT[13]);
  for (int i = 12; i >= 0; --i) p = dfma(p, r, dset(INV_FACT[i]));
  return dscale2(p, n);
}
#endif

// out[i] = act(g[i]) (times u[i] when u is given: the float32 product), i < k
template <int ACT> inline void activation_row(const float* g, const float* u, float* out, int k) {
  int i = 0;
#if LP_CPU_ISA >= 1
  for (; i + VD <= k; i += VD) {
    const Vd x = dload(g + i);
    Vd e;
    if constexpr (ACT == ACT_SILU) {
      e = vexpd(dfma(x, dset(-1.0), dset(0.0)));
    } else {
      const Vd y = dfma(dset(GELU_C), dfma(dset(0.044715), x * x * x, x), dset(0.0));
      e = vexpd(dfma(y, dset(-2.0), dset(0.0)));
    }
    dstore(out + i, x / (e + dset(1.0)));
  }
#endif
  for (; i < k; ++i) out[i] = activation<ACT>(g[i]);
  if (u)
    for (i = 0; i < k; ++i) out[i] = out[i] * u[i];
}

// f(r0, r1) over row ranges of about `work` values each (rows of k values): small launches (a decode
// step's one row) stay on the calling thread
constexpr size_t ROW_TASK_VALUES = 1 << 15;
template <class F> inline void over_rows(int rows, int k, F f) {
  const int per = (int)lp_max<size_t>(1, ROW_TASK_VALUES / lp_max(1, k));
  const int tasks = (rows + per - 1) / per;
  lp_parallel(tasks, [&](int t) { f(t * per, lp_min(rows, (t + 1) * per)); });
}

}  // namespace lp_cpu
