// unpack.h: a weight row's blocks (read in place through quant.cuh's LpWeight<F, LP_BLOCKS>) as the
// SIMD engines of matmul.h take them: whole bytes, one per value, and plain scales. Each format has one
// decoder (Unpack<F>); the engines call it on the blocks as they read them (a few activation rows: each
// weight row is read once, nothing is stored), or a task first unpacks its rows through it into a
// scratch that its register tiles reuse for every activation row (many activation rows).
//
// Kind A (the 32-value formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): q[k] int8, the value's integer as the
// dequantizer has it (q - 8, q - 16, the int8 itself) or, for the formats with a min, the unsigned q;
// dw[k/32] = d and mw[k/32] = m as float.
// Kind B (the K-quants): u[k] the value's unsigned integer (Q2_K 0..3, Q3_K 0..7, Q4_K 0..15, Q5_K
// 0..31, Q6_K 0..63); per super-block a head (KHead): sc[16] and aux[16] int16 per 16-value sub-block,
// d and da float. The value is d * sc * u - (d * aux, OFF formats; da * aux, MIN formats):
//   Q2_K: sc = scales & 15, aux = scales >> 4 (min), da = dmin      (MIN)
//   Q3_K: sc = the signed 6-bit scale, u = low 2 bits | mask bit << 2, aux = 4 sc, da = d  (OFF)
//   Q4_K, Q5_K: sc, aux = the 6-bit scale and min of each 32 values (common.cuh lp_k_scale_min), da = dmin  (MIN)
//   Q6_K: sc = the int8 scale, aux = 32 sc, da = d  (OFF)
// Bit positions follow quant.cuh's comments (and core/formats.py): Q2_K value 128G + 32s + i is bits 2s
// of qs[32G + i]; Q3_K's mask bit of value v is bit v / 32 of hmask[v % 32]; Q4_K value 64g + 32h + i is
// nibble h of qs[32g + i], Q5_K's bit 4 bit v / 32 of qh[v % 32]; Q6_K value 128G + r is nibble r / 64
// of ql[64G + r % 64] with bits 2 (r / 32) of qh[32G + r % 32] as bits 4..5. Whole 32-byte groups at a
// time with byte operations (16-bit shifts whose spill into the neighbouring byte the masks remove);
// only the SIMD paths decode here (the scalar path reads the blocks through quant.cuh's dot).
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

// a K-quant super-block's scales (kind B above)
struct KHead {
  __m256i sc, aux;  // int16 per 16-value sub-block
  float d, da;
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
    sv.resize(n * (k / 16));
    av.resize(n * (k / 16));
    dv.resize(n * (k / 256));
    dav.resize(n * (k / 256));
  }
  uint8_t* u(int row) { return uv.data() + (size_t)(row - base) * k; }
  int16_t* sc(int row) { return sv.data() + (size_t)(row - base) * (k / 16); }
  int16_t* aux(int row) { return av.data() + (size_t)(row - base) * (k / 16); }
  float* d(int row) { return dv.data() + (size_t)(row - base) * (k / 256); }
  float* da(int row) { return dav.data() + (size_t)(row - base) * (k / 256); }
  const uint8_t* u(int row) const { return uv.data() + (size_t)(row - base) * k; }
  const int16_t* sc(int row) const { return sv.data() + (size_t)(row - base) * (k / 16); }
  const int16_t* aux(int row) const { return av.data() + (size_t)(row - base) * (k / 16); }
  const float* d(int row) const { return dv.data() + (size_t)(row - base) * (k / 256); }
  const float* da(int row) const { return dav.data() + (size_t)(row - base) * (k / 256); }
};

inline void store32(void* p, __m256i v) { _mm256_storeu_si256((__m256i*)p, v); }

// the cache lines of a block of BYTES bytes at p
template <int BYTES> inline void prefetch_block(const void* p) {
  const char* end = (const char*)p + BYTES;
  for (const char* line = (const char*)((uintptr_t)p & ~(uintptr_t)63); line < end; line += 64) _mm_prefetch(line, _MM_HINT_T0);
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

template <int F> struct Unpack;

// Kind A: block(w, blk) is block blk's 32 values as bytes, d(w, blk) and m(w, blk) its scale and min;
// row() writes a row of them to the scratch (matmul.h also reads blocks directly through these).
template <> struct Unpack<LP_FMT_Q8_0> {
  using W = LpWeight<LP_FMT_Q8_0, LP_BLOCKS>;
  static constexpr int KIND = UNPACK_A;
  static constexpr bool SIGNED = true, MIN = W::MIN;
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

template <int F> struct Unpack32 {
  using W = LpWeight32<F, LP_BLOCKS>;
  static constexpr bool HI = W::HI, MN = W::MIN;
  static constexpr int KIND = UNPACK_A;
  static constexpr bool SIGNED = !MN, MIN = MN;
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
template <int F> inline void Unpack32<F>::row(const W& w, int row, UnpackedA& u) {
  unpack_a_row<Unpack32<F>>(w, row, u);
}
template <> struct Unpack<LP_FMT_Q4_0> : Unpack32<LP_FMT_Q4_0> {};
template <> struct Unpack<LP_FMT_Q4_1> : Unpack32<LP_FMT_Q4_1> {};
template <> struct Unpack<LP_FMT_Q5_0> : Unpack32<LP_FMT_Q5_0> {};
template <> struct Unpack<LP_FMT_Q5_1> : Unpack32<LP_FMT_Q5_1> {};

// Kind B: head(w, blk) is super-block blk's KHead; q32(w, blk, g) its values 32g .. 32g + 31 as bytes,
// q64(w, blk, g) (avx512) values 64g .. 64g + 63; first(w, blk) the block's first byte (its fields
// follow it: the prefetch's address). row() writes a row of them to the scratch.

// bits [from, from + n) of each byte of v at bits [to, to + n), every other bit clear
inline __m256i bits_at(__m256i v, int from, int n, int to) {
  const __m256i moved = from >= to ? _mm256_srli_epi16(v, from - to) : _mm256_slli_epi16(v, to - from);
  return _mm256_and_si256(moved, bytes(((1 << n) - 1) << to));
}
inline __m256i widen16(__m128i bytes16) { return _mm256_cvtepu8_epi16(bytes16); }

#if LP_CPU_ISA >= 2
// a 32-byte group in both halves of a vector, each 16-bit lane of half h shifted right by s[h]
inline __m512i halves(const uint8_t* p) { return _mm512_broadcast_i64x4(load32(p)); }
inline __m512i shift_halves(__m512i v, int s0, int s1) {
  return _mm512_srlv_epi16(v, _mm512_inserti64x4(_mm512_set1_epi16((short)s0), _mm256_set1_epi16((short)s1), 1));
}
// the bytes of v whose bit b0 (first half) / b1 (second half) is set
inline __mmask64 bit_mask(__m512i v, int b0, int b1) {
  return _mm512_test_epi8_mask(v, _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << b0)), _mm256_set1_epi8((char)(1 << b1)), 1));
}
#endif

template <class U, class W> inline void unpack_b_row(const W& w, int row, UnpackedB& u) {
  for (int sb = 0; sb < w.nb; ++sb) {
    const size_t blk = (size_t)row * w.nb + sb;
    const KHead h = U::head(w, blk);
    store32(u.sc(row) + 16 * sb, h.sc);
    store32(u.aux(row) + 16 * sb, h.aux);
    u.d(row)[sb] = h.d;
    u.da(row)[sb] = h.da;
    for (int g = 0; g < 8; ++g) store32(u.u(row) + 256 * sb + 32 * g, U::q32(w, blk, g));
  }
}

template <> struct Unpack<LP_FMT_Q2_K> {
  using W = LpWeight<LP_FMT_Q2_K, LP_BLOCKS>;
  static constexpr int KIND = UNPACK_B;
  static constexpr bool MIN = W::MIN;
  static const void* first(const W& w, size_t blk) { return w.scales.at(blk); }
  static KHead head(const W& w, size_t blk) {
    const __m128i s = _mm_loadu_si128((const __m128i*)w.scales.at(blk));
    const __m128i m4 = _mm_set1_epi8(0xF);
    return KHead{widen16(_mm_and_si128(s, m4)), widen16(_mm_and_si128(_mm_srli_epi16(s, 4), m4)), lp_h2f(w.d[blk]),
                  lp_h2f(w.dmin[blk])};
  }
  static __m256i q32(const W& w, size_t blk, int g) {  // G = g / 4, s = g % 4
    return bits_at(load32(w.qs.at(blk) + 32 * (g / 4)), 2 * (g % 4), 2, 0);
  }
#if LP_CPU_ISA >= 2
  static __m512i q64(const W& w, size_t blk, int g) {  // G = g / 2, s = 2 (g % 2) and the next
    const int s = 2 * (g % 2);
    return _mm512_and_si512(shift_halves(halves(w.qs.at(blk) + 32 * (g / 2)), 2 * s, 2 * s + 2), _mm512_set1_epi8(3));
  }
#endif
  static void row(const W& w, int row, UnpackedB& u) { unpack_b_row<Unpack>(w, row, u); }
};

template <> struct Unpack<LP_FMT_Q3_K> {
  using W = LpWeight<LP_FMT_Q3_K, LP_BLOCKS>;
  static constexpr int KIND = UNPACK_B;
  static constexpr bool MIN = W::MIN;
  static const void* first(const W& w, size_t blk) { return w.hmask.at(blk); }
  static KHead head(const W& w, size_t blk) {
    alignas(32) int16_t sc[16];
    for (int j = 0; j < 16; ++j) sc[j] = (int16_t)lp_q3k_scale(LpScaleBytes{w.scales.at(blk)}, j);
    const __m256i s = load32(sc);
    const float d = lp_h2f(w.d[blk]);
    return KHead{s, _mm256_slli_epi16(s, 2), d, d};
  }
  static __m256i q32(const W& w, size_t blk, int g) {  // G = g / 4, s = g % 4; the mask bit g
    const __m256i low = bits_at(load32(w.qs.at(blk) + 32 * (g / 4)), 2 * (g % 4), 2, 0);
    return _mm256_or_si256(low, bits_at(load32(w.hmask.at(blk)), g, 1, 2));
  }
#if LP_CPU_ISA >= 2
  static __m512i q64(const W& w, size_t blk, int g) {
    const int s = 2 * (g % 2);
    const __m512i low = _mm512_and_si512(shift_halves(halves(w.qs.at(blk) + 32 * (g / 2)), 2 * s, 2 * s + 2), _mm512_set1_epi8(3));
    return _mm512_mask_add_epi8(low, bit_mask(halves(w.hmask.at(blk)), 2 * g, 2 * g + 1), low, _mm512_set1_epi8(4));
  }
#endif
  static void row(const W& w, int row, UnpackedB& u) { unpack_b_row<Unpack>(w, row, u); }
};

template <int F> struct UnpackK45 {
  using W = LpWeightK45<F, LP_BLOCKS>;
  static constexpr int KIND = UNPACK_B;
  static constexpr bool Q5 = W::Q5, MIN = W::MIN;
  static const void* first(const W& w, size_t blk) { return w.d.at(blk); }
  // the 6-bit scales and mins of lp_k_scale_min, four bytes at a time: scales 0..3 and mins 0..3 are the
  // low 6 bits of bytes 0..3 and 4..7; scales 4..7 (mins 4..7) the low (high) nibbles of bytes 8..11
  // with the top 2 bits of bytes 0..3 (4..7) above them
  static KHead head(const W& w, size_t blk) {
    uint32_t t[3];
    __builtin_memcpy(t, w.scales.at(blk), 12);
    const uint32_t six = 0x3f3f3f3f, four = 0x0f0f0f0f, two = 0x03030303;
    const __m128i v = _mm_setr_epi32((int)(t[0] & six), (int)((t[2] & four) | (t[0] >> 6 & two) << 4), (int)(t[1] & six),
                                     (int)((t[2] >> 4 & four) | (t[1] >> 6 & two) << 4));
    // each 32 values' scale and min for both of its 16-value sub-blocks
    return KHead{widen16(_mm_unpacklo_epi8(v, v)), widen16(_mm_unpackhi_epi8(v, v)), lp_h2f(w.d[blk]),
                  lp_h2f(w.dmin[blk])};
  }
  static __m256i q32(const W& w, size_t blk, int g) {  // nibble g % 2 of qs[32 (g / 2) + i]; Q5_K: bit g of qh[i]
    const __m256i v = bits_at(load32(w.qs.at(blk) + 32 * (g / 2)), 4 * (g % 2), 4, 0);
    return Q5 ? _mm256_or_si256(v, bits_at(load32(w.qh.at(blk)), g, 1, 4)) : v;
  }
#if LP_CPU_ISA >= 2
  static __m512i q64(const W& w, size_t blk, int g) {  // both nibbles of qs[32g + i]; Q5_K: bits 2g, 2g + 1
    const __m512i v = _mm512_and_si512(shift_halves(halves(w.qs.at(blk) + 32 * g), 0, 4), _mm512_set1_epi8(0xF));
    if constexpr (!Q5) return v;
    return _mm512_mask_add_epi8(v, bit_mask(halves(w.qh.at(blk)), 2 * g, 2 * g + 1), v, _mm512_set1_epi8(0x10));
  }
#endif
  static void row(const W& w, int row, UnpackedB& u) { unpack_b_row<UnpackK45>(w, row, u); }
};
template <> struct Unpack<LP_FMT_Q4_K> : UnpackK45<LP_FMT_Q4_K> {};
template <> struct Unpack<LP_FMT_Q5_K> : UnpackK45<LP_FMT_Q5_K> {};

template <> struct Unpack<LP_FMT_Q6_K> {
  using W = LpWeight<LP_FMT_Q6_K, LP_BLOCKS>;
  static constexpr int KIND = UNPACK_B;
  static constexpr bool MIN = W::MIN;
  static const void* first(const W& w, size_t blk) { return w.ql.at(blk); }
  static KHead head(const W& w, size_t blk) {
    const __m256i s = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)w.scales.at(blk)));
    const float d = lp_h2f(w.d[blk]);
    return KHead{s, _mm256_slli_epi16(s, 5), d, d};
  }
  static __m256i q32(const W& w, size_t blk, int g) {  // G = g / 4, s = g % 4
    const int G = g / 4, s = g % 4;
    const __m256i low = bits_at(load32(w.ql.at(blk) + 64 * G + 32 * (s % 2)), 4 * (s / 2), 4, 0);
    return _mm256_or_si256(low, bits_at(load32(w.qh.at(blk) + 32 * G), 2 * s, 2, 4));
  }
#if LP_CPU_ISA >= 2
  static __m512i q64(const W& w, size_t blk, int g) {  // G = g / 2, nibble h = g % 2; qh bits 2s, s = 2h and 2h + 1
    const int G = g / 2, h = g % 2;
    const __m512i ql = _mm512_loadu_si512(w.ql.at(blk) + 64 * G);
    const __m512i low = _mm512_and_si512(h ? _mm512_srli_epi16(ql, 4) : ql, _mm512_set1_epi8(0xF));
    const __m512i qh = halves(w.qh.at(blk) + 32 * G);  // bits 2s .. 2s + 1 to bits 4 .. 5
    const __m512i top = h ? shift_halves(qh, 0, 2)
                          : _mm512_sllv_epi16(qh, _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1));
    return _mm512_or_si512(low, _mm512_and_si512(top, _mm512_set1_epi8(0x30)));
  }
#endif
  static void row(const W& w, int row, UnpackedB& u) { unpack_b_row<Unpack>(w, row, u); }
};

}  // namespace lp_cpu
#endif
