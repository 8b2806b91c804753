// fused.cuh: what the decode step's small fused kernels share (attention_decode.cu, rope_kv.cu,
// glu.cu, elementwise.cu), built on vendor.h and common.cuh only:
//   - float vector types for 128-bit (4 floats) and 64-bit (2 floats) loads and stores;
//   - activations without device libraries (AMD builds with -nogpulib): exp through lp_exp, tanh from
//     exp or a short odd polynomial, each with its accuracy stated;
//   - storing a tile of an output row in any activation format: 8-bit blocks through common.cuh's
//     lp_pack_row on the tile's slice of the field planes, or f16 / bf16 / f32 values.
#pragma once
#include "common.cuh"

struct alignas(16) lp_f4 { float x, y, z, w; };  // 4 floats: one 128-bit load or store
struct alignas(8) lp_f2 { float x, y; };

__device__ __forceinline__ float lp_inf() { return __builtin_inff(); }
__device__ __forceinline__ bool lp_isfinite(float x) { return lp_abs(x) < __builtin_inff(); }  // false for NaN
__device__ __forceinline__ float lp_f16_round(float x) { return lp_h2f(lp_f2h(x)); }

// --- activations (core/numerics.py computes them in float64 and rounds once; these are float32) ---
//
// lp_exp is __builtin_expf: CUDA's expf (at most 2 ulp without fast math) and, on AMD without device
// libraries, LLVM's own expansion of llvm.exp.f32 (range reduction around v_exp_f32, about 1 ulp).
// Division is IEEE on both (nvcc's default -prec-div, clang HIP's correctly rounded f32 divide).

// x * sigmoid(x) = x / (1 + exp(-x)): a few ulp from the float64 result (the argument is exact). Below
// x = -88.7, exp(-x) overflows and the result is -0 where float64 gives at most 1e-36 in magnitude.
__device__ __forceinline__ float lp_silu(float x) { return x / (1.0f + lp_exp(-x)); }

// 0.5 x (1 + tanh(y)) with y = sqrt(2/pi) (x + 0.044715 x^3), written as x / (1 + exp(-2y)) (the same
// function: 0.5 (1 + tanh(y)) = sigmoid(2y)), which has no cancellation where tanh(y) is near -1. The
// argument -2y is formed in double (as the twin forms y; four double operations, cheap even at RDNA's
// 1/32 rate) and split into float hi + lo, and exp(-2y) = exp(hi) (1 + lo) to 2^-48: a float32 -2y
// alone would cost about 2|y| ulps (tens of ulps below x = -4). Result: within a few ulp of the exact
// value (3 measured with glibc's expf). Below x = -5 the twin's float64 1 + tanh(y) cancels: its
// values there (under 1e-9 in magnitude) carry an absolute error of about |x| 2^-53, tens of float32
// ulps, and these are the closer ones.
__device__ __forceinline__ float lp_gelu_tanh(float x) {
  const double xd = x;
  const double t = -1.5957691216057308 * (xd + 0.044715 * (xd * xd * xd));  // -2y, -2 sqrt(2/pi) exactly
  const float hi = (float)t;
  const float e = lp_abs(hi) < 100.0f ? lp_exp(hi) * (1.0f + (float)(t - (double)hi)) : lp_exp(hi);
  return x / (1.0f + e);
}

// tanh(x): for |x| >= 0.625, 1 - 2 / (exp(2|x|) + 1) (no cancellation there: the result is >= 0.55;
// about 2 ulp); below, Cephes' tanhf odd polynomial (about 2 ulp, no exp needed).
__device__ __forceinline__ float lp_tanh(float x) {
  const float a = lp_abs(x);
  if (a < 0.625f) {
    const float z = x * x;
    const float p = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z +
                      1.33314422036e-1f) * z - 3.33332819422e-1f);
    return x + x * z * p;
  }
  const float t = 1.0f - 2.0f / (lp_exp(2.0f * a) + 1.0f);  // exp overflow -> inf -> t = 1
  return x < 0.0f ? -t : t;
}

enum { LP_ACT_SILU = 0, LP_ACT_GELU_TANH = 1 };
template <int ACT> __device__ __forceinline__ float lp_act(float x) {
  if constexpr (ACT == LP_ACT_SILU) return lp_silu(x);
  else return lp_gelu_tanh(x);
}

// float32 -> bfloat16 bits, round to nearest even; NaNs stay quiet NaNs (numerics.packed_values "bf16")
__device__ __forceinline__ uint16_t lp_f2bf(float x) {
  const uint32_t b = __builtin_bit_cast(uint32_t, x);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((b >> 16) | 64u);
  return (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

// --- output tiles in any activation format -------------------------------------------------------

// The planes of values [t0, t0 + kt) of `row` of a packed [rows, k] buffer, as a one-row Q8Rows of kt
// values: every plane is [rows, k / block, ...] in row-major order, so a tile that starts on a block
// boundary is the plane pointers advanced by (row * k + t0) / block (common.cuh lp_q8_rows).
template <int FMT>
__device__ __forceinline__ Q8Rows lp_q8_tile(void* base, int rows, int k, int row, int t0) {
  Q8Rows p = lp_q8_rows(base, rows, k, FMT);
  const size_t at = (size_t)row * k + t0;
  p.qs += at;
  if (FMT == LP_ACT_Q8_K) {
    p.d = (float*)p.d + at / 256;
    p.bsums += at / 16;
  } else {
    p.d = (lp_half*)p.d + at / 32;
    if (FMT == LP_ACT_Q8_1) p.s += at / 32;
  }
  return p;
}

// Store values value(i), i in [0, kt), as elements [t0, t0 + kt) of `row` of out [rows, k] in format
// FMT, with the whole block. For 8-bit formats t0 and kt are multiples of the block (32 or 256) and
// the rounding is exactly common.cuh's (the CPU twins').
template <int FMT, class F>
__device__ __forceinline__ void lp_store_tile(F value, void* out, int rows, int k, int row, int t0, int kt) {
  if constexpr (FMT <= LP_ACT_Q8_K) {  // the 8-bit block formats, numbered first
    lp_pack_row<FMT>(value, kt, 0, lp_q8_tile<FMT>(out, rows, k, row, t0));
  } else {
    const size_t at = (size_t)row * k + t0;
    for (int i = lp_tid(); i < kt; i += lp_bdim()) {
      const float x = value(i);
      if constexpr (FMT == LP_ACT_F16) ((lp_half*)out)[at + i] = lp_f2h(x);
      else if constexpr (FMT == LP_ACT_BF16) ((uint16_t*)out)[at + i] = lp_f2bf(x);
      else ((float*)out)[at + i] = x;
    }
  }
}
