// simd.h: the vector instructions the CPU kernels use, fixed when the library is compiled.
//
// LP_CPU_ISA (codegen/cpu_build.py ISAS sets it with the matching compiler flags):
//   0  scalar: portable C++, no intrinsics (the reference path every test also runs);
//   1  avx2: AVX2 + FMA + F16C, 256-bit integer dot products through vpmaddubsw / vpmaddwd;
//   2  avx512: AVX-512 F/BW/VL + VNNI: the projections' integer engines in 512-bit vectors (two 32-value
//      blocks or two 32-value groups per instruction, matmul.h tile_a512 / tile_b512) with vpdpbusd /
//      vpdpwssd; the rest as avx2 with vpdpbusd in place of AVX2's two-instruction dot product (on an
//      Ice Lake server core the 512-bit engines measured 15-25% faster than the same code in 256 bits);
//   3  amx: avx512 plus AMX-TILE and AMX-INT8: rows16 records against many activation rows on int8 tiles
//      (tiles.h), everything else as avx512.
// Every path sums in an order fixed by the code alone (never by the row count, the tile a row lands
// in, or the thread), so a row's result never depends on the rows beside it.
#pragma once
#ifndef LP_CPU_ISA
#error "LP_CPU_ISA must be 0 (scalar), 1 (avx2), 2 (avx512) or 3 (amx)"
#endif
#if LP_CPU_ISA >= 1
#include <immintrin.h>
#if !(defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#error "LP_CPU_ISA 1 needs -mavx2 -mfma -mf16c"
#endif
#endif
#if LP_CPU_ISA >= 2 && !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__))
#error "LP_CPU_ISA 2 needs -mavx512f -mavx512bw -mavx512vl -mavx512vnni"
#endif
#if LP_CPU_ISA >= 3 && !(defined(__AMX_TILE__) && defined(__AMX_INT8__))
#error "LP_CPU_ISA 3 needs -mamx-tile -mamx-int8"
#endif

namespace lp_cpu {

#if LP_CPU_ISA >= 1
// lanes 0..7 summed as ((0+4) + (2+6)) + ((1+5) + (3+7))
inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256i load32(const void* p) { return _mm256_loadu_si256((const __m256i*)p); }

// 8 int32 partial sums of the products of 32 int8 weights w with 32 int8 activations x; wa = |w|
inline __m256i dot_signed(__m256i wa, __m256i w, __m256i x) {
  const __m256i sx = _mm256_sign_epi8(x, w);  // x with w's sign, so that |w| * sx = w * x
#if LP_CPU_ISA >= 2
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), wa, sx);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(wa, sx), _mm256_set1_epi16(1));
#endif
}

// the same for unsigned weights u (at most 127: the pairwise int16 sums cannot saturate)
inline __m256i dot_unsigned(__m256i u, __m256i x) {
#if LP_CPU_ISA >= 2
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, x);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
#endif
}

// acc + the products of unsigned u with x, pairs of values summed in int16, then each pair times its int16
// scale sc16, summed in pairs into 8 int32 lanes; u at most 127 and x not -128, so no pair saturates
// (|u| of a signed weight, x carrying its sign, as dot_signed)
inline __m256i dot_scaled(__m256i acc, __m256i u, __m256i x, __m256i sc16) {
  const __m256i p16 = _mm256_maddubs_epi16(u, x);
#if LP_CPU_ISA >= 2
  return _mm256_dpwssd_epi32(acc, p16, sc16);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p16, sc16));
#endif
}

inline __m256 load_h8(const void* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
inline __m256 load_bf8(const void* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
#endif

}  // namespace lp_cpu
