// host.h: codegen/kernels/vendor.h for the CPU target. The GPU kernels' shared headers (common.cuh,
// quant.cuh, fused.cuh) compile as host C++ with this header in their place, so the CPU kernels take
// every block layout, scale unpacking and packing rule from the same source as the GPU kernels.
//
// A "wave" here is one lane (WAVE 1): quant.cuh's lp_row_dot walks all of a row's pieces in order on
// the calling thread, and the shuffle reductions are the identity. Nothing else of the GPU execution
// model exists on the host; the CPU kernels (codegen/cpu/*.h) split work over pool.h's threads.
#pragma once
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define LP_CPU 1
#define WAVE 1
#define __global__
#define __device__
#define __forceinline__ inline __attribute__((always_inline))
#define __restrict__ __restrict
// entry points are the library's only exported symbols (cpu_build.py builds with -fvisibility=hidden),
// so libraries of several SIMD paths or kernel sets in one process never bind each other's inline code
#define LP_KERNEL extern "C" __attribute__((visibility("default")))

__device__ __forceinline__ int lp_tid() { return 0; }
__device__ __forceinline__ int lp_bid() { return 0; }
__device__ __forceinline__ int lp_bid_y() { return 0; }
__device__ __forceinline__ int lp_bid_z() { return 0; }
__device__ __forceinline__ int lp_bdim() { return 1; }
__device__ __forceinline__ void lp_sync() {}

typedef _Float16 lp_half;
__device__ __forceinline__ float lp_h2f(lp_half h) { return (float)h; }
__device__ __forceinline__ lp_half lp_f2h(float f) { return (lp_half)f; }

template <typename T> __device__ __forceinline__ T lp_shfl_xor(T v, int) { return v; }
template <typename T> __device__ __forceinline__ T lp_shfl(T v, int) { return v; }

// 4-way signed int8 dot product accumulated into c
__device__ __forceinline__ int lp_dot4(int a, int b, int c) {
  for (int i = 0; i < 4; ++i) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
  return c;
}

// the bytes of the 16-byte table t0..t3 at the 4-bit indices of q (8 nibbles): lo those of the low
// nibbles of q's bytes 0..3, hi those of the high nibbles (the GPUs' byte permutes, one byte at a time)
__device__ __forceinline__ void lp_lookup16(uint32_t q, uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3,
                                            uint32_t& lo, uint32_t& hi) {
  const uint32_t t[4] = {t0, t1, t2, t3};
  lo = hi = 0;
  for (int b = 0; b < 8; ++b) {
    const uint32_t i = (q >> (4 * b)) & 0xF, v = (t[i / 4] >> (8 * (i % 4))) & 0xFF;
    if (b % 2) hi |= v << (8 * (b / 2));
    else lo |= v << (8 * (b / 2));
  }
}

__device__ __forceinline__ int lp_lane() { return 0; }
__device__ __forceinline__ int lp_wave() { return 0; }
__device__ __forceinline__ int lp_waves() { return 1; }

__device__ __forceinline__ float lp_sqrt(float x) { return __builtin_sqrtf(x); }
__device__ __forceinline__ float lp_exp(float x) { return expf(x); }
__device__ __forceinline__ float lp_abs(float x) { return __builtin_fabsf(x); }
__device__ __forceinline__ float lp_fmax(float a, float b) { return __builtin_fmaxf(a, b); }
// round to nearest, ties to even (NumPy's rint) in the default rounding mode
__device__ __forceinline__ float lp_rint(float x) { return __builtin_rintf(x); }
template <typename T> __device__ __forceinline__ T lp_min(T a, T b) { return a < b ? a : b; }
template <typename T> __device__ __forceinline__ T lp_max(T a, T b) { return a < b ? b : a; }
template <typename T> __device__ __forceinline__ T lp_wave_sum(T v) { return v; }
template <typename T> __device__ __forceinline__ T lp_wave_max(T v) { return v; }
