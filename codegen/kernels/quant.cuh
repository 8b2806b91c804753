// quant.cuh: the weight formats on the GPU, one struct per format (LpWeight<F>), shared by the mat-vec,
// embedding and tail kernels.
//
// Weights are stored "planar" (models/formats.py planes()): each field of a format's block layout is one
// contiguous plane [rows, blocks per row, field bytes], planes in field order, each starting on a
// 256-byte boundary. LpPlaneCursor walks those planes exactly as planes() does; each LpWeight<F> names its
// fields in the order of models/formats.py FORMATS, so the two can be checked side by side.
//
// Each LpWeight<F> has
//   value(row, i)  element i of the row, dequantized with the same float32 operations in the same
//                  order as models/formats.py's dequantizer (bit-exact; lp_mul keeps every product
//                  that feeds an add rounded on its own, as NumPy rounds it);
//   dot<C>(row, p, x, ncols, acc)
//                  one lane's share of the dot products of a weight row with C activation columns:
//                  "piece" p of the row (PIECE values whose quant bytes are one 16-byte load of the
//                  format's main plane), as integer dot products (lp_dot4) of the weight's quantized
//                  values with the activation's int8 values, the per-block scales applied in float.
//                  The pieces of a block are taken by consecutive lanes, so a wave reads consecutive
//                  16-byte chunks of the quant plane (a Q4_K super-block's 128-byte qs plane is
//                  8 lanes x 16 B; see each format's comment for its split).
// The activation a weight takes is ir/ops.py ACTIVATION_FORMAT: q8_0 (Q4_0, Q5_0, Q8_0), q8_1 (Q4_1,
// Q5_1), q8_k (the K-quants: 256-value blocks, f32 scale, 16-value sums), f16 values (F16 weights).
// Sums equal the CPU twin's x_values @ dequantize(W)^T up to float rounding: every product of
// quantized integers is exact, and a block's terms are summed in a different order than BLAS does.
#pragma once
#include "common.cuh"

// Names here are prefixed (LP_FMT_, LpWeight, lp_load_u4) so that this header can share a translation
// unit with the other families' kernel sources, which define their own LP_Q4_K, LpW and lp_load16.
enum LpWeightFormat { LP_FMT_F32, LP_FMT_F16, LP_FMT_BF16, LP_FMT_Q4_0, LP_FMT_Q4_1, LP_FMT_Q5_0, LP_FMT_Q5_1,
                      LP_FMT_Q8_0, LP_FMT_Q2_K, LP_FMT_Q3_K, LP_FMT_Q4_K, LP_FMT_Q5_K, LP_FMT_Q6_K };
// activation formats: the first three are common.cuh's lp_q8_rows codes
enum LpActFormat { LP_ACT_Q8_0 = 0, LP_ACT_Q8_1 = 1, LP_ACT_Q8_K = 2, LP_ACT_F16 = 3, LP_ACT_NONE = 4 };

// --- vendor-specific pieces this header needs beyond vendor.h --------------------------------------

// 16 bytes as four 32-bit words, read with one 128-bit load (p must be 16-byte aligned)
struct LpU4 {
  uint32_t v[4];
};
#if defined(LP_CUDA)
__device__ __forceinline__ LpU4 lp_load_u4(const void* p) {
  const uint4 u = *(const uint4*)p;
  return {{u.x, u.y, u.z, u.w}};
}
// a float product rounded on its own: never contracted into an FMA with a following add
__device__ __forceinline__ float lp_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float lp_bits_h2f(uint16_t b) { return __half2float(__ushort_as_half(b)); }
#else
typedef uint32_t lp_u32x4_t __attribute__((ext_vector_type(4)));
__device__ __forceinline__ LpU4 lp_load_u4(const void* p) {
  const lp_u32x4_t u = *(const lp_u32x4_t*)p;
  return {{u.x, u.y, u.z, u.w}};
}
__device__ __forceinline__ float lp_mul(float a, float b) {
  #pragma clang fp contract(off)
  return a * b;
}
__device__ __forceinline__ float lp_bits_h2f(uint16_t b) { return (float)__builtin_bit_cast(_Float16, b); }
#endif

// --- byte tricks used to turn packed quants into int8 operands of lp_dot4 ---------------------------

// per byte b - c as int8, for bytes b < 128 and c <= 128 (no borrow crosses a byte: each byte is
// first lifted by 128)
__device__ __forceinline__ uint32_t lp_sub8x4(uint32_t b, uint32_t c) {
  return ((b | 0x80808080u) - c) ^ 0x80808080u;
}

// bits 0..3 of x as bit 0 of bytes 0..3 (the four partial products cannot carry into each other)
__device__ __forceinline__ uint32_t lp_bits4(uint32_t x) { return ((x & 0xFu) * 0x00204081u) & 0x01010101u; }

__device__ __forceinline__ int lp_idot4(uint32_t a, uint32_t b, int c) { return lp_dot4((int)a, (int)b, c); }

// --- field planes ---------------------------------------------------------------------------------

// models/formats.py planes(): field after field, each plane [rows, blocks, bytes] on a 256-byte boundary
struct LpPlaneCursor {
  const char* p;
  size_t blocks;  // rows * blocks per row
  __device__ LpPlaneCursor(const void* base, int rows, int blocks_per_row)
      : p((const char*)base), blocks((size_t)rows * blocks_per_row) {}
  template <class T> __device__ const T* next(int bytes_per_block) {
    const T* here = (const T*)p;
    p += lp_align(blocks * bytes_per_block);
    return here;
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

// --- scale unpacking shared by several formats ----------------------------------------------------

// Q4_K / Q5_K: 6-bit scale and min of sub-block j (0..7) from the 12 scale bytes (formats.k_scale_min)
__device__ __forceinline__ void lp_k_scale_min(const uint8_t* s, int j, int& sc, int& mn) {
  if (j < 4) {
    sc = s[j] & 63;
    mn = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q3_K: signed 6-bit scale of sub-block j (0..15) from the 12 scale bytes (formats.q3k_scales)
__device__ __forceinline__ int lp_q3k_scale(const uint8_t* s, int j) {
  const int lo = j < 8 ? s[j] & 0x0F : s[j - 8] >> 4;
  const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

// --- the formats ------------------------------------------------------------------------------------

template <int F> struct LpWeight;

// F32 / F16 / BF16: one plane "v" [rows, k]
template <> struct LpWeight<LP_FMT_F32> {
  static constexpr int BLOCK = 1, ACT = LP_ACT_NONE;
  const float* v;
  int k;
  __device__ LpWeight(const void* base, int rows, int k_) : k(k_) { v = LpPlaneCursor(base, rows, k).next<float>(4); }
  __device__ float value(size_t row, int i) const { return v[row * k + i]; }
};

template <> struct LpWeight<LP_FMT_BF16> {
  static constexpr int BLOCK = 1, ACT = LP_ACT_NONE;
  const uint16_t* v;
  int k;
  __device__ LpWeight(const void* base, int rows, int k_) : k(k_) { v = LpPlaneCursor(base, rows, k).next<uint16_t>(2); }
  __device__ float value(size_t row, int i) const { return __builtin_bit_cast(float, (uint32_t)v[row * k + i] << 16); }
};

// F16 x f16 activations: a piece is 8 values (16 bytes of the row); products and sums in float.
template <> struct LpWeight<LP_FMT_F16> {
  static constexpr int BLOCK = 1, PIECE = 8, ACT = LP_ACT_F16;
  const uint16_t* v;
  int k;
  __device__ LpWeight(const void* base, int rows, int k_) : k(k_) { v = LpPlaneCursor(base, rows, k).next<uint16_t>(2); }
  __device__ float value(size_t row, int i) const { return lp_bits_h2f(v[row * k + i]); }

  template <int C> __device__ void dot(size_t row, int p, const LpX& x, int ncols, float (&acc)[C]) const {
    const LpU4 w = lp_load_u4(v + row * k + 8 * p);
    float wf[8];
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
      wf[2 * j] = lp_bits_h2f((uint16_t)w.v[j]);
      wf[2 * j + 1] = lp_bits_h2f((uint16_t)(w.v[j] >> 16));
    }
    #pragma unroll
    for (int c = 0; c < C; ++c) {
      if (c < ncols) {
        const LpU4 a = lp_load_u4(x.h + (size_t)c * k + 8 * p);
        float s = 0.0f;
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
          s += wf[2 * j] * lp_bits_h2f((uint16_t)a.v[j]);
          s += wf[2 * j + 1] * lp_bits_h2f((uint16_t)(a.v[j] >> 16));
        }
        acc[c] += s;
      }
    }
  }
};

// Q8_0: d f16, qs[32] i8. x q8_0. A piece is half a block: 16 qs bytes; 2 lanes per block.
template <> struct LpWeight<LP_FMT_Q8_0> {
  static constexpr int BLOCK = 32, PIECE = 16, ACT = LP_ACT_Q8_0;
  const lp_half* d;
  const int8_t* qs;
  int k, nb;
  __device__ LpWeight(const void* base, int rows, int k_) : k(k_), nb(k_ / 32) {
    LpPlaneCursor c(base, rows, nb);
    d = c.next<lp_half>(2);
    qs = c.next<int8_t>(32);
  }
  __device__ float value(size_t row, int i) const {  // qs * d
    const size_t blk = row * nb + i / 32;
    return (float)qs[blk * 32 + i % 32] * lp_h2f(d[blk]);
  }
  template <int C> __device__ void dot(size_t row, int p, const LpX& x, int ncols, float (&acc)[C]) const {
    const int b = p / 2, h = p % 2;  // block b, values [16h, 16h + 16)
    const size_t blk = row * nb + b;
    const LpU4 q = lp_load_u4(qs + blk * 32 + 16 * h);
    const float dw = lp_h2f(d[blk]);
    #pragma unroll
    for (int c = 0; c < C; ++c) {
      if (c < ncols) {
        const LpU4 a = lp_load_u4(x.qs + (size_t)c * k + 32 * b + 16 * h);
        int s = 0;
        #pragma unroll
        for (int j = 0; j < 4; ++j) s = lp_idot4(q.v[j], a.v[j], s);
        acc[c] += lp_h2f(x.d[(size_t)c * nb + b]) * dw * (float)s;
      }
    }
  }
};

// The 32-value formats with 4-bit (+1 high bit) quants: a piece is one block, its 16 qs bytes: low
// nibbles are values 0..15, high nibbles values 16..31 (formats.nibbles(qs, 16)); the high bit of
// value v is bit v of qh. Activations: the block's 32 int8 values, two 16-byte loads.
// Q4_0: d f16, qs[16]: d * (q - 8). x q8_0.
template <> struct LpWeight<LP_FMT_Q4_0> {
  static constexpr int BLOCK = 32, PIECE = 32, ACT = LP_ACT_Q8_0;
  const lp_half* d;
  const uint8_t* qs;
  int k, nb;
  __device__ LpWeight(const void* base, int rows, int k_) : k(k_), nb(k_ / 32) {
    LpPlaneCursor c(base, rows, nb);
    d = c.next<lp_half>(2);
    qs = c.next<uint8_t>(16);
  }
  __device__ float value(size_t row, int i) const {
    const size_t blk = row * nb + i / 32;
    const int j = i % 32;
    const int q = (j < 16 ? qs[blk * 16 + j] & 0xF : qs[blk * 16 + j - 16] >> 4) - 8;
    return lp_h2f(d[blk]) * (float)q;
  }
  template <int C> __device__ void dot(size_t row, int p, const LpX& x, int ncols, float (&acc)[C]) const {
    const size_t blk = row * nb + p;
    const LpU4 q = lp_load_u4(qs + blk * 16);
    uint32_t lo[4], hi[4];  // values 4j.. and 16 + 4j.., as int8 q - 8
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
      lo[j] = lp_sub8x4(q.v[j] & 0x0F0F0F0Fu, 0x08080808u);
      hi[j] = lp_sub8x4((q.v[j] >> 4) & 0x0F0F0F0Fu, 0x08080808u);
    }
    const float dw = lp_h2f(d[blk]);
    #pragma unroll
    for (int c = 0; c < C; ++c) {
      if (c < ncols) {
        const int8_t* xq = x.qs + (size_t)c * k + 32 * p;
        const LpU4 a0 = lp_load_u4(xq), a1 = lp_load_u4(xq + 16);
        int s = 0;
        #pragma unroll
        for (int j = 0; j < 4; ++j) s = lp_idot4(hi[j], a1.v[j], lp_idot4(lo[j], a0.v[j], s));
        acc[c] += lp_h2f(x.d[(size_t)c * nb + p]) * dw * (float)s;
      }
    }
  }
};

// Q4_1: d f16, m f16, qs[16]: d * q + m. x q8_1; the min meets the exact sum of the block's x values.
template <> struct LpWeight<LP_FMT_Q4_1> {
  static constexpr int BLOCK = 32, PIECE = 32, ACT = LP_ACT_Q8_1;
  const lp_half *d, *m;
  const uint8_t* qs;
  int k, nb;
  __device__ LpWeight(const void* base, int rows, int k_) : k(k_), nb(k_ / 32) {
    LpPlaneCursor c(base, rows, nb);
    d = c.next<lp_half>(2);
    m = c.next<lp_half>(2);
    qs = c.next<uint8_t>(16);
  }
  __device__ float value(size_t row, int i) const {
    const size_t blk = row * nb + i / 32;
    const int j = i % 32;
    const int q = j < 16 ? qs[blk * 16 + j] & 0xF : qs[blk * 16 + j - 16] >> 4;
    return lp_mul(lp_h2f(d[blk]), (float)q) + lp_h2f(m[blk]);
  }
  template <int C> __device__ void dot(size_t row, int p, const LpX& x, int ncols, float (&acc)[C]) const {
    const size_t blk = row * nb + p;
    const LpU4 q = lp_load_u4(qs + blk * 16);
    uint32_t lo[4], hi[4];
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
      lo[j] = q.v[j] & 0x0F0F0F0Fu;
      hi[j] = (q.v[j] >> 4) & 0x0F0F0F0Fu;
    }
    const float dw = lp_h2f(d[blk]), mw = lp_h2f(m[blk]);
    #pragma unroll
    for (int c = 0; c < C; ++c) {
      if (c < ncols) {
        const int8_t* xq = x.qs + (size_t)c * k + 32 * p;
        const LpU4 a0 = lp_load_u4(xq), a1 = lp_load_u4(xq + 16);
        int s = 0, xsum = 0;
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
          s = lp_idot4(hi[j], a1.v[j], lp_idot4(lo[j], a0.v[j], s));
          xsum = lp_idot4(0x01010101u, a1.v[j], lp_idot4(0x01010101u, a0.v[j], xsum));
        }
        acc[c] += lp_h2f(x.d[(size_t)c * nb + p]) * (dw * (float)s + mw * (float)xsum);
      }
    }
  }
};

// Q5_0: d f16, qh u32, qs[16]: d * ((nibble | high bit << 4) - 16). x q8_0.
template <> struct LpWeight<LP_FMT_Q5_0> {
  static constexpr int BLOCK = 32, PIECE = 32, ACT = LP_ACT_Q8_0;
  const lp_half* d;
  const uint32_t* qh;
  const uint8_t* qs;
  int k, nb;
  __device__ LpWeight(const void* base, int rows, int k_) : k(k_), nb(k_ / 32) {
    LpPlaneCursor c(base, rows, nb);
    d = c.next<lp_half>(2);
    qh = c.next<uint32_t>(4);
    qs = c.next<uint8_t>(16);
  }
  __device__ float value(size_t row, int i) const {
    const size_t blk = row * nb + i / 32;
    const int j = i % 32;
    const int nib = j < 16 ? qs[blk * 16 + j] & 0xF : qs[blk * 16 + j - 16] >> 4;
    const int q = (nib | (((qh[blk] >> j) & 1) << 4)) - 16;
    return lp_h2f(d[blk]) * (float)q;
  }
  template <int C> __device__ void dot(size_t row, int p, const LpX& x, int ncols, float (&acc)[C]) const {
    const size_t blk = row * nb + p;
    const LpU4 q = lp_load_u4(qs + blk * 16);
    const uint32_t h = qh[blk];
    uint32_t lo[4], hi[4];  // values 4j.. (high bits 4j..) and 16 + 4j.. (high bits 16 + 4j..)
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
      lo[j] = lp_sub8x4((q.v[j] & 0x0F0F0F0Fu) | (lp_bits4(h >> (4 * j)) << 4), 0x10101010u);
      hi[j] = lp_sub8x4(((q.v[j] >> 4) & 0x0F0F0F0Fu) | (lp_bits4(h >> (16 + 4 * j)) << 4), 0x10101010u);
    }
    const float dw = lp_h2f(d[blk]);
    #pragma unroll
    for (int c = 0; c < C; ++c) {
      if (c < ncols) {
        const int8_t* xq = x.qs + (size_t)c * k + 32 * p;
        const LpU4 a0 = lp_load_u4(xq), a1 = lp_load_u4(xq + 16);
        int s = 0;
        #pragma unroll
        for (int j = 0; j < 4; ++j) s = lp_idot4(hi[j], a1.v[j], lp_idot4(lo[j], a0.v[j], s));
        acc[c] += lp_h2f(x.d[(size_t)c * nb + p]) * dw * (float)s;
      }
    }
  }
};

// Q5_1: d f16, m f16, qh u32, qs[16]: d * (nibble | high bit << 4) + m. x q8_1.
template <> struct LpWeight<LP_FMT_Q5_1> {
  static constexpr int BLOCK = 32, PIECE = 32, ACT = LP_ACT_Q8_1;
  const lp_half *d, *m;
  const uint32_t* qh;
  const uint8_t* qs;
  int k, nb;
  __device__ LpWeight(const void* base, int rows, int k_) : k(k_), nb(k_ / 32) {
    LpPlaneCursor c(base, rows, nb);
    d = c.next<lp_half>(2);
    m = c.next<lp_half>(2);
    qh = c.next<uint32_t>(4);
    qs = c.next<uint8_t>(16);
  }
  __device__ float value(size_t row, int i) const {
    const size_t blk = row * nb + i / 32;
    const int j = i % 32;
    const int nib = j < 16 ? qs[blk * 16 + j] & 0xF : qs[blk * 16 + j - 16] >> 4;
    const int q = nib | (((qh[blk] >> j) & 1) << 4);
    return lp_mul(lp_h2f(d[blk]), (float)q) + lp_h2f(m[blk]);
  }
  template <int C> __device__ void dot(size_t row, int p, const LpX& x, int ncols, float (&acc)[C]) const {
    const size_t blk = row * nb + p;
    const LpU4 q = lp_load_u4(qs + blk * 16);
    const uint32_t h = qh[blk];
    uint32_t lo[4], hi[4];
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
      lo[j] = (q.v[j] & 0x0F0F0F0Fu) | (lp_bits4(h >> (4 * j)) << 4);
      hi[j] = ((q.v[j] >> 4) & 0x0F0F0F0Fu) | (lp_bits4(h >> (16 + 4 * j)) << 4);
    }
    const float dw = lp_h2f(d[blk]), mw = lp_h2f(m[blk]);
    #pragma unroll
    for (int c = 0; c < C; ++c) {
      if (c < ncols) {
        const int8_t* xq = x.qs + (size_t)c * k + 32 * p;
        const LpU4 a0 = lp_load_u4(xq), a1 = lp_load_u4(xq + 16);
        int s = 0, xsum = 0;
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
          s = lp_idot4(hi[j], a1.v[j], lp_idot4(lo[j], a0.v[j], s));
          xsum = lp_idot4(0x01010101u, a1.v[j], lp_idot4(0x01010101u, a0.v[j], xsum));
        }
        acc[c] += lp_h2f(x.d[(size_t)c * nb + p]) * (dw * (float)s + mw * (float)xsum);
      }
    }
  }
};

// Q2_K: scales[16], qs[64], d f16, dmin f16. Sub-block j (16 values): d * (scales[j] & 15) * q
// - dmin * (scales[j] >> 4), q the 2-bit value: value 128G + 32s + i is bits 2s of qs[32G + i]
// (formats.bits(qs, 2, 32)). x q8_k. A piece is 16 qs bytes = 64 values; 4 lanes per super-block:
// lane l (G = l / 2, h = l % 2) takes qs[32G + 16h, +16): values 128G + 32s + 16h + t (s < 4, t < 16),
// sub-blocks 8G + 2s + h.
template <> struct LpWeight<LP_FMT_Q2_K> {
  static constexpr int BLOCK = 256, PIECE = 64, ACT = LP_ACT_Q8_K;
  const uint8_t *scales, *qs;
  const lp_half *d, *dmin;
  int k, nb;
  __device__ LpWeight(const void* base, int rows, int k_) : k(k_), nb(k_ / 256) {
    LpPlaneCursor c(base, rows, nb);
    scales = c.next<uint8_t>(16);
    qs = c.next<uint8_t>(64);
    d = c.next<lp_half>(2);
    dmin = c.next<lp_half>(2);
  }
  __device__ float value(size_t row, int i) const {
    const size_t blk = row * nb + i / 256;
    const int j = i % 256;
    const int sc = scales[blk * 16 + j / 16];
    const float dl = lp_mul(lp_h2f(d[blk]), (float)(sc & 0xF));
    const float ml = lp_mul(lp_h2f(dmin[blk]), (float)(sc >> 4));
    const int q = (qs[blk * 64 + 32 * (j / 128) + j % 32] >> (2 * (j % 128 / 32))) & 3;
    return lp_mul(dl, (float)q) - ml;
  }
  template <int C> __device__ void dot(size_t row, int p, const LpX& x, int ncols, float (&acc)[C]) const {
    const int b = p / 4, l = p % 4, G = l / 2, h = l % 2;
    const size_t blk = row * nb + b;
    const LpU4 q = lp_load_u4(qs + blk * 64 + 32 * G + 16 * h);
    int sc[4], mn[4];  // sub-block 8G + 2s + h
    #pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int v = scales[blk * 16 + 8 * G + 2 * s + h];
      sc[s] = v & 0xF;
      mn[s] = v >> 4;
    }
    const float dd = lp_h2f(d[blk]), dm = lp_h2f(dmin[blk]);
    #pragma unroll
    for (int c = 0; c < C; ++c) {
      if (c < ncols) {
        const int8_t* xq = x.qs + (size_t)c * k + 256 * b + 128 * G + 16 * h;
        const int16_t* bs = x.bsums + (size_t)c * (k / 16) + 16 * b + 8 * G + h;  // + 2s: sub-block 8G + 2s + h
        int isum = 0, msum = 0;
        #pragma unroll
        for (int s = 0; s < 4; ++s) {
          const LpU4 a = lp_load_u4(xq + 32 * s);
          int dot = 0;
          #pragma unroll
          for (int j = 0; j < 4; ++j) dot = lp_idot4((q.v[j] >> (2 * s)) & 0x03030303u, a.v[j], dot);
          isum += sc[s] * dot;
          msum += mn[s] * bs[2 * s];
        }
        acc[c] += x.dk[(size_t)c * nb + b] * (dd * (float)isum - dm * (float)msum);
      }
    }
  }
};

// Q3_K: hmask[32], qs[64], scales[12], d f16. Sub-block j (16 values): d * scale_j * q, q = the low 2
// bits - 4 where the value's hmask bit is clear: value 128G + 32s + i has its low bits at bit 2s of
// qs[32G + i] (formats.bits(qs, 2, 32)), value v its mask bit at bit v / 32 of hmask[v % 32]
// (formats.bits(hmask, 1, 32)). x q8_k. Pieces as Q2_K: lane l (G = l / 2, h = l % 2) takes
// qs[32G + 16h, +16) and hmask[16h, +16) (mask bits 4G + s).
template <> struct LpWeight<LP_FMT_Q3_K> {
  static constexpr int BLOCK = 256, PIECE = 64, ACT = LP_ACT_Q8_K;
  const uint8_t *hmask, *qs, *scales;
  const lp_half* d;
  int k, nb;
  __device__ LpWeight(const void* base, int rows, int k_) : k(k_), nb(k_ / 256) {
    LpPlaneCursor c(base, rows, nb);
    hmask = c.next<uint8_t>(32);
    qs = c.next<uint8_t>(64);
    scales = c.next<uint8_t>(12);
    d = c.next<lp_half>(2);
  }
  __device__ float value(size_t row, int i) const {
    const size_t blk = row * nb + i / 256;
    const int j = i % 256;
    const float dl = lp_mul(lp_h2f(d[blk]), (float)lp_q3k_scale(scales + blk * 12, j / 16));
    const int low = (qs[blk * 64 + 32 * (j / 128) + j % 32] >> (2 * (j % 128 / 32))) & 3;
    const int high = ((hmask[blk * 32 + j % 32] >> (j / 32)) & 1) ^ 1;  // a clear bit means "subtract 4"
    return dl * (float)(low - (high << 2));
  }
  template <int C> __device__ void dot(size_t row, int p, const LpX& x, int ncols, float (&acc)[C]) const {
    const int b = p / 4, l = p % 4, G = l / 2, h = l % 2;
    const size_t blk = row * nb + b;
    const LpU4 q = lp_load_u4(qs + blk * 64 + 32 * G + 16 * h);
    const LpU4 hm = lp_load_u4(hmask + blk * 32 + 16 * h);
    uint32_t w[4][4];  // [s][j]: values 128G + 32s + 16h + 4j.., as int8 (low | mask bit << 2) - 4
    int sc[4];
    #pragma unroll
    for (int s = 0; s < 4; ++s) {
      #pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t low = (q.v[j] >> (2 * s)) & 0x03030303u;
        const uint32_t bit = (hm.v[j] >> (4 * G + s)) & 0x01010101u;
        w[s][j] = lp_sub8x4(low | (bit << 2), 0x04040404u);
      }
      sc[s] = lp_q3k_scale(scales + blk * 12, 8 * G + 2 * s + h);
    }
    const float dd = lp_h2f(d[blk]);
    #pragma unroll
    for (int c = 0; c < C; ++c) {
      if (c < ncols) {
        const int8_t* xq = x.qs + (size_t)c * k + 256 * b + 128 * G + 16 * h;
        int isum = 0;
        #pragma unroll
        for (int s = 0; s < 4; ++s) {
          const LpU4 a = lp_load_u4(xq + 32 * s);
          int dot = 0;
          #pragma unroll
          for (int j = 0; j < 4; ++j) dot = lp_idot4(w[s][j], a.v[j], dot);
          isum += sc[s] * dot;
        }
        acc[c] += x.dk[(size_t)c * nb + b] * (dd * (float)isum);
      }
    }
  }
};

// Q4_K / Q5_K: d f16, dmin f16, scales[12], (qh[32],) qs[128]. Sub-block j (32 values):
// d * sc_j * q - dmin * m_j. Value 64g + 32u + i (u = 0 low, 1 high nibble) is nibble u of qs[32g + i]
// (formats.nibbles(qs, 32)), in sub-block 2g + u; Q5_K adds bit v / 32 of qh[v % 32] as bit 4.
// x q8_k; the mins meet the 16-value sums (bsums). A piece is 16 qs bytes = 32 values; 8 lanes per
// super-block: lane l (g = l / 2, h = l % 2) takes qs[32g + 16h, +16): low nibbles are values
// 64g + 16h + t (sub-block 2g, bsum 4g + h), high nibbles 64g + 32 + 16h + t (sub-block 2g + 1, bsum
// 4g + 2 + h); Q5_K's high bits for both are in qh[16h, +16).
template <bool Q5> struct LpWeightK45 {
  static constexpr int BLOCK = 256, PIECE = 32, ACT = LP_ACT_Q8_K;
  const lp_half *d, *dmin;
  const uint8_t *scales, *qh, *qs;
  int k, nb;
  __device__ LpWeightK45(const void* base, int rows, int k_) : k(k_), nb(k_ / 256) {
    LpPlaneCursor c(base, rows, nb);
    d = c.next<lp_half>(2);
    dmin = c.next<lp_half>(2);
    scales = c.next<uint8_t>(12);
    qh = Q5 ? c.next<uint8_t>(32) : nullptr;
    qs = c.next<uint8_t>(128);
  }
  __device__ float value(size_t row, int i) const {
    const size_t blk = row * nb + i / 256;
    const int j = i % 256;
    int sc, mn;
    lp_k_scale_min(scales + blk * 12, j / 32, sc, mn);
    const float dl = lp_mul(lp_h2f(d[blk]), (float)sc);
    const float ml = lp_mul(lp_h2f(dmin[blk]), (float)mn);
    int q = (qs[blk * 128 + 32 * (j / 64) + j % 32] >> (4 * (j % 64 / 32))) & 0xF;
    if (Q5) q |= ((qh[blk * 32 + j % 32] >> (j / 32)) & 1) << 4;
    return lp_mul(dl, (float)q) - ml;
  }
  template <int C> __device__ void dot(size_t row, int p, const LpX& x, int ncols, float (&acc)[C]) const {
    const int b = p / 8, l = p % 8, g = l / 2, h = l % 2;
    const size_t blk = row * nb + b;
    const LpU4 q = lp_load_u4(qs + blk * 128 + 16 * l);
    uint32_t lo[4], hi[4];  // values 64g + 16h + 4j.. and 64g + 32 + 16h + 4j..
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
      lo[j] = q.v[j] & 0x0F0F0F0Fu;
      hi[j] = (q.v[j] >> 4) & 0x0F0F0F0Fu;
    }
    if constexpr (Q5) {
      const LpU4 qb = lp_load_u4(qh + blk * 32 + 16 * h);
      #pragma unroll
      for (int j = 0; j < 4; ++j) {
        lo[j] |= ((qb.v[j] >> (2 * g)) & 0x01010101u) << 4;
        hi[j] |= ((qb.v[j] >> (2 * g + 1)) & 0x01010101u) << 4;
      }
    }
    int sc0, m0, sc1, m1;
    lp_k_scale_min(scales + blk * 12, 2 * g, sc0, m0);
    lp_k_scale_min(scales + blk * 12, 2 * g + 1, sc1, m1);
    const float dd = lp_h2f(d[blk]), dm = lp_h2f(dmin[blk]);
    #pragma unroll
    for (int c = 0; c < C; ++c) {
      if (c < ncols) {
        const int8_t* xq = x.qs + (size_t)c * k + 256 * b + 64 * g + 16 * h;
        const int16_t* bs = x.bsums + (size_t)c * (k / 16) + 16 * b + 4 * g + h;
        const LpU4 a0 = lp_load_u4(xq), a1 = lp_load_u4(xq + 32);
        int s0 = 0, s1 = 0;
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
          s0 = lp_idot4(lo[j], a0.v[j], s0);
          s1 = lp_idot4(hi[j], a1.v[j], s1);
        }
        const int isum = sc0 * s0 + sc1 * s1, msum = m0 * bs[0] + m1 * bs[2];
        acc[c] += x.dk[(size_t)c * nb + b] * (dd * (float)isum - dm * (float)msum);
      }
    }
  }
};
template <> struct LpWeight<LP_FMT_Q4_K> : LpWeightK45<false> {
  using LpWeightK45<false>::LpWeightK45;
};
template <> struct LpWeight<LP_FMT_Q5_K> : LpWeightK45<true> {
  using LpWeightK45<true>::LpWeightK45;
};

// Q6_K: ql[128], qh[64], scales[16] i8, d f16. Sub-block j (16 values): d * scales[j] * (q - 32), q the
// 6-bit value: in half G (128 values), value 128G + r has the nibble r / 64 of ql[64G + r % 64]
// (formats.nibbles(ql, 64)) and bits 2 * (r / 32) of qh[32G + r % 32] (formats.bits(qh, 2, 32)) as bits
// 4..5. x q8_k. A piece is 16 ql bytes = 32 values; 8 lanes per super-block: lane l (G = l / 4,
// u = l % 4) takes ql[64G + 16u, +16): low nibbles are values 128G + 16u + t (sub-block 8G + u, high
// bits at shift 2 * (u / 2)), high nibbles 128G + 64 + 16u + t (sub-block 8G + 4 + u, shift 4 + 2 * (u / 2));
// both read qh[32G + 16 * (u % 2), +16).
template <> struct LpWeight<LP_FMT_Q6_K> {
  static constexpr int BLOCK = 256, PIECE = 32, ACT = LP_ACT_Q8_K;
  const uint8_t *ql, *qh;
  const int8_t* scales;
  const lp_half* d;
  int k, nb;
  __device__ LpWeight(const void* base, int rows, int k_) : k(k_), nb(k_ / 256) {
    LpPlaneCursor c(base, rows, nb);
    ql = c.next<uint8_t>(128);
    qh = c.next<uint8_t>(64);
    scales = c.next<int8_t>(16);
    d = c.next<lp_half>(2);
  }
  __device__ float value(size_t row, int i) const {
    const size_t blk = row * nb + i / 256;
    const int j = i % 256, G = j / 128, r = j % 128;
    const float dl = lp_mul(lp_h2f(d[blk]), (float)scales[blk * 16 + j / 16]);
    const int nib = (ql[blk * 128 + 64 * G + r % 64] >> (4 * (r / 64))) & 0xF;
    const int high = (qh[blk * 64 + 32 * G + r % 32] >> (2 * (r / 32))) & 3;
    return dl * (float)((nib | (high << 4)) - 32);
  }
  template <int C> __device__ void dot(size_t row, int p, const LpX& x, int ncols, float (&acc)[C]) const {
    const int b = p / 8, l = p % 8, G = l / 4, u = l % 4, shift = 2 * (u / 2);
    const size_t blk = row * nb + b;
    const LpU4 q = lp_load_u4(ql + blk * 128 + 64 * G + 16 * u);
    const LpU4 hb = lp_load_u4(qh + blk * 64 + 32 * G + 16 * (u % 2));
    uint32_t lo[4], hi[4];  // values 128G + 16u + 4j.. and 128G + 64 + 16u + 4j.., as int8 q - 32
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
      lo[j] = lp_sub8x4((q.v[j] & 0x0F0F0F0Fu) | (((hb.v[j] >> shift) & 0x03030303u) << 4), 0x20202020u);
      hi[j] = lp_sub8x4(((q.v[j] >> 4) & 0x0F0F0F0Fu) | (((hb.v[j] >> (shift + 4)) & 0x03030303u) << 4), 0x20202020u);
    }
    const int sc0 = scales[blk * 16 + 8 * G + u], sc1 = scales[blk * 16 + 8 * G + 4 + u];
    const float dd = lp_h2f(d[blk]);
    #pragma unroll
    for (int c = 0; c < C; ++c) {
      if (c < ncols) {
        const int8_t* xq = x.qs + (size_t)c * k + 256 * b + 128 * G + 16 * u;
        const LpU4 a0 = lp_load_u4(xq), a1 = lp_load_u4(xq + 64);
        int s0 = 0, s1 = 0;
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
          s0 = lp_idot4(lo[j], a0.v[j], s0);
          s1 = lp_idot4(hi[j], a1.v[j], s1);
        }
        acc[c] += x.dk[(size_t)c * nb + b] * (dd * (float)(sc0 * s0 + sc1 * s1));
      }
    }
  }
};

// --- one wave, one weight row ------------------------------------------------------------------------

// acc[c] = row `row` of w . activation column c, for c < ncols, summed over the whole wave: lane l takes
// pieces l, l + WAVE, ... (consecutive lanes, consecutive 16-byte chunks), then the lanes' partial sums
// meet in a butterfly, which leaves every lane with the same totals. Every lane of the wave must call it.
template <int F, int C>
__device__ __forceinline__ void lp_row_dot(const LpWeight<F>& w, size_t row, const LpX& x, int ncols, float (&acc)[C]) {
  #pragma unroll
  for (int c = 0; c < C; ++c) acc[c] = 0.0f;
  const int pieces = x.k / LpWeight<F>::PIECE;
  for (int p = lp_lane(); p < pieces; p += WAVE) w.template dot<C>(row, p, x, ncols, acc);
  #pragma unroll
  for (int c = 0; c < C; ++c) acc[c] = lp_wave_sum(acc[c]);
}
