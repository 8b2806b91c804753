// matmul.h: the projections on the CPU (ops matmul, matmul_segmented, matmul_residual; CPU twin
// runtime/numpy_kernels.py matmul) and the row loop the fused tail shares (tail.h).
//
// y[c, j] = x[c] . W[j] for activation rows c < rows and weight rows j < n, as integer dot products of
// the weight's quantized values with the packed 8-bit activations (q8_0 / q8_1 / q8_k, field planes as
// in the arena: common.cuh lp_q8_rows), the per-block scales applied in float; f16 / bf16 / f32
// weights meet f16 / bf16 / f32 activations in float. Weights are read in place: the bytes of the
// mapped GGUF tensor, blocks as GGUF stores them (quant.cuh LpWeight<F, LP_BLOCKS>); but Q4_K, Q6_K,
// Q8_0, Q4_0 and Q5_0, which the runtime relays out once at load into 16-row records (weight codes
// LP_FMT_*_R16 of formats.h; rows16.h, rows16_q8.h: their own engine, the same on every path).
//
// Threads: a launch is split into tasks of `task_rows` consecutive weight rows of one segment (q|k|v,
// gate|up are one launch; rows16 tasks rounded up to whole records); pool.h hands tasks to threads as
// they come free, so each thread streams contiguous stretches of every weight. Each output element is
// computed by one task alone.
//
// Paths (simd.h):
//   scalar: quant.cuh's own dot<C> per piece (the GPU mat-vec's arithmetic, pieces in order), C = 4
//     activation rows per pass over a weight row;
//   amx: avx512's, but rows16 records against many activation rows on AMX int8 tiles (tiles.h);
//   avx2 / avx512: register tiles of RT weight rows x CT activation rows (engines below; 256-bit on
//     avx2, 512-bit integer engines on avx512), activation rows in the outer loop so a tile's
//     activations stay in L1. With more activation rows than one tile holds, a task first unpacks its
//     weight rows into a thread-local scratch (unpack.h: whole-byte values and plain scales, one pass
//     over the weight bytes) that every tile reuses; with fewer (decode), the tiles decode the blocks
//     as they read them, through the same decoders. Both give a tile the same integers and floats.
// In every path an output's operations and their order depend only on its weight row and activation
// row: never on the row count, the tile it falls in, or the thread. A row's result is the same batched
// or alone.
#pragma once
#include <type_traits>
#include <vector>

#include "pool.h"
#include "quant.cuh"
#include "rows16.h"
#include "rows16_q8.h"
#include "simd.h"
#include "tiles.h"
#include "unpack.h"

namespace lp_cpu {

// --- the activation operand ------------------------------------------------------------------------

// Packed activations [rows, k] as the SIMD engines read them: q8 blocks' int8 values, per-block scales
// as float (q8_0 / q8_1 f16 scales widened here once per launch), q8_1's exact block sums times the
// scale (for the weight's min; the buffer's own f16 `s` plane is rounded and not read), q8_k's 16-value
// sums; or plain f16 / bf16 / f32 values.
struct Acts {
  int rows = 0, k = 0;
  const void* base = nullptr;  // plain values: the first row; q8: the packed buffer, `planes` rows, of
  int planes = 0, row0 = 0;    // which these are rows row0 .. row0 + rows - 1 (experts.h: a group's rows)
  const int8_t* qs = nullptr;
  const float* d = nullptr;       // q8_0 / q8_1: [rows, k / 32]; q8_k: [rows, k / 256]
  const float* s = nullptr;       // q8_1: d * (exact sum of the block's values) [rows, k / 32]
  const int16_t* bsums = nullptr; // q8_k: [rows, k / 16]
  std::vector<float> own;         // storage of d and s where they are computed here
  std::vector<int32_t> pairs, off; // the sums rows16 records take (rows16.h r16_sums, rows16_q8.h r16q8_sums), where one is read
  R16Col col(int c) const {
    const int8_t* x = qs + (size_t)c * k;
    if (!bsums) return R16Col{x, d + (size_t)c * (k / 32), nullptr, off.data() + (size_t)c * (k / 32)};  // q8_0
    return R16Col{x, d + (size_t)c * (k / 256), pairs.data() + (size_t)c * (k / 64), off.data() + (size_t)c * (k / 16)};
  }
};

// rows row0 .. row0 + rows - 1 of a packed [planes, k] buffer x
template <int ACT> inline void make_acts(Acts& a, const void* x, int rows, int k, int planes, int row0) {
  a.rows = rows, a.k = k;
  if constexpr (ACT == LP_ACT_Q8_0 || ACT == LP_ACT_Q8_1 || ACT == LP_ACT_Q8_K) {
    a.base = x, a.planes = planes, a.row0 = row0;
    const Q8Rows q = lp_q8_rows((void*)x, planes, k, ACT);
    a.qs = q.qs + (size_t)row0 * k;
    if constexpr (ACT == LP_ACT_Q8_K) {
      a.d = (const float*)q.d + (size_t)row0 * (k / 256);
      a.bsums = q.bsums + (size_t)row0 * (k / 16);
    } else {
      const size_t nb = (size_t)rows * (k / 32);
      const lp_half* d = (const lp_half*)q.d + (size_t)row0 * (k / 32);
      a.own.resize(ACT == LP_ACT_Q8_1 ? 2 * nb : nb);
      for (size_t b = 0; b < nb; ++b) a.own[b] = lp_h2f(d[b]);
      if constexpr (ACT == LP_ACT_Q8_1) {
        for (size_t b = 0; b < nb; ++b) {
          int sum = 0;
          for (int i = 0; i < 32; ++i) sum += a.qs[b * 32 + i];
          a.own[nb + b] = a.own[b] * (float)sum;
        }
        a.s = a.own.data() + nb;
      }
      a.d = a.own.data();
    }
  } else {
    a.base = (const char*)x + (size_t)row0 * k * (ACT == LP_ACT_F32 ? 4 : 2), a.planes = rows;
  }
}

template <int ACT> inline void make_acts(Acts& a, const void* x, int rows, int k) { make_acts<ACT>(a, x, rows, k, rows, 0); }

// bytes of a packed [rows, k] buffer in format FMT (common.cuh lp_q8_rows' planes; plain values)
template <int FMT> inline size_t packed_bytes(int rows, int k) {
  const size_t n = (size_t)rows * k;
  if constexpr (FMT == LP_ACT_Q8_0) return lp_align(n / 32 * 2) + n;
  else if constexpr (FMT == LP_ACT_Q8_1) return 2 * lp_align(n / 32 * 2) + n;
  else if constexpr (FMT == LP_ACT_Q8_K) return lp_align(n / 256 * 4) + lp_align(n) + n / 16 * 2;
  else if constexpr (FMT == LP_ACT_F32) return 4 * n;
  else return 2 * n;
}

// the activation format each weight code takes (rows16 records: their format's)
template <int F> constexpr int act_of() {
  if constexpr (is_r16<F>) return R16Rec<F>::type::ACT;
  else return LpFormat<F>::ACT;
}

// --- the scalar path ----------------------------------------------------------------------------------

constexpr int SCALAR_COLUMNS = 4;

// values i0 .. k - 1 of a float-weight row against activation row `col` (f32, f16 or bf16 values, as the
// weight), in order, one float sum: the whole row for f32 / bf16 weights (quant.cuh has no dot for
// them), the k % 8 values past the last 8-value piece for f16
template <int F>
inline float value_dot(const LpWeight<F, LP_BLOCKS>& w, size_t row, const void* x, int col, int k, int i0) {
  float acc = 0.0f;
  for (int i = i0; i < k; ++i) {
    const size_t at = (size_t)col * k + i;
    float xv;
    if constexpr (F == LP_FMT_F32) xv = ((const float*)x)[at];
    else if constexpr (F == LP_FMT_F16) xv = lp_bits_h2f(((const uint16_t*)x)[at]);
    else xv = __builtin_bit_cast(float, (uint32_t)((const uint16_t*)x)[at] << 16);
    acc += w.value(row, i) * xv;
  }
  return acc;
}

template <int F, class Out>
inline void rows_scalar(const LpWeight<F, LP_BLOCKS>& w, int r0, int r1, const Acts& a, Out& out) {
  for (int row = r0; row < r1; ++row) {
    if constexpr (F == LP_FMT_F32 || F == LP_FMT_BF16) {
      for (int c = 0; c < a.rows; ++c) out(row, c, value_dot<F>(w, row, a.base, c, a.k, 0));
    } else {
      for (int c0 = 0; c0 < a.rows; c0 += SCALAR_COLUMNS) {
        const int nc = lp_min(SCALAR_COLUMNS, a.rows - c0);
        float acc[SCALAR_COLUMNS];
        lp_row_dot<F, SCALAR_COLUMNS>(w, row, lp_x<LpWeight<F>::ACT>(a.base, a.planes, a.k, a.row0 + c0), nc, acc);
        if constexpr (F == LP_FMT_F16) {
          const int done = a.k / LpWeight<F>::PIECE * LpWeight<F>::PIECE;
          for (int c = 0; c < nc; ++c) acc[c] += value_dot<F>(w, row, a.base, c0 + c, a.k, done);
        }
        for (int c = 0; c < nc; ++c) out(row, c0 + c, acc[c]);
      }
    }
  }
}

#if LP_CPU_ISA >= 1
// --- SIMD engines: register tiles ---------------------------------------------------------------------

// register tiles (weight rows x activation rows) per engine, measured on an Ice Lake server core
#if LP_CPU_ISA >= 2
constexpr int RT_A = 4, CT_A = 4, RT_B = 2, CT_B = 4, RT_V = 4, CT_V = 4;
#else
constexpr int RT_A = 2, CT_A = 3, RT_B = 2, CT_B = 2, RT_V = 2, CT_V = 3;
#endif
constexpr int RT_B1 = 4;  // engine B's tile rows with a few activation rows

#if LP_CPU_ISA >= 2
inline float hsum16(__m512 v) {
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  return hsum8(_mm256_add_ps(_mm512_castps512_ps256(v), hi));
}
inline __m512 pair_spread(__m128 p) {  // (p[0] x 8, p[1] x 8)
  const __m512i lanes = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(p));
}
inline __m512 pair_spread(const float* p) { return pair_spread(_mm_castsi128_ps(_mm_loadl_epi64((const __m128i*)p))); }

#endif

// Where engine A's tiles read a weight row's values and scales: the task's unpacked rows (many activation
// rows: each row unpacked once for every tile), or the blocks themselves, decoded as a tile reads them (a
// few activation rows: one tile per weight row, so nothing is decoded twice, and nothing is stored). The
// values are the same integers and floats either way, so the result does not depend on which.
template <bool SIGNED> struct FromUnpacked {
  static constexpr bool AHEAD = false;  // the scratch is in cache
  const UnpackedA& u;
  __m256i q32(int row, int b) const { return load32(u.q(row) + 32 * b); }
  float dw(int row, int b) const { return u.dw(row)[b]; }
  float mw(int row, int b) const { return u.mw(row)[b]; }
#if LP_CPU_ISA >= 2
  static constexpr int BIAS = SIGNED ? 128 : 0;  // q64: the values + BIAS as unsigned bytes (signed: the sign bit flipped)
  __m512i q64(int row, int b) const {
    const __m512i q = _mm512_loadu_si512(u.q(row) + 32 * b);
    return SIGNED ? _mm512_xor_si512(q, _mm512_set1_epi8((char)0x80)) : q;
  }
  __m512 dw2(int row, int b) const { return pair_spread(_mm_castsi128_ps(_mm_loadl_epi64((const __m128i*)(u.dw(row) + b)))); }
#endif
};
template <int F> struct FromBlocks {
  // ahead(): the block to prefetch while a tile reads block b of `row`: the same block `dist` rows on,
  // which a later tile reads (RT rows read side by side are too many streams for the hardware
  // prefetcher: one-row decode of the Q8_0 head measured 20% faster on avx512, 45% on avx2). Only where
  // loads, not decoding, bound the tile: every format on the 512-bit engine; on avx2 Q8_0 alone (Q5_0
  // measured 8% slower with it).
  static constexpr bool AHEAD = LP_CPU_ISA >= 2 || F == LP_FMT_Q8_0;
  const LpWeight<F, LP_BLOCKS>& w;
  int dist;  // rows (0: no prefetch)
  size_t at(int row, int b) const { return (size_t)row * w.nb + b; }
  const char* ahead(int row, int b) const { return (const char*)w.d.at(at(row + dist, b)); }
  static bool new_line(int b) {  // whether block b starts a 64-byte line of its row (a prefetch per line)
    constexpr int B = LpWeight<F, LP_BLOCKS>::BYTES;
    return b * B % 64 < B;
  }
  __m256i q32(int row, int b) const { return Unpack<F>::block(w, at(row, b)); }
  float dw(int row, int b) const { return Unpack<F>::d(w, at(row, b)); }
  float mw(int row, int b) const { return Unpack<F>::m(w, at(row, b)); }
#if LP_CPU_ISA >= 2
  static constexpr int BIAS = Unpack<F>::BIAS;
  __m512i q64(int row, int b) const { return Unpack<F>::pair(w, at(row, b)); }
  __m512 dw2(int row, int b) const {  // the two f16 scales widened at once
    const size_t blk = at(row, b);
    const __m128i h = _mm_insert_epi16(_mm_cvtsi32_si128(lp_ld<uint16_t>(w.d.at(blk))), lp_ld<uint16_t>(w.d.at(blk + 1)), 1);
    return pair_spread(_mm_cvtph_ps(h));
  }
#endif
};

// Engine A (32-value blocks): per block b, 8 int32 partial sums of the block's products, converted
// and accumulated in 8 float lanes with the scale dw * dx; the min (Q4_1 / Q5_1) adds mw * (dx * sum x)
// in a float of its own. Lanes summed last (hsum8).
template <bool SIGNED, bool MIN, int RT, int CT, class Src>
inline void tile_a(const Src& u, int r0, const Acts& a, int c0, float (&out)[RT][CT]) {
  const int nb = a.k / 32;
  __m256 acc[RT][CT];
  float macc[RT][CT];
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < CT; ++c) acc[r][c] = _mm256_setzero_ps(), macc[r][c] = 0.0f;
  for (int b = 0; b < nb; ++b) {
    __m256i w[RT], wa[RT];
    __m256 dw[RT];
    for (int r = 0; r < RT; ++r) {
      w[r] = u.q32(r0 + r, b);
      wa[r] = SIGNED ? _mm256_sign_epi8(w[r], w[r]) : w[r];
      dw[r] = _mm256_set1_ps(u.dw(r0 + r, b));
      if constexpr (Src::AHEAD) {
        if (u.dist && u.new_line(b)) _mm_prefetch(u.ahead(r0 + r, b), _MM_HINT_T0);
      }
    }
    for (int c = 0; c < CT; ++c) {
      const size_t xc = (size_t)(c0 + c);
      const __m256i xv = load32(a.qs + xc * a.k + 32 * b);
      const __m256 xd = _mm256_set1_ps(a.d[xc * nb + b]);
      for (int r = 0; r < RT; ++r) {
        const __m256i p = SIGNED ? dot_signed(wa[r], w[r], xv) : dot_unsigned(w[r], xv);
        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dw[r], xd), acc[r][c]);
        if constexpr (MIN) macc[r][c] = macc[r][c] + u.mw(r0 + r, b) * a.s[xc * nb + b];
      }
    }
  }
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < CT; ++c) out[r][c] = hsum8(acc[r][c]) + macc[r][c];
}

// Where engine B's tiles read a super-block's head and values: the task's unpacked rows (many activation
// rows), or the blocks, decoded as a tile reads them (a few: one tile per weight row), prefetching the
// same super-block `dist` rows on, which a later tile reads. The same integers and floats either way.
struct FromUnpackedB {
  static constexpr bool AHEAD = false;
  const UnpackedB& u;
  KHead head(int row, int sb) const {
    return KHead{load32(u.sc(row) + 16 * sb), load32(u.aux(row) + 16 * sb), u.d(row)[sb], u.da(row)[sb]};
  }
  __m256i q32(int row, int sb, int g) const { return load32(u.u(row) + 256 * sb + 32 * g); }
#if LP_CPU_ISA >= 2
  __m512i q64(int row, int sb, int g) const { return _mm512_loadu_si512(u.u(row) + 256 * sb + 64 * g); }
#endif
};
template <int F> struct FromBlocksB {
  static constexpr bool AHEAD = true;
  const LpWeight<F, LP_BLOCKS>& w;
  int dist;  // rows (0: no prefetch)
  size_t at(int row, int sb) const { return (size_t)row * w.nb + sb; }
  void ahead(int row, int sb) const {
    if (dist) prefetch_block<LpWeight<F, LP_BLOCKS>::BYTES>(Unpack<F>::first(w, at(row + dist, sb)));
  }
  KHead head(int row, int sb) const { return Unpack<F>::head(w, at(row, sb)); }
  __m256i q32(int row, int sb, int g) const { return Unpack<F>::q32(w, at(row, sb), g); }
#if LP_CPU_ISA >= 2
  __m512i q64(int row, int sb, int g) const { return Unpack<F>::q64(w, at(row, sb), g); }
#endif
};

// the int16 scales of values 32g .. 32g + 31 as vpmaddwd pairs: 8 copies of sub-block 2g's, 8 of 2g + 1's
inline __m256i scales32(__m256i sc, int g) {
  const __m256i pair = _mm256_permutevar8x32_epi32(sc, _mm256_set1_epi32(g));
  return _mm256_shuffle_epi8(pair, _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3,
                                                    2, 3, 2, 3, 2, 3, 2, 3));
}

// Engine B (K-quants, IQ4_XS): per super-block, int32 lanes of sum_j sc_j * (u_j . x_j) over the 16-value
// sub-blocks j (unsigned values u, or SIGNED ones as |u| times x with u's sign; scales pairwise through
// vpmaddwd / vpdpwssd), and of sum_j aux_j * bsum_j (aux: the offset times the scale, OFF formats,
// scaled by d; or the min, MIN formats, scaled by dmin); then d * dk and da * dk applied in 8 float
// lanes, summed last. Lane l's integers are those of the values 4l .. 4l + 3 of every 32, however they
// are grouped into vectors.
template <bool MIN, int RT, int CT> inline void apply_b(const KHead (&h)[RT], const __m256i (&is)[RT][CT], const Acts& a,
                                                         int c0, int sb, __m256 (&acc)[RT][CT]) {
  const int nsb = a.k / 256;
  for (int c = 0; c < CT; ++c) {
    const size_t xc = (size_t)(c0 + c);
    const __m256i bs = load32(a.bsums + xc * (a.k / 16) + 16 * sb);
    const float dk = a.d[xc * nsb + sb];
    for (int r = 0; r < RT; ++r) {
      const __m256i m = _mm256_madd_epi16(h[r].aux, bs);
      const float d = h[r].d * dk;
      if constexpr (MIN) {
        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[r][c]), _mm256_set1_ps(d), acc[r][c]);
        acc[r][c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(h[r].da * dk), acc[r][c]);
      } else {
        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(is[r][c], m)), _mm256_set1_ps(d), acc[r][c]);
      }
    }
  }
}

template <bool SIGNED, bool MIN, int RT, int CT, class Src>
inline void tile_b(const Src& u, int r0, const Acts& a, int c0, float (&out)[RT][CT]) {
  const int nsb = a.k / 256;
  __m256 acc[RT][CT];
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < CT; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int sb = 0; sb < nsb; ++sb) {
    KHead h[RT];
    __m256i isum[RT][CT];
    for (int r = 0; r < RT; ++r) {
      if constexpr (Src::AHEAD) u.ahead(r0 + r, sb);
      h[r] = u.head(r0 + r, sb);
      for (int c = 0; c < CT; ++c) isum[r][c] = _mm256_setzero_si256();
    }
#pragma unroll
    for (int g = 0; g < 8; ++g) {
      __m256i w[RT], wa[RT], sc[RT];
      for (int r = 0; r < RT; ++r) {
        w[r] = u.q32(r0 + r, sb, g);
        wa[r] = SIGNED ? _mm256_sign_epi8(w[r], w[r]) : w[r];
        sc[r] = scales32(h[r].sc, g);
      }
      for (int c = 0; c < CT; ++c) {
        const __m256i xv = load32(a.qs + (size_t)(c0 + c) * a.k + 256 * sb + 32 * g);
        for (int r = 0; r < RT; ++r)
          isum[r][c] = dot_scaled(isum[r][c], wa[r], SIGNED ? _mm256_sign_epi8(xv, w[r]) : xv, sc[r]);
      }
    }
    apply_b<MIN>(h, isum, a, c0, sb, acc);
  }
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < CT; ++c) out[r][c] = hsum8(acc[r][c]);
}

#if LP_CPU_ISA >= 2
// The AVX-512 path's engines A and B in 512-bit vectors: 64 values per instruction (two 32-value blocks
// in lanes 0..7 and 8..15; two groups of a super-block), an odd last block of A through the 256-bit form.
// A's signed values come as unsigned bytes q + BIAS (Src::q64), and vpdpbusd starts from -BIAS * (the
// sum of each 4 activations): each int32 lane is exactly the 256-bit form's sum of w * x (vpdpbusd
// does not saturate), so the same integers in fewer instructions than |w| and x with w's sign.
template <bool SIGNED, bool MIN, int RT, int CT, class Src>
inline void tile_a512(const Src& u, int r0, const Acts& a, int c0, float (&out)[RT][CT]) {
  const int nb = a.k / 32;
  __m512 acc[RT][CT];
  float macc[RT][CT];
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < CT; ++c) acc[r][c] = _mm512_setzero_ps(), macc[r][c] = 0.0f;
  for (int b = 0; b + 2 <= nb; b += 2) {
    __m512i wu[RT];
    __m512 dw[RT];
    for (int r = 0; r < RT; ++r) {
      wu[r] = u.q64(r0 + r, b);
      dw[r] = u.dw2(r0 + r, b);
      if constexpr (Src::AHEAD) {
        if (u.dist) _mm_prefetch(u.ahead(r0 + r, b), _MM_HINT_T0);
      }
    }
    for (int c = 0; c < CT; ++c) {
      const size_t xc = (size_t)(c0 + c);
      const __m512i xv = _mm512_loadu_si512(a.qs + xc * a.k + 32 * b);
      const __m512 xd = pair_spread(a.d + xc * nb + b);
      const __m512i zero = _mm512_setzero_si512(), bias = _mm512_set1_epi8((char)Src::BIAS);
      const __m512i p0 = SIGNED ? _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, xv)) : zero;
      for (int r = 0; r < RT; ++r) {
        const __m512i p = _mm512_dpbusd_epi32(p0, wu[r], xv);
        acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw[r], xd), acc[r][c]);
        if constexpr (MIN) {
          macc[r][c] = macc[r][c] + u.mw(r0 + r, b) * a.s[xc * nb + b];
          macc[r][c] = macc[r][c] + u.mw(r0 + r, b + 1) * a.s[xc * nb + b + 1];
        }
      }
    }
  }
  float last[RT][CT] = {};
  if (nb % 2) {  // the odd block: 8 lanes of its own
    const int b = nb - 1;
    for (int r = 0; r < RT; ++r) {
      const __m256i w = u.q32(r0 + r, b);
      const __m256i wa = SIGNED ? _mm256_sign_epi8(w, w) : w;
      for (int c = 0; c < CT; ++c) {
        const size_t xc = (size_t)(c0 + c);
        const __m256i xv = load32(a.qs + xc * a.k + 32 * b);
        const __m256i p = SIGNED ? dot_signed(wa, w, xv) : dot_unsigned(w, xv);
        last[r][c] = hsum8(_mm256_mul_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(u.dw(r0 + r, b) * a.d[xc * nb + b])));
        if constexpr (MIN) macc[r][c] = macc[r][c] + u.mw(r0 + r, b) * a.s[xc * nb + b];
      }
    }
  }
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < CT; ++c) out[r][c] = hsum16(acc[r][c]) + last[r][c] + macc[r][c];
}

// the int16 scales of values 64g .. 64g + 63 as vpdpwssd pairs: 8 copies each of sub-blocks 4g .. 4g + 3's
inline __m512i scales64(__m256i sc, int g) {
  const __m512i quarter = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0,
                                           0, 0, 0, 0);
  return _mm512_permutexvar_epi16(_mm512_add_epi16(quarter, _mm512_set1_epi16((short)(4 * g))), _mm512_castsi256_si512(sc));
}

// SIGNED values: |u| (vpabsb) against x negated where u is negative (AVX-512 has no vpsignb)
template <bool SIGNED, bool MIN, int RT, int CT, class Src>
inline void tile_b512(const Src& u, int r0, const Acts& a, int c0, float (&out)[RT][CT]) {
  const int nsb = a.k / 256;
  __m256 acc[RT][CT];
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < CT; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int sb = 0; sb < nsb; ++sb) {
    KHead h[RT];
    __m512i isum[RT][CT];
    for (int r = 0; r < RT; ++r) {
      if constexpr (Src::AHEAD) u.ahead(r0 + r, sb);
      h[r] = u.head(r0 + r, sb);
      for (int c = 0; c < CT; ++c) isum[r][c] = _mm512_setzero_si512();
    }
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      __m512i w[RT], sc[RT];
      __mmask64 neg[RT];
      for (int r = 0; r < RT; ++r) {
        w[r] = u.q64(r0 + r, sb, g);
        if constexpr (SIGNED) {
          neg[r] = _mm512_movepi8_mask(w[r]);
          w[r] = _mm512_abs_epi8(w[r]);
        }
        sc[r] = scales64(h[r].sc, g);
      }
      for (int c = 0; c < CT; ++c) {
        const __m512i xv = _mm512_loadu_si512(a.qs + (size_t)(c0 + c) * a.k + 256 * sb + 64 * g);
        for (int r = 0; r < RT; ++r) {
          const __m512i xs = SIGNED ? _mm512_mask_sub_epi8(xv, neg[r], _mm512_setzero_si512(), xv) : xv;
          isum[r][c] = _mm512_dpwssd_epi32(isum[r][c], _mm512_maddubs_epi16(w[r], xs), sc[r]);
        }
      }
    }
    __m256i is[RT][CT];  // lanes l and l + 8 hold the same 4 of every 32 values
    for (int r = 0; r < RT; ++r)
      for (int c = 0; c < CT; ++c)
        is[r][c] = _mm256_add_epi32(_mm512_castsi512_si256(isum[r][c]), _mm512_extracti64x4_epi64(isum[r][c], 1));
    apply_b<MIN>(h, is, a, c0, sb, acc);
  }
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < CT; ++c) out[r][c] = hsum8(acc[r][c]);
}
#endif

// Engine V (f32 / f16 / bf16 weights, read in place): 8 float lanes of products, then the k % 8 tail
// in order, then the lanes.
template <int F> inline __m256 load_v8(const void* p) {
  if constexpr (F == LP_FMT_F32) return _mm256_loadu_ps((const float*)p);
  else if constexpr (F == LP_FMT_F16) return load_h8(p);
  else return load_bf8(p);
}
template <int F> inline float load_v1(const void* p) {
  if constexpr (F == LP_FMT_F32) return *(const float*)p;
  else if constexpr (F == LP_FMT_F16) return lp_bits_h2f(lp_ld<uint16_t>(p));
  else return __builtin_bit_cast(float, (uint32_t)lp_ld<uint16_t>(p) << 16);
}

template <int F, int RT, int CT>
inline void tile_v(const char* w, int r0, const Acts& a, int c0, float (&out)[RT][CT]) {
  constexpr int E = F == LP_FMT_F32 ? 4 : 2;  // bytes per value, weights and activations alike
  const int k = a.k, k8 = k / 8 * 8;
  const char* x = (const char*)a.base;
  __m256 acc[RT][CT];
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < CT; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int i = 0; i < k8; i += 8) {
    __m256 wv[RT];
    for (int r = 0; r < RT; ++r) wv[r] = load_v8<F>(w + ((size_t)(r0 + r) * k + i) * E);
    for (int c = 0; c < CT; ++c) {
      const __m256 xv = load_v8<F>(x + ((size_t)(c0 + c) * k + i) * E);
      for (int r = 0; r < RT; ++r) acc[r][c] = _mm256_fmadd_ps(wv[r], xv, acc[r][c]);
    }
  }
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < CT; ++c) {
      float tail = 0.0f;
      for (int i = k8; i < k; ++i)
        tail += load_v1<F>(w + ((size_t)(r0 + r) * k + i) * E) * load_v1<F>(x + ((size_t)(c0 + c) * k + i) * E);
      out[r][c] = hsum8(acc[r][c]) + tail;
    }
}

// One tile of rt <= RT weight rows x ct <= CT activation rows: the same tile code at the exact size
// (so an output's arithmetic never depends on the tile it lands in).
template <int RT, int CT, class Tile, class Out>
inline void run_tile(int rt, int ct, int r0, int c0, Tile& tile, Out& out) {
  if constexpr (RT > 1) {
    if (rt < RT) return run_tile<RT - 1, CT>(rt, ct, r0, c0, tile, out);
  }
  if constexpr (CT > 1) {
    if (ct < CT) return run_tile<RT, CT - 1>(rt, ct, r0, c0, tile, out);
  }
  float v[RT][CT];
  tile(v, r0, c0);
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < CT; ++c) out(r0 + r, c0 + c, v[r][c]);
}

template <int RT, int CT, class Tile, class Out>
inline void tiles(int r0, int r1, const Acts& a, Tile tile, Out& out) {
  for (int c0 = 0; c0 < a.rows; c0 += CT)
    for (int rr = r0; rr < r1; rr += RT) run_tile<RT, CT>(lp_min(RT, r1 - rr), lp_min(CT, a.rows - c0), rr, c0, tile, out);
}

// weight rows [r0, r1) of w against every activation row; out(row, col, value)
template <int F, class Out>
inline void rows_simd(const LpWeight<F, LP_BLOCKS>& w, const void* raw, int r0, int r1, const Acts& a, int ahead,
                      Out& out) {
  if constexpr (F == LP_FMT_F32 || F == LP_FMT_F16 || F == LP_FMT_BF16) {
    tiles<RT_V, CT_V>(r0, r1, a, [&]<int RT, int CT>(float (&v)[RT][CT], int rr, int c0) {
      tile_v<F, RT, CT>((const char*)raw, rr, a, c0, v);
    }, out);
  } else if constexpr (Unpack<F>::KIND == UNPACK_A) {
    auto run = [&](const auto& src) {
      tiles<RT_A, CT_A>(r0, r1, a, [&]<int RT, int CT>(float (&v)[RT][CT], int rr, int c0) {
#if LP_CPU_ISA >= 2
        tile_a512<Unpack<F>::SIGNED, Unpack<F>::MIN, RT, CT>(src, rr, a, c0, v);
#else
        tile_a<Unpack<F>::SIGNED, Unpack<F>::MIN, RT, CT>(src, rr, a, c0, v);
#endif
      }, out);
    };
    if (a.rows <= CT_A) return run(FromBlocks<F>{w, ahead * RT_A});  // one tile per weight row: decode as read
    static thread_local UnpackedA u;
    u.reset(r0, r1, a.k);
    for (int row = r0; row < r1; ++row) Unpack<F>::row(w, row, u);
    run(FromUnpacked<Unpack<F>::SIGNED>{u});
  } else {
    auto run = [&](const auto& src, auto rt) {
      tiles<decltype(rt)::value, CT_B>(r0, r1, a, [&]<int RT, int CT>(float (&v)[RT][CT], int rr, int c0) {
#if LP_CPU_ISA >= 2
        tile_b512<Unpack<F>::SIGNED, Unpack<F>::MIN, RT, CT>(src, rr, a, c0, v);
#else
        tile_b<Unpack<F>::SIGNED, Unpack<F>::MIN, RT, CT>(src, rr, a, c0, v);
#endif
      }, out);
    };
    // one tile per weight row: decode as read, in taller tiles (RT_B1: more independent sums)
    if (a.rows <= CT_B) return run(FromBlocksB<F>{w, ahead * RT_B1}, std::integral_constant<int, RT_B1>{});
    static thread_local UnpackedB u;
    u.reset(r0, r1, a.k);
    for (int row = r0; row < r1; ++row) Unpack<F>::row(w, row, u);
    run(FromUnpackedB{u}, std::integral_constant<int, RT_B>{});
  }
}
#endif

// Rows16 records (rows16.h): weight rows [r0, r1) (r0 a multiple of 16) against every activation row.
// Tiles of a record's rows x CT activation rows: one row (decode) keeps 4 independent sums per
// sub-block (rows16.h r16_tile); more take `cols` rows a pass (the tune store's decision; 0: CT_R16, at most CT_R16_MAX), one
// group at a time. Each lane's steps are the same at any width, so the width never changes a bit. A
// task's records are one stream, which the one-row pass requests R16_AHEAD bytes ahead (Q8_0's records
// none); the `ahead` schedule is for blocks read in place.
#if LP_CPU_ISA >= 2
using VR16 = V512;
// 6, not 4: a record's unpacking then serves 12 products, not 8 (128-token prefill, 2 threads, Intel Xeon
// VM, medians of 5-7 alternated runs: llama3-8b 37.1 tok/s against 35.8, gemma3-270m 1421 against 1347,
// tiny-llama3 7442 against 6667); 8 keeps too many sums for 32 registers (llama3-8b 35.4 against 36.7)
constexpr int CT_R16 = 6;
#elif LP_CPU_ISA >= 1
using VR16 = V256;
constexpr int CT_R16 = 2;
#endif
constexpr int CT_R16_MAX = 6;
#if LP_CPU_ISA >= 1
template <int CT, class Rec, class Out>
inline void r16_columns(const Rows16<Rec>& w, int group, int rows_here, const Acts& a, int c0, int ct, Out& out) {
  if constexpr (CT > 1) {
    if (ct < CT) return r16_columns<CT - 1>(w, group, rows_here, a, c0, ct, out);
  }
  constexpr int L = VR16::LANES;
  R16Col cols[CT];
  for (int i = 0; i < CT; ++i) cols[i] = a.col(c0 + i);
  for (int h = 0; h < R16 / L; ++h) {
    float v[CT][L];
    if constexpr (is_b32<Rec>) {
      if (a.rows == 1) r16_b32_tile<VR16, Rec, CT, 4>(w, group, h, cols, v);
      else r16_b32_tile<VR16, Rec, CT, 1>(w, group, h, cols, v);
    } else {
      if (a.rows == 1) r16_tile<VR16, Rec, CT, 4>(w, group, h, cols, v);
      else r16_tile<VR16, Rec, CT, 1>(w, group, h, cols, v);
    }
    for (int i = 0; i < CT; ++i)
      for (int r = 0; r < L && L * h + r < rows_here; ++r) out(R16 * group + L * h + r, c0 + i, v[i][r]);
  }
}
#endif
// Which engine rows16 records run on: the path's own (on amx, AMX tiles for more activation rows than
// one pass of the vector engine takes, each record then read once for all of them), or the tile
// engine's scalar twin (tiles.h), which the tests hold to the other paths' bits.
enum R16Engine { R16_PATH, R16_TWIN };

// the tile engine of records Rec (tiles.h, rows16_q8.h) on tiles T
template <class T, class Rec, class Out> inline void r16_tile_engine(const Rows16<Rec>& w, int r0, int r1, const Acts& a, Out& out) {
  if constexpr (is_b32<Rec>) r16_b32_tiles<T>(w, r0, r1, a, out);
  else r16_tiles<T>(w, r0, r1, a, out);
}

template <class Rec, R16Engine E, class Out>
inline void rows_r16(const void* raw, int r0, int r1, const Acts& a, int cols, Out& out) {
  const Rows16<Rec> w{(const uint8_t*)raw, a.k / Rec::VALUES};
  if constexpr (E == R16_TWIN) return r16_tile_engine<TwinTiles>(w, r0, r1, a, out);
#if LP_CPU_ISA >= 3
  if (a.rows > CT_R16_MAX) return r16_tile_engine<AmxTiles>(w, r0, r1, a, out);
#endif
  for (int group = r0 / R16; R16 * group < r1; ++group) {
    const int rows_here = lp_min(R16, r1 - R16 * group);
#if LP_CPU_ISA >= 1
    const int width = cols > 0 ? lp_min(cols, CT_R16_MAX) : CT_R16;
    for (int c0 = 0; c0 < a.rows; c0 += width)
      r16_columns<CT_R16_MAX>(w, group, rows_here, a, c0, lp_min(width, a.rows - c0), out);
#else
    for (int c = 0; c < a.rows; ++c) {
      float v[R16];
      if constexpr (is_b32<Rec>) r16_b32_scalar(w, group, a.col(c), v);
      else r16_scalar(w, group, a.col(c), v);
      for (int r = 0; r < rows_here; ++r) out(R16 * group + r, c, v[r]);
    }
#endif
  }
}

// weight rows [r0, r1) of a weight in format F (rows n, row length a.k) against every activation row;
// the one-row engines prefetch `ahead` tiles on; rows16 records take `cols` activation rows a pass
template <int F, R16Engine E, class Out>
inline void weight_rows(const void* raw, int n, int r0, int r1, const Acts& a, int ahead, int cols, Out& out) {
  if constexpr (is_r16<F>) {
    rows_r16<typename R16Rec<F>::type, E>(raw, r0, r1, a, cols, out);
  } else {
    const LpWeight<F, LP_BLOCKS> w(raw, n, a.k);
#if LP_CPU_ISA >= 1
    rows_simd<F>(w, raw, r0, r1, a, ahead, out);
#else
    rows_scalar<F>(w, r0, r1, a, out);
#endif
  }
}

constexpr int TASK_ROWS = 16;  // weight rows per task when the launch does not say (tune store: task_rows)

// a task's weight rows in format F for `task_rows` asked (0: TASK_ROWS): rows16 records are not split
template <int F> constexpr int task_rows_of(int task_rows) {
  const int tr = task_rows > 0 ? task_rows : TASK_ROWS;
  return is_r16<F> ? (tr + R16 - 1) / R16 * R16 : tr;
}

// The row loop of a projection launch: weights w[s] (format F0, F1, F2; n[s] rows each) against the
// packed activations x [rows, k]; out(task, segment, weight row, activation row, value) for every
// output, each from one task. Returns the task count (tail.h keeps a best per task).
template <int F0, int F1, int F2, int NSEG, R16Engine E = R16_PATH, class Out>
inline int project(const void* x, const void* const* w, const int* n, int rows, int k, int task_rows, int ahead,
                   int cols, Out out) {
  constexpr int ACT = act_of<F0>();
  static_assert(NSEG == 1 || act_of<F1>() == ACT, "segments must take the same activations");
  static_assert(NSEG < 3 || act_of<F2>() == ACT, "segments must take the same activations");
  if (rows <= 0) return 0;
  const int tr[3] = {task_rows_of<F0>(task_rows), task_rows_of<F1>(task_rows), task_rows_of<F2>(task_rows)};
  int first[NSEG + 1];
  first[0] = 0;
  for (int s = 0; s < NSEG; ++s) first[s + 1] = first[s] + (n[s] + tr[s] - 1) / tr[s];
  Acts a;
  make_acts<ACT>(a, x, rows, k);
  if constexpr (is_r16<F0> || is_r16<F1> || is_r16<F2>) {
    if constexpr (ACT == LP_ACT_Q8_K) r16_sums(a.bsums, rows, k, a.pairs, a.off);
    else r16q8_sums(a.qs, rows, k, a.off);
  }
  lp_parallel(first[NSEG], [&](int t) {
    int s = 0;
    while (t >= first[s + 1]) ++s;
    const int r0 = (t - first[s]) * tr[s], r1 = lp_min(n[s], r0 + tr[s]);
    auto o = [&](int row, int col, float v) { out(t, s, row, col, v); };
    if (s == 0) weight_rows<F0, E>(w[0], n[0], r0, r1, a, ahead, cols, o);
    if constexpr (NSEG >= 2) {
      if (s == 1) weight_rows<F1, E>(w[1], n[1], r0, r1, a, ahead, cols, o);
    }
    if constexpr (NSEG >= 3) {
      if (s == 2) weight_rows<F2, E>(w[2], n[2], r0, r1, a, ahead, cols, o);
    }
  });
  return first[NSEG];
}

// matmul / matmul_segmented (y_s = x . W_s^T) and matmul_residual (y0 = r + x . W0^T; r may be y0)
template <int F0, int F1, int F2, int NSEG, bool RES, R16Engine E = R16_PATH>
inline void matmul(const void* x, const void* w0, const void* w1, const void* w2, float* y0, float* y1, float* y2,
                   const float* r, int rows, int k, int n0, int n1, int n2, int task_rows, int ahead, int cols) {
  static_assert(!RES || NSEG == 1, "the residual epilogue has one weight");
  const void* w[3] = {w0, w1, w2};
  const int n[3] = {n0, n1, n2};
  float* y[3] = {y0, y1, y2};
  project<F0, F1, F2, NSEG, E>(x, w, n, rows, k, task_rows, ahead, cols, [&](int, int s, int row, int col, float v) {
    const size_t at = (size_t)col * n[s] + row;
    y[s][at] = RES ? r[at] + v : v;
  });
}

}  // namespace lp_cpu
