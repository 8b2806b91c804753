// vendor.h: the one header that makes every llmplan kernel build as CUDA (nvcc) and as HIP (clang).
//
// Kernels use only what is defined here for anything that differs between vendors: thread and block
// indices, the wave width (32 on NVIDIA and RDNA, 64 on CDNA), shuffles, barriers, the 4-way int8 dot
// product, byte permutes, half precision, and math. The lane index is always lp_tid() % WAVE. On AMD the code builds
// with clang's builtins alone (-nogpuinc -nogpulib: no HIP headers or device libraries needed), so any
// machine with clang-19 can compile it.
#pragma once
#include <stddef.h>
#include <stdint.h>

#if defined(__HIP__)
  #define LP_HIP 1
  #if defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__) || defined(__gfx90a__) || defined(__gfx908__)
    #define LP_CDNA 1
    #define WAVE 64
  #else
    #define LP_RDNA 1
    #define WAVE 32
  #endif
  #if defined(__gfx1100__) || defined(__gfx1101__) || defined(__gfx1102__) || defined(__gfx1150__) || defined(__gfx1151__)
    #define LP_WMMA 1  // RDNA3 WMMA: 16x16x16 iu8 and f16 fragments, wave32
  #endif
  #define __global__ __attribute__((global))
  #define __device__ __attribute__((device))
  #define __shared__ __attribute__((shared))
  #define __forceinline__ __inline__ __attribute__((always_inline))
  #define __restrict__ __restrict
  #define __launch_bounds__(n) __attribute__((amdgpu_flat_work_group_size(1, n)))

  __device__ __forceinline__ int lp_tid() { return __builtin_amdgcn_workitem_id_x(); }
  __device__ __forceinline__ int lp_bid() { return __builtin_amdgcn_workgroup_id_x(); }
  __device__ __forceinline__ int lp_bid_y() { return __builtin_amdgcn_workgroup_id_y(); }
  __device__ __forceinline__ int lp_bid_z() { return __builtin_amdgcn_workgroup_id_z(); }
  __device__ __forceinline__ int lp_bdim() { return __builtin_amdgcn_workgroup_size_x(); }
  __device__ __forceinline__ void lp_sync() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
  }

  typedef _Float16 lp_half;
  __device__ __forceinline__ float lp_h2f(lp_half h) { return (float)h; }
  __device__ __forceinline__ lp_half lp_f2h(float f) { return (lp_half)f; }

  __device__ __forceinline__ int lp_lane_id() {
    return __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
  }
  __device__ __forceinline__ int lp_shfl_i32(int v, int src) { return __builtin_amdgcn_ds_bpermute(src << 2, v); }
  template <typename T> __device__ __forceinline__ T lp_shfl(T v, int src) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "32- or 64-bit values");
    if constexpr (sizeof(T) == 4) {
      return __builtin_bit_cast(T, lp_shfl_i32(__builtin_bit_cast(int, v), src));
    } else {
      const long long x = __builtin_bit_cast(long long, v);
      const int lo = lp_shfl_i32((int)x, src), hi = lp_shfl_i32((int)(x >> 32), src);
      return __builtin_bit_cast(T, ((long long)hi << 32) | (unsigned int)lo);
    }
  }
  template <typename T> __device__ __forceinline__ T lp_shfl_xor(T v, int mask) { return lp_shfl(v, lp_lane_id() ^ mask); }

  // 4-way signed int8 dot product accumulated into c
  __device__ __forceinline__ int lp_dot4(int a, int b, int c) {
  #if defined(LP_CDNA)
    return __builtin_amdgcn_sdot4(a, b, c, false);
  #else
    return __builtin_amdgcn_sudot4(true, a, true, b, c, false);
  #endif
  }
  __device__ __forceinline__ int lp_atomic_add(int* p, int v) { return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT); }
  // v_perm_b32: byte i of the result is byte sel[i] (0..7) of hi:lo (lo's bytes 0..3, hi's 4..7);
  // common.cuh's lp_lookup16 is made of it
  __device__ __forceinline__ uint32_t lp_perm(uint32_t hi, uint32_t lo, uint32_t sel) {
    return __builtin_amdgcn_perm(hi, lo, sel);
  }
#else
  #include <cuda_fp16.h>
  #define LP_CUDA 1
  #define WAVE 32
  #if __CUDA_ARCH__ >= 800
    #define LP_MMA 1  // mma.sync int8 m16n8k32 and f16 m16n8k16
  #endif
  __device__ __forceinline__ int lp_tid() { return threadIdx.x; }
  __device__ __forceinline__ int lp_bid() { return blockIdx.x; }
  __device__ __forceinline__ int lp_bid_y() { return blockIdx.y; }
  __device__ __forceinline__ int lp_bid_z() { return blockIdx.z; }
  __device__ __forceinline__ int lp_bdim() { return blockDim.x; }
  __device__ __forceinline__ void lp_sync() { __syncthreads(); }

  typedef __half lp_half;
  __device__ __forceinline__ float lp_h2f(lp_half h) { return __half2float(h); }
  __device__ __forceinline__ lp_half lp_f2h(float f) { return __float2half_rn(f); }
  template <typename T> __device__ __forceinline__ T lp_shfl_xor(T v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
  template <typename T> __device__ __forceinline__ T lp_shfl(T v, int src) { return __shfl_sync(0xffffffffu, v, src); }
  __device__ __forceinline__ int lp_dot4(int a, int b, int c) { return __dp4a(a, b, c); }
  __device__ __forceinline__ int lp_atomic_add(int* p, int v) { return atomicAdd(p, v); }
  // the bytes of the 16-byte table t0..t3 at the 4-bit indices of q (8 nibbles): lo those of the low
  // nibbles of q's bytes 0..3, hi those of the high nibbles (AMD's: common.cuh). __byte_perm (prmt) reads
  // the 3 low bits of 4 nibble indices: each pair of q's bytes is looked up in both table halves and each
  // byte's half picked by its index's bit 3 (llama.cpp's get_int_from_table_16), then the values sorted
  // into the low and the high nibbles' words.
  __device__ __forceinline__ void lp_lookup16(uint32_t q, uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3,
                                              uint32_t& lo, uint32_t& hi) {
    const uint32_t half = 0x32103210u | ((q & 0x88888888u) >> 1);
    uint32_t v[2];
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t s = q >> (16 * i);
      v[i] = __byte_perm(__byte_perm(t0, t1, s), __byte_perm(t2, t3, s), half >> (16 * i));
    }
    lo = __byte_perm(v[0], v[1], 0x6420);
    hi = __byte_perm(v[0], v[1], 0x7531);
  }
#endif

#define LP_KERNEL extern "C" __global__

__device__ __forceinline__ int lp_lane() { return lp_tid() % WAVE; }
__device__ __forceinline__ int lp_wave() { return lp_tid() / WAVE; }
__device__ __forceinline__ int lp_waves() { return lp_bdim() / WAVE; }

// Math through compiler builtins (no device libraries on AMD); IEEE-rounded where it matters.
__device__ __forceinline__ float lp_sqrt(float x) { return __builtin_sqrtf(x); }
__device__ __forceinline__ float lp_exp(float x) { return __builtin_expf(x); }
__device__ __forceinline__ float lp_abs(float x) { return __builtin_fabsf(x); }
__device__ __forceinline__ float lp_fmax(float a, float b) { return __builtin_fmaxf(a, b); }
// round to nearest, ties to even (NumPy's rint): the packing rule of the CPU twins
__device__ __forceinline__ float lp_rint(float x) { return __builtin_rintf(x); }
template <typename T> __device__ __forceinline__ T lp_min(T a, T b) { return a < b ? a : b; }
template <typename T> __device__ __forceinline__ T lp_max(T a, T b) { return a < b ? b : a; }

template <typename T> __device__ __forceinline__ T lp_wave_sum(T v) {
  #pragma unroll
  for (int m = WAVE / 2; m > 0; m >>= 1) v += lp_shfl_xor(v, m);
  return v;
}

template <typename T> __device__ __forceinline__ T lp_wave_max(T v) {
  #pragma unroll
  for (int m = WAVE / 2; m > 0; m >>= 1) v = lp_max(v, lp_shfl_xor(v, m));
  return v;
}
