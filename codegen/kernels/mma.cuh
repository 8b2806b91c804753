// mma.cuh: matrix-core fragments on top of vendor.h, one CUDA and one HIP implementation each.
//
// NVIDIA sm_80+ (LP_MMA): warp-wide mma.sync through inline PTX.
//   lp_mma_i8_k32: m16n8k32 s8 x s8 -> s32      A 16x32 (4 regs), B 32x8 (2 regs), C/D 16x8 (4 regs)
//   lp_mma_i8_k16: m16n8k16 s8 x s8 -> s32      A 16x16 (2 regs), B 16x8 (1 reg),  C/D 16x8 (4 regs)
//   lp_mma_f16_k16: m16n8k16 f16 x f16 -> f32   A 16x16 (4 regs), B 16x8 (2 regs), C/D 16x8 (4 regs)
//   With g = lane / 4 and t = lane % 4, and rows of A / columns of B held k-contiguous as 32-bit words
//   (4 int8 or 2 f16 values each), a lane holds: A word t of rows g and g + 8 (a0, a1), word t + 4 of the
//   same rows (a2, a3; k32 / f16 only); B word t (b0) and t + 4 (b1) of column g; C elements
//   (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1). lp_frag_row / lp_frag_col say so in code.
//
// AMD RDNA3 gfx11 (LP_WMMA): wave32 WMMA builtins.
//   lp_wmma_i8: 16x16x16 iu8 (signed) -> i32    A: lane l holds row l % 16, k 0..15 (16 bytes);
//   lp_wmma_f16: 16x16x16 f16 -> f32            B: lane l holds column l % 16, k 0..15 (16 bytes / halves);
//   lanes 16..31 repeat lanes 0..15 for A and B. C/D: 8 registers, element e of lane l is
//   (row 2e + l / 16, column l % 16).
//
// Kernels use the vendor-neutral layer built on these (LP_FRAGMENTS: the target has fragments):
//   LP_FRAG_N, LP_FRAG_EL: a C fragment's columns (it has 16 rows) and a lane's accumulators of it
//   (LpFragAcc); lp_frag_row / lp_frag_col: the row and column of accumulator element e.
//   LpFragA<W>, LpFragB<W>: a lane's part of an A operand (16 rows) or a B operand (LP_FRAG_N columns),
//   W 32-bit words of k each; lp_frag_a / lp_frag_b load them from a tile in shared memory whose rows
//   hold k contiguously (B's columns are its rows): any type with word(row, w), the 32-bit word w of a
//   row (NVIDIA), and words(row, w0, r), r's words from word w0 on (gfx11).
//   lp_frag_mma_f16: d += a b over 16 f16 values; lp_frag_mma_i8: c = LP_I2F_MAGIC + a b over 4W int8;
//   lp_sched_barrier between stretches of fragment work.
//   LpRowMma: products over the wave's own 16 rows (flash attention).
//
// Integer sums become floats through the magic-number trick: a sum that starts at LP_I2F_MAGIC
// (the bits of 2^23 + 2^22) ends as the bits of the float 12582912 + I, exact while |I| < 2^22, so
// lp_magic_to_float(d) = I with one float subtraction instead of an integer-to-float conversion
// (a quarter-rate instruction on sm_86+). Every block sum the GEMM forms is below 32 * 128 * 128 = 2^19.
#pragma once
#include "common.cuh"

#define LP_I2F_MAGIC 0x4B400000
__device__ __forceinline__ float lp_as_float(int x) {
#if defined(LP_HIP)
  return __builtin_bit_cast(float, x);
#else
  return __int_as_float(x);
#endif
}
__device__ __forceinline__ float lp_magic_to_float(int x) { return lp_as_float(x) - 12582912.0f; }

#if defined(LP_MMA) && !defined(LP_EMU)  // (emu.h emulates these on the CPU)
// accumulator element e (0..3) of a 16x8 C fragment: row and column within the fragment
__device__ __forceinline__ int lp_frag_row(int e) { return (lp_lane() >> 2) + ((e >> 1) << 3); }
__device__ __forceinline__ int lp_frag_col(int e) { return ((lp_lane() & 3) << 1) + (e & 1); }

__device__ __forceinline__ void lp_mma_i8_k32(int (&d)[4], const int (&a)[4], const int (&b)[2], const int (&c)[4]) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
}

__device__ __forceinline__ void lp_mma_i8_k16(int (&d)[4], const int (&a)[2], int b, const int (&c)[4]) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%9,%10};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(b), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
}

// d += a * b (f32 accumulators)
__device__ __forceinline__ void lp_mma_f16_k16(float (&d)[4], const int (&a)[4], const int (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

#if defined(LP_WMMA) && !defined(LP_EMU)
typedef int lp_v4i __attribute__((ext_vector_type(4)));
typedef int lp_v8i __attribute__((ext_vector_type(8)));
typedef float lp_v8f __attribute__((ext_vector_type(8)));
typedef _Float16 lp_v16h __attribute__((ext_vector_type(16)));

__device__ __forceinline__ int lp_frag_row(int e) { return 2 * e + (lp_lane() >> 4); }
__device__ __forceinline__ int lp_frag_col(int e) { return lp_lane() & 15; }

__device__ __forceinline__ lp_v8i lp_wmma_i8(lp_v4i a, lp_v4i b, lp_v8i c) {
  return __builtin_amdgcn_wmma_i32_16x16x16_iu8_w32(true, a, true, b, c, false);
}
__device__ __forceinline__ lp_v8f lp_wmma_f16(lp_v16h a, lp_v16h b, lp_v8f c) {
  return __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(a, b, c);
}
#endif

// ---- the vendor-neutral layer -------------------------------------------------------------------
#if defined(LP_MMA) || defined(LP_WMMA)
#define LP_FRAGMENTS 1
#endif

// the scheduler moves nothing across this point, which bounds the registers a stretch of fragment work
// keeps live (AMD; ptxas takes no such hint)
__device__ __forceinline__ void lp_sched_barrier() {
#if defined(LP_HIP)
  __builtin_amdgcn_sched_barrier(0);
#endif
}

// two floats rounded to f16, low then high half of one 32-bit operand word
__device__ __forceinline__ unsigned lp_pack_h2(float lo, float hi) {
#if defined(LP_HIP)
  return (unsigned)__builtin_bit_cast(unsigned short, (_Float16)lo) |
         ((unsigned)__builtin_bit_cast(unsigned short, (_Float16)hi) << 16);
#else
  return (unsigned)__half_as_ushort(__float2half_rn(lo)) | ((unsigned)__half_as_ushort(__float2half_rn(hi)) << 16);
#endif
}

#if defined(LP_MMA)
constexpr int LP_FRAG_N = 8, LP_FRAG_EL = 4;

// W = 8 (m16n8k16 f16, m16n8k32 s8): A rows g, g + 8 x words t, t + 4; B column g x words t, t + 4.
// W = 4 (m16n8k16 s8): word t only.
template <int W> struct LpFragA {
  int r[W / 2];
};
template <int W> struct LpFragB {
  int r[W / 4];
};

// A: tile rows row0 .. row0 + 15, words w0 .. w0 + W - 1 of each
template <int W, class Tile> __device__ __forceinline__ LpFragA<W> lp_frag_a(const Tile& t, int row0, int w0) {
  const int g = lp_lane() >> 2, tq = lp_lane() & 3;
  LpFragA<W> a;
  #pragma unroll
  for (int j = 0; j < W / 4; ++j) {
    a.r[2 * j] = t.word(row0 + g, w0 + 4 * j + tq);
    a.r[2 * j + 1] = t.word(row0 + g + 8, w0 + 4 * j + tq);
  }
  return a;
}
// B: columns col0 .. col0 + LP_FRAG_N - 1 (tile rows), words w0 .. w0 + W - 1 of each
template <int W, class Tile> __device__ __forceinline__ LpFragB<W> lp_frag_b(const Tile& t, int col0, int w0) {
  const int g = lp_lane() >> 2, tq = lp_lane() & 3;
  LpFragB<W> b;
  #pragma unroll
  for (int j = 0; j < W / 4; ++j) b.r[j] = t.word(col0 + g, w0 + 4 * j + tq);
  return b;
}

typedef float LpFragAcc[LP_FRAG_EL];  // a lane's f32 accumulators of one fragment

__device__ __forceinline__ void lp_frag_mma_f16(LpFragAcc& d, const LpFragA<8>& a, const LpFragB<8>& b) {
  lp_mma_f16_k16(d, a.r, b.r);
}

template <int W>
__device__ __forceinline__ void lp_frag_mma_i8(int (&c)[LP_FRAG_EL], const LpFragA<W>& a, const LpFragB<W>& b) {
  const int magic[4] = {LP_I2F_MAGIC, LP_I2F_MAGIC, LP_I2F_MAGIC, LP_I2F_MAGIC};
  if constexpr (W == 8) lp_mma_i8_k32(c, a.r, b.r, magic);
  else lp_mma_i8_k16(c, a.r, b.r[0], magic);
}
#elif defined(LP_WMMA)
constexpr int LP_FRAG_N = 16, LP_FRAG_EL = 8;

// A and B alike: lane l holds row (A) / column (B) l % 16, all W words (k32 int8 takes two WMMAs)
template <int W> struct LpFragA {
  int r[W];
};
template <int W> using LpFragB = LpFragA<W>;

template <int W, class Tile> __device__ __forceinline__ LpFragA<W> lp_frag_a(const Tile& t, int row0, int w0) {
  LpFragA<W> a;
  t.words(row0 + (lp_lane() & 15), w0, a.r);
  return a;
}
template <int W, class Tile> __device__ __forceinline__ LpFragB<W> lp_frag_b(const Tile& t, int col0, int w0) {
  return lp_frag_a<W>(t, col0, w0);
}

typedef lp_v8f LpFragAcc;

__device__ __forceinline__ void lp_frag_mma_f16(LpFragAcc& d, const LpFragA<8>& a, const LpFragB<8>& b) {
  const lp_v8i aw = {a.r[0], a.r[1], a.r[2], a.r[3], a.r[4], a.r[5], a.r[6], a.r[7]};
  const lp_v8i bw = {b.r[0], b.r[1], b.r[2], b.r[3], b.r[4], b.r[5], b.r[6], b.r[7]};
  d = lp_wmma_f16(__builtin_bit_cast(lp_v16h, aw), __builtin_bit_cast(lp_v16h, bw), d);
}

template <int W>
__device__ __forceinline__ void lp_frag_mma_i8(int (&c)[LP_FRAG_EL], const LpFragA<W>& a, const LpFragB<W>& b) {
  lp_v8i v = {LP_I2F_MAGIC, LP_I2F_MAGIC, LP_I2F_MAGIC, LP_I2F_MAGIC,
              LP_I2F_MAGIC, LP_I2F_MAGIC, LP_I2F_MAGIC, LP_I2F_MAGIC};
  #pragma unroll
  for (int h = 0; h < W / 4; ++h) {
    const lp_v4i ah = {a.r[4 * h], a.r[4 * h + 1], a.r[4 * h + 2], a.r[4 * h + 3]};
    const lp_v4i bh = {b.r[4 * h], b.r[4 * h + 1], b.r[4 * h + 2], b.r[4 * h + 3]};
    v = lp_wmma_i8(ah, bh, v);
  }
  #pragma unroll
  for (int e = 0; e < 8; ++e) c[e] = v[e];
}
#endif

// ---- products over the wave's own 16 rows ------------------------------------------------------
// D[16 x n] += A[16 x 16] B[16 x n] where the wave owns A's and D's 16 rows (flash attention: S = Q K^T
// over its query vectors, O += P V over their weights), f16 operands, f32 accumulators (LpFragAcc) in
// fragments of N columns. NVIDIA computes D as is: A is the A operand, a lane holds rows g and g + 8
// (SLOTS = 2). gfx11 computes D^T = B^T A^T: A is the B operand, so that a lane holds one row, l % 16
// (SLOTS = 1), and the lanes holding a row are 16 apart. B is read as the rows of a tile (K's
// positions, V^T's dimensions). A lane's accumulator elements are SLOTS runs of ROW_EL, one per row.
#if defined(LP_MMA)
struct LpRowMma {
  static constexpr int N = LP_FRAG_N, SLOTS = 2, ROW_EL = LP_FRAG_EL / SLOTS;
  typedef LpFragA<8> Rows;
  typedef LpFragB<8> Cols;
  // the row (0..15) of slot h; the column of accumulator element e of a fragment at column c0
  __device__ static __forceinline__ int row(int h) { return lp_frag_row(2 * h); }
  __device__ static __forceinline__ int col(int c0, int e) { return c0 + ((lp_lane() & 3) << 1) + (e & 1); }
  template <class Tile> __device__ static __forceinline__ Rows rows(const Tile& t, int r0, int w0) {
    return lp_frag_a<8>(t, r0, w0);
  }
  template <class Tile> __device__ static __forceinline__ Cols cols(const Tile& t, int c0, int w0) {
    return lp_frag_b<8>(t, c0, w0);
  }
  __device__ static __forceinline__ void mma(LpFragAcc& d, const Rows& a, const Cols& b) { lp_frag_mma_f16(d, a, b); }
  // over the lanes holding the same rows (t = 0..3)
  __device__ static __forceinline__ float max(float x) {
    x = lp_fmax(x, lp_shfl_xor(x, 1));
    return lp_fmax(x, lp_shfl_xor(x, 2));
  }
  __device__ static __forceinline__ float sum(float x) {
    x += lp_shfl_xor(x, 1);
    return x + lp_shfl_xor(x, 2);
  }
  // 16 columns of D (acc[0], acc[1]), rounded to f16, as the A operand of the next product: the
  // accumulator layout of two neighbouring fragments is the A fragment layout
  __device__ static __forceinline__ Rows rows_of(const float (*acc)[LP_FRAG_EL]) {
    Rows a;
    #pragma unroll
    for (int j = 0; j < 2; ++j) {
      a.r[2 * j] = (int)lp_pack_h2(acc[j][0], acc[j][1]);
      a.r[2 * j + 1] = (int)lp_pack_h2(acc[j][2], acc[j][3]);
    }
    return a;
  }
};
#elif defined(LP_WMMA)
struct LpRowMma {
  static constexpr int N = 16, SLOTS = 1, ROW_EL = LP_FRAG_EL;  // N: D^T's fragment rows
  typedef LpFragB<8> Rows;
  typedef LpFragA<8> Cols;
  __device__ static __forceinline__ int row(int h) { return lp_frag_col(h); }
  __device__ static __forceinline__ int col(int c0, int e) { return c0 + 2 * e + (lp_lane() >> 4); }
  template <class Tile> __device__ static __forceinline__ Rows rows(const Tile& t, int r0, int w0) {
    return lp_frag_b<8>(t, r0, w0);
  }
  template <class Tile> __device__ static __forceinline__ Cols cols(const Tile& t, int c0, int w0) {
    return lp_frag_a<8>(t, c0, w0);
  }
  __device__ static __forceinline__ void mma(LpFragAcc& d, const Rows& a, const Cols& b) { lp_frag_mma_f16(d, b, a); }
  // over the lanes holding the same row (l, l ^ 16)
  __device__ static __forceinline__ float max(float x) { return lp_fmax(x, lp_shfl_xor(x, 16)); }
  __device__ static __forceinline__ float sum(float x) { return x + lp_shfl_xor(x, 16); }
  // 16 columns of D (acc[0]), rounded to f16, as the B operand of the next product: lane l needs
  // columns 0..15 of row l % 16; it holds 2e + l / 16, the lane 16 away the rest
  __device__ static __forceinline__ Rows rows_of(const float (*acc)[LP_FRAG_EL]) {
    const bool hi = lp_lane() >> 4;
    unsigned mine[4], other[4];
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
      mine[j] = lp_pack_h2(acc[0][2 * j], acc[0][2 * j + 1]);
      other[j] = lp_shfl_xor(mine[j], 16);
    }
    Rows b;
    #pragma unroll
    for (int j = 0; j < 8; ++j) {  // word j: columns 2j (the even lane's e = j), 2j + 1 (the odd lane's)
      const unsigned ev = hi ? other[j >> 1] : mine[j >> 1], od = hi ? mine[j >> 1] : other[j >> 1];
      const unsigned sh = (j & 1) * 16;
      b.r[j] = (int)(((ev >> sh) & 0xFFFFu) | (((od >> sh) & 0xFFFFu) << 16));
    }
    return b;
  }
};
#endif
