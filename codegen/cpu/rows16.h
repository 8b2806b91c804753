// rows16.h: Q4_K and Q6_K projections held in 16-row records (layout "rows16", core/layouts.py makes
// it once at load from the file's blocks), the engine matmul.h runs for them (Q8_0's, Q4_0's and Q5_0's
// records and engine: rows16_q8.h, on this header's vectors).
//
// Why a relayout: read in place, a K-quant super-block's scales are unpacked for every weight row, and
// each 16 values go through vpmaddubsw plus a scaled vpdpwssd, then a float epilogue per row (matmul.h
// engine B). Here 16 rows sit side by side, 4 bytes of each per 64-byte vector, so one vpdpbusd takes 4
// values of 16 rows against 4 activations broadcast, each int32 lane one row's sum: the lanes are the
// rows, nothing is summed across lanes, the scales are plain bytes, and the float epilogue serves 16
// rows at once. A task's rows are one contiguous stream. A record holds the same bytes as the 16 rows'
// blocks (Q6_K) or 64 more (Q4_K: its mins as int16 pairs).
//
// A record: super-block sb of rows 16G .. 16G + 15 (rows past the weight's end are zero), records in
// order (G, sb). Values come in 64-value groups g, each 4-byte chunk t (t < 8) of a row's vector
// holding values 64g + 4t .. + 3 in its low nibbles and 64g + 32 + 4t .. + 3 in its high ones:
//   Q4_K (K4, 2368 bytes)                          Q6_K (K6, 3360 bytes)
//   d    f16[16]          super-block scales        d   f16[16]
//   dmin f16[16]          and mins' scales          sc  i8[16][16]         16-value sub-block scales
//   sc   u8[8][16]        32-value sub-block scales then for G < 2: (ql(2G, t), qh(G, t)) for t < 8, then
//   m    u8[4][16][2]     mins, sub-blocks 2i, 2i+1   ql(2G + 1, t) for t < 8: vectors [16][4] (row, byte);
//   qs   u8[4][8][16][4]  (g, t, row, byte)           ql(g, t) the low 4 bits, qh(G, t) bits 4..5 of values
//                                                     128G + 32i + 4t + b at bits 2i
// (scales and mins as common.cuh lp_k_scale_min / quant.cuh's Q6_K unpack them, by sub-block then row).
// A row's result, for every path: per super-block exact integers, then its float steps, in order:
//   Q4_K: isum = sum_j sc_j (u_j . x_j), msum = sum_j m_j (sum x_j);
//         acc = fma(float(isum), d dk, acc), acc = fma(-float(msum), dmin dk, acc)
//   Q6_K: isum = sum_j sc_j (u_j . x_j - 32 sum x_j);  acc = fma(float(isum), d dk, acc)
// The integers do not depend on how they are summed, so the scalar, avx2 and avx512 paths give the
// same bits, and a row's result never depends on the rows beside it, the tile or the thread.
#pragma once
#include <cmath>
#include <type_traits>
#include <vector>

#include "pool.h"
#include "quant.cuh"
#include "simd.h"

namespace lp_cpu {

// the records' weight codes (LP_FMT_Q4_K_R16, LP_FMT_Q6_K_R16; rows16_q8.h's), rows and bytes come
// from formats.h
constexpr int R16 = LP_ROWS16;

// The bytes a one-row pass requests ahead of its reads, into L2: with the unpacking between its loads a
// core keeps too few of them in flight for the hardware prefetchers alone (alternated A/B, 2 threads:
// a 255 MB Q6_K head from memory 1.22-1.32x; llama3-8b's whole decode 1.04x and tiny-llama3's, held in
// the last-level cache, 1.06x, medians of 12 and 16 pairs).
// Each line is asked for once: two lines every step, 74 or 105 bytes apart (Q4_K's, Q6_K's), asked
// for most lines twice and streamed slower (alternated pairs on the Intel Xeon VM, 1.2 GB of one
// projection's records from memory, 2 threads: Q4_K 1.020-1.037x, Q6_K 1.006x). Asked that way, Q8_0's
// lighter records had lost with it on the AMD EPYC; once a line, they gain (rows16_q8.h).
constexpr int R16_AHEAD = 8192;
// whether the pass over lanes [L h, L h + L) of CT activation rows asks ahead: decode's, once a record
// (the first half's where a vector holds half a record's rows)
template <class V, int CT> inline bool r16_asks_ahead(int h) { return CT == 1 && (V::LANES == LP_ROWS16 || h == 0); }

// One activation row as the records take it: q8_k values and scales, and its sums per sub-block: as
// int16 pairs of 32-value sums (Q4_K's mins) and as 32 times the 16-value sums (Q6_K's offset); or
// (rows16_q8.h's records) q8_0 values and scales, and the block sums.
struct R16Col {
  const int8_t* x;       // [k]
  const float* dk;       // [k / 256]; q8_0: [k / 32]
  const int32_t* pairs;  // [k / 64]; q8_0: none
  const int32_t* off;    // [k / 16]; q8_0: [k / 32]
};

// those sums of `rows` q8_k rows, from their 16-value sums
inline void r16_sums(const int16_t* bsums, int rows, int k, std::vector<int32_t>& pairs, std::vector<int32_t>& off) {
  pairs.resize((size_t)rows * (k / 64));
  off.resize((size_t)rows * (k / 16));
  for (size_t i = 0; i < pairs.size(); ++i) {
    const int16_t* b = bsums + 4 * i;
    const uint32_t lo = (uint16_t)(int16_t)(b[0] + b[1]), hi = (uint16_t)(int16_t)(b[2] + b[3]);
    pairs[i] = (int32_t)(lo | hi << 16);
  }
  for (size_t i = 0; i < off.size(); ++i) off[i] = 32 * bsums[i];
}

inline float r16_half(const uint8_t* p, int r) { return lp_h2f(((const lp_half*)p)[r]); }

struct K4 {
  static constexpr int BYTES = LpRows16<LP_FMT_Q4_K_R16>::BYTES, SUB = LpFormat<LP_FMT_Q4_K>::SB;
  static constexpr int VALUES = 256, ACT = LP_ACT_Q8_K;  // a record's values of a row; the activations
  static constexpr bool NARROW = true;  // a sub-block's products fit int16 pairs: 8 x 2 x 15 x 128 = 30720
  static constexpr int D = 0, DMIN = 32, SC = 64, M = 192, QS = 320;
  static_assert(QS + 4 * 8 * R16 * 4 == BYTES, "the fields fill the record");
  static void u4(const uint8_t* rec, int r, int v, int (&u)[4]) {  // values v .. v + 3 (v % 4 == 0) of row r
    const int g = v / 64, h = v % 64 / 32, t = v % 32 / 4;
    const uint8_t* p = rec + QS + ((g * 8 + t) * R16 + r) * 4;
    for (int b = 0; b < 4; ++b) u[b] = h ? p[b] >> 4 : p[b] & 15;
  }
  static int32_t term(int32_t s, const uint8_t* rec, int r, int j, const int32_t*) { return s * rec[SC + j * R16 + r]; }
  static float apply(float acc, int32_t isum, const uint8_t* rec, int r, const int32_t* pairs, const int32_t*, float dk) {
    int32_t msum = 0;
    for (int i = 0; i < 4; ++i)
      msum += rec[M + (i * R16 + r) * 2] * (int16_t)(pairs[i] & 0xFFFF) + rec[M + (i * R16 + r) * 2 + 1] * (int16_t)(pairs[i] >> 16);
    acc = std::fma((float)isum, r16_half(rec + D, r) * dk, acc);
    return std::fma(-(float)msum, r16_half(rec + DMIN, r) * dk, acc);
  }
};

struct K6 {
  static constexpr int BYTES = LpRows16<LP_FMT_Q6_K_R16>::BYTES, SUB = LpFormat<LP_FMT_Q6_K>::SB;
  static constexpr int VALUES = 256, ACT = LP_ACT_Q8_K;
  static constexpr bool NARROW = false;  // 4 x 2 x 63 x 128 does not fit int16
  static constexpr int D = 0, SC = 32, Q = 288;
  static_assert(Q + 2 * 1536 == BYTES, "the fields fill the record");
  // the vectors' offsets: per 128 values G, the low bits of group 2G interleaved with the high bits,
  // then group 2G + 1's low bits (a one-row pass reads the record in address order)
  static int ql(int g, int t) { return Q + (g / 2) * 1536 + (g % 2 ? 1024 + 64 * t : 128 * t); }
  static int qh(int G, int t) { return Q + G * 1536 + 128 * t + 64; }
  static void u4(const uint8_t* rec, int r, int v, int (&u)[4]) {
    const int g = v / 64, h = v % 64 / 32, t = v % 32 / 4, i = 2 * (g % 2) + h;
    const uint8_t* lo = rec + ql(g, t) + r * 4;
    const uint8_t* hi = rec + qh(g / 2, t) + r * 4;
    for (int b = 0; b < 4; ++b) u[b] = (h ? lo[b] >> 4 : lo[b] & 15) | (hi[b] >> 2 * i & 3) << 4;
  }
  static int32_t term(int32_t s, const uint8_t* rec, int r, int j, const int32_t* off) {
    return (s - off[j]) * (int8_t)rec[SC + j * R16 + r];
  }
  static float apply(float acc, int32_t isum, const uint8_t* rec, int r, const int32_t*, const int32_t*, float dk) {
    return std::fma((float)isum, r16_half(rec + D, r) * dk, acc);
  }
};

// the record of a weight code (void: not a rows16 code)
template <int F> struct R16Rec { using type = void; };
template <> struct R16Rec<LP_FMT_Q4_K_R16> { using type = K4; };
template <> struct R16Rec<LP_FMT_Q6_K_R16> { using type = K6; };
template <int F> constexpr bool is_r16 = !std::is_void_v<typename R16Rec<F>::type>;

template <class Rec> struct Rows16 {
  const uint8_t* base;
  int nsb;  // records per row (k / Rec::VALUES)
  const uint8_t* rec(int group, int sb) const { return base + ((size_t)group * nsb + sb) * Rec::BYTES; }
};

// Making the records at load (the runtime's relayout; core/layouts.py makes the same bytes in NumPy, the
// reference the tests hold this to): the records of row groups [g0, g1) of a weight's blocks (rows x k,
// as the file holds them) into out, which holds every group's. Bytes are moved, never computed: the
// scales and mins unpacked by common.cuh's lp_k_scale_min, the 6-bit values read by quant.cuh's q6.
inline void r16_copy_half(uint8_t* to, const void* from) { __builtin_memcpy(to, from, 2); }

inline void r16_make(K4, const void* blocks, int rows, int k, int group, int sb, uint8_t* rec) {
  const LpWeight<LP_FMT_Q4_K, LP_BLOCKS> w(blocks, rows, k);
  for (int r = 0; r < R16; ++r) {
    const int row = R16 * group + r;
    if (row >= rows) continue;
    const size_t blk = (size_t)row * w.nb + sb;
    r16_copy_half(rec + K4::D + 2 * r, w.d.at(blk));
    r16_copy_half(rec + K4::DMIN + 2 * r, w.dmin.at(blk));
    for (int j = 0; j < 8; ++j) {
      int sc, mn;
      lp_k_scale_min(LpScaleBytes{w.scales.at(blk)}, j, sc, mn);
      rec[K4::SC + j * R16 + r] = (uint8_t)sc;
      rec[K4::M + ((j / 2) * R16 + r) * 2 + j % 2] = (uint8_t)mn;
    }
    for (int g = 0; g < 4; ++g)
      for (int t = 0; t < 8; ++t) __builtin_memcpy(rec + K4::QS + ((g * 8 + t) * R16 + r) * 4, w.qs.at(blk) + 32 * g + 4 * t, 4);
  }
}

inline void r16_make(K6, const void* blocks, int rows, int k, int group, int sb, uint8_t* rec) {
  const LpWeight<LP_FMT_Q6_K, LP_BLOCKS> w(blocks, rows, k);
  for (int r = 0; r < R16; ++r) {
    const int row = R16 * group + r;
    if (row >= rows) continue;
    const size_t blk = (size_t)row * w.nb + sb;
    r16_copy_half(rec + K6::D + 2 * r, w.d.at(blk));
    for (int j = 0; j < 16; ++j) rec[K6::SC + j * R16 + r] = (uint8_t)w.scales.at(blk)[j];
    uint8_t q[256];  // the 6-bit values
    for (int v = 0; v < 256; ++v) q[v] = (uint8_t)w.q6(blk, v);
    for (int g = 0; g < 4; ++g)
      for (int t = 0; t < 8; ++t)
        for (int b = 0; b < 4; ++b) {
          const int v = 64 * g + 4 * t + b;
          rec[K6::ql(g, t) + r * 4 + b] = (uint8_t)((q[v] & 15) | (q[v + 32] & 15) << 4);
        }
    for (int G = 0; G < 2; ++G)
      for (int t = 0; t < 8; ++t)
        for (int b = 0; b < 4; ++b) {
          uint8_t top = 0;
          for (int i = 0; i < 4; ++i) top |= (uint8_t)((q[128 * G + 32 * i + 4 * t + b] >> 4) << 2 * i);
          rec[K6::qh(G, t) + r * 4 + b] = top;
        }
  }
}

// row groups [g0, g1) (rows past the weight's end zero)
template <class Rec> inline void r16_make_groups(const void* blocks, int rows, int k, int g0, int g1, void* out) {
  const Rows16<Rec> w{(const uint8_t*)out, k / Rec::VALUES};
  lp_parallel(g1 - g0, [&](int i) {
    for (int sb = 0; sb < w.nsb; ++sb) {
      uint8_t* rec = (uint8_t*)w.rec(g0 + i, sb);
      __builtin_memset(rec, 0, Rec::BYTES);
      r16_make(Rec{}, blocks, rows, k, g0 + i, sb, rec);
    }
  });
}

// The scalar path: rows 16G .. 16G + 15 against one activation row.
template <class Rec> inline void r16_scalar(const Rows16<Rec>& w, int group, const R16Col& col, float (&out)[R16]) {
  for (int r = 0; r < R16; ++r) out[r] = 0.0f;
  for (int sb = 0; sb < w.nsb; ++sb) {
    const uint8_t* rec = w.rec(group, sb);
    const int8_t* x = col.x + 256 * sb;
    int32_t isum[R16] = {};
    for (int j = 0; j < 256 / Rec::SUB; ++j) {
      int32_t s[R16] = {};
      for (int v = Rec::SUB * j; v < Rec::SUB * (j + 1); v += 4)
        for (int r = 0; r < R16; ++r) {
          int u[4];
          Rec::u4(rec, r, v, u);
          s[r] += u[0] * x[v] + u[1] * x[v + 1] + u[2] * x[v + 2] + u[3] * x[v + 3];
        }
      for (int r = 0; r < R16; ++r) isum[r] += Rec::term(s[r], rec, r, j, col.off + 16 * sb);
    }
    for (int r = 0; r < R16; ++r) out[r] = Rec::apply(out[r], isum[r], rec, r, col.pairs + 4 * sb, col.off + 16 * sb, col.dk[sb]);
  }
}

#if LP_CPU_ISA >= 1
// The SIMD engines, over a vector of LANES rows (V512: a record's 16; V256: its half `h`, 8 rows).
// Within a sub-block the products go to an int32 sum per row (vpdpbusd; avx2: vpmaddubsw then vpmaddwd
// by 1, or for NARROW records int16 pairs summed by vpmaddwd at the sub-block's end).
#if LP_CPU_ISA >= 2
struct V512 {
  static constexpr int LANES = 16;
  using I = __m512i;
  using F = __m512;
  static I zero() { return _mm512_setzero_si512(); }
  static I load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static I bytes(int v) { return _mm512_set1_epi8((char)v); }
  static I and_(I a, I b) { return _mm512_and_si512(a, b); }
  static I or_(I a, I b) { return _mm512_or_si512(a, b); }
  static I shl16(I v, int n) { return _mm512_slli_epi16(v, n); }
  static I shr16(I v, int n) { return _mm512_srli_epi16(v, n); }
  template <bool NARROW> static I dot(I s, I u, const int8_t* x) {
    return _mm512_dpbusd_epi32(s, u, _mm512_set1_epi32(lp_ld<int32_t>(x)));
  }
  template <bool NARROW> static I total(I s) { return s; }
  static I scales(const uint8_t* p, bool sign) {
    const __m128i b = _mm_loadu_si128((const __m128i*)p);
    return sign ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b);
  }
  static I mul(I a, I b) { return _mm512_mullo_epi32(a, b); }
  static I add(I a, I b) { return _mm512_add_epi32(a, b); }
  static I sub(I a, int32_t b) { return _mm512_sub_epi32(a, _mm512_set1_epi32(b)); }
  static I mins(I acc, const uint8_t* p, int32_t pair) {
    return _mm512_dpwssd_epi32(acc, _mm512_cvtepu8_epi16(load32(p)), _mm512_set1_epi32(pair));
  }
  static F halves(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
  static F fzero() { return _mm512_setzero_ps(); }
  static F fma(F acc, I n, F d, float dk) { return _mm512_fmadd_ps(_mm512_cvtepi32_ps(n), _mm512_mul_ps(d, _mm512_set1_ps(dk)), acc); }
  static F fnma(F acc, I n, F d, float dk) { return _mm512_fnmadd_ps(_mm512_cvtepi32_ps(n), _mm512_mul_ps(d, _mm512_set1_ps(dk)), acc); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
};
#endif
struct V256 {
  static constexpr int LANES = 8;
  using I = __m256i;
  using F = __m256;
  static I zero() { return _mm256_setzero_si256(); }
  static I load(const uint8_t* p) { return load32(p); }
  static I bytes(int v) { return _mm256_set1_epi8((char)v); }
  static I and_(I a, I b) { return _mm256_and_si256(a, b); }
  static I or_(I a, I b) { return _mm256_or_si256(a, b); }
  static I shl16(I v, int n) { return _mm256_slli_epi16(v, n); }
  static I shr16(I v, int n) { return _mm256_srli_epi16(v, n); }
  template <bool NARROW> static I dot(I s, I u, const int8_t* x) {
    const I p = _mm256_maddubs_epi16(u, _mm256_set1_epi32(lp_ld<int32_t>(x)));
    return NARROW ? _mm256_add_epi16(s, p) : _mm256_add_epi32(s, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
  }
  template <bool NARROW> static I total(I s) { return NARROW ? _mm256_madd_epi16(s, _mm256_set1_epi16(1)) : s; }
  static I scales(const uint8_t* p, bool sign) {
    const __m128i b = _mm_loadl_epi64((const __m128i*)p);
    return sign ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
  }
  static I mul(I a, I b) { return _mm256_mullo_epi32(a, b); }
  static I add(I a, I b) { return _mm256_add_epi32(a, b); }
  static I sub(I a, int32_t b) { return _mm256_sub_epi32(a, _mm256_set1_epi32(b)); }
  static I mins(I acc, const uint8_t* p, int32_t pair) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)p)),
                                                    _mm256_set1_epi32(pair)));
  }
  static F halves(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
  static F fzero() { return _mm256_setzero_ps(); }
  static F fma(F acc, I n, F d, float dk) { return _mm256_fmadd_ps(_mm256_cvtepi32_ps(n), _mm256_mul_ps(d, _mm256_set1_ps(dk)), acc); }
  static F fnma(F acc, I n, F d, float dk) { return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(n), _mm256_mul_ps(d, _mm256_set1_ps(dk)), acc); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
};

// The records' vector steps, for lanes [L h, L h + L): values (u0: 64g + 4t + b, u1: 32 on), a
// sub-block's integer term, and a super-block's float steps.
template <class V> struct K4V {
  using I = typename V::I;
  using F = typename V::F;
  static void values(const uint8_t* rec, int g, int t, int h, I& u0, I& u1) {
    const I v = V::load(rec + K4::QS + (g * 8 + t) * 64 + 4 * V::LANES * h);
    u0 = V::and_(v, V::bytes(0x0F)), u1 = V::and_(V::shr16(v, 4), V::bytes(0x0F));
  }
  static I term(I s, const uint8_t* rec, int h, int j, const int32_t*) {
    return V::mul(s, V::scales(rec + K4::SC + j * R16 + V::LANES * h, false));
  }
  static F apply(F acc, I isum, const uint8_t* rec, int h, const int32_t* pairs, const int32_t*, float dk) {
    I msum = V::zero();
    for (int i = 0; i < 4; ++i) msum = V::mins(msum, rec + K4::M + i * 2 * R16 + 2 * V::LANES * h, pairs[i]);
    acc = V::fma(acc, isum, V::halves(rec + K4::D + 2 * V::LANES * h), dk);
    return V::fnma(acc, msum, V::halves(rec + K4::DMIN + 2 * V::LANES * h), dk);
  }
};
template <class V> struct K6V {
  using I = typename V::I;
  using F = typename V::F;
  static I top(I hb, int i) {  // bits 2i, 2i + 1 of each byte at bits 4, 5
    const I m = V::bytes(0x30);
    return i == 0 ? V::and_(V::shl16(hb, 4), m) : i == 1 ? V::and_(V::shl16(hb, 2), m) : i == 2 ? V::and_(hb, m) : V::and_(V::shr16(hb, 2), m);
  }
  static void values(const uint8_t* rec, int g, int t, int h, I& u0, I& u1) {
    const I v = V::load(rec + K6::ql(g, t) + 4 * V::LANES * h);
    const I hb = V::load(rec + K6::qh(g / 2, t) + 4 * V::LANES * h);
    u0 = V::or_(V::and_(v, V::bytes(0x0F)), top(hb, 2 * (g % 2)));
    u1 = V::or_(V::and_(V::shr16(v, 4), V::bytes(0x0F)), top(hb, 2 * (g % 2) + 1));
  }
  static I term(I s, const uint8_t* rec, int h, int j, const int32_t* off) {
    return V::mul(V::sub(s, off[j]), V::scales(rec + K6::SC + j * R16 + V::LANES * h, true));
  }
  static F apply(F acc, I isum, const uint8_t* rec, int h, const int32_t*, const int32_t*, float dk) {
    return V::fma(acc, isum, V::halves(rec + K6::D + 2 * V::LANES * h), dk);
  }
};
template <class V, class Rec> struct RecV;
template <class V> struct RecV<V, K4> : K4V<V> {};
template <class V> struct RecV<V, K6> : K6V<V> {};

// Lanes [L h, L h + L) of record group `group` against CT activation rows. A record's vectors are read in
// address order, one stream the hardware prefetchers follow (decode reading the four 64-value groups
// interleaved streamed 1.7x slower from memory), each sub-block's products in P independent sums
// (decode's one row needs more of them than its few products hide), added as integers.
template <class V, class Rec, int CT, int P>
inline void r16_tile(const Rows16<Rec>& w, int group, int h, const R16Col (&col)[CT], float (&out)[CT][V::LANES]) {
  using RV = RecV<V, Rec>;
  constexpr int PER = 32 / Rec::SUB, CHUNKS = Rec::SUB / 4;  // sub-blocks per 32 values, chunks per sub-block
  // the 64-value groups one pass of the loop takes: decode's four on 512-bit vectors (its offsets,
  // prefetches and the h == 0 test then fixed in straight code: 1.2 GB of one projection's records from
  // memory, alternated pairs, 2 threads, Q4_K 1.010-1.015x, Q6_K 1.049-1.062x), else one (more rows: four
  // of the wider pass in one ran 0.6-0.8x; avx2's two half-record passes: Q4_K 0.87x)
  constexpr int GU = CT == 1 && V::LANES == R16 ? 4 : 1;
  typename V::F acc[CT];
  for (int c = 0; c < CT; ++c) acc[c] = V::fzero();
  for (int sb = 0; sb < w.nsb; ++sb) {
    const uint8_t* rec = w.rec(group, sb);
    typename V::I isum[CT];
    for (int c = 0; c < CT; ++c) isum[c] = V::zero();
    for (int g0 = 0; g0 < 4; g0 += GU)
#pragma GCC unroll 4
      for (int g = g0; g < g0 + GU; ++g)
        for (int q = 0; q < PER; ++q) {
          typename V::I s[CT][2][P];
          for (int c = 0; c < CT; ++c)
            for (int p = 0; p < P; ++p) s[c][0][p] = s[c][1][p] = V::zero();
#pragma unroll
          for (int t = CHUNKS * q; t < CHUNKS * (q + 1); ++t) {
            typename V::I u0, u1;
            if (r16_asks_ahead<V, CT>(h)) {  // each line of the record R16_AHEAD on once over its 32 steps
              static_assert(Rec::BYTES <= 64 * 64, "two lines a step cover the record");
              const int line = g * 8 + t;
              const char* ahead = (const char*)rec + R16_AHEAD + 64 * line;
              _mm_prefetch(ahead, _MM_HINT_T1);
              if (64 * (line + 32) < Rec::BYTES) _mm_prefetch(ahead + 64 * 32, _MM_HINT_T1);
            }
            RV::values(rec, g, t, h, u0, u1);
            for (int c = 0; c < CT; ++c) {
              const int8_t* x = col[c].x + 256 * sb + 64 * g + 4 * t;
              s[c][0][t % P] = V::template dot<Rec::NARROW>(s[c][0][t % P], u0, x);
              s[c][1][t % P] = V::template dot<Rec::NARROW>(s[c][1][t % P], u1, x + 32);
            }
          }
          for (int half = 0; half < 2; ++half) {
            const int j = (64 * g + 32 * half) / Rec::SUB + q;  // the sub-block
            for (int c = 0; c < CT; ++c) {
              typename V::I sum = V::template total<Rec::NARROW>(s[c][half][0]);
              for (int p = 1; p < P; ++p) sum = V::add(sum, V::template total<Rec::NARROW>(s[c][half][p]));
              isum[c] = V::add(isum[c], RV::term(sum, rec, h, j, col[c].off + 16 * sb));
            }
          }
        }
    for (int c = 0; c < CT; ++c)
      acc[c] = RV::apply(acc[c], isum[c], rec, h, col[c].pairs + 4 * sb, col[c].off + 16 * sb, col[c].dk[sb]);
  }
  for (int c = 0; c < CT; ++c) V::store(out[c], acc[c]);
}
#endif

}  // namespace lp_cpu
