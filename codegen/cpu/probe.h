// probe.h: what a C++ compiler must build to serve the CPU target. codegen/cpu_build.py compiles it with
// each candidate compiler, under the kernels' flags for the best SIMD path this machine runs, and builds
// with the first that succeeds: C++20, the host vendor header (its _Float16 half type), simd.h's
// helpers, and on the avx512 path the 512-bit VNNI dot products of matmul.h's engines.
#include "vendor.h"
#include "simd.h"

LP_KERNEL float lp_probe(const int8_t* w, const int8_t* x) {
  float s = lp_h2f(lp_f2h((float)w[0]));
#if LP_CPU_ISA >= 1
  const __m256i wv = lp_cpu::load32(w), xv = lp_cpu::load32(x);
  const __m256i d = lp_cpu::dot_signed(_mm256_abs_epi8(wv), wv, xv);
  const __m256i e = lp_cpu::dot_scaled(lp_cpu::dot_unsigned(_mm256_abs_epi8(wv), xv), wv, xv, wv);
  s += lp_cpu::hsum8(_mm256_cvtepi32_ps(_mm256_add_epi32(d, e))) + lp_cpu::hsum8(lp_cpu::load_h8(w)) +
       lp_cpu::hsum8(lp_cpu::load_bf8(x));
#endif
#if LP_CPU_ISA >= 2
  const __m512i a = _mm512_loadu_si512(w), b = _mm512_loadu_si512(x);
  s += (float)_mm512_reduce_add_epi32(_mm512_dpwssd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), a, b), a, b));
#endif
  return s;
}
