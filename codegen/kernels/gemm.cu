// gemm.cu: prefill projections out[rows, n] = x[rows, k] . dequantize(W[n, k])^T (+ r), compute-bound.
//
// What it computes: the CPU twin (runtime/numpy_kernels.py matmul) multiplies the packed activation's
// values (qs * d) by the exactly dequantized weight in float32. Here every product is formed exactly
// in integers: per quantization sub-block (32 values, or 16 for Q2_K/Q3_K/Q6_K) the int8 weight
// values meet the int8 activation values in an integer matrix-core tile (or lp_dot4), and the exact
// integer sum I is scaled into float accumulators: acc += I * (d_x * d_w) - xs * m_w, where d_w and m_w
// are the weight sub-block's scale and min as the dequantizer forms them (d * sc, dmin * m, in f32) and
// xs = d_x * sum(qs) over the sub-block (q8_k: from bsums; q8_1: counted exactly). The sums differ from
// the twin's only in float accumulation order (NMSE well under 5e-4). F16 weights (f16 activations)
// use f16 matrix cores with f32 accumulators (products exact in f32, as the twin's).
//
// Launch geometry: a block computes a TR x TW tile of the output (TR activation rows x TW weight rows,
// TW = output columns) with THREADS = 2 * TW threads. grid = (sum over segments of ceil(n_i / TW),
// ceil(rows / TR), splits): x walks the concatenated weight rows of up to three segments (q|k|v,
// gate|up; each in its own weight format), y the activation rows, z the split of k. K is walked in
// tiles of 128 values (64 for F16): each thread loads the next tile's raw quantized fields into
// registers (16-byte loads from the planar weight, core/formats.planes) while the block computes
// the current one from shared memory, then unpacks them to int8 + float scales in shared memory.
// With splits > 1 the block writes its partial float tile to a workspace [splits, rows, sum n_i] and
// lp_gemm_fixup sums the partials and applies the epilogue (segment outputs, residual add).
//
// Members (KIND): 0 = matrix cores (mma.sync m16n8k32 / m16n8k16 s8 on sm_80+, WMMA iu8 16x16x16 on
// gfx11; f16 m16n8k16 / WMMA f16 for F16 weights), 1 = lp_dot4 micro-tiles (every target).
// Waves (LpGemmCfg): sm_80+ puts 2 waves along the rows (128x128: 64x32 per wave, 4x4 fragments of
// 16x8; 64x128 and 64x64: 32x32); gfx11 puts 4 along the rows at 128x128 (32x64 per wave, 2x4
// fragments of 16x16) and 2 otherwise (32x32). The activation rows are the fragments' M side, so a
// q8_k activation scale is loaded once per k-tile. The dot4 tile gives each thread 8 rows x 4 weights.
// Shared memory is static: LpGemmSmem<TR, TW, F>::BYTES (mirrored in codegen/families/gemm.py).
//
// Why it is fast: prefill is compute-bound, so the inner loop is matrix-core work fed from shared
// memory (XOR-swizzled 16-byte chunks: conflict-free fragment loads, 16-byte stores), with one float
// rescale per 16/32-value sub-block (the integer sum reaches float through lp_magic_to_float, no I2F),
// and global loads of the next tile in flight under the current tile's math. Weights stay in their
// quantized planar form (no second, wider copy of the model in memory).
#include "common.cuh"
#include "mma.cuh"

// ---- bytes ------------------------------------------------------------------------------------

// byte i of the 12 bytes w0, w1, w2 (selects, not an indexed array: i may be a runtime value)
__device__ __forceinline__ unsigned lp_byte(unsigned w0, unsigned w1, unsigned w2, int i) {
  const unsigned word = (i >> 2) == 0 ? w0 : ((i >> 2) == 1 ? w1 : w2);
  return (word >> (8 * (i & 3))) & 0xFFu;
}

// ---- weight formats ----------------------------------------------------------------------------
// LpW<F>: formats.h's LpFormat<F> (values per block, per integer sub-sum SB, the min, the activation
// format, each field plane's bytes per block).
template <int F> using LpW = LpFormat<F>;

// The field planes of a planar weight [n, k] (core/formats.planes: plane i holds field i of every
// block, rows in order, each plane starting on a 256-byte boundary). Shared by every weight reader.
template <int F> struct LpWPlanes {
  const uint8_t* f[5];
};

template <int F> __device__ __forceinline__ LpWPlanes<F> lp_weight_planes(const void* base, int n, int k) {
  typedef LpW<F> T;
  const int fb[5] = {T::FB0, T::FB1, T::FB2, T::FB3, T::FB4};
  const size_t blocks = (size_t)n * (size_t)(k / T::BLOCK);
  const uint8_t* p = (const uint8_t*)base;
  LpWPlanes<F> out;
  #pragma unroll
  for (int i = 0; i < 5; ++i) {
    out.f[i] = p;
    if (i < T::NFIELD) p += lp_align(blocks * fb[i]);
  }
  return out;
}

// ---- shared-memory tile ------------------------------------------------------------------------
// One k-tile = 128 bytes per row: 128 int8 values (64 f16 for F16). Rows are 8 chunks of 16 bytes;
// chunk c of row r lives at chunk (c ^ (r & 7)) (fragment loads of 8 consecutive rows hit 8 different
// chunks, so all 32 banks). Float side tables per row: weight scale / min per sub-block (wsc, wmn),
// activation scale per activation block (xd: 4 per tile for q8_0/q8_1, 1 for q8_k) and activation
// sub-block sums d_x * sum(qs) (xs, only for formats with a min).
template <int TR, int TW, int F> struct LpGemmSmem {
  typedef LpW<F> T;
  static constexpr int NSB = T::ACT == LP_ACT_F16 ? 0 : 128 / T::SB;
  static constexpr int NXD = T::ACT == LP_ACT_F16 ? 0 : (T::ACT == LP_ACT_Q8_K ? 1 : 4);
  static constexpr int W = 0;
  static constexpr int X = W + TW * 128;
  static constexpr int WSC = X + TR * 128;
  static constexpr int WMN = WSC + TW * NSB * 4;
  static constexpr int XD = WMN + (T::MIN ? TW * NSB * 4 : 0);
  static constexpr int XS = XD + TR * NXD * 4;
  static constexpr int BYTES = XS + (T::MIN ? TR * NSB * 4 : 0);
};

struct LpTile {
  lp_u4* w;
  lp_u4* x;
  float* wsc;
  float* wmn;
  float* xd;
  float* xs;
};

__device__ __forceinline__ int lp_chunk(int row, int c) { return row * 8 + (c ^ (row & 7)); }

// ---- weight tile loaders -----------------------------------------------------------------------
// A loader unit is one weight row x 64 values of the k-tile (u = 0, 1); load() fetches the raw fields
// into registers (zeros outside the matrix), store() writes int8 values and float scales to the tile.
// Value = wsc * q - wmn for every format (the dequantizer's products, in f32).
template <int F> struct LpWRaw;

// Q4_0, Q4_1, Q5_0, Q5_1: a unit is two 32-value blocks, tile sub-blocks 2u and 2u + 1
template <int F> struct LpWRaw32 {
  typedef LpW<F> T;
  static constexpr bool HI = F == LP_FMT_Q5_0 || F == LP_FMT_Q5_1;
  static constexpr bool MINF = T::MIN;
  lp_u4 qs[2];
  unsigned qh[2];
  float d[2], m[2];
  __device__ __forceinline__ void load(const LpWPlanes<F>& p, int row, int kt, int u, int nb, bool ok) {
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int b = kt * 4 + 2 * u + i;
      const bool v = ok && b < nb;
      const size_t blk = (size_t)row * nb + b;
      d[i] = v ? lp_h2f(((const lp_half*)p.f[0])[blk]) : 0.0f;
      m[i] = MINF && v ? lp_h2f(((const lp_half*)p.f[1])[blk]) : 0.0f;
      qh[i] = HI && v ? ((const unsigned*)p.f[MINF ? 2 : 1])[blk] : 0u;
      qs[i] = v ? lp_load16(p.f[T::NFIELD - 1] + blk * 16) : lp_zero16();
    }
  }
  __device__ __forceinline__ void store(const LpTile& t, int r, int u) const {
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int s = 2 * u + i;
      lp_u4 lo, hi;
      #pragma unroll
      for (int w = 0; w < 4; ++w) {
        unsigned l = qs[i].w[w] & 0x0F0F0F0Fu, h = (qs[i].w[w] >> 4) & 0x0F0F0F0Fu;
        if (HI) {  // bit j of qh is bit 4 of value j
          l |= lp_bits4(qh[i] >> (4 * w)) << 4;
          h |= lp_bits4(qh[i] >> (16 + 4 * w)) << 4;
        }
        if (!MINF) {  // Q4_0: q - 8, Q5_0: q - 16
          l = lp_sub_bytes(l, HI ? 16u : 8u);
          h = lp_sub_bytes(h, HI ? 16u : 8u);
        }
        lo.w[w] = l;
        hi.w[w] = h;
      }
      lp_store16(&t.w[lp_chunk(r, 2 * s)], lo);
      lp_store16(&t.w[lp_chunk(r, 2 * s + 1)], hi);
      t.wsc[r * 4 + s] = d[i];
      if (MINF) t.wmn[r * 4 + s] = -m[i];  // value = d * q + m
    }
  }
};
template <> struct LpWRaw<LP_FMT_Q4_0> : LpWRaw32<LP_FMT_Q4_0> {};
template <> struct LpWRaw<LP_FMT_Q4_1> : LpWRaw32<LP_FMT_Q4_1> {};
template <> struct LpWRaw<LP_FMT_Q5_0> : LpWRaw32<LP_FMT_Q5_0> {};
template <> struct LpWRaw<LP_FMT_Q5_1> : LpWRaw32<LP_FMT_Q5_1> {};

template <> struct LpWRaw<LP_FMT_Q8_0> {
  lp_u4 qs[4];
  float d[2];
  __device__ __forceinline__ void load(const LpWPlanes<LP_FMT_Q8_0>& p, int row, int kt, int u, int nb, bool ok) {
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int b = kt * 4 + 2 * u + i;
      const bool v = ok && b < nb;
      const size_t blk = (size_t)row * nb + b;
      d[i] = v ? lp_h2f(((const lp_half*)p.f[0])[blk]) : 0.0f;
      qs[2 * i] = v ? lp_load16(p.f[1] + blk * 32) : lp_zero16();
      qs[2 * i + 1] = v ? lp_load16(p.f[1] + blk * 32 + 16) : lp_zero16();
    }
  }
  __device__ __forceinline__ void store(const LpTile& t, int r, int u) const {
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int s = 2 * u + i;
      lp_store16(&t.w[lp_chunk(r, 2 * s)], qs[2 * i]);
      lp_store16(&t.w[lp_chunk(r, 2 * s + 1)], qs[2 * i + 1]);
      t.wsc[r * 4 + s] = d[i];
    }
  }
};

// Q4_K, Q5_K: the k-tile is half hh of a super-block; unit u is qs run r = 2hh + u (32 bytes): low
// nibbles are sub-block 2r, high nibbles 2r + 1 (tile sub-blocks 2u, 2u + 1). Q5_K: bit j of qh byte b
// is bit 4 of value 32j + b.
template <int F> struct LpWRawK45 {
  static constexpr bool HI = F == LP_FMT_Q5_K;
  lp_u4 qs[2], qh[2];
  unsigned sc0, sc1, sc2;
  float d, dmin;
  int r;
  __device__ __forceinline__ void load(const LpWPlanes<F>& p, int row, int kt, int u, int nb, bool ok) {
    const size_t blk = (size_t)row * nb + (kt >> 1);
    r = 2 * (kt & 1) + u;
    d = ok ? lp_h2f(((const lp_half*)p.f[0])[blk]) : 0.0f;
    dmin = ok ? lp_h2f(((const lp_half*)p.f[1])[blk]) : 0.0f;
    const unsigned* scp = (const unsigned*)(p.f[2] + blk * 12);
    sc0 = ok ? scp[0] : 0u;
    sc1 = ok ? scp[1] : 0u;
    sc2 = ok ? scp[2] : 0u;
    const uint8_t* q = p.f[HI ? 4 : 3] + blk * 128 + 32 * r;
    qs[0] = ok ? lp_load16(q) : lp_zero16();
    qs[1] = ok ? lp_load16(q + 16) : lp_zero16();
    if (HI) {
      qh[0] = ok ? lp_load16(p.f[3] + blk * 32) : lp_zero16();
      qh[1] = ok ? lp_load16(p.f[3] + blk * 32 + 16) : lp_zero16();
    }
  }
  __device__ __forceinline__ void store(const LpTile& t, int row, int u) const {
    #pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int j = 2 * r + half, s = 2 * u + half;
      #pragma unroll
      for (int c = 0; c < 2; ++c) {
        lp_u4 v;
        #pragma unroll
        for (int w = 0; w < 4; ++w) {
          unsigned x = (qs[c].w[w] >> (4 * half)) & 0x0F0F0F0Fu;
          if (HI) x |= ((qh[c].w[w] >> j) & 0x01010101u) << 4;
          v.w[w] = x;
        }
        lp_store16(&t.w[lp_chunk(row, 2 * s + c)], v);
      }
      int scv, mnv;
      lp_k_scale_min([&](int i) { return (int)lp_byte(sc0, sc1, sc2, i); }, j, scv, mnv);
      t.wsc[row * 4 + s] = d * (float)scv;
      t.wmn[row * 4 + s] = dmin * (float)mnv;
    }
  }
};
template <> struct LpWRaw<LP_FMT_Q4_K> : LpWRawK45<LP_FMT_Q4_K> {};
template <> struct LpWRaw<LP_FMT_Q5_K> : LpWRawK45<LP_FMT_Q5_K> {};

// Q6_K: local value 32f + b (f = 0..3) of half hh is nibble (f >> 1) of ql[64hh + 32(f & 1) + b] with
// bits 2f, 2f + 1 of qh[32hh + b] above it, minus 32. Unit u takes bytes b in [16u, 16u + 16), i.e. the
// four 16-value sub-blocks 2f + u of the tile.
template <> struct LpWRaw<LP_FMT_Q6_K> {
  lp_u4 a, b, h;
  unsigned sc0, sc1;
  float d;
  __device__ __forceinline__ void load(const LpWPlanes<LP_FMT_Q6_K>& p, int row, int kt, int u, int nb, bool ok) {
    const size_t blk = (size_t)row * nb + (kt >> 1);
    const int hh = kt & 1;
    d = ok ? lp_h2f(((const lp_half*)p.f[3])[blk]) : 0.0f;
    a = ok ? lp_load16(p.f[0] + blk * 128 + 64 * hh + 16 * u) : lp_zero16();
    b = ok ? lp_load16(p.f[0] + blk * 128 + 64 * hh + 32 + 16 * u) : lp_zero16();
    h = ok ? lp_load16(p.f[1] + blk * 64 + 32 * hh + 16 * u) : lp_zero16();
    sc0 = ok ? ((const unsigned*)(p.f[2] + blk * 16 + 8 * hh))[0] : 0u;
    sc1 = ok ? ((const unsigned*)(p.f[2] + blk * 16 + 8 * hh))[1] : 0u;
  }
  __device__ __forceinline__ void store(const LpTile& t, int row, int u) const {
    #pragma unroll
    for (int f = 0; f < 4; ++f) {
      const lp_u4& src = (f & 1) ? b : a;
      lp_u4 v;
      #pragma unroll
      for (int w = 0; w < 4; ++w) {
        const unsigned nib = (src.w[w] >> (4 * (f >> 1))) & 0x0F0F0F0Fu;
        const unsigned hi = ((h.w[w] >> (2 * f)) & 0x03030303u) << 4;
        v.w[w] = lp_sub_bytes(nib | hi, 32u);
      }
      const int s = 2 * f + u;
      lp_store16(&t.w[lp_chunk(row, s)], v);
      t.wsc[row * 8 + s] = d * (float)(int8_t)lp_byte(sc0, sc1, 0u, s);
    }
  }
};

// Q3_K: local value 32f + b of half hh is bits 2f, 2f + 1 of qs[32hh + b], minus 4 where bit 4hh + f
// of hmask[b] is clear. Unit u takes bytes b in [16u, 16u + 16): sub-blocks 2f + u of the tile.
template <> struct LpWRaw<LP_FMT_Q3_K> {
  lp_u4 q, hm;
  unsigned sc0, sc1, sc2;
  float d;
  int hh;
  __device__ __forceinline__ void load(const LpWPlanes<LP_FMT_Q3_K>& p, int row, int kt, int u, int nb, bool ok) {
    const size_t blk = (size_t)row * nb + (kt >> 1);
    hh = kt & 1;
    d = ok ? lp_h2f(((const lp_half*)p.f[3])[blk]) : 0.0f;
    q = ok ? lp_load16(p.f[1] + blk * 64 + 32 * hh + 16 * u) : lp_zero16();
    hm = ok ? lp_load16(p.f[0] + blk * 32 + 16 * u) : lp_zero16();
    const unsigned* scp = (const unsigned*)(p.f[2] + blk * 12);
    sc0 = ok ? scp[0] : 0u;
    sc1 = ok ? scp[1] : 0u;
    sc2 = ok ? scp[2] : 0u;
  }
  __device__ __forceinline__ void store(const LpTile& t, int row, int u) const {
    #pragma unroll
    for (int f = 0; f < 4; ++f) {
      lp_u4 v;
      #pragma unroll
      for (int w = 0; w < 4; ++w) {
        const unsigned low = (q.w[w] >> (2 * f)) & 0x03030303u;
        const unsigned hb = (hm.w[w] >> (4 * hh + f)) & 0x01010101u;
        v.w[w] = lp_sub_bytes(low | (hb << 2), 4u);
      }
      const int s = 2 * f + u;
      lp_store16(&t.w[lp_chunk(row, s)], v);
      const int sc = lp_q3k_scale([&](int i) { return (int)lp_byte(sc0, sc1, sc2, i); }, 8 * hh + s);
      t.wsc[row * 8 + s] = d * (float)sc;
    }
  }
};

// Q2_K: local value 32f + b of half hh is bits 2f, 2f + 1 of qs[32hh + b]; sub-block scale byte
// 8hh + 2f + u: low nibble scale, high nibble min. Unit u takes bytes b in [16u, 16u + 16).
template <> struct LpWRaw<LP_FMT_Q2_K> {
  lp_u4 q;
  unsigned sc0, sc1;
  float d, dmin;
  __device__ __forceinline__ void load(const LpWPlanes<LP_FMT_Q2_K>& p, int row, int kt, int u, int nb, bool ok) {
    const size_t blk = (size_t)row * nb + (kt >> 1);
    const int hh = kt & 1;
    d = ok ? lp_h2f(((const lp_half*)p.f[2])[blk]) : 0.0f;
    dmin = ok ? lp_h2f(((const lp_half*)p.f[3])[blk]) : 0.0f;
    q = ok ? lp_load16(p.f[1] + blk * 64 + 32 * hh + 16 * u) : lp_zero16();
    sc0 = ok ? ((const unsigned*)(p.f[0] + blk * 16 + 8 * hh))[0] : 0u;
    sc1 = ok ? ((const unsigned*)(p.f[0] + blk * 16 + 8 * hh))[1] : 0u;
  }
  __device__ __forceinline__ void store(const LpTile& t, int row, int u) const {
    #pragma unroll
    for (int f = 0; f < 4; ++f) {
      lp_u4 v;
      #pragma unroll
      for (int w = 0; w < 4; ++w) v.w[w] = (q.w[w] >> (2 * f)) & 0x03030303u;
      const int s = 2 * f + u;
      lp_store16(&t.w[lp_chunk(row, s)], v);
      const unsigned scb = lp_byte(sc0, sc1, 0u, s);
      t.wsc[row * 8 + s] = d * (float)(scb & 15u);
      t.wmn[row * 8 + s] = dmin * (float)(scb >> 4);
    }
  }
};

// IQ4_NL: a unit is two 32-value blocks, tile sub-blocks 2u and 2u + 1 (as Q4_0): each block's 16 qs
// bytes looked up in the codebook, low nibbles values 0..15, high nibbles 16..31.
template <> struct LpWRaw<LP_FMT_IQ4_NL> {
  lp_u4 qs[2];
  float d[2];
  __device__ __forceinline__ void load(const LpWPlanes<LP_FMT_IQ4_NL>& p, int row, int kt, int u, int nb, bool ok) {
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int b = kt * 4 + 2 * u + i;
      const bool v = ok && b < nb;
      const size_t blk = (size_t)row * nb + b;
      d[i] = v ? lp_h2f(((const lp_half*)p.f[0])[blk]) : 0.0f;
      qs[i] = v ? lp_load16(p.f[1] + blk * 16) : lp_zero16();
    }
  }
  __device__ __forceinline__ void store(const LpTile& t, int r, int u) const {
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int s = 2 * u + i;
      lp_u4 lo, hi;
      #pragma unroll
      for (int w = 0; w < 4; ++w) lp_iq4_values(qs[i].w[w], lo.w[w], hi.w[w]);
      lp_store16(&t.w[lp_chunk(r, 2 * s)], lo);
      lp_store16(&t.w[lp_chunk(r, 2 * s + 1)], hi);
      t.wsc[r * 4 + s] = d[i];
    }
  }
};

// IQ4_XS: the k-tile is half hh of a super-block, its sub-blocks 4hh .. 4hh + 3; unit u takes sub-blocks
// j = 4hh + 2u + i (tile sub-blocks 2u + i), qs[16j, +16) each: low nibbles values 32j + b, high nibbles
// 32j + 16 + b, under scale d * lp_iq4xs_scale(j) (the dequantizer's product, in f32).
template <> struct LpWRaw<LP_FMT_IQ4_XS> {
  lp_u4 qs[2];
  unsigned sh, sl;
  float d;
  int j0;
  __device__ __forceinline__ void load(const LpWPlanes<LP_FMT_IQ4_XS>& p, int row, int kt, int u, int nb, bool ok) {
    const size_t blk = (size_t)row * nb + (kt >> 1);
    j0 = 4 * (kt & 1) + 2 * u;
    d = ok ? lp_h2f(((const lp_half*)p.f[0])[blk]) : 0.0f;
    sh = ok ? ((const uint16_t*)p.f[1])[blk] : 0u;
    sl = ok ? ((const unsigned*)p.f[2])[blk] : 0u;
    qs[0] = ok ? lp_load16(p.f[3] + blk * 128 + 16 * j0) : lp_zero16();
    qs[1] = ok ? lp_load16(p.f[3] + blk * 128 + 16 * j0 + 16) : lp_zero16();
  }
  __device__ __forceinline__ void store(const LpTile& t, int r, int u) const {
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int s = 2 * u + i;
      lp_u4 lo, hi;
      #pragma unroll
      for (int w = 0; w < 4; ++w) lp_iq4_values(qs[i].w[w], lo.w[w], hi.w[w]);
      lp_store16(&t.w[lp_chunk(r, 2 * s)], lo);
      lp_store16(&t.w[lp_chunk(r, 2 * s + 1)], hi);
      t.wsc[r * 4 + s] = d * (float)lp_iq4xs_scale(sh, sl, j0 + i);
    }
  }
};

// F16: the k-tile is 64 values; unit u is values 32u .. 32u + 31 (four chunks). nb is k here.
template <> struct LpWRaw<LP_FMT_F16> {
  lp_u4 v[4];
  __device__ __forceinline__ void load(const LpWPlanes<LP_FMT_F16>& p, int row, int kt, int u, int nb, bool ok) {
    const uint8_t* base = p.f[0] + ((size_t)row * nb + kt * 64 + 32 * u) * 2;
    #pragma unroll
    for (int c = 0; c < 4; ++c) v[c] = ok && kt * 64 + 32 * u + 8 * c < nb ? lp_load16(base + 16 * c) : lp_zero16();
  }
  __device__ __forceinline__ void store(const LpTile& t, int row, int u) const {
    #pragma unroll
    for (int c = 0; c < 4; ++c) lp_store16(&t.w[lp_chunk(row, 4 * u + c)], v[c]);
  }
};

// ---- activation tile loader --------------------------------------------------------------------
// A unit is one activation row x 32 bytes of the k-tile (q = 0..3): chunks 2q, 2q + 1.
struct LpXSrc {
  const int8_t* qs;     // int8 planes, or the f16 rows
  const void* d;
  const int16_t* bsums;
};

template <int ACT, int SB, int XS> struct LpXRaw {
  lp_u4 v[2];
  float d;
  int bs;  // q8_k: two 16-value sums (int16 pair)
  __device__ __forceinline__ void load(const LpXSrc& x, int n, int kt, int q, int rows, int k) {
    const bool ok = n < rows;
    if (ACT == LP_ACT_F16) {
      const int kk = kt * 64 + 16 * q;
      const uint8_t* p = (const uint8_t*)x.qs + ((size_t)n * k + kk) * 2;
      v[0] = ok && kk < k ? lp_load16(p) : lp_zero16();
      v[1] = ok && kk + 8 < k ? lp_load16(p + 16) : lp_zero16();
    } else if (ACT == LP_ACT_Q8_K) {
      const size_t sb = (size_t)n * (k / 256) + (kt >> 1);
      const int8_t* p = x.qs + (size_t)n * k + kt * 128 + 32 * q;
      v[0] = ok ? lp_load16(p) : lp_zero16();
      v[1] = ok ? lp_load16(p + 16) : lp_zero16();
      d = ok ? ((const float*)x.d)[sb] : 0.0f;
      bs = XS && ok ? ((const int*)x.bsums)[(sb * 16 + 8 * (kt & 1) + 2 * q) >> 1] : 0;
    } else {
      const int nb = k / 32, b = kt * 4 + q;
      const bool v_ok = ok && b < nb;
      const int8_t* p = x.qs + (size_t)n * k + (size_t)b * 32;
      v[0] = v_ok ? lp_load16(p) : lp_zero16();
      v[1] = v_ok ? lp_load16(p + 16) : lp_zero16();
      d = v_ok ? lp_h2f(((const lp_half*)x.d)[(size_t)n * nb + b]) : 0.0f;
    }
  }
  __device__ __forceinline__ void store(const LpTile& t, int r, int q) const {
    lp_store16(&t.x[lp_chunk(r, 2 * q)], v[0]);
    lp_store16(&t.x[lp_chunk(r, 2 * q + 1)], v[1]);
    if (ACT == LP_ACT_Q8_K) {
      if (q == 0) t.xd[r] = d;
      if (XS) {
        const int lo = (int)(short)(bs & 0xFFFF), hi = bs >> 16;
        if (SB == 32) {
          t.xs[r * 4 + q] = d * (float)(lo + hi);
        } else {
          t.xs[r * 8 + 2 * q] = d * (float)lo;
          t.xs[r * 8 + 2 * q + 1] = d * (float)hi;
        }
      }
    } else if (ACT != LP_ACT_F16) {
      t.xd[r * 4 + q] = d;
      if (XS) {  // the block's exact sum of qs
        int sum = 0;
        #pragma unroll
        for (int w = 0; w < 4; ++w) sum = lp_dot4((int)v[0].w[w], 0x01010101, lp_dot4((int)v[1].w[w], 0x01010101, sum));
        t.xs[r * 4 + q] = d * (float)sum;
      }
    }
  }
};

// ---- members: configuration --------------------------------------------------------------------
template <int TR, int TW, int KIND> struct LpGemmCfg {
  static constexpr int THREADS = 2 * TW;
  static constexpr int WAVES = THREADS / 32;
#if defined(LP_WMMA)
  static constexpr int WR = TR == 128 && TW == 128 ? 4 : 2;  // waves along rows
  static constexpr int KU = 1;  // F16 k-steps unrolled per tile (all 4 spill at 128x128 on gfx11)
#else
  static constexpr int WR = 2;
  static constexpr int KU = 4;
#endif
#if defined(LP_FRAGMENTS)
  static constexpr int FN = LP_FRAG_N, EL = LP_FRAG_EL;  // a fragment's weights, a lane's accumulators of it
#else
  static constexpr int FN = 1, EL = 0;  // no fragments: the dot-product member only
#endif
  static constexpr int WW = WAVES / WR;
  static constexpr int WTR = TR / WR, WTW = TW / WW;  // a wave's tile
  static constexpr int MF = WTR / 16, NF = WTW / FN;   // its fragments
  // dot4 micro-tiles: thread (tid % 16, tid / 16) owns weights tid % 16 + 16j, rows tid / 16 + RG * i
  static constexpr int RG = THREADS / 16;
  static constexpr int DI = TR / RG, DJ = TW / 16;
  static constexpr int ACC = KIND == 0 ? MF * NF * EL : DI * DJ;
};

struct LpGemmArgs {
  const void* x;
  int rows, k;
  const void* w[3];
  int n[3];
  float* out[3];
  const float* r;
  float* ws;
  int splits, ntot;
};

template <int SPLIT, int RES>
__device__ __forceinline__ void lp_gemm_put(const LpGemmArgs& a, int seg, int coff, int row, int col, float v) {
  const int n = a.n[seg];
  if (row >= a.rows || col >= n) return;
  if (SPLIT) {
    a.ws[((size_t)lp_bid_z() * a.rows + row) * a.ntot + coff + col] = v;
  } else {
    const size_t o = (size_t)row * n + col;
    a.out[seg][o] = RES ? a.r[o] + v : v;
  }
}

// a k-tile as mma.cuh's fragment loaders read it: word w of a row, or its words from w0 on (whole
// 16-byte chunks, each a single load)
struct LpTileRows {
  const lp_u4* p;
  __device__ __forceinline__ int word(int row, int w) const { return (int)p[lp_chunk(row, w >> 2)].w[w & 3]; }
  template <int W> __device__ __forceinline__ void words(int row, int w0, int (&r)[W]) const {
    #pragma unroll
    for (int c = 0; c < W / 4; ++c) {
      const lp_u4 v = p[lp_chunk(row, w0 / 4 + c)];
      #pragma unroll
      for (int j = 0; j < 4; ++j) r[4 * c + j] = (int)v.w[j];
    }
  }
};

// ---- compute: matrix cores ---------------------------------------------------------------------
// The wave's MF x NF fragments of 16 activation rows x FN weights; acc holds fragment (mi, ni)'s
// accumulators at (mi * NF + ni) * EL.
template <class C, int F>
__device__ __forceinline__ void lp_gemm_mma_tile(const LpTile& t, float (&acc)[C::ACC]) {
#if defined(LP_FRAGMENTS)
  typedef LpW<F> T;
  constexpr int NSB = T::ACT == 3 ? 0 : 128 / T::SB;
  const int wave = lp_wave();
  const int rb = (wave % C::WR) * C::WTR, wb = (wave / C::WR) * C::WTW;
  const LpTileRows xt{t.x}, wt{t.w};
  if constexpr (T::ACT == 3) {
    #pragma unroll C::KU
    for (int s = 0; s < 4; ++s) {  // 16 f16 values (8 words) per step
      LpFragA<8> a[C::MF];
      LpFragB<8> b[C::NF];
      #pragma unroll
      for (int mi = 0; mi < C::MF; ++mi) a[mi] = lp_frag_a<8>(xt, rb + mi * 16, 8 * s);
      #pragma unroll
      for (int ni = 0; ni < C::NF; ++ni) b[ni] = lp_frag_b<8>(wt, wb + ni * C::FN, 8 * s);
      #pragma unroll
      for (int mi = 0; mi < C::MF; ++mi)
        #pragma unroll
        for (int ni = 0; ni < C::NF; ++ni) {
          float* d = &acc[(mi * C::NF + ni) * C::EL];
          LpFragAcc c;
          #pragma unroll
          for (int e = 0; e < C::EL; ++e) c[e] = d[e];
          lp_frag_mma_f16(c, a[mi], b[ni]);
          #pragma unroll
          for (int e = 0; e < C::EL; ++e) d[e] = c[e];
        }
    }
  } else {
    constexpr int W = T::SB / 4;  // words per sub-block
    #pragma unroll 1
    for (int s = 0; s < NSB; ++s) {
      // this sub-block's weight scales and operands, then each fragment's integer tile is scaled as soon
      // as it is made; scales per accumulator element (the compiler loads each distinct column once)
      float sw[C::NF][C::EL], wm[C::NF][C::EL];
      #pragma unroll
      for (int ni = 0; ni < C::NF; ++ni)
        #pragma unroll
        for (int e = 0; e < C::EL; ++e) {
          const int col = wb + ni * C::FN + lp_frag_col(e);
          sw[ni][e] = t.wsc[col * NSB + s];
          if (T::MIN) wm[ni][e] = t.wmn[col * NSB + s];
        }
      LpFragA<W> a[C::MF];
      LpFragB<W> b[C::NF];
      #pragma unroll
      for (int mi = 0; mi < C::MF; ++mi) a[mi] = lp_frag_a<W>(xt, rb + mi * 16, W * s);
      #pragma unroll
      for (int ni = 0; ni < C::NF; ++ni) b[ni] = lp_frag_b<W>(wt, wb + ni * C::FN, W * s);
      #pragma unroll
      for (int mi = 0; mi < C::MF; ++mi) {
        // this fragment row's activation scales
        float dx[C::EL], xs[C::EL];
        #pragma unroll
        for (int e = 0; e < C::EL; ++e) {
          const int row = rb + mi * 16 + lp_frag_row(e);
          dx[e] = T::ACT == 2 ? t.xd[row] : t.xd[row * 4 + s];
          xs[e] = T::MIN ? t.xs[row * NSB + s] : 0.0f;
        }
        #pragma unroll
        for (int ni = 0; ni < C::NF; ++ni) {
          int c[C::EL];
          lp_frag_mma_i8<W>(c, a[mi], b[ni]);
          #pragma unroll
          for (int e = 0; e < C::EL; ++e) {
            float& v = acc[(mi * C::NF + ni) * C::EL + e];
            v = __builtin_fmaf(lp_magic_to_float(c[e]), dx[e] * sw[ni][e], v);
            if (T::MIN) v = __builtin_fmaf(-xs[e], wm[ni][e], v);
          }
        }
        // one row of fragments at a time: the scheduler would otherwise form every fragment's scale
        // products up front (VGPR pressure on gfx11)
        lp_sched_barrier();
      }
    }
  }
#else
  (void)t; (void)acc;
  __builtin_trap();  // no matrix cores here: the family declares itself unsupported (codegen/targets.py)
#endif
}

// every accumulator to put(row, column, value), the tile's own row and column
template <class C, class Put>
__device__ __forceinline__ void lp_gemm_mma_store(const float (&acc)[C::ACC], Put put) {
#if defined(LP_FRAGMENTS)
  const int wave = lp_wave();
  const int rb = (wave % C::WR) * C::WTR, wb = (wave / C::WR) * C::WTW;
  #pragma unroll
  for (int mi = 0; mi < C::MF; ++mi)
    #pragma unroll
    for (int ni = 0; ni < C::NF; ++ni)
      #pragma unroll
      for (int e = 0; e < C::EL; ++e)
        put(rb + mi * 16 + lp_frag_row(e), wb + ni * C::FN + lp_frag_col(e), acc[(mi * C::NF + ni) * C::EL + e]);
#else
  (void)acc; (void)put;
#endif
}

// ---- compute: dot-product micro-tiles ----------------------------------------------------------
template <class C, int F>
__device__ __forceinline__ void lp_gemm_dot_tile(const LpTile& t, float (&acc)[C::ACC]) {
  typedef LpW<F> T;
  const int tw = lp_tid() % 16, tr = lp_tid() / 16;
  if constexpr (T::ACT == LP_ACT_F16) {
    #pragma unroll 1
    for (int ch = 0; ch < 8; ++ch) {
      lp_u4 b[C::DJ];
      #pragma unroll
      for (int j = 0; j < C::DJ; ++j) b[j] = t.w[lp_chunk(tw + 16 * j, ch)];
      #pragma unroll
      for (int i = 0; i < C::DI; ++i) {
        const lp_u4 av = t.x[lp_chunk(tr + C::RG * i, ch)];
        #pragma unroll
        for (int w = 0; w < 4; ++w) {
          const float a0 = lp_half_lo(av.w[w]), a1 = lp_half_hi(av.w[w]);
          #pragma unroll
          for (int j = 0; j < C::DJ; ++j) {
            float& v = acc[i * C::DJ + j];
            v = __builtin_fmaf(a1, lp_half_hi(b[j].w[w]), __builtin_fmaf(a0, lp_half_lo(b[j].w[w]), v));
          }
        }
      }
    }
  } else {
    constexpr int NSB = 128 / T::SB, CH = T::SB / 16;
    #pragma unroll 1
    for (int s = 0; s < NSB; ++s) {
      int isum[C::DI][C::DJ];
      #pragma unroll
      for (int i = 0; i < C::DI; ++i)
        #pragma unroll
        for (int j = 0; j < C::DJ; ++j) isum[i][j] = LP_I2F_MAGIC;
      #pragma unroll
      for (int c = 0; c < CH; ++c) {
        lp_u4 b[C::DJ];
        #pragma unroll
        for (int j = 0; j < C::DJ; ++j) b[j] = t.w[lp_chunk(tw + 16 * j, s * CH + c)];
        #pragma unroll
        for (int i = 0; i < C::DI; ++i) {
          const lp_u4 av = t.x[lp_chunk(tr + C::RG * i, s * CH + c)];
          #pragma unroll
          for (int j = 0; j < C::DJ; ++j)
            #pragma unroll
            for (int w = 0; w < 4; ++w) isum[i][j] = lp_dot4((int)av.w[w], (int)b[j].w[w], isum[i][j]);
        }
      }
      float sw[C::DJ], wm[C::DJ];
      #pragma unroll
      for (int j = 0; j < C::DJ; ++j) {
        sw[j] = t.wsc[(tw + 16 * j) * NSB + s];
        wm[j] = T::MIN ? t.wmn[(tw + 16 * j) * NSB + s] : 0.0f;
      }
      #pragma unroll
      for (int i = 0; i < C::DI; ++i) {
        const int row = tr + C::RG * i;
        const float dx = T::ACT == LP_ACT_Q8_K ? t.xd[row] : t.xd[row * 4 + s];
        const float xs = T::MIN ? t.xs[row * NSB + s] : 0.0f;
        #pragma unroll
        for (int j = 0; j < C::DJ; ++j) {
          float& v = acc[i * C::DJ + j];
          v = __builtin_fmaf(lp_magic_to_float(isum[i][j]), dx * sw[j], v);
          if (T::MIN) v = __builtin_fmaf(-xs, wm[j], v);
        }
      }
    }
  }
}

template <class C, class Put>
__device__ __forceinline__ void lp_gemm_dot_store(const float (&acc)[C::ACC], Put put) {
  const int tw = lp_tid() % 16, tr = lp_tid() / 16;
  #pragma unroll
  for (int i = 0; i < C::DI; ++i)
    #pragma unroll
    for (int j = 0; j < C::DJ; ++j) put(tr + C::RG * i, tw + 16 * j, acc[i * C::DJ + j]);
}

// ---- one output tile ----------------------------------------------------------------------------
// The activation rows of an arena buffer [rows, k] in format F's activation format, for the row loaders
template <int F> __device__ __forceinline__ LpXSrc lp_gemm_xsrc(const void* x, int rows, int k) {
  LpXSrc xsrc;
  if (LpW<F>::ACT == LP_ACT_F16) {
    xsrc.qs = (const int8_t*)x;
    xsrc.d = nullptr;
    xsrc.bsums = nullptr;
  } else {
    const Q8Rows q = lp_q8_rows((void*)x, rows, k, LpW<F>::ACT);
    xsrc.qs = q.qs;
    xsrc.d = q.d;
    xsrc.bsums = q.bsums;
  }
  return xsrc;
}

// A TR x TW tile's accumulators over k-tiles [kt0, kt1): tile row i is activation row r0 + i of x (zeros
// from rend on), tile column j weight row w0 + j of wp (zeros from wend on). Every accumulator takes the
// same operations in the same order, whichever tile row or column it is, so a row's result depends on its
// own operands only (the k range fixed).
template <int TR, int TW, int KIND, int F>
__device__ __forceinline__ void lp_gemm_acc(const LpWPlanes<F>& wp, int w0, int wend, const LpXSrc& xsrc, int r0,
                                            int rend, int k, int kt0, int kt1, char* smem,
                                            float (&acc)[LpGemmCfg<TR, TW, KIND>::ACC]) {
  typedef LpW<F> T;
  typedef LpGemmCfg<TR, TW, KIND> C;
  typedef LpGemmSmem<TR, TW, F> L;
  LpTile t;
  t.w = (lp_u4*)(smem + L::W);
  t.x = (lp_u4*)(smem + L::X);
  t.wsc = (float*)(smem + L::WSC);
  t.wmn = (float*)(smem + L::WMN);
  t.xd = (float*)(smem + L::XD);
  t.xs = (float*)(smem + L::XS);

  const int nb = T::ACT == LP_ACT_F16 ? k : k / T::BLOCK;
  constexpr int XU = TR * 4 / C::THREADS;  // activation units per thread
  const int tid = lp_tid();
  const int wrow = tid >> 1, wu = tid & 1;

  LpWRaw<F> wr;
  LpXRaw<T::ACT, T::SB, T::MIN> xr[XU];
  #pragma unroll
  for (int i = 0; i < C::ACC; ++i) acc[i] = 0.0f;

  if (kt0 < kt1) {
    wr.load(wp, w0 + wrow, kt0, wu, nb, w0 + wrow < wend);
    #pragma unroll
    for (int i = 0; i < XU; ++i) {
      const int id = tid + i * C::THREADS;
      xr[i].load(xsrc, r0 + (id >> 2), kt0, id & 3, rend, k);
    }
  }
  #pragma unroll 1
  for (int kt = kt0; kt < kt1; ++kt) {
    lp_sync();  // the previous tile is consumed
    wr.store(t, wrow, wu);
    #pragma unroll
    for (int i = 0; i < XU; ++i) {
      const int id = tid + i * C::THREADS;
      xr[i].store(t, id >> 2, id & 3);
    }
    lp_sync();
    if (kt + 1 < kt1) {  // the next tile's loads fly under this tile's math
      wr.load(wp, w0 + wrow, kt + 1, wu, nb, w0 + wrow < wend);
      #pragma unroll
      for (int i = 0; i < XU; ++i) {
        const int id = tid + i * C::THREADS;
        xr[i].load(xsrc, r0 + (id >> 2), kt + 1, id & 3, rend, k);
      }
    }
    if constexpr (KIND == 0) lp_gemm_mma_tile<C, F>(t, acc);
    else lp_gemm_dot_tile<C, F>(t, acc);
  }
}

// the tile's k-tiles: every one of the k dimension (F16 tiles hold 64 values, the others 128)
template <int F> __device__ __forceinline__ int lp_gemm_ktiles(int k) {
  return LpW<F>::ACT == LP_ACT_F16 ? (k + 63) / 64 : (k + 127) / 128;
}

template <int TR, int TW, int KIND, class Put>
__device__ __forceinline__ void lp_gemm_store(const float (&acc)[LpGemmCfg<TR, TW, KIND>::ACC], Put put) {
  if constexpr (KIND == 0) lp_gemm_mma_store<LpGemmCfg<TR, TW, KIND>>(acc, put);
  else lp_gemm_dot_store<LpGemmCfg<TR, TW, KIND>>(acc, put);
}

// ---- one segment's tile ------------------------------------------------------------------------
template <int TR, int TW, int KIND, int F, int SPLIT, int RES>
__device__ __forceinline__ void lp_gemm_run(const LpGemmArgs& a, int seg, int tile, int coff, char* smem) {
  const int n = a.n[seg], k = a.k;
  const int w0 = tile * TW, r0 = lp_bid_y() * TR;
  const int nkt = lp_gemm_ktiles<F>(k);
  const int per = (nkt + a.splits - 1) / a.splits;
  const int kt0 = SPLIT ? lp_min(nkt, (int)lp_bid_z() * per) : 0;
  const int kt1 = SPLIT ? lp_min(nkt, kt0 + per) : nkt;
  float acc[LpGemmCfg<TR, TW, KIND>::ACC];
  lp_gemm_acc<TR, TW, KIND, F>(lp_weight_planes<F>(a.w[seg], n, k), w0, n, lp_gemm_xsrc<F>(a.x, a.rows, k), r0,
                               a.rows, k, kt0, kt1, smem, acc);
  lp_gemm_store<TR, TW, KIND>(acc, [&](int r, int c, float v) { lp_gemm_put<SPLIT, RES>(a, seg, coff, r0 + r, w0 + c, v); });
}

template <int A, int B> struct LpMax {
  static constexpr int V = A > B ? A : B;
};

// The kernel body: up to three segments (F0, F1, F2; NSEG used), RES: out = r + x.W^T, SPLIT: partial
// tiles to the workspace (ws [splits, rows, n0 + n1 + n2]) for lp_gemm_fixup.
template <int TR, int TW, int KIND, int F0, int F1, int F2, int NSEG, int RES, int SPLIT>
__device__ __forceinline__ void lp_gemm(const void* x, int rows, int k, const void* w0, int n0, float* o0, const void* w1, int n1,
                        float* o1, const void* w2, int n2, float* o2, const float* r, float* ws, int splits) {
  constexpr int B1 = (NSEG > 1) ? LpGemmSmem<TR, TW, F1>::BYTES : 0;
  constexpr int B2 = (NSEG > 2) ? LpGemmSmem<TR, TW, F2>::BYTES : 0;
  constexpr int BYTES = LpMax<LpGemmSmem<TR, TW, F0>::BYTES, LpMax<B1, B2>::V>::V;
  __shared__ char smem[BYTES] __attribute__((aligned(16)));
  LpGemmArgs a;
  a.x = x;
  a.rows = rows;
  a.k = k;
  a.w[0] = w0; a.w[1] = w1; a.w[2] = w2;
  a.n[0] = n0; a.n[1] = n1; a.n[2] = n2;
  a.out[0] = o0; a.out[1] = o1; a.out[2] = o2;
  a.r = r;
  a.ws = ws;
  a.splits = splits;
  a.ntot = n0 + n1 + n2;
  const int t0 = (n0 + TW - 1) / TW, t1 = (n1 + TW - 1) / TW;
  const int bx = lp_bid();
  if (bx < t0) {
    lp_gemm_run<TR, TW, KIND, F0, SPLIT, RES>(a, 0, bx, 0, smem);
  } else if constexpr (NSEG > 1) {
    if (bx < t0 + t1) {
      lp_gemm_run<TR, TW, KIND, F1, SPLIT, RES>(a, 1, bx - t0, n0, smem);
    } else if constexpr (NSEG > 2) {
      lp_gemm_run<TR, TW, KIND, F2, SPLIT, RES>(a, 2, bx - t0 - t1, n0 + n1, smem);
    }
  }
}

// Split-K fix-up: out_seg[row, c] = (r +) sum over splits of ws[split, row, c]. grid (ceil(ntot / 256), rows).
template <int NSEG, int RES>
__device__ __forceinline__ void lp_gemm_fixup(const float* ws, int splits, int rows, float* o0, int n0, float* o1, int n1, float* o2,
                              int n2, const float* r) {
  const int ntot = n0 + n1 + n2;
  const int c = lp_bid() * lp_bdim() + lp_tid(), row = lp_bid_y();
  if (c >= ntot) return;
  float v = 0.0f;
  for (int s = 0; s < splits; ++s) v += ws[((size_t)s * rows + row) * ntot + c];
  float* out = o0;
  int n = n0, col = c;
  if (NSEG > 1 && c >= n0) {
    out = o1; n = n1; col = c - n0;
    if (NSEG > 2 && col >= n1) {
      out = o2; n = n2; col -= n1;
    }
  }
  const size_t o = (size_t)row * n + col;
  out[o] = RES ? r[o] + v : v;
}
