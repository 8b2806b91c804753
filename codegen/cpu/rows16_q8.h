// rows16_q8.h: Q8_0, Q4_0 and Q5_0 projections held in 16-row records (layout "rows16", core/layouts.py
// makes it once at load from the file's blocks), the engine matmul.h runs for them against q8_0
// activations.
//
// Why: read in place (matmul.h engine A) a one-row pass over Q8_0 reads 4 rows side by side, two blocks
// a vector, and sums each row's lanes at its end; from memory it ran at 8.2 GB/s a core where a plain
// stream reads 19, its compute and its loads not overlapping (the records: 20.7 GB/s; Q5_0 and Q4_0 2x
// as well, docs/benchmarks.md 2026-12-03 15:24). Here, as rows16.h does for the K-quants,
// 16 rows sit side by side, 4 bytes of each per 64-byte vector, so one vpdpbusd takes 4 values of 16
// rows against 4 activations broadcast, each int32 lane one row's sum, and the float step serves 16 rows
// at once; a task's rows are one contiguous stream.
//
// A record: 32-value block b of rows 16G .. 16G + 15 (rows past the weight's end as zero blocks), in order
// (G, b), the same bytes as the 16 rows' blocks. Every value is held unsigned, u = q + BIAS, the operand
// vpdpbusd (and TDPBSUD) takes unsigned, so the 512-bit engine and AMX take them as they are; the bias
// comes off as BIAS times the activation block's sum (exact, per activation row and block, once per
// launch). Vector (t, half) holds values 16 half + 4t .. + 3 of each row (t < 4):
//   Q8 (Q8_0, 544 bytes, BIAS 128)          Q4 (Q4_0, 288, BIAS 8)      Q5 (Q5_0, 352, BIAS 16)
//   d   f16[16]                             d   f16[16]                 d   f16[16]
//   qs  u8[4][2][16][4] (t, half, row, byte) qs  u8[4][16][4]           qs  as Q4's
//                                           (t, row, byte): the row's   qh  u8[16][4] (row, byte): bit
//                                           qs bytes 4t .. 4t + 3, half  4 half + t the high bit of
//                                           0 the low nibbles, 1 the    value 16 half + 4t + byte
//                                           high ones
// avx2 takes Q8's values back signed (xor 0x80) through the sign trick, as engine A does for Q8_0 (a
// pair of 4- and 5-bit values' products fits vpmaddubsw's int16 as they are).
// A row's result, for every path: per block b an exact integer isum_b = q_b . x_b, then one float step
// per block in block order: acc = fma(float(isum_b), d_b dx_b, acc). The integers do not depend on how
// they are summed, so the scalar, avx2, avx512 and amx paths give the same bits, and a row's result
// never depends on the rows beside it, the tile or the thread.
#pragma once
#include <cmath>
#include <vector>

#include "rows16.h"
#include "tiles.h"

namespace lp_cpu {

template <int F, int B> struct B32 {  // what the three records share
  static constexpr int BYTES = LpRows16<F>::BYTES, VALUES = 32, ACT = LP_ACT_Q8_0, BIAS = B;
  static constexpr int D = 0, QS = 32;
};
struct Q8 : B32<LP_FMT_Q8_0_R16, 128> {
  static_assert(QS + 512 == BYTES, "the fields fill the record");
  static int u(const uint8_t* rec, int r, int v) { return rec[QS + ((v % 16 / 4 * 2 + v / 16) * R16 + r) * 4 + v % 4]; }
};
struct Q4 : B32<LP_FMT_Q4_0_R16, 8> {
  static_assert(QS + 256 == BYTES, "the fields fill the record");
  static int u(const uint8_t* rec, int r, int v) {
    const uint8_t b = rec[QS + (v % 16 / 4 * R16 + r) * 4 + v % 4];
    return v < 16 ? b & 15 : b >> 4;
  }
};
struct Q5 : B32<LP_FMT_Q5_0_R16, 16> {
  static constexpr int QH = QS + 256;
  static_assert(QH + 64 == BYTES, "the fields fill the record");
  static int u(const uint8_t* rec, int r, int v) {
    return Q4::u(rec, r, v) | (rec[QH + r * 4 + v % 4] >> (v / 16 * 4 + v % 16 / 4) & 1) << 4;
  }
};
template <> struct R16Rec<LP_FMT_Q8_0_R16> { using type = Q8; };
template <> struct R16Rec<LP_FMT_Q4_0_R16> { using type = Q4; };
template <> struct R16Rec<LP_FMT_Q5_0_R16> { using type = Q5; };
template <class Rec> constexpr bool is_b32 = Rec::VALUES == 32;

// each q8_0 block's sum of `rows` rows (R16Col::off; the bias off is BIAS times it)
inline void r16q8_sums(const int8_t* qs, int rows, int k, std::vector<int32_t>& off) {
  off.resize((size_t)rows * (k / 32));
  for (size_t b = 0; b < off.size(); ++b) {
    int32_t s = 0;
    for (int i = 0; i < 32; ++i) s += qs[32 * b + i];
    off[b] = s;
  }
}

// the records at load (rows16.h r16_make_groups): bytes moved; Q8's sign bits flipped, Q5's high bits
// regrouped
inline void r16_make(Q8, const void* blocks, int rows, int k, int group, int b, uint8_t* rec) {
  const LpWeight<LP_FMT_Q8_0, LP_BLOCKS> w(blocks, rows, k);
  for (int r = 0; r < R16; ++r) {
    const int row = R16 * group + r;
    const int8_t* q = row < rows ? w.qs.at((size_t)row * w.nb + b) : nullptr;
    if (q) r16_copy_half(rec + Q8::D + 2 * r, w.d.at((size_t)row * w.nb + b));
    for (int v = 0; v < 32; ++v)
      rec[Q8::QS + ((v % 16 / 4 * 2 + v / 16) * R16 + r) * 4 + v % 4] = (uint8_t)((q ? q[v] : 0) ^ 0x80);
  }
}
template <class Rec, int F> inline void r16_make_nibbles(const void* blocks, int rows, int k, int group, int b, uint8_t* rec) {
  const LpWeight<F, LP_BLOCKS> w(blocks, rows, k);
  for (int r = 0; r < R16; ++r) {
    const int row = R16 * group + r;
    if (row >= rows) continue;
    const size_t blk = (size_t)row * w.nb + b;
    r16_copy_half(rec + Rec::D + 2 * r, w.d.at(blk));
    for (int t = 0; t < 4; ++t) __builtin_memcpy(rec + Rec::QS + (t * R16 + r) * 4, w.qs.at(blk) + 4 * t, 4);
    if constexpr (F == LP_FMT_Q5_0) {
      const uint32_t qh = w.qh[blk];
      for (int byte = 0; byte < 4; ++byte) {
        uint8_t top = 0;
        for (int i = 0; i < 8; ++i) top |= (uint8_t)((qh >> (16 * (i / 4) + 4 * (i % 4) + byte) & 1) << i);
        rec[Q5::QH + r * 4 + byte] = top;
      }
    }
  }
}
inline void r16_make(Q4, const void* blocks, int rows, int k, int group, int b, uint8_t* rec) {
  r16_make_nibbles<Q4, LP_FMT_Q4_0>(blocks, rows, k, group, b, rec);
}
inline void r16_make(Q5, const void* blocks, int rows, int k, int group, int b, uint8_t* rec) {
  r16_make_nibbles<Q5, LP_FMT_Q5_0>(blocks, rows, k, group, b, rec);
}

// The scalar path: rows 16G .. 16G + 15 against one activation row.
template <class Rec> inline void r16_b32_scalar(const Rows16<Rec>& w, int group, const R16Col& col, float (&out)[R16]) {
  for (int r = 0; r < R16; ++r) out[r] = 0.0f;
  for (int b = 0; b < w.nsb; ++b) {
    const uint8_t* rec = w.rec(group, b);
    const int8_t* x = col.x + 32 * b;
    for (int r = 0; r < R16; ++r) {
      int32_t isum = 0;
      for (int v = 0; v < 32; ++v) isum += (Rec::u(rec, r, v) - Rec::BIAS) * x[v];
      out[r] = std::fma((float)isum, r16_half(rec + Rec::D, r) * col.dk[b], out[r]);
    }
  }
}

#if LP_CPU_ISA >= 1
// A record's vectors (t, half) for lanes [L h, L h + L), as unsigned bytes
template <class V, class Rec> struct B32V;
template <class V> struct B32V<V, Q8> {
  static void values(const uint8_t* rec, int t, int h, typename V::I& u0, typename V::I& u1) {
    u0 = V::load(rec + Q8::QS + 128 * t + 4 * V::LANES * h);
    u1 = V::load(rec + Q8::QS + 128 * t + 64 + 4 * V::LANES * h);
  }
};
template <class V> struct B32V<V, Q4> {
  static void values(const uint8_t* rec, int t, int h, typename V::I& u0, typename V::I& u1) {
    const typename V::I v = V::load(rec + Q4::QS + 64 * t + 4 * V::LANES * h);
    u0 = V::and_(v, V::bytes(0x0F)), u1 = V::and_(V::shr16(v, 4), V::bytes(0x0F));
  }
};
template <class V> struct B32V<V, Q5> {
  static void values(const uint8_t* rec, int t, int h, typename V::I& u0, typename V::I& u1) {
    B32V<V, Q4>::values(rec, t, h, u0, u1);
    const typename V::I hb = V::load(rec + Q5::QH + 4 * V::LANES * h), m = V::bytes(0x10);
    u0 = V::or_(u0, V::and_(V::shl16(hb, 4 - t), m)), u1 = V::or_(u1, V::and_(V::shr16(hb, t), m));
  }
};

// A vector's products into int32 row sums, and the bias off a block's sum: the unsigned values straight
// into vpdpbusd (256-bit: vpmaddubsw, then vpmaddwd by 1); on avx2 Q8's back signed through the sign
// trick (activations are in [-127, 127]), no bias to take off.
template <class V, class Rec> struct B32Dot {
  static typename V::I dot(typename V::I s, typename V::I u, const int8_t* x) { return V::template dot<false>(s, u, x); }
  static typename V::I unbias(typename V::I s, int32_t sum) { return V::sub(s, Rec::BIAS * sum); }
};
template <> struct B32Dot<V256, Q8> {
  static __m256i dot(__m256i s, __m256i u, const int8_t* x) {
    const __m256i w = _mm256_xor_si256(u, _mm256_set1_epi8((char)0x80));
    const __m256i xs = _mm256_sign_epi8(_mm256_set1_epi32(lp_ld<int32_t>(x)), w);
    return _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), xs), _mm256_set1_epi16(1)));
  }
  static __m256i unbias(__m256i s, int32_t) { return s; }
};

// Lanes [L h, L h + L) of record group `group` against CT activation rows, a block's 8 vectors read in
// address order into P independent sums (decode's one row needs more than its few products hide),
// added as integers. Decode's one row asks for each record's lines R16_AHEAD ahead, as rows16.h's pass
// does (alternated pairs on the Intel Xeon VM, 2 threads, from memory: gemma3-270m's 262144-row Q8_0
// head 1.14x, Q5_0 and Q4_0 at n 131072, k 2048 1.43x and 1.41x; gemma3-270m's decode step 1.26x).
template <class V, class Rec, int CT, int P>
inline void r16_b32_tile(const Rows16<Rec>& w, int group, int h, const R16Col (&col)[CT], float (&out)[CT][V::LANES]) {
  using Dot = B32Dot<V, Rec>;
  typename V::F acc[CT];
  for (int c = 0; c < CT; ++c) acc[c] = V::fzero();
  for (int b = 0; b < w.nsb; ++b) {
    const uint8_t* rec = w.rec(group, b);
    if (r16_asks_ahead<V, CT>(h))  // the record R16_AHEAD on, line by line (a line two records share: twice)
      for (int l = 0; 64 * l < Rec::BYTES; ++l) _mm_prefetch((const char*)rec + R16_AHEAD + 64 * l, _MM_HINT_T1);
    typename V::I s[CT][P];
    for (int c = 0; c < CT; ++c)
      for (int p = 0; p < P; ++p) s[c][p] = V::zero();
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      typename V::I u0, u1;
      B32V<V, Rec>::values(rec, t, h, u0, u1);
      for (int c = 0; c < CT; ++c) {
        const int8_t* x = col[c].x + 32 * b + 4 * t;
        s[c][2 * t % P] = Dot::dot(s[c][2 * t % P], u0, x);
        s[c][(2 * t + 1) % P] = Dot::dot(s[c][(2 * t + 1) % P], u1, x + 16);
      }
    }
    const typename V::F d = V::halves(rec + Rec::D + 2 * V::LANES * h);
    for (int c = 0; c < CT; ++c) {
      typename V::I sum = s[c][0];
      for (int p = 1; p < P; ++p) sum = V::add(sum, s[c][p]);
      acc[c] = V::fma(acc[c], Dot::unbias(sum, col[c].off[b]), d, col[c].dk[b]);
    }
  }
  for (int c = 0; c < CT; ++c) V::store(out[c], acc[c]);
}
#endif

// The amx path (and its scalar twin, tiles.h) for many activation rows: per record and block of M <= 16
// activation rows, A the rows' q8_0 values of block b (stride k), B the record's unsigned values in
// value order (8 rows of 64 bytes, row i values 4i .. 4i + 3 of the 16 rows: the VNNI order), C = A . B
// (TDPBSUD) M rows of 16 exact int32 sums; then the bias off and the float step, as the other paths.
#if LP_CPU_ISA >= 2
template <class Rec> inline void tile_b32_values(const uint8_t* rec, uint8_t (&b)[8][64]) {
  for (int t = 0; t < 4; ++t) {
    V512::I u0, u1;
    B32V<V512, Rec>::values(rec, t, 0, u0, u1);
    _mm512_store_si512(b[t], u0);
    _mm512_store_si512(b[4 + t], u1);
  }
}
template <class Rec> inline void tile_b32_step(float* acc, const int32_t* c, const uint8_t* rec, int32_t sum, float dx) {
  const __m512i isum = V512::sub(_mm512_loadu_si512(c), Rec::BIAS * sum);
  _mm512_storeu_ps(acc, V512::fma(_mm512_loadu_ps(acc), isum, V512::halves(rec + Rec::D), dx));
}
#else
template <class Rec> inline void tile_b32_values(const uint8_t* rec, uint8_t (&b)[8][64]) {
  for (int i = 0; i < 8; ++i)
    for (int r = 0; r < R16; ++r)
      for (int k = 0; k < 4; ++k) b[i][4 * r + k] = (uint8_t)Rec::u(rec, r, 4 * i + k);
}
template <class Rec> inline void tile_b32_step(float* acc, const int32_t* c, const uint8_t* rec, int32_t sum, float dx) {
  for (int r = 0; r < R16; ++r) acc[r] = std::fma((float)(c[r] - Rec::BIAS * sum), r16_half(rec + Rec::D, r) * dx, acc[r]);
}
#endif

template <class T, class Rec, class Acts, class Out>
inline void r16_b32_tiles(const Rows16<Rec>& w, int r0, int r1, const Acts& a, Out& out) {
  const int rows = a.rows, k = a.k;
  alignas(64) static thread_local uint8_t b[8][64];
  alignas(64) static thread_local int32_t c[TILE_M][R16];
  static thread_local std::vector<float> acc;  // [rows][16]: the group's float sums
  int shaped = 0;
  for (int group = r0 / R16; R16 * group < r1; ++group) {
    acc.assign((size_t)rows * R16, 0.0f);
    for (int blk = 0; blk < w.nsb; ++blk) {
      const uint8_t* rec = w.rec(group, blk);
      tile_b32_values<Rec>(rec, b);
      for (int m0 = 0; m0 < rows; m0 += TILE_M) {
        const int m = lp_min(TILE_M, rows - m0);
        if (m != shaped) T::config(TileShapes(m, 32)), shaped = m;
        T::template zero<0>();
        T::template load<1>(a.qs + (size_t)m0 * k + 32 * blk, k);
        T::template load<2>(b, 64);
        T::template dot<0, 1, 2>();
        T::template store<0>(c, 64);
        for (int i = 0; i < m; ++i) {
          const R16Col col = a.col(m0 + i);
          tile_b32_step<Rec>(&acc[(size_t)(m0 + i) * R16], c[i], rec, col.off[blk], col.dk[blk]);
        }
      }
    }
    for (int i = 0; i < rows; ++i)
      for (int r = 0; r < R16 && R16 * group + r < r1; ++r) out(R16 * group + r, i, acc[(size_t)i * R16 + r]);
  }
  if (shaped) T::release();
}

}  // namespace lp_cpu
