// rows16.h: Q4_K projections held in 16-row records (layout "rows16", core/layouts.py makes it once at
// load from the file's blocks), the engine matmul.h runs for them.
//
// Why a relayout: read in place, a Q4_K super-block's scales are unpacked for every weight row, and each
// 16 values go through vpmaddubsw plus a scaled vpdpwssd, then a float epilogue per row (matmul.h engine
// B). Here 16 rows sit side by side, 4 bytes of each per 64-byte vector, so one vpdpbusd takes 4 values
// of 16 rows against 4 activations broadcast, each int32 lane one row's sum: the lanes are the rows,
// nothing is summed across lanes, the scales are plain bytes, and the float epilogue serves 16 rows at
// once. A task's rows are one contiguous stream.
//
// A record: super-block sb of rows 16G .. 16G + 15 (rows past the weight's end are zero), records in
// order (G, sb), R16_BYTES each:
//   d    f16[16]          the rows' super-block scales
//   dmin f16[16]          and mins' scales
//   sc   u8[8][16]        sub-block j's 6-bit scale, by row (common.cuh lp_k_scale_min)
//   m    u8[4][16][2]     sub-blocks 2i and 2i + 1's 6-bit mins, by row: a row's pair as one int16 pair
//   qs   u8[4][8][16][4]  for g, t, row: the row's bytes 32g + 4t .. 32g + 4t + 3 of qs, whose low nibbles
//                         are values 64g + 4t .. + 3 (sub-block 2g) and high nibbles values 64g + 32 + 4t
//                         .. + 3 (sub-block 2g + 1)
// A row's result, for every path: per super-block the exact integers
//   isum = sum_j sc_j * (u_j . x_j)   and   msum = sum_j m_j * (sum of x_j)   (j: the 32-value sub-blocks)
// then acc = fma(float(isum), d * dk, acc) and acc = fma(-float(msum), dmin * dk, acc), super-blocks in
// order. The integers do not depend on how they are summed, so the scalar, avx2 and avx512 paths give the
// same bits, and a row's result never depends on the rows beside it, the tile or the thread.
#pragma once
#include <cmath>

#include "quant.cuh"
#include "simd.h"

namespace lp_cpu {

enum { LP_FMT_Q4_K_R16 = 100 };  // a CPU-only weight code: Q4_K in rows16 records
constexpr int R16 = 16;
constexpr int R16_D = 0, R16_DMIN = 32, R16_SC = 64, R16_M = 192, R16_QS = 320, R16_BYTES = 2368;

struct Rows16 {
  const uint8_t* base;
  int nsb;  // super-blocks per row
  const uint8_t* rec(int group, int sb) const { return base + ((size_t)group * nsb + sb) * R16_BYTES; }
};

// the activations' per-sub-block sums that msum takes, as int16 pairs (sub-blocks 2i, 2i + 1): q8_k's
// 16-value sums added in pairs, [rows, k / 64]
inline void r16_pair_sums(const int16_t* bsums, int rows, int k, std::vector<int32_t>& out) {
  out.resize((size_t)rows * (k / 64));
  for (size_t i = 0; i < out.size(); ++i) {
    const int16_t* b = bsums + 4 * i;
    const uint32_t lo = (uint16_t)(int16_t)(b[0] + b[1]), hi = (uint16_t)(int16_t)(b[2] + b[3]);
    out[i] = (int32_t)(lo | hi << 16);
  }
}

// the epilogue of one super-block for one lane
inline float r16_apply(float acc, int32_t isum, int32_t msum, float d, float dmin, float dk) {
  acc = std::fma((float)isum, d * dk, acc);
  return std::fma(-(float)msum, dmin * dk, acc);
}

// The scalar path: rows 16G .. 16G + 15 against activation row c (q8_k values qs, scales dk, pair sums bp).
inline void r16_scalar(const Rows16& w, int group, const int8_t* qs, const float* dk, const int32_t* bp,
                       float (&out)[R16]) {
  for (int r = 0; r < R16; ++r) out[r] = 0.0f;
  for (int sb = 0; sb < w.nsb; ++sb) {
    const uint8_t* rec = w.rec(group, sb);
    const int8_t* x = qs + 256 * sb;
    for (int r = 0; r < R16; ++r) {
      int32_t isum = 0, msum = 0;
      for (int j = 0; j < 8; ++j) {
        const int g = j / 2, h = j % 2;
        int32_t s = 0;
        for (int t = 0; t < 8; ++t)
          for (int b = 0; b < 4; ++b) {
            const uint8_t byte = rec[R16_QS + ((g * 8 + t) * R16 + r) * 4 + b];
            s += (h ? byte >> 4 : byte & 15) * x[64 * g + 32 * h + 4 * t + b];
          }
        isum += s * rec[R16_SC + j * R16 + r];
      }
      for (int i = 0; i < 4; ++i) {
        const int32_t pair = bp[4 * sb + i];
        msum += rec[R16_M + (i * R16 + r) * 2] * (int16_t)(pair & 0xFFFF) + rec[R16_M + (i * R16 + r) * 2 + 1] * (int16_t)(pair >> 16);
      }
      out[r] = r16_apply(out[r], isum, msum, lp_h2f(((const lp_half*)(rec + R16_D))[r]),
                         lp_h2f(((const lp_half*)(rec + R16_DMIN))[r]), dk[sb]);
    }
  }
}

#if LP_CPU_ISA >= 1
// The SIMD engines, over a vector of LANES rows (V512: a record's 16; V256: its half `h`, 8 rows).
// Within a sub-block the products go to Sub (V512: int32 lanes by vpdpbusd; V256: int16 lanes by
// vpmaddubsw, at most 8 x 2 x 15 x 128 = 30720, exact), total() turns them into one int32 per row.
#if LP_CPU_ISA >= 2
struct V512 {
  static constexpr int LANES = 16;
  using I = __m512i;
  using F = __m512;
  static I zero() { return _mm512_setzero_si512(); }
  static I load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static I lo(I v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
  static I hi(I v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F)); }
  static I dot(I s, I u, const int8_t* x) { return _mm512_dpbusd_epi32(s, u, _mm512_set1_epi32(lp_ld<int32_t>(x))); }
  static I total(I s) { return s; }
  static I scales(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)); }
  static I mul(I a, I b) { return _mm512_mullo_epi32(a, b); }
  static I add(I a, I b) { return _mm512_add_epi32(a, b); }
  static I mins(I acc, const uint8_t* p, int32_t pair) {
    return _mm512_dpwssd_epi32(acc, _mm512_cvtepu8_epi16(load32(p)), _mm512_set1_epi32(pair));
  }
  static F halves(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
  static F fzero() { return _mm512_setzero_ps(); }
  static F apply(F acc, I isum, I msum, F d, F dmin, float dk) {
    const F k = _mm512_set1_ps(dk);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, k), acc);
    return _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dmin, k), acc);
  }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
};
#endif
struct V256 {
  static constexpr int LANES = 8;
  using I = __m256i;
  using F = __m256;
  static I zero() { return _mm256_setzero_si256(); }
  static I load(const uint8_t* p) { return load32(p); }
  static I lo(I v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
  static I hi(I v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }
  static I dot(I s, I u, const int8_t* x) {
    return _mm256_add_epi16(s, _mm256_maddubs_epi16(u, _mm256_set1_epi32(lp_ld<int32_t>(x))));
  }
  static I total(I s) { return _mm256_madd_epi16(s, _mm256_set1_epi16(1)); }
  static I scales(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)); }
  static I mul(I a, I b) { return _mm256_mullo_epi32(a, b); }
  static I add(I a, I b) { return _mm256_add_epi32(a, b); }
  static I mins(I acc, const uint8_t* p, int32_t pair) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)p)),
                                                    _mm256_set1_epi32(pair)));
  }
  static F halves(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
  static F fzero() { return _mm256_setzero_ps(); }
  static F apply(F acc, I isum, I msum, F d, F dmin, float dk) {
    const F k = _mm256_set1_ps(dk);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, k), acc);
    return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dmin, k), acc);
  }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
};

// Lanes [L h, L h + L) of record group `group` against CT activation rows (values qs + c * k, scales
// dk + c * nsb, pair sums bp + c * k / 64), NG of the four 64-value groups in flight (independent sums:
// decode's one row needs more of them than its few products can hide).
template <class V, int CT, int NG>
inline void r16_tile(const Rows16& w, int group, int h, const int8_t* qs, const float* dk, const int32_t* bp, int k,
                     float (&out)[CT][V::LANES]) {
  constexpr int L = V::LANES;
  const int nsb = w.nsb;
  typename V::F acc[CT];
  for (int c = 0; c < CT; ++c) acc[c] = V::fzero();
  for (int sb = 0; sb < nsb; ++sb) {
    const uint8_t* rec = w.rec(group, sb);
    typename V::I isum[CT], msum[CT];
    for (int c = 0; c < CT; ++c) isum[c] = msum[c] = V::zero();
    for (int g0 = 0; g0 < 4; g0 += NG) {
      typename V::I s[CT][NG][2];
      for (int c = 0; c < CT; ++c)
        for (int gi = 0; gi < NG; ++gi) s[c][gi][0] = s[c][gi][1] = V::zero();
#pragma unroll
      for (int t = 0; t < 8; ++t)
        for (int gi = 0; gi < NG; ++gi) {
          const int g = g0 + gi;
          const typename V::I v = V::load(rec + R16_QS + (g * 8 + t) * 64 + 4 * L * h);
          const typename V::I u0 = V::lo(v), u1 = V::hi(v);
          for (int c = 0; c < CT; ++c) {
            const int8_t* x = qs + (size_t)c * k + 256 * sb + 64 * g + 4 * t;
            s[c][gi][0] = V::dot(s[c][gi][0], u0, x);
            s[c][gi][1] = V::dot(s[c][gi][1], u1, x + 32);
          }
        }
      for (int gi = 0; gi < NG; ++gi) {
        const int g = g0 + gi;
        const typename V::I s0 = V::scales(rec + R16_SC + 2 * g * R16 + L * h);
        const typename V::I s1 = V::scales(rec + R16_SC + (2 * g + 1) * R16 + L * h);
        for (int c = 0; c < CT; ++c)
          isum[c] = V::add(isum[c], V::add(V::mul(V::total(s[c][gi][0]), s0), V::mul(V::total(s[c][gi][1]), s1)));
      }
    }
    for (int i = 0; i < 4; ++i)
      for (int c = 0; c < CT; ++c) msum[c] = V::mins(msum[c], rec + R16_M + i * 2 * R16 + 2 * L * h, bp[(size_t)c * (k / 64) + 4 * sb + i]);
    const typename V::F d = V::halves(rec + R16_D + 2 * L * h), dmin = V::halves(rec + R16_DMIN + 2 * L * h);
    for (int c = 0; c < CT; ++c) acc[c] = V::apply(acc[c], isum[c], msum[c], d, dmin, dk[(size_t)c * nsb + sb]);
  }
  for (int c = 0; c < CT; ++c) V::store(out[c], acc[c]);
}
#endif

}  // namespace lp_cpu
