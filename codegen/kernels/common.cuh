// common.cuh: what several kernel families share (on the GPUs, and on the CPU target through
// codegen/cpu/host.h): 16-byte loads and stores, f16 bits as floats, float operations never contracted
// into an FMA (where a kernel promises NumPy's float32 operation order), the byte tricks that turn
// packed quants into int8 operands of lp_dot4, the K-quants' and IQ4_XS's packed scales and the IQ4
// codebook lookup (the mat-vec's and the GEMM's weight readers both use them), the paged K/V cache's
// addressing, the argmax order of the fused tails, field planes of packed activations, block
// reductions, and packing a row to 8-bit blocks with exactly the CPU twins' rounding
// (core/numerics.py pack_blocks: q8_0/q8_1 take amax/127 as an f16 scale and round half to even; q8_k
// takes the signed max of 256 values, iscale = -127/max, d = 1/iscale, with 16-value sums). The format
// codes and block sizes come from formats.h, generated from core/formats.py.
#pragma once
#include "vendor.h"
#include <stdint.h>

#include "formats.h"

// 16 bytes as four 32-bit words, moved with one 128-bit load or store (the address 16-byte aligned)
struct alignas(16) lp_u4 {
  uint32_t w[4];
};
#if defined(LP_CUDA)
__device__ __forceinline__ lp_u4 lp_load16(const void* p) {
  const uint4 v = *(const uint4*)p;
  return {{v.x, v.y, v.z, v.w}};
}
__device__ __forceinline__ void lp_store16(void* p, const lp_u4& v) {
  *(uint4*)p = make_uint4(v.w[0], v.w[1], v.w[2], v.w[3]);
}
// an f16 value's bits as a float
__device__ __forceinline__ float lp_bits_h2f(uint16_t b) { return __half2float(__ushort_as_half(b)); }
#elif defined(LP_CPU)
// the CPU target reads blocks in place from the mapped file, where 16 bytes need not be aligned
__device__ __forceinline__ lp_u4 lp_load16(const void* p) {
  lp_u4 v;
  __builtin_memcpy(&v, p, 16);
  return v;
}
__device__ __forceinline__ void lp_store16(void* p, const lp_u4& v) { __builtin_memcpy(p, &v, 16); }
__device__ __forceinline__ float lp_bits_h2f(uint16_t b) { return (float)__builtin_bit_cast(_Float16, b); }
#else
typedef uint32_t lp_u32x4 __attribute__((ext_vector_type(4)));
__device__ __forceinline__ lp_u4 lp_load16(const void* p) {
  const lp_u32x4 v = *(const lp_u32x4*)p;
  return {{v.x, v.y, v.z, v.w}};
}
__device__ __forceinline__ void lp_store16(void* p, const lp_u4& v) {
  lp_u32x4 t;
  t.x = v.w[0]; t.y = v.w[1]; t.z = v.w[2]; t.w = v.w[3];
  *(lp_u32x4*)p = t;
}
__device__ __forceinline__ float lp_bits_h2f(uint16_t b) { return (float)__builtin_bit_cast(_Float16, b); }
#endif
__device__ __forceinline__ lp_u4 lp_zero16() { return {{0u, 0u, 0u, 0u}}; }

// one T at p, which on the CPU (fields of a GGUF's blocks) need not be aligned
template <class T> __device__ __forceinline__ T lp_ld(const void* p) {
#if defined(LP_CPU)
  T v;
  __builtin_memcpy(&v, p, sizeof(T));
  return v;
#else
  return *(const T*)p;
#endif
}

// the low and the high f16 value of a 32-bit word, as floats
__device__ __forceinline__ float lp_half_lo(uint32_t w) { return lp_bits_h2f((uint16_t)(w & 0xFFFFu)); }
__device__ __forceinline__ float lp_half_hi(uint32_t w) { return lp_bits_h2f((uint16_t)(w >> 16)); }

// Single IEEE operations that the compiler may not fuse with their neighbours (nvcc contracts a*b+c
// into an FMA by default; clang's HIP default does too, except where a pragma says otherwise), in float
// and (lp_exp64) double.
#if defined(LP_CUDA)
__device__ __forceinline__ float lp_mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float lp_add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float lp_sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double lp_mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ double lp_add_rn(double a, double b) { return __dadd_rn(a, b); }
#else
template <class T> __device__ __forceinline__ T lp_mul_rn(T a, T b) {
  #pragma clang fp contract(off)
  return a * b;
}
template <class T> __device__ __forceinline__ T lp_add_rn(T a, T b) {
  #pragma clang fp contract(off)
  return a + b;
}
template <class T> __device__ __forceinline__ T lp_sub_rn(T a, T b) {
  #pragma clang fp contract(off)
  return a - b;
}
#endif

// exp(d) in double for d <= 0 (a softmax's exp of the difference to the row's max), by IEEE operations
// alone, so the CPU kernels, every GPU and the NumPy twin (core/numerics.py exp64, its step-for-step port)
// get the same bits: libm's, NVIDIA's and NumPy's exp differ in the last bit, and AMD has no double exp
// without device libraries. d = n ln2 + r (n = rint(d / ln2), Cody-Waite's two-part ln2: n * LN2_HI
// exact), exp(r) by its Taylor polynomial to degree 13 in Horner's order (|r| <= ln2 / 2: truncation
// below 2^-56), scaled by 2^n. Below -746 the result is 0 (it underflows); NaN stays NaN.
constexpr double LP_LN2_HI = 6.93147180369123816490e-01, LP_LN2_LO = 1.90821492927058770002e-10;
constexpr double LP_INV_LN2 = 1.44269504088896338700e+00;

__device__ __forceinline__ double lp_exp64(double d) {
  constexpr double c[] = {1.0, 1.0, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040, 1.0 / 40320,
                          1.0 / 362880, 1.0 / 3628800, 1.0 / 39916800, 1.0 / 479001600, 1.0 / 6227020800};  // 1 / i!
  if (!(d >= -746.0)) return d < -746.0 ? 0.0 : d;
  const double n = __builtin_rint(lp_mul_rn(d, LP_INV_LN2));
  const double r = lp_add_rn(lp_add_rn(d, -lp_mul_rn(n, LP_LN2_HI)), -lp_mul_rn(n, LP_LN2_LO));
  double q = c[13];
#pragma unroll
  for (int i = 12; i >= 0; --i) q = lp_add_rn(c[i], lp_mul_rn(r, q));
  return __builtin_ldexp(q, (int)n);
}

// per byte x - c as int8, for bytes x in [0, 127 + c], c <= 128 (each byte is first lifted by
// 128 - c, so no carry or borrow crosses a byte)
__device__ __forceinline__ uint32_t lp_sub_bytes(uint32_t x, uint32_t c) {
  return (x + 0x01010101u * (0x80u - c)) ^ 0x80808080u;
}

// bits 0..3 of x as bit 0 of bytes 0..3 (the four partial products cannot carry into each other)
__device__ __forceinline__ uint32_t lp_bits4(uint32_t x) { return ((x & 0xFu) * 0x00204081u) & 0x01010101u; }

// The K-quants' packed scales, from the block's 12 scale bytes byte(0..11) (read from a weight plane or
// from registers):
// Q4_K / Q5_K: 6-bit scale and min of sub-block j (0..7) (core/formats.py k_scale_min)
template <class B> __device__ __forceinline__ void lp_k_scale_min(B byte, int j, int& sc, int& mn) {
  if (j < 4) {
    sc = byte(j) & 63;
    mn = byte(j + 4) & 63;
  } else {
    sc = (byte(j + 4) & 0x0F) | ((byte(j - 4) >> 6) << 4);
    mn = (byte(j + 4) >> 4) | ((byte(j) >> 6) << 4);
  }
}

// Q3_K: signed 6-bit scale of sub-block j (0..15) (core/formats.py q3k_scales)
template <class B> __device__ __forceinline__ int lp_q3k_scale(B byte, int j) {
  const int lo = j < 8 ? byte(j) & 0x0F : byte(j - 8) >> 4;
  const int hi = (byte(8 + j % 4) >> (2 * (j / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

#if defined(LP_HIP)
// the bytes of the 16-byte table t0..t3 at the 4-bit indices of q (8 nibbles): lo those of the low
// nibbles of q's bytes 0..3, hi those of the high nibbles (NVIDIA's and the CPU's: their vendor headers).
// On AMD, and so on the emulated GPU: v_perm_b32 picks bytes by 3-bit indices from each table half, and a
// third picks each byte's half by its index's bit 3.
__device__ __forceinline__ void lp_lookup16(uint32_t q, uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3,
                                            uint32_t& lo, uint32_t& hi) {
  const auto look = [&](uint32_t i) {
    const uint32_t low = lp_perm(t1, t0, i & 0x07070707u), high = lp_perm(t3, t2, i & 0x07070707u);
    return lp_perm(high, low, 0x03020100u | ((i & 0x08080808u) >> 1));
  };
  lo = look(q);
  hi = look(q >> 4);
}
#endif

// IQ4_NL / IQ4_XS: the codebook values (formats.h LP_IQ4_W0..3) of the 4-bit indices in q as int8 bytes:
// lo those of the low nibbles of q's bytes 0..3, hi those of the high nibbles
__device__ __forceinline__ void lp_iq4_values(uint32_t q, uint32_t& lo, uint32_t& hi) {
  lp_lookup16(q, LP_IQ4_W0, LP_IQ4_W1, LP_IQ4_W2, LP_IQ4_W3, lo, hi);
}

// IQ4_XS: the signed 6-bit scale of sub-block j (0..7) from the block's scales_h and its 4 scales_l
// bytes as a little-endian word: nibble j of scales_l below bits 2j, 2j + 1 of scales_h, stored + 32
// (core/formats.py iq4xs_scales)
__device__ __forceinline__ int lp_iq4xs_scale(uint32_t scales_h, uint32_t scales_l, int j) {
  return (int)(((scales_l >> (4 * j)) & 0xFu) | (((scales_h >> (2 * j)) & 3u) << 4)) - 32;
}

// The paged K/V cache [layers, 2 (K, V), blocks, LP_PAGE, kv_dim] of f16 (core/numerics.py PAGE, store_kv):
// sequence s's position p lives in block pages[s * npages + p / LP_PAGE] at offset p % LP_PAGE, npages
// being the page table's row length. lp_kv_plane is the first element of the K (kv 0) or V (kv 1) plane
// of a layer; a position's row of kv_dim features starts lp_kv_row(block, offset, kv_dim) after it.
#define LP_PAGE 16
__device__ __forceinline__ size_t lp_kv_plane(int layer, int kv, int blocks, int kv_dim) {
  return (size_t)(layer * 2 + kv) * blocks * LP_PAGE * kv_dim;
}
// (a cache holds fewer than 2^32 positions: the position index is 32-bit, one wide multiply-add)
__device__ __forceinline__ size_t lp_kv_row(int block, int offset, int kv_dim) {
  return (size_t)((unsigned)block * LP_PAGE + (unsigned)offset) * (unsigned)kv_dim;
}

// A (logit, index) pair in np.argmax's order: the largest value, a NaN before any number, the lower
// index on ties; a total order, so how the candidates are split cannot change the winner (the GPU and
// CPU tails).
struct LpBest {
  float v;
  int i;
};

// does (v, i) come before (bv, bi) in np.argmax's order?
__device__ __forceinline__ bool lp_better(float v, int i, float bv, int bi) {
  const bool nan = v != v, bnan = bv != bv;
  if (nan || bnan) return nan && (!bnan || i < bi);
  return v > bv || (v == bv && i < bi);
}

__device__ __forceinline__ LpBest lp_no_best() { return {-__builtin_huge_valf(), 0x7fffffff}; }

// Planes start on 256-byte boundaries (core/formats.py PLANE_ALIGN).
__device__ __forceinline__ size_t lp_align(size_t n) { return (n + 255) & ~(size_t)255; }

// A packed activation buffer [rows, k] as its planes, in field order (core/formats.py planes()).
struct Q8Rows {
  void* d;         // lp_half [rows, k/32] (q8_0, q8_1) or float [rows, k/256] (q8_k)
  lp_half* s;      // q8_1: lp_half [rows, k/32] = d * sum(qs); else null
  int8_t* qs;      // [rows, k]
  int16_t* bsums;  // q8_k: [rows, k/16]; else null
};

// fmt: LP_ACT_Q8_0, LP_ACT_Q8_1 or LP_ACT_Q8_K
__device__ __forceinline__ Q8Rows lp_q8_rows(void* base, int rows, int k, int fmt) {
  char* p = (char*)base;
  Q8Rows r;
  const size_t n = (size_t)rows * k;
  if (fmt == LP_ACT_Q8_K) {
    r.d = p;
    p += lp_align(n / 256 * sizeof(float));
    r.s = nullptr;
    r.qs = (int8_t*)p;
    p += lp_align(n);
    r.bsums = (int16_t*)p;
  } else {
    r.d = p;
    p += lp_align(n / 32 * sizeof(lp_half));
    if (fmt == LP_ACT_Q8_1) {
      r.s = (lp_half*)p;
      p += lp_align(n / 32 * sizeof(lp_half));
    } else {
      r.s = nullptr;
    }
    r.qs = (int8_t*)p;
    r.bsums = nullptr;
  }
  return r;
}

// Sum over the block; every thread gets the result. `scratch` holds one T per wave.
template <typename T> __device__ __forceinline__ T lp_block_sum(T v, T* scratch) {
  v = lp_wave_sum(v);
  if (lp_lane() == 0) scratch[lp_wave()] = v;
  lp_sync();
  T total = 0;
  for (int w = 0; w < lp_waves(); ++w) total += scratch[w];
  lp_sync();
  return total;
}

// Pack one row of k values, value(i) giving element i, with the whole block. Each group of 32
// threads packs one 32-value block at a time (32-lane groups also on wave64 targets).
template <int FMT, class F>
__device__ void lp_pack_row_q8_32(F value, int k, int row, Q8Rows out) {
  const int group = lp_tid() / 32, lane = lp_tid() % 32, groups = lp_bdim() / 32;
  for (int b = group; b < k / 32; b += groups) {
    const int i = b * 32 + lane;
    const float x = value(i);
    float amax = lp_abs(x);
    #pragma unroll
    for (int m = 16; m > 0; m >>= 1) amax = lp_fmax(amax, lp_shfl_xor(amax, m));
    const float d = amax / 127.0f;
    const float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
    const int q = (int)lp_rint(x * inv);
    const size_t blk = (size_t)row * (k / 32) + b;
    out.qs[(size_t)row * k + i] = (int8_t)q;
    if (FMT == LP_ACT_Q8_1) {
      int sum = q;
      #pragma unroll
      for (int m = 16; m > 0; m >>= 1) sum += lp_shfl_xor(sum, m);
      if (lane == 0) out.s[blk] = lp_f2h(d * (float)sum);
    }
    if (lane == 0) ((lp_half*)out.d)[blk] = lp_f2h(d);
  }
}

// q8_k: each group of 32 threads packs one 256-value block, 8 consecutive values per thread.
template <class F>
__device__ void lp_pack_row_q8_k(F value, int k, int row, Q8Rows out) {
  const int group = lp_tid() / 32, lane = lp_tid() % 32, groups = lp_bdim() / 32;
  for (int b = group; b < k / 256; b += groups) {
    float x[8];
    float best = -1.0f, mx = 0.0f;
    int at = 0;
    #pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int i = b * 256 + lane * 8 + j;
      x[j] = value(i);
      if (lp_abs(x[j]) > best) { best = lp_abs(x[j]); mx = x[j]; at = i; }
    }
    // the first element of largest magnitude, as np.argmax picks it
    #pragma unroll
    for (int m = 16; m > 0; m >>= 1) {
      const float ob = lp_shfl_xor(best, m), om = lp_shfl_xor(mx, m);
      const int oa = lp_shfl_xor(at, m);
      if (ob > best || (ob == best && oa < at)) { best = ob; mx = om; at = oa; }
    }
    const float iscale = mx != 0.0f ? -127.0f / mx : 0.0f;
    const float d = mx != 0.0f ? 1.0f / iscale : 0.0f;
    int half_sum = 0;
    #pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int q = lp_min(127, (int)lp_rint(iscale * x[j]));
      out.qs[(size_t)row * k + b * 256 + lane * 8 + j] = (int8_t)q;
      half_sum += q;
    }
    // each 16-value sum spans two neighbouring threads
    const int pair = half_sum + lp_shfl_xor(half_sum, 1);
    if ((lane & 1) == 0) out.bsums[((size_t)row * (k / 256) + b) * 16 + lane / 2] = (int16_t)pair;
    if (lane == 0) ((float*)out.d)[(size_t)row * (k / 256) + b] = d;
  }
}

template <int FMT, class F>
__device__ __forceinline__ void lp_pack_row(F value, int k, int row, Q8Rows out) {
  if (FMT == LP_ACT_Q8_K) lp_pack_row_q8_k(value, k, row, out);
  else lp_pack_row_q8_32<FMT>(value, k, row, out);
}
