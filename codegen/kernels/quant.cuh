// quant.cuh: the weight formats, one struct per format (LpWeight<F>), shared by the GPU's mat-vec,
// embedding and tail kernels and by the CPU target's kernels (codegen/cpu/), so that every block layout
// and every scale unpacking has this one source.
//
// Two layouts of the same blocks (LpLayout): on the GPU weights are stored "planar" (core/formats.py
// planes()): each field of a format's block layout is one contiguous plane [rows, blocks per row, field
// bytes], planes in field order, each starting on a 256-byte boundary. On the CPU they are read in place
// from the mapped GGUF, block after block with each block's fields side by side ("blocks"). LpCursor walks
// the fields of a block in the order of core/formats.py FORMATS for either layout, and each field is an
// LpField: where that field of block `blk` starts. Each LpWeight<F> takes its block size, bytes and
// activation format from formats.h's LpFormat<F> (generated from core/formats.py), for either layout.
//
// Each LpWeight<F> has
//   value(row, i)  element i of the row, dequantized with the same float32 operations in the same
//                  order as core/formats.py's dequantizer (bit-exact; lp_mul_rn keeps every product
//                  that feeds an add rounded on its own, as NumPy rounds it);
//   dot<C>(row, p, x, ncols, acc)
//                  one lane's share of the dot products of a weight row with C activation columns:
//                  "piece" p of the row (PIECE values whose quant bytes are one 16-byte load of the
//                  format's main plane), as integer dot products (lp_dot4) of the weight's quantized
//                  values with the activation's int8 values, the per-block scales applied in float.
//                  The pieces of a block are taken by consecutive lanes, so a wave reads consecutive
//                  16-byte chunks of the quant plane (a Q4_K super-block's 128-byte qs plane is
//                  8 lanes x 16 B; see each format's comment for its split).
// The activation a weight takes is core/formats.py ACTIVATION_FORMAT: q8_0 (Q4_0, Q5_0, Q8_0), q8_1 (Q4_1,
// Q5_1), q8_k (the K-quants: 256-value blocks, f32 scale, 16-value sums), f16 values (F16 weights).
// Sums equal the CPU twin's x_values @ dequantize(W)^T up to float rounding: every product of
// quantized integers is exact, and a block's terms are summed in a different order than BLAS does.
#pragma once
#include "common.cuh"

// lp_dot4 of the words common.cuh's byte tricks make
__device__ __forceinline__ int lp_idot4(uint32_t a, uint32_t b, int c) { return lp_dot4((int)a, (int)b, c); }

// --- layouts ---------------------------------------------------------------------------------------

enum LpLayout { LP_PLANAR, LP_BLOCKS };

// One field of every block: block blk's field starts at p + blk * STRIDE (planar: the field's bytes per
// block; blocks: the block's size), a compile-time constant either way. lp_ld reads it where it may be
// unaligned (a GGUF's 18-byte blocks).
template <class T, int STRIDE> struct LpField {
  const char* p;
  __device__ const T* at(size_t blk) const { return (const T*)(p + blk * STRIDE); }
  __device__ T operator[](size_t blk) const { return lp_ld<T>(p + blk * STRIDE); }
};

// The fields of rows x blocks_per_row blocks of BYTES bytes each, in field order: next<T, N>() is the
// next field, N bytes per block. Planar (core/formats.py planes()): field after field, each plane
// [rows, blocks, N] on a 256-byte boundary. Blocks: each block's fields side by side, blocks one after
// another (GGUF).
template <LpLayout L, int BYTES> struct LpCursor {
  template <int N> static constexpr int STRIDE = L == LP_BLOCKS ? BYTES : N;
  const char* p;
  size_t blocks;  // rows * blocks per row
  __device__ LpCursor(const void* base, int rows, int blocks_per_row)
      : p((const char*)base), blocks((size_t)rows * blocks_per_row) {}
  template <class T, int N> __device__ LpField<T, STRIDE<N>> next() {
    const LpField<T, STRIDE<N>> f = {p};
    p += L == LP_BLOCKS ? (size_t)N : lp_align(blocks * N);
    return f;
  }
};

// --- activations ---------------------------------------------------------------------------------

// C activation columns from column col0 of a packed buffer [rows, k] (common.cuh's planes), or of
// f16 values [rows, k]; column c's data starts at the pointers plus c rows.
struct LpX {
  const float* dk;         // q8_k: scale [cols, k/256]
  const lp_half* d;        // q8_0, q8_1: scale [cols, k/32]
  const int8_t* qs;        // [cols, k]
  const int16_t* bsums;    // q8_k: 16-value sums [cols, k/16]
  const lp_half* h;        // f16 values [cols, k]
  int k;
};

template <int ACT> __device__ __forceinline__ LpX lp_x(const void* base, int rows, int k, int col0) {
  LpX x = {};
  x.k = k;
  const size_t c = col0;
  if constexpr (ACT == LP_ACT_F16) {
    x.h = (const lp_half*)base + c * k;
  } else {
    const Q8Rows q = lp_q8_rows((void*)base, rows, k, ACT);
    x.qs = q.qs + c * k;
    if constexpr (ACT == LP_ACT_Q8_K) {
      x.dk = (const float*)q.d + c * (k / 256);
      x.bsums = q.bsums + c * (k / 16);
    } else {
      x.d = (const lp_half*)q.d + c * (k / 32);  // q8_1's s plane is not read: sums come from qs
    }
  }
  return x;
}

// the 12 scale bytes of a K-quant block, for common.cuh's lp_k_scale_min / lp_q3k_scale
struct LpScaleBytes {
  const uint8_t* s;
  __device__ int operator()(int i) const { return s[i]; }
};

// --- the formats ------------------------------------------------------------------------------------

template <int F, LpLayout L = LP_PLANAR> struct LpWeight;

// F32 / F16 / BF16: one field "v" [rows, k] (both layouts are the plain values)
template <LpLayout L> struct LpWeight<LP_FMT_F32, L> : LpFormat<LP_FMT_F32> {
  LpField<float, 4> v;
  int k;
  __device__ LpWeight(const void* base, int rows, int k_) : k(k_) {
    v = LpCursor<L, BYTES>(base, rows, k).template next<float, 4>();
  }
  __device__ float value(size_t row, int i) const { return v[row * k + i]; }
};

template <LpLayout L> struct LpWeight<LP_FMT_BF16, L> : LpFormat<LP_FMT_BF16> {
  LpField<uint16_t, 2> v;
  int k;
  __device__ LpWeight(const void* base, int rows, int k_) : k(k_) {
    v = LpCursor<L, BYTES>(base, rows, k).template next<uint16_t, 2>();
  }
  __device__ float value(size_t row, int i) const { return __builtin_bit_cast(float, (uint32_t)v[row * k + i] << 16); }
};

// F16 x f16 activations: a piece is 8 values (16 bytes of the row); products and sums in float.
template <LpLayout L> struct LpWeight<LP_FMT_F16, L> : LpFormat<LP_FMT_F16> {
  static constexpr int PIECE = 8;
  LpField<uint16_t, 2> v;
  int k;
  __device__ LpWeight(const void* base, int rows, int k_) : k(k_) {
    v = LpCursor<L, BYTES>(base, rows, k).template next<uint16_t, 2>();
  }
  __device__ float value(size_t row, int i) const { return lp_bits_h2f(v[row * k + i]); }

  template <int C> __device__ void dot(size_t row, int p, const LpX& x, int ncols, float (&acc)[C]) const {
    const lp_u4 w = lp_load16(v.at(row * k + 8 * p));
    float wf[8];
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
      wf[2 * j] = lp_half_lo(w.w[j]);
      wf[2 * j + 1] = lp_half_hi(w.w[j]);
    }
    #pragma unroll
    for (int c = 0; c < C; ++c) {
      if (c < ncols) {
        const lp_u4 a = lp_load16(x.h + (size_t)c * k + 8 * p);
        float s = 0.0f;
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
          s += wf[2 * j] * lp_half_lo(a.w[j]);
          s += wf[2 * j + 1] * lp_half_hi(a.w[j]);
        }
        acc[c] += s;
      }
    }
  }
};

// The 32-value formats meet q8_0 / q8_1 activations block by block: acc[c] += the dot product of V
// groups of 16 int8 weight values w[v] (the piece) with activation values 32 b + off + 16 v of column
// c, scaled by the activation block's d and the weight's dw; MIN: plus the weight's min mw times the
// exact sum of those activation values. (The q8_1 s plane is not read: its f16 sums are rounded.)
template <int C, int V, bool MIN>
__device__ __forceinline__ void lp_dot_block32(const LpX& x, int nb, int b, int off, const lp_u4 (&w)[V], float dw,
                                               float mw, int ncols, float (&acc)[C]) {
  #pragma unroll
  for (int c = 0; c < C; ++c) {
    if (c < ncols) {
      const int8_t* xq = x.qs + (size_t)c * x.k + 32 * b + off;
      lp_u4 a[V];
      #pragma unroll
      for (int v = 0; v < V; ++v) a[v] = lp_load16(xq + 16 * v);
      int s = 0, xsum = 0;
      #pragma unroll
      for (int j = 0; j < 4; ++j) {
        #pragma unroll
        for (int v = 0; v < V; ++v) {
          s = lp_idot4(w[v].w[j], a[v].w[j], s);
          if constexpr (MIN) xsum = lp_idot4(0x01010101u, a[v].w[j], xsum);
        }
      }
      const float xd = lp_h2f(x.d[(size_t)c * nb + b]);
      if constexpr (MIN) acc[c] += xd * (dw * (float)s + mw * (float)xsum);
      else acc[c] += xd * dw * (float)s;
    }
  }
}

// Q8_0: d f16, qs[32] i8. x q8_0. A piece is half a block: 16 qs bytes; 2 lanes per block.
template <LpLayout L> struct LpWeight<LP_FMT_Q8_0, L> : LpFormat<LP_FMT_Q8_0> {
  static constexpr int PIECE = 16;
  using Cur = LpCursor<L, BYTES>;
  LpField<lp_half, Cur::template STRIDE<2>> d;
  LpField<int8_t, Cur::template STRIDE<32>> qs;
  int nb;  // blocks per row
  __device__ LpWeight(const void* base, int rows, int k) : nb(k / 32) {
    Cur c(base, rows, nb);
    d = c.template next<lp_half, 2>();
    qs = c.template next<int8_t, 32>();
  }
  __device__ float value(size_t row, int i) const {  // qs * d
    const size_t blk = row * nb + i / 32;
    return (float)qs.at(blk)[i % 32] * lp_h2f(d[blk]);
  }
  template <int C> __device__ void dot(size_t row, int p, const LpX& x, int ncols, float (&acc)[C]) const {
    const int b = p / 2, h = p % 2;  // block b, values [16h, 16h + 16)
    const size_t blk = row * nb + b;
    const lp_u4 q[1] = {lp_load16(qs.at(blk) + 16 * h)};
    lp_dot_block32<C, 1, false>(x, nb, b, 16 * h, q, lp_h2f(d[blk]), 0.0f, ncols, acc);
  }
};

// The 32-value formats with 4-bit (+1 high bit) quants: a piece is one block, its 16 qs bytes: low
// nibbles are values 0..15, high nibbles values 16..31 (formats.nibbles(qs, 16)); the high bit of
// value v is bit v of qh. Activations: the block's 32 int8 values, two 16-byte loads.
//   Q4_0: d f16, qs[16]: d * (q - 8). x q8_0.
//   Q4_1: d f16, m f16, qs[16]: d * q + m. x q8_1; the min meets the exact sum of the block's x values.
//   Q5_0: d f16, qh u32, qs[16]: d * ((nibble | high bit << 4) - 16). x q8_0.
//   Q5_1: d f16, m f16, qh u32, qs[16]: d * (nibble | high bit << 4) + m. x q8_1.
template <int F, LpLayout L> struct LpWeight32 : LpFormat<F> {
  using LpFormat<F>::MIN;
  static constexpr bool HI = F == LP_FMT_Q5_0 || F == LP_FMT_Q5_1;
  static constexpr int PIECE = 32;
  static constexpr uint32_t OFFSET = MIN ? 0 : (HI ? 16 : 8);  // subtracted from q where there is no min
  using Cur = LpCursor<L, LpFormat<F>::BYTES>;
  LpField<lp_half, Cur::template STRIDE<2>> d, m = {};
  LpField<uint32_t, Cur::template STRIDE<4>> qh = {};
  LpField<uint8_t, Cur::template STRIDE<16>> qs;
  int nb;  // blocks per row
  __device__ LpWeight32(const void* base, int rows, int k) : nb(k / 32) {
    Cur c(base, rows, nb);
    d = c.template next<lp_half, 2>();
    if (MIN) m = c.template next<lp_half, 2>();
    if (HI) qh = c.template next<uint32_t, 4>();
    qs = c.template next<uint8_t, 16>();
  }
  __device__ float value(size_t row, int i) const {
    const size_t blk = row * nb + i / 32;
    const int j = i % 32;
    int q = j < 16 ? qs.at(blk)[j] & 0xF : qs.at(blk)[j - 16] >> 4;
    if constexpr (HI) q |= ((qh[blk] >> j) & 1) << 4;
    if constexpr (MIN) return lp_mul_rn(lp_h2f(d[blk]), (float)q) + lp_h2f(m[blk]);
    else return lp_h2f(d[blk]) * (float)(q - (int)OFFSET);
  }
  template <int C> __device__ void dot(size_t row, int p, const LpX& x, int ncols, float (&acc)[C]) const {
    const size_t blk = row * nb + p;
    const lp_u4 q = lp_load16(qs.at(blk));
    const uint32_t h = HI ? qh[blk] : 0u;
    lp_u4 v[2];  // values 4j.. and 16 + 4j.. (high bits 4j.. and 16 + 4j..), as int8 q - OFFSET
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t lo = q.w[j] & 0x0F0F0F0Fu, hi = (q.w[j] >> 4) & 0x0F0F0F0Fu;
      if constexpr (HI) {
        lo |= lp_bits4(h >> (4 * j)) << 4;
        hi |= lp_bits4(h >> (16 + 4 * j)) << 4;
      }
      v[0].w[j] = OFFSET ? lp_sub_bytes(lo, OFFSET) : lo;
      v[1].w[j] = OFFSET ? lp_sub_bytes(hi, OFFSET) : hi;
    }
    lp_dot_block32<C, 2, MIN>(x, nb, p, 0, v, lp_h2f(d[blk]), MIN ? lp_h2f(m[blk]) : 0.0f, ncols, acc);
  }
};
template <LpLayout L> struct LpWeight<LP_FMT_Q4_0, L> : LpWeight32<LP_FMT_Q4_0, L> {
  using LpWeight32<LP_FMT_Q4_0, L>::LpWeight32;
};
template <LpLayout L> struct LpWeight<LP_FMT_Q4_1, L> : LpWeight32<LP_FMT_Q4_1, L> {
  using LpWeight32<LP_FMT_Q4_1, L>::LpWeight32;
};
template <LpLayout L> struct LpWeight<LP_FMT_Q5_0, L> : LpWeight32<LP_FMT_Q5_0, L> {
  using LpWeight32<LP_FMT_Q5_0, L>::LpWeight32;
};
template <LpLayout L> struct LpWeight<LP_FMT_Q5_1, L> : LpWeight32<LP_FMT_Q5_1, L> {
  using LpWeight32<LP_FMT_Q5_1, L>::LpWeight32;
};

// The K-quants meet q8_k activations super-block by super-block: acc[c] += the activation's scale times
// (dd * sum over groups g < S of sc[g] * (the 16 int8 weight values word(g, 0..3) . activation values
// 256 b + off + stride * g of column c) - dm * sum over g of mn[g] * the activation's 16-value sum
// 16 b + bsum + 2 g of column c), the mins only where MIN.
template <int C, int S, bool MIN, class Word>
__device__ __forceinline__ void lp_dot_block256(const LpX& x, int nb, int b, int off, int stride, int bsum, Word word,
                                                const int (&sc)[S], const int* mn, float dd, float dm, int ncols,
                                                float (&acc)[C]) {
  #pragma unroll
  for (int c = 0; c < C; ++c) {
    if (c < ncols) {
      const int8_t* xq = x.qs + (size_t)c * x.k + 256 * b + off;
      const int16_t* bs = x.bsums + (size_t)c * (x.k / 16) + 16 * b + bsum;
      int isum = 0, msum = 0;
      #pragma unroll
      for (int g = 0; g < S; ++g) {
        const lp_u4 a = lp_load16(xq + stride * g);
        int dot = 0;
        #pragma unroll
        for (int j = 0; j < 4; ++j) dot = lp_idot4(word(g, j), a.w[j], dot);
        isum += sc[g] * dot;
        if constexpr (MIN) msum += mn[g] * bs[2 * g];
      }
      const float dk = x.dk[(size_t)c * nb + b];
      if constexpr (MIN) acc[c] += dk * (dd * (float)isum - dm * (float)msum);
      else acc[c] += dk * (dd * (float)isum);
    }
  }
}

// Q2_K: scales[16], qs[64], d f16, dmin f16. Sub-block j (16 values): d * (scales[j] & 15) * q
// - dmin * (scales[j] >> 4), q the 2-bit value: value 128G + 32s + i is bits 2s of qs[32G + i]
// (formats.bits(qs, 2, 32)). x q8_k. A piece is 16 qs bytes = 64 values; 4 lanes per super-block:
// lane l (G = l / 2, h = l % 2) takes qs[32G + 16h, +16): values 128G + 32s + 16h + t (s < 4, t < 16),
// sub-blocks 8G + 2s + h.
template <LpLayout L> struct LpWeight<LP_FMT_Q2_K, L> : LpFormat<LP_FMT_Q2_K> {
  static constexpr int PIECE = 64;
  using Cur = LpCursor<L, BYTES>;
  LpField<uint8_t, Cur::template STRIDE<16>> scales;
  LpField<uint8_t, Cur::template STRIDE<64>> qs;
  LpField<lp_half, Cur::template STRIDE<2>> d, dmin;
  int nb;  // blocks per row
  __device__ LpWeight(const void* base, int rows, int k) : nb(k / 256) {
    Cur c(base, rows, nb);
    scales = c.template next<uint8_t, 16>();
    qs = c.template next<uint8_t, 64>();
    d = c.template next<lp_half, 2>();
    dmin = c.template next<lp_half, 2>();
  }
  __device__ float value(size_t row, int i) const {
    const size_t blk = row * nb + i / 256;
    const int j = i % 256;
    const int sc = scales.at(blk)[j / 16];
    const float dl = lp_mul_rn(lp_h2f(d[blk]), (float)(sc & 0xF));
    const float ml = lp_mul_rn(lp_h2f(dmin[blk]), (float)(sc >> 4));
    const int q = (qs.at(blk)[32 * (j / 128) + j % 32] >> (2 * (j % 128 / 32))) & 3;
    return lp_mul_rn(dl, (float)q) - ml;
  }
  template <int C> __device__ void dot(size_t row, int p, const LpX& x, int ncols, float (&acc)[C]) const {
    const int b = p / 4, l = p % 4, G = l / 2, h = l % 2;
    const size_t blk = row * nb + b;
    const lp_u4 q = lp_load16(qs.at(blk) + 32 * G + 16 * h);
    int sc[4], mn[4];  // sub-block 8G + 2s + h
    #pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int v = scales.at(blk)[8 * G + 2 * s + h];
      sc[s] = v & 0xF;
      mn[s] = v >> 4;
    }
    // value group s: the 2-bit values at bit 2s; the 16-value sums of sub-blocks 8G + 2s + h
    lp_dot_block256<C, 4, true>(x, nb, b, 128 * G + 16 * h, 32, 8 * G + h,
                                [&](int s, int j) { return (q.w[j] >> (2 * s)) & 0x03030303u; }, sc, mn,
                                lp_h2f(d[blk]), lp_h2f(dmin[blk]), ncols, acc);
  }
};

// Q3_K: hmask[32], qs[64], scales[12], d f16. Sub-block j (16 values): d * scale_j * q, q = the low 2
// bits - 4 where the value's hmask bit is clear: value 128G + 32s + i has its low bits at bit 2s of
// qs[32G + i] (formats.bits(qs, 2, 32)), value v its mask bit at bit v / 32 of hmask[v % 32]
// (formats.bits(hmask, 1, 32)). x q8_k. Pieces as Q2_K: lane l (G = l / 2, h = l % 2) takes
// qs[32G + 16h, +16) and hmask[16h, +16) (mask bits 4G + s).
template <LpLayout L> struct LpWeight<LP_FMT_Q3_K, L> : LpFormat<LP_FMT_Q3_K> {
  static constexpr int PIECE = 64;
  using Cur = LpCursor<L, BYTES>;
  LpField<uint8_t, Cur::template STRIDE<32>> hmask;
  LpField<uint8_t, Cur::template STRIDE<64>> qs;
  LpField<uint8_t, Cur::template STRIDE<12>> scales;
  LpField<lp_half, Cur::template STRIDE<2>> d;
  int nb;  // blocks per row
  __device__ LpWeight(const void* base, int rows, int k) : nb(k / 256) {
    Cur c(base, rows, nb);
    hmask = c.template next<uint8_t, 32>();
    qs = c.template next<uint8_t, 64>();
    scales = c.template next<uint8_t, 12>();
    d = c.template next<lp_half, 2>();
  }
  __device__ float value(size_t row, int i) const {
    const size_t blk = row * nb + i / 256;
    const int j = i % 256;
    const float dl = lp_mul_rn(lp_h2f(d[blk]), (float)lp_q3k_scale(LpScaleBytes{scales.at(blk)}, j / 16));
    const int low = (qs.at(blk)[32 * (j / 128) + j % 32] >> (2 * (j % 128 / 32))) & 3;
    const int high = ((hmask.at(blk)[j % 32] >> (j / 32)) & 1) ^ 1;  // a clear bit means "subtract 4"
    return dl * (float)(low - (high << 2));
  }
  template <int C> __device__ void dot(size_t row, int p, const LpX& x, int ncols, float (&acc)[C]) const {
    const int b = p / 4, l = p % 4, G = l / 2, h = l % 2;
    const size_t blk = row * nb + b;
    const lp_u4 q = lp_load16(qs.at(blk) + 32 * G + 16 * h);
    const lp_u4 hm = lp_load16(hmask.at(blk) + 16 * h);
    uint32_t w[4][4];  // [s][j]: values 128G + 32s + 16h + 4j.., as int8 (low | mask bit << 2) - 4
    int sc[4];
    #pragma unroll
    for (int s = 0; s < 4; ++s) {
      #pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t low = (q.w[j] >> (2 * s)) & 0x03030303u;
        const uint32_t bit = (hm.w[j] >> (4 * G + s)) & 0x01010101u;
        w[s][j] = lp_sub_bytes(low | (bit << 2), 4u);
      }
      sc[s] = lp_q3k_scale(LpScaleBytes{scales.at(blk)}, 8 * G + 2 * s + h);
    }
    lp_dot_block256<C, 4, false>(x, nb, b, 128 * G + 16 * h, 32, 0, [&](int s, int j) { return w[s][j]; }, sc,
                                 nullptr, lp_h2f(d[blk]), 0.0f, ncols, acc);
  }
};

// Q4_K / Q5_K: d f16, dmin f16, scales[12], (qh[32],) qs[128]. Sub-block j (32 values):
// d * sc_j * q - dmin * m_j. Value 64g + 32u + i (u = 0 low, 1 high nibble) is nibble u of qs[32g + i]
// (formats.nibbles(qs, 32)), in sub-block 2g + u; Q5_K adds bit v / 32 of qh[v % 32] as bit 4.
// x q8_k; the mins meet the 16-value sums (bsums). A piece is 16 qs bytes = 32 values; 8 lanes per
// super-block: lane l (g = l / 2, h = l % 2) takes qs[32g + 16h, +16): low nibbles are values
// 64g + 16h + t (sub-block 2g, bsum 4g + h), high nibbles 64g + 32 + 16h + t (sub-block 2g + 1, bsum
// 4g + 2 + h); Q5_K's high bits for both are in qh[16h, +16).
template <int F, LpLayout L> struct LpWeightK45 : LpFormat<F> {
  static constexpr bool Q5 = F == LP_FMT_Q5_K;
  static constexpr int PIECE = 32;
  using Cur = LpCursor<L, LpFormat<F>::BYTES>;
  LpField<lp_half, Cur::template STRIDE<2>> d, dmin;
  LpField<uint8_t, Cur::template STRIDE<12>> scales;
  LpField<uint8_t, Cur::template STRIDE<32>> qh = {};
  LpField<uint8_t, Cur::template STRIDE<128>> qs;
  int nb;  // blocks per row
  __device__ LpWeightK45(const void* base, int rows, int k) : nb(k / 256) {
    Cur c(base, rows, nb);
    d = c.template next<lp_half, 2>();
    dmin = c.template next<lp_half, 2>();
    scales = c.template next<uint8_t, 12>();
    if (Q5) qh = c.template next<uint8_t, 32>();
    qs = c.template next<uint8_t, 128>();
  }
  __device__ float value(size_t row, int i) const {
    const size_t blk = row * nb + i / 256;
    const int j = i % 256;
    int sc, mn;
    lp_k_scale_min(LpScaleBytes{scales.at(blk)}, j / 32, sc, mn);
    const float dl = lp_mul_rn(lp_h2f(d[blk]), (float)sc);
    const float ml = lp_mul_rn(lp_h2f(dmin[blk]), (float)mn);
    int q = (qs.at(blk)[32 * (j / 64) + j % 32] >> (4 * (j % 64 / 32))) & 0xF;
    if (Q5) q |= ((qh.at(blk)[j % 32] >> (j / 32)) & 1) << 4;
    return lp_mul_rn(dl, (float)q) - ml;
  }
  template <int C> __device__ void dot(size_t row, int p, const LpX& x, int ncols, float (&acc)[C]) const {
    const int b = p / 8, l = p % 8, g = l / 2, h = l % 2;
    const size_t blk = row * nb + b;
    const lp_u4 q = lp_load16(qs.at(blk) + 16 * l);
    uint32_t lo[4], hi[4];  // values 64g + 16h + 4j.. and 64g + 32 + 16h + 4j..
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
      lo[j] = q.w[j] & 0x0F0F0F0Fu;
      hi[j] = (q.w[j] >> 4) & 0x0F0F0F0Fu;
    }
    if constexpr (Q5) {
      const lp_u4 qb = lp_load16(qh.at(blk) + 16 * h);
      #pragma unroll
      for (int j = 0; j < 4; ++j) {
        lo[j] |= ((qb.w[j] >> (2 * g)) & 0x01010101u) << 4;
        hi[j] |= ((qb.w[j] >> (2 * g + 1)) & 0x01010101u) << 4;
      }
    }
    int sc[2], mn[2];  // sub-blocks 2g, 2g + 1
    lp_k_scale_min(LpScaleBytes{scales.at(blk)}, 2 * g, sc[0], mn[0]);
    lp_k_scale_min(LpScaleBytes{scales.at(blk)}, 2 * g + 1, sc[1], mn[1]);
    lp_dot_block256<C, 2, true>(x, nb, b, 64 * g + 16 * h, 32, 4 * g + h,
                                [&](int u, int j) { return u ? hi[j] : lo[j]; }, sc, mn, lp_h2f(d[blk]),
                                lp_h2f(dmin[blk]), ncols, acc);
  }
};
template <LpLayout L> struct LpWeight<LP_FMT_Q4_K, L> : LpWeightK45<LP_FMT_Q4_K, L> {
  using LpWeightK45<LP_FMT_Q4_K, L>::LpWeightK45;
};
template <LpLayout L> struct LpWeight<LP_FMT_Q5_K, L> : LpWeightK45<LP_FMT_Q5_K, L> {
  using LpWeightK45<LP_FMT_Q5_K, L>::LpWeightK45;
};

// Q6_K: ql[128], qh[64], scales[16] i8, d f16. Sub-block j (16 values): d * scales[j] * (q - 32), q the
// 6-bit value: in half G (128 values), value 128G + r has the nibble r / 64 of ql[64G + r % 64]
// (formats.nibbles(ql, 64)) and bits 2 * (r / 32) of qh[32G + r % 32] (formats.bits(qh, 2, 32)) as bits
// 4..5. x q8_k. A piece is 16 ql bytes = 32 values; 8 lanes per super-block: lane l (G = l / 4,
// u = l % 4) takes ql[64G + 16u, +16): low nibbles are values 128G + 16u + t (sub-block 8G + u, high
// bits at shift 2 * (u / 2)), high nibbles 128G + 64 + 16u + t (sub-block 8G + 4 + u, shift 4 + 2 * (u / 2));
// both read qh[32G + 16 * (u % 2), +16).
template <LpLayout L> struct LpWeight<LP_FMT_Q6_K, L> : LpFormat<LP_FMT_Q6_K> {
  static constexpr int PIECE = 32;
  using Cur = LpCursor<L, BYTES>;
  LpField<uint8_t, Cur::template STRIDE<128>> ql;
  LpField<uint8_t, Cur::template STRIDE<64>> qh;
  LpField<int8_t, Cur::template STRIDE<16>> scales;
  LpField<lp_half, Cur::template STRIDE<2>> d;
  int nb;  // blocks per row
  __device__ LpWeight(const void* base, int rows, int k) : nb(k / 256) {
    Cur c(base, rows, nb);
    ql = c.template next<uint8_t, 128>();
    qh = c.template next<uint8_t, 64>();
    scales = c.template next<int8_t, 16>();
    d = c.template next<lp_half, 2>();
  }
  // the 6-bit value j (0..255) of block blk, before the offset of 32
  __device__ int q6(size_t blk, int j) const {
    const int G = j / 128, r = j % 128;
    const int nib = (ql.at(blk)[64 * G + r % 64] >> (4 * (r / 64))) & 0xF;
    const int high = (qh.at(blk)[32 * G + r % 32] >> (2 * (r / 32))) & 3;
    return nib | (high << 4);
  }
  __device__ float value(size_t row, int i) const {
    const size_t blk = row * nb + i / 256;
    const int j = i % 256;
    const float dl = lp_mul_rn(lp_h2f(d[blk]), (float)scales.at(blk)[j / 16]);
    return dl * (float)(q6(blk, j) - 32);
  }
  template <int C> __device__ void dot(size_t row, int p, const LpX& x, int ncols, float (&acc)[C]) const {
    const int b = p / 8, l = p % 8, G = l / 4, u = l % 4, shift = 2 * (u / 2);
    const size_t blk = row * nb + b;
    const lp_u4 q = lp_load16(ql.at(blk) + 64 * G + 16 * u);
    const lp_u4 hb = lp_load16(qh.at(blk) + 32 * G + 16 * (u % 2));
    uint32_t lo[4], hi[4];  // values 128G + 16u + 4j.. and 128G + 64 + 16u + 4j.., as int8 q - 32
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
      lo[j] = lp_sub_bytes((q.w[j] & 0x0F0F0F0Fu) | (((hb.w[j] >> shift) & 0x03030303u) << 4), 32u);
      hi[j] = lp_sub_bytes(((q.w[j] >> 4) & 0x0F0F0F0Fu) | (((hb.w[j] >> (shift + 4)) & 0x03030303u) << 4), 32u);
    }
    const int sc[2] = {scales.at(blk)[8 * G + u], scales.at(blk)[8 * G + 4 + u]};
    lp_dot_block256<C, 2, false>(x, nb, b, 128 * G + 16 * u, 64, 0, [&](int v, int j) { return v ? hi[j] : lo[j]; },
                                 sc, nullptr, lp_h2f(d[blk]), 0.0f, ncols, acc);
  }
};

// --- one wave, one weight row ------------------------------------------------------------------------

// acc[c] = row `row` of w . activation column c, for c < ncols, summed over the whole wave: lane l takes
// pieces l, l + WAVE, ... (consecutive lanes, consecutive 16-byte chunks), then the lanes' partial sums
// meet in a butterfly, which leaves every lane with the same totals. Every lane of the wave must call it.
template <int F, int C, LpLayout L>
__device__ __forceinline__ void lp_row_dot(const LpWeight<F, L>& w, size_t row, const LpX& x, int ncols,
                                           float (&acc)[C]) {
  #pragma unroll
  for (int c = 0; c < C; ++c) acc[c] = 0.0f;
  const int pieces = x.k / LpWeight<F, L>::PIECE;
  for (int p = lp_lane(); p < pieces; p += WAVE) w.template dot<C>(row, p, x, ncols, acc);
  #pragma unroll
  for (int c = 0; c < C; ++c) acc[c] = lp_wave_sum(acc[c]);
}
