// unpack.h: a weight row's blocks (read in place through quant.cuh's LpWeight<F, LP_BLOCKS>) as the
// SIMD engines of matmul.h take them: whole bytes, one per value, and plain scales. A task unpacks its
// rows once (one pass over the weight bytes) and its register tiles reuse them for every activation row.
//
// Kind A (the 32-value formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): q[k] int8, the value's integer as the
// dequantizer has it (q - 8, q - 16, the int8 itself) or, for the formats with a min, the unsigned q;
// dw[k/32] = d and mw[k/32] = m as float.
// Kind B (the K-quants): u[k] the value's unsigned integer (Q2_K 0..3, Q3_K 0..7, Q4_K 0..15, Q5_K
// 0..31, Q6_K 0..63); per 32 values, scx = 16 int16 (8 copies of the scale of the first 16 values, 8
// of the second: vpmaddwd's pairs); aux[k/16] int16; d, da [k/256] float. The value is
// d * sc * u - (d * aux, OFF formats; da * aux, MIN formats) per 16-value sub-block:
//   Q2_K: sc = scales & 15, aux = scales >> 4 (min), da = dmin      (MIN)
//   Q3_K: sc = the signed 6-bit scale, u = low 2 bits | mask bit << 2, aux = 4 sc, da = d  (OFF)
//   Q4_K, Q5_K: sc, aux = the 6-bit scale and min of each 32 values (common.cuh lp_k_scale_min), da = dmin  (MIN)
//   Q6_K: sc = the int8 scale, aux = 32 sc, da = d  (OFF)
// Bit positions follow quant.cuh's comments (and core/formats.py): Q2_K value 128G + 32s + i is bits 2s
// of qs[32G + i]; Q3_K's mask bit of value v is bit v / 32 of hmask[v % 32]; Q4_K value 64g + 32h + i is
// nibble h of qs[32g + i], Q5_K's bit 4 bit v / 32 of qh[v % 32]; Q6_K value 128G + r is nibble r / 64
// of ql[64G + r % 64] with bits 2 (r / 32) of qh[32G + r % 32] as bits 4..5. Whole 32-byte groups at a
// time with AVX2 byte operations (16-bit shifts whose spill into the neighbouring byte the masks remove);
// only the SIMD paths unpack (the scalar path reads the blocks through quant.cuh's dot).
#pragma once
#include <vector>

#include "quant.cuh"
#include "simd.h"

#if LP_CPU_ISA >= 1
namespace lp_cpu {

enum { UNPACK_A, UNPACK_B };

// unpacked rows [r0, r1) of one task
struct UnpackedA {
  std::vector<int8_t> qv;
  std::vector<float> dv, mv;
  int k = 0, base = 0;
  void reset(int r0, int r1, int k_) {
    k = k_, base = r0;
    qv.resize((size_t)(r1 - r0) * k);
    dv.resize((size_t)(r1 - r0) * (k / 32));
    mv.resize((size_t)(r1 - r0) * (k / 32));
  }
  int8_t* q(int row) { return qv.data() + (size_t)(row - base) * k; }
  float* dw(int row) { return dv.data() + (size_t)(row - base) * (k / 32); }
  float* mw(int row) { return mv.data() + (size_t)(row - base) * (k / 32); }
  const int8_t* q(int row) const { return qv.data() + (size_t)(row - base) * k; }
  const float* dw(int row) const { return dv.data() + (size_t)(row - base) * (k / 32); }
  const float* mw(int row) const { return mv.data() + (size_t)(row - base) * (k / 32); }
};

struct UnpackedB {
  std::vector<uint8_t> uv;
  std::vector<int16_t> sv, av;
  std::vector<float> dv, dav;
  int k = 0, base = 0;
  void reset(int r0, int r1, int k_) {
    k = k_, base = r0;
    const size_t n = r1 - r0;
    uv.resize(n * k);
    sv.resize(n * (k / 2));
    av.resize(n * (k / 16));
    dv.resize(n * (k / 256));
    dav.resize(n * (k / 256));
  }
  uint8_t* u(int row) { return uv.data() + (size_t)(row - base) * k; }
  int16_t* scx(int row) { return sv.data() + (size_t)(row - base) * (k / 2); }
  int16_t* aux(int row) { return av.data() + (size_t)(row - base) * (k / 16); }
  float* d(int row) { return dv.data() + (size_t)(row - base) * (k / 256); }
  float* da(int row) { return dav.data() + (size_t)(row - base) * (k / 256); }
  const uint8_t* u(int row) const { return uv.data() + (size_t)(row - base) * k; }
  const int16_t* scx(int row) const { return sv.data() + (size_t)(row - base) * (k / 2); }
  const int16_t* aux(int row) const { return av.data() + (size_t)(row - base) * (k / 16); }
  const float* d(int row) const { return dv.data() + (size_t)(row - base) * (k / 256); }
  const float* da(int row) const { return dav.data() + (size_t)(row - base) * (k / 256); }
};

// per-16-value scales and aux of one super-block into the row's scx / aux at super-block sb
inline void put_scales(UnpackedB& u, int row, int sb, const int (&sc)[16], const int (&aux)[16]) {
  int16_t* scx = u.scx(row) + 128 * sb;
  int16_t* ax = u.aux(row) + 16 * sb;
  for (int j = 0; j < 16; ++j) {
    _mm_storeu_si128((__m128i*)(scx + 8 * j), _mm_set1_epi16((int16_t)sc[j]));
    ax[j] = (int16_t)aux[j];
  }
}

inline void store32(void* p, __m256i v) { _mm256_storeu_si256((__m256i*)p, v); }

// The Q4_K / Q5_K / Q6_K rows prefetch each super-block AHEAD_ROWS rows on as they unpack it: one-row
// decode unpacks a tile (matmul.h RT_B1 = AHEAD_ROWS rows) at a time, and the blocks of the next tile's
// rows are too many streams for the hardware prefetcher (measured 12-16% faster with 2 threads).
constexpr int AHEAD_ROWS = 4;
template <int BYTES> inline void prefetch_block(const void* p) {
  for (int i = 0; i < BYTES; i += 64) _mm_prefetch((const char*)p + i, _MM_HINT_T0);
}
inline __m256i bytes(int v) { return _mm256_set1_epi8((char)v); }

// byte j of the result is 0xFF where bit j of x is set
inline __m256i bits_to_bytes(uint32_t x) {
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x),
                                             _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202,
                                                                0x0303030303030303));
  const __m256i others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);  // every bit but the byte's own
  return _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi64x(-1));
}

// bit b of each byte of v moved to bit `to` (b, to < 8), every other bit clear
inline __m256i bit_to(__m256i v, int b, int to) {
  const __m256i moved = b >= to ? _mm256_srli_epi16(v, b - to) : _mm256_slli_epi16(v, to - b);
  return _mm256_and_si256(moved, bytes(1 << to));
}

template <int F> struct Unpack;

// Kind A: block(w, blk) is block blk's 32 values as bytes, d(w, blk) and m(w, blk) its scale and min;
// row() writes a row of them to the scratch (matmul.h also reads blocks directly through these).
template <> struct Unpack<LP_FMT_Q8_0> {
  static constexpr int KIND = UNPACK_A;
  static constexpr bool SIGNED = true, MIN = false;
  using W = LpWeight<LP_FMT_Q8_0, LP_BLOCKS>;
  static __m256i block(const W& w, size_t blk) { return load32(w.qs.at(blk)); }
  static float d(const W& w, size_t blk) { return lp_h2f(w.d[blk]); }
  static float m(const W&, size_t) { return 0.0f; }
#if LP_CPU_ISA >= 2
  // pair(): blocks blk and blk + 1 as unsigned bytes, each value + BIAS (the sign bit flipped)
  static constexpr int BIAS = 128;
  static __m512i pair(const W& w, size_t blk) {
    const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(block(w, blk)), block(w, blk + 1), 1);
    return _mm512_xor_si512(q, _mm512_set1_epi8((char)0x80));
  }
#endif
  static void row(const W& w, int row, UnpackedA& u);
};

template <bool HI, bool MN> struct Unpack32 {
  static constexpr int KIND = UNPACK_A;
  static constexpr bool SIGNED = !MN, MIN = MN;
  using W = LpWeight32<HI, MN, LP_BLOCKS>;
  static __m256i block(const W& w, size_t blk) {
    const __m128i qs = _mm_loadu_si128((const __m128i*)w.qs.at(blk));
    __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), bytes(0xF));  // values 0..15, 16..31
    if constexpr (HI) v = _mm256_or_si256(v, _mm256_and_si256(bits_to_bytes(w.qh[blk]), bytes(0x10)));
    if constexpr (W::OFFSET != 0) v = _mm256_sub_epi8(v, bytes(W::OFFSET));
    return v;
  }
  static float d(const W& w, size_t blk) { return lp_h2f(w.d[blk]); }
  static float m(const W& w, size_t blk) { return MN ? lp_h2f(w.m[blk]) : 0.0f; }
#if LP_CPU_ISA >= 2
  // blocks blk and blk + 1 (their values 0..31 in bytes 0..31 and 32..63) as unsigned bytes, each value
  // + BIAS (the stored integer before the offset): the nibbles of each block's 16 bytes split by a
  // variable shift, the high bits through a 64-bit mask
  static constexpr int BIAS = W::OFFSET;
  static __m512i pair(const W& w, size_t blk) {
    constexpr long long F4 = 0x0004000400040004;  // shift the 16-bit lanes of 128-bit lanes 1 and 3 by 4
    const __m128i q0 = _mm_loadu_si128((const __m128i*)w.qs.at(blk)), q1 = _mm_loadu_si128((const __m128i*)w.qs.at(blk + 1));
    const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(q0, q0)), _mm256_set_m128i(q1, q1), 1);
    __m512i v = _mm512_and_si512(_mm512_srlv_epi16(q, _mm512_set_epi64(F4, F4, 0, 0, F4, F4, 0, 0)), _mm512_set1_epi8(0xF));
    if constexpr (HI) {
      const __mmask64 hi = (uint64_t)w.qh[blk] | (uint64_t)w.qh[blk + 1] << 32;
      v = _mm512_mask_add_epi8(v, hi, v, _mm512_set1_epi8(0x10));
    }
    return v;
  }
#endif
  static void row(const W& w, int row, UnpackedA& u);
};

template <class U, class W> inline void unpack_a_row(const W& w, int row, UnpackedA& u) {
  for (int b = 0; b < w.nb; ++b) {
    const size_t blk = (size_t)row * w.nb + b;
    store32(u.q(row) + 32 * b, U::block(w, blk));
    u.dw(row)[b] = U::d(w, blk);
    if constexpr (U::MIN) u.mw(row)[b] = U::m(w, blk);
  }
}
inline void Unpack<LP_FMT_Q8_0>::row(const W& w, int row, UnpackedA& u) { unpack_a_row<Unpack<LP_FMT_Q8_0>>(w, row, u); }
template <bool HI, bool MN> inline void Unpack32<HI, MN>::row(const W& w, int row, UnpackedA& u) {
  unpack_a_row<Unpack32<HI, MN>>(w, row, u);
}
template <> struct Unpack<LP_FMT_Q4_0> : Unpack32<false, false> {};
template <> struct Unpack<LP_FMT_Q4_1> : Unpack32<false, true> {};
template <> struct Unpack<LP_FMT_Q5_0> : Unpack32<true, false> {};
template <> struct Unpack<LP_FMT_Q5_1> : Unpack32<true, true> {};

template <> struct Unpack<LP_FMT_Q2_K> {
  static constexpr int KIND = UNPACK_B;
  static constexpr bool MIN = true;
  static void row(const LpWeight<LP_FMT_Q2_K, LP_BLOCKS>& w, int row, UnpackedB& u) {
    for (int sb = 0; sb < w.nb; ++sb) {
      const size_t blk = (size_t)row * w.nb + sb;
      const uint8_t* qs = w.qs.at(blk);
      uint8_t* o = u.u(row) + 256 * sb;
      for (int G = 0; G < 2; ++G) {
        const __m256i q = load32(qs + 32 * G);
        for (int s = 0; s < 4; ++s) store32(o + 128 * G + 32 * s, _mm256_and_si256(_mm256_srli_epi16(q, 2 * s), bytes(3)));
      }
      int sc[16], mn[16];
      for (int j = 0; j < 16; ++j) {
        const int v = w.scales.at(blk)[j];
        sc[j] = v & 0xF;
        mn[j] = v >> 4;
      }
      put_scales(u, row, sb, sc, mn);
      u.d(row)[sb] = lp_h2f(w.d[blk]);
      u.da(row)[sb] = lp_h2f(w.dmin[blk]);
    }
  }
};

template <> struct Unpack<LP_FMT_Q3_K> {
  static constexpr int KIND = UNPACK_B;
  static constexpr bool MIN = false;
  static void row(const LpWeight<LP_FMT_Q3_K, LP_BLOCKS>& w, int row, UnpackedB& u) {
    for (int sb = 0; sb < w.nb; ++sb) {
      const size_t blk = (size_t)row * w.nb + sb;
      const uint8_t* qs = w.qs.at(blk);
      const uint8_t* hm = w.hmask.at(blk);
      uint8_t* o = u.u(row) + 256 * sb;
      const __m256i m = load32(hm);
      for (int G = 0; G < 2; ++G) {
        const __m256i q = load32(qs + 32 * G);
        for (int s = 0; s < 4; ++s)
          store32(o + 128 * G + 32 * s,
                  _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * s), bytes(3)), bit_to(m, 4 * G + s, 2)));
      }
      int sc[16], off[16];
      for (int j = 0; j < 16; ++j) {
        sc[j] = lp_q3k_scale(LpScaleBytes{w.scales.at(blk)}, j);
        off[j] = 4 * sc[j];
      }
      put_scales(u, row, sb, sc, off);
      u.d(row)[sb] = u.da(row)[sb] = lp_h2f(w.d[blk]);
    }
  }
};

template <bool Q5> struct UnpackK45 {
  static constexpr int KIND = UNPACK_B;
  static constexpr bool MIN = true;
  static void row(const LpWeightK45<Q5, LP_BLOCKS>& w, int row, UnpackedB& u) {
    for (int sb = 0; sb < w.nb; ++sb) {
      const size_t blk = (size_t)row * w.nb + sb;
      prefetch_block<LpWeightK45<Q5, LP_BLOCKS>::BYTES>(w.d.at(blk + AHEAD_ROWS * w.nb));  // d: the block's first field
      const uint8_t* qs = w.qs.at(blk);
      uint8_t* o = u.u(row) + 256 * sb;
      const __m256i qh = Q5 ? load32(w.qh.at(blk)) : _mm256_setzero_si256();
      for (int g = 0; g < 4; ++g) {
        const __m256i q = load32(qs + 32 * g);
        for (int h = 0; h < 2; ++h) {
          __m256i v = _mm256_and_si256(h ? _mm256_srli_epi16(q, 4) : q, bytes(0xF));
          if constexpr (Q5) v = _mm256_or_si256(v, bit_to(qh, 2 * g + h, 4));
          store32(o + 64 * g + 32 * h, v);
        }
      }
      int sc[16], mn[16];
      for (int j = 0; j < 8; ++j) {
        lp_k_scale_min(LpScaleBytes{w.scales.at(blk)}, j, sc[2 * j], mn[2 * j]);
        sc[2 * j + 1] = sc[2 * j];
        mn[2 * j + 1] = mn[2 * j];
      }
      put_scales(u, row, sb, sc, mn);
      u.d(row)[sb] = lp_h2f(w.d[blk]);
      u.da(row)[sb] = lp_h2f(w.dmin[blk]);
    }
  }
};
template <> struct Unpack<LP_FMT_Q4_K> : UnpackK45<false> {};
template <> struct Unpack<LP_FMT_Q5_K> : UnpackK45<true> {};

template <> struct Unpack<LP_FMT_Q6_K> {
  static constexpr int KIND = UNPACK_B;
  static constexpr bool MIN = false;
  static void row(const LpWeight<LP_FMT_Q6_K, LP_BLOCKS>& w, int row, UnpackedB& u) {
    for (int sb = 0; sb < w.nb; ++sb) {
      const size_t blk = (size_t)row * w.nb + sb;
      prefetch_block<LpWeight<LP_FMT_Q6_K, LP_BLOCKS>::BYTES>(w.ql.at(blk + AHEAD_ROWS * w.nb));  // ql: the first field
      const uint8_t* ql = w.ql.at(blk);
      const uint8_t* qh = w.qh.at(blk);
      uint8_t* o = u.u(row) + 256 * sb;
      for (int G = 0; G < 2; ++G) {
        const __m256i a = load32(ql + 64 * G), b = load32(ql + 64 * G + 32), h = load32(qh + 32 * G);
        const __m256i m4 = bytes(0xF), m30 = bytes(0x30);
        uint8_t* og = o + 128 * G;  // r / 32 = 0..3: low nibbles of a, b, high nibbles of a, b; qh bits 2 (r / 32)
        store32(og, _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30)));
        store32(og + 32, _mm256_or_si256(_mm256_and_si256(b, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m30)));
        store32(og + 64, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4), _mm256_and_si256(h, m30)));
        store32(og + 96, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), m4),
                                         _mm256_and_si256(_mm256_srli_epi16(h, 2), m30)));
      }
      int sc[16], off[16];
      for (int j = 0; j < 16; ++j) {
        sc[j] = w.scales.at(blk)[j];
        off[j] = 32 * sc[j];
      }
      put_scales(u, row, sb, sc, off);
      u.d(row)[sb] = u.da(row)[sb] = lp_h2f(w.d[blk]);
    }
  }
};

}  // namespace lp_cpu
#endif
