// rows16_q8.h: Q8_0 projections held in 16-row records (layout "rows16", core/layouts.py makes it once
// at load from the file's blocks), the engine matmul.h runs for them against q8_0 activations.
//
// Why: read in place (matmul.h engine A) a one-row pass over Q8_0 reads 4 rows side by side, two blocks
// a vector, and sums each row's lanes at its end; from memory it ran at 8.2 GB/s a core where a plain
// stream reads 19, its compute and its loads not overlapping. Here, as rows16.h does for the K-quants,
// 16 rows sit side by side, 4 bytes of each per 64-byte vector, so one vpdpbusd takes 4 values of 16
// rows against 4 activations broadcast, each int32 lane one row's sum, and the float step serves 16 rows
// at once; a task's rows are one contiguous stream.
//
// A record (Q8, 544 bytes: the same bytes as the 16 rows' blocks): 32-value block b of rows 16G .. 16G +
// 15 (rows past the weight's end have scale 0 and values 0), records in order (G, b):
//   d   f16[16]         the rows' scales
//   qs  u8[8][16][4]    (t, row, byte): value 4t + byte of the row, plus 128
// The values are stored biased to unsigned bytes, vpdpbusd's (and TDPBSUD's) unsigned operand, so the
// 512-bit engine and AMX take them as they are; the bias comes off as 128 times the activation block's
// sum (exact, per activation row and block, once per launch); avx2 takes the values back signed
// (xor 0x80) through the sign trick, as matmul.h's engine A does for Q8_0.
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

struct Q8 {
  static constexpr int BYTES = LpRows16<LP_FMT_Q8_0_R16>::BYTES, VALUES = 32, ACT = LP_ACT_Q8_0;
  static constexpr int D = 0, QS = 32;
  static_assert(QS + 8 * R16 * 4 == BYTES, "the fields fill the record");
  static int value(const uint8_t* rec, int r, int v) { return rec[QS + ((v / 4) * R16 + r) * 4 + v % 4] - 128; }
};
template <> struct R16Rec<LP_FMT_Q8_0_R16> { using type = Q8; };

// 128 times each q8_0 block's sum of `rows` rows (the bias the records' values carry), R16Col::off
inline void r16q8_sums(const int8_t* qs, int rows, int k, std::vector<int32_t>& off) {
  off.resize((size_t)rows * (k / 32));
  for (size_t b = 0; b < off.size(); ++b) {
    int32_t s = 0;
    for (int i = 0; i < 32; ++i) s += qs[32 * b + i];
    off[b] = 128 * s;
  }
}

// the records at load (rows16.h r16_make_groups): bytes moved, the values' sign bit flipped
inline void r16_make(Q8, const void* blocks, int rows, int k, int group, int b, uint8_t* rec) {
  const LpWeight<LP_FMT_Q8_0, LP_BLOCKS> w(blocks, rows, k);
  for (int r = 0; r < R16; ++r) {
    const int row = R16 * group + r;
    const int8_t* q = row < rows ? w.qs.at((size_t)row * w.nb + b) : nullptr;
    if (q) r16_copy_half(rec + Q8::D + 2 * r, w.d.at((size_t)row * w.nb + b));
    for (int v = 0; v < 32; ++v) rec[Q8::QS + ((v / 4) * R16 + r) * 4 + v % 4] = (uint8_t)((q ? q[v] : 0) ^ 0x80);
  }
}

// The scalar path: rows 16G .. 16G + 15 against one activation row.
inline void r16_scalar(const Rows16<Q8>& w, int group, const R16Col& col, float (&out)[R16]) {
  for (int r = 0; r < R16; ++r) out[r] = 0.0f;
  for (int b = 0; b < w.nsb; ++b) {
    const uint8_t* rec = w.rec(group, b);
    const int8_t* x = col.x + 32 * b;
    for (int r = 0; r < R16; ++r) {
      int32_t isum = 0;
      for (int v = 0; v < 32; ++v) isum += Q8::value(rec, r, v) * x[v];
      out[r] = std::fma((float)isum, r16_half(rec + Q8::D, r) * col.dk[b], out[r]);
    }
  }
}

#if LP_CPU_ISA >= 1
// A block's products for lanes [L h, L h + L): 512-bit: the biased values straight into vpdpbusd, the
// bias off at the block's end; 256-bit: the signed values through the sign trick (activations are in
// [-127, 127], so a pair of products fits vpmaddubsw's int16).
template <class V> struct Q8V;
#if LP_CPU_ISA >= 2
template <> struct Q8V<V512> {
  static __m512i dot(__m512i s, __m512i u, const int8_t* x) { return V512::dot<false>(s, u, x); }
  static __m512i unbias(__m512i s, int32_t off) { return V512::sub(s, off); }
};
#endif
template <> struct Q8V<V256> {
  static __m256i dot(__m256i s, __m256i u, const int8_t* x) {
    const __m256i w = _mm256_xor_si256(u, _mm256_set1_epi8((char)0x80));
    const __m256i xs = _mm256_sign_epi8(_mm256_set1_epi32(lp_ld<int32_t>(x)), w);
    return _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), xs), _mm256_set1_epi16(1)));
  }
  static __m256i unbias(__m256i s, int32_t) { return s; }
};

// Lanes [L h, L h + L) of record group `group` against CT activation rows, each block's 8 vectors in P
// independent sums (decode's one row needs more than its few products hide), added as integers.
template <class V, int CT, int P>
inline void r16q8_tile(const Rows16<Q8>& w, int group, int h, const R16Col (&col)[CT], float (&out)[CT][V::LANES]) {
  typename V::F acc[CT];
  for (int c = 0; c < CT; ++c) acc[c] = V::fzero();
  for (int b = 0; b < w.nsb; ++b) {
    const uint8_t* rec = w.rec(group, b);
    typename V::I s[CT][P];
    for (int c = 0; c < CT; ++c)
      for (int p = 0; p < P; ++p) s[c][p] = V::zero();
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      const typename V::I u = V::load(rec + Q8::QS + 64 * t + 4 * V::LANES * h);
      for (int c = 0; c < CT; ++c) s[c][t % P] = Q8V<V>::dot(s[c][t % P], u, col[c].x + 32 * b + 4 * t);
    }
    const typename V::F d = V::halves(rec + Q8::D + 2 * V::LANES * h);
    for (int c = 0; c < CT; ++c) {
      typename V::I sum = s[c][0];
      for (int p = 1; p < P; ++p) sum = V::add(sum, s[c][p]);
      acc[c] = V::fma(acc[c], Q8V<V>::unbias(sum, col[c].off[b]), d, col[c].dk[b]);
    }
  }
  for (int c = 0; c < CT; ++c) V::store(out[c], acc[c]);
}
#endif

// The amx path (and its scalar twin, tiles.h) for many activation rows: per record and block of M <= 16
// activation rows, A the rows' q8_0 values of block b (stride k), B the record's values as they are
// (8 rows of 64 bytes: the VNNI order), C = A . B (TDPBSUD) M rows of 16 exact int32 sums; then the bias
// off and the float step, as the other paths take them.
#if LP_CPU_ISA >= 2
inline void tile_q8_step(float* acc, const int32_t* c, const uint8_t* rec, int32_t off, float dx) {
  const __m512i isum = V512::sub(_mm512_loadu_si512(c), off);
  _mm512_storeu_ps(acc, V512::fma(_mm512_loadu_ps(acc), isum, V512::halves(rec + Q8::D), dx));
}
#else
inline void tile_q8_step(float* acc, const int32_t* c, const uint8_t* rec, int32_t off, float dx) {
  for (int r = 0; r < R16; ++r) acc[r] = std::fma((float)(c[r] - off), r16_half(rec + Q8::D, r) * dx, acc[r]);
}
#endif

template <class T, class Acts, class Out>
inline void r16_tiles(const Rows16<Q8>& w, int r0, int r1, const Acts& a, Out& out) {
  const int rows = a.rows, k = a.k;
  alignas(64) static thread_local int32_t c[TILE_M][R16];
  static thread_local std::vector<float> acc;  // [rows][16]: the group's float sums
  int shaped = 0;
  for (int group = r0 / R16; R16 * group < r1; ++group) {
    acc.assign((size_t)rows * R16, 0.0f);
    for (int b = 0; b < w.nsb; ++b) {
      const uint8_t* rec = w.rec(group, b);
      for (int m0 = 0; m0 < rows; m0 += TILE_M) {
        const int m = lp_min(TILE_M, rows - m0);
        if (m != shaped) T::config(TileShapes(m, 32)), shaped = m;
        T::template zero<0>();
        T::template load<1>(a.qs + (size_t)m0 * k + 32 * b, k);
        T::template load<2>(rec + Q8::QS, 64);
        T::template dot<0, 1, 2>();
        T::template store<0>(c, 64);
        for (int i = 0; i < m; ++i) {
          const R16Col col = a.col(m0 + i);
          tile_q8_step(&acc[(size_t)(m0 + i) * R16], c[i], rec, col.off[b], col.dk[b]);
        }
      }
    }
    for (int i = 0; i < rows; ++i)
      for (int r = 0; r < R16 && R16 * group + r < r1; ++r) out(R16 * group + r, i, acc[(size_t)i * R16 + r]);
  }
  if (shaped) T::release();
}

}  // namespace lp_cpu
