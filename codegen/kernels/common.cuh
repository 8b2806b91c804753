// common.cuh: what several kernel families share: field planes of packed activations, block
// reductions, and packing a row to 8-bit blocks with exactly the CPU twins' rounding
// (models/numerics.py pack_blocks: q8_0/q8_1 take amax/127 as an f16 scale and round half to even;
// q8_k takes the signed max of 256 values, iscale = -127/max, d = 1/iscale, with 16-value sums).
#pragma once
#include "vendor.h"
#include <stdint.h>

// Planes start on 256-byte boundaries (models/formats.py PLANE_ALIGN).
__device__ __forceinline__ size_t lp_align(size_t n) { return (n + 255) & ~(size_t)255; }

// A packed activation buffer [rows, k] as its planes, in field order (models/formats.py planes()).
struct Q8Rows {
  void* d;         // lp_half [rows, k/32] (q8_0, q8_1) or float [rows, k/256] (q8_k)
  lp_half* s;      // q8_1: lp_half [rows, k/32] = d * sum(qs); else null
  int8_t* qs;      // [rows, k]
  int16_t* bsums;  // q8_k: [rows, k/16]; else null
};

// fmt: 0 = q8_0, 1 = q8_1, 2 = q8_k
__device__ __forceinline__ Q8Rows lp_q8_rows(void* base, int rows, int k, int fmt) {
  char* p = (char*)base;
  Q8Rows r;
  const size_t n = (size_t)rows * k;
  if (fmt == 2) {
    r.d = p;
    p += lp_align(n / 256 * sizeof(float));
    r.s = nullptr;
    r.qs = (int8_t*)p;
    p += lp_align(n);
    r.bsums = (int16_t*)p;
  } else {
    r.d = p;
    p += lp_align(n / 32 * sizeof(lp_half));
    if (fmt == 1) {
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
    if (FMT == 1) {
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
  if (FMT == 2) lp_pack_row_q8_k(value, k, row, out);
  else lp_pack_row_q8_32<FMT>(value, k, row, out);
}
