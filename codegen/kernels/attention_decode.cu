// attention_decode.cu: split-context ("flash-decoding") attention for decode steps, in two kernels.
//
// lp_attention_partial<D, G, CHUNK, NT>: one block per (split j, K/V head, row): grid (splits, kv_heads,
// rows), NT threads. The block reads its row's positions [lo, hi) = [max(first, j*CHUNK),
// min(pos+1, (j+1)*CHUNK)) of one K/V head once and computes, for all G = heads / kv_heads query heads
// that share it (GQA), the slice's partial result: exp-weighted V sum [D], max score m, exp sum l,
// written to part [rows, heads, splits, D + 2]. Splits with no positions (outside the window or past
// pos) get (0, -inf, 0). The cache is paged (common.cuh): the chunk is CHUNK / LP_PAGE whole pages of
// the row's sequence (16 for a 256-position chunk), whose blocks the block reads from the page table
// once, into shared memory, while it loads q. This is core/numerics.py attention_partials / attend,
// in its order:
//   1. scores s[g][n] = (sum_d f16(q[g][d]) * k[n][d]) * scale in float32 (q rounded to f16 where it
//      meets the f16 cache; the products of two f16 values are exact in float32);
//   2. m[g] = max_n s, e = exp(s - m), l[g] = sum_n e (the unrounded e);
//   3. acc[g][d] = sum_n f16(e[g][n]) * v[n][d] (again exact products, float32 sums).
// Only the summation order differs from the twin (tolerance class: accumulation order, NMSE < 5e-4).
//
// Why it is fast (decode is memory bound: the K/V slice is the traffic): a position's K (or V) row of
// one head is D halves; L = D/8 lanes (a power of two, at most 32) each take 16 bytes of it with one
// 128-bit load, so a wave reads WAVE/L whole rows per instruction, fully coalesced (a page holds 16
// consecutive positions, so the rows a wave reads at once lie in one or two blocks), and every K/V
// byte is read once for all G query heads (q for the G heads sits in registers). A position's block
// comes from shared memory (a broadcast read: no global load in a K/V address's chain). Each thread
// issues U = 4 independent loads before using them (NT * 64 bytes in flight per block). Scores and f16 weights
// live in shared memory between the K and the V pass; the V pass accumulates G x 8 outputs per lane,
// reduced over the position groups of a wave with shuffles and over waves with a halving tree in the
// same shared memory. The grid (splits x kv_heads x rows) fills the GPU from one sequence once the
// context spans a few chunks; an unused split costs one block that writes its (0, -inf, 0) and leaves.
//
// lp_attention_reduce<FMT, TILE>: combines the splits (numerics.combine): top = max_j m_j,
// w_j = exp(m_j - top) (0 for empty splits), out = sum_j acc_j w_j / sum_j l_j w_j, for TILE
// consecutive outputs of one row per block: grid (ceil(heads*D / TILE), rows). FMT f32 stores the
// values; the packed formats (attention_reduce_pack) compute the tile into shared memory, then pack
// it with common.cuh's lp_pack_row on the tile's slice of the field planes (TILE is a multiple of
// 256, so a tile is whole q8_0/q8_1/q8_k blocks). Empty splits are skipped (the twin adds 0 for them).
#include "fused.cuh"

// 8 halves in 4 words -> 8 floats
__device__ __forceinline__ void lp_unpack_h8(const lp_u4& v, float* f) {
  #pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = lp_half_lo(v.w[i]);
    f[2 * i + 1] = lp_half_hi(v.w[i]);
  }
}

template <int D> struct LpAttnShape {
  static_assert(D % 8 == 0, "head_dim must be a multiple of 8 (16-byte slices of f16 K/V rows)");
  static constexpr int V8 = D / 8;  // 16-byte slices in a head row
  // lanes per position: the power of two covering V8 slices, at most 32 (one group never spans waves)
  static constexpr int L = V8 <= 1 ? 1 : V8 <= 2 ? 2 : V8 <= 4 ? 4 : V8 <= 8 ? 8 : V8 <= 16 ? 16 : 32;
  static constexpr int C = (V8 + L - 1) / L;  // slices per lane
};

// f(g, c, dim) for each query head g < G and each slice c of this lane (lane li of its position group)
// that lies in the head: dims dim .. dim + 7
template <int D, int G, class F> __device__ __forceinline__ void lp_attn_slices(int li, F f) {
  constexpr int L = LpAttnShape<D>::L, C = LpAttnShape<D>::C;
  #pragma unroll
  for (int g = 0; g < G; ++g) {
    #pragma unroll
    for (int c = 0; c < C; ++c) {
      const int dim = (c * L + li) * 8;
      if (dim < D) f(g, c, dim);
    }
  }
}

// U positions' K or V rows for this lane: slices c of positions n0 + pg + u * NG (u < U) of the head at
// `head` in its plane, position n in cache row rows[(n - c0) / LP_PAGE] + n % LP_PAGE (rows: the first
// row, block * LP_PAGE, of each page of the chunk); zeros past position hi or the head
template <int D, int U, int NG>
__device__ __forceinline__ void lp_attn_load(const lp_half* head, const int* rows, int c0, int kv_dim, int n0, int pg,
                                             int li, int hi, lp_u4 (&r)[U][LpAttnShape<D>::C]) {
  constexpr int L = LpAttnShape<D>::L, C = LpAttnShape<D>::C;
  #pragma unroll
  for (int u = 0; u < U; ++u) {
    const int n = n0 + pg + u * NG;
    const unsigned o = lp_min(n, hi - 1) - c0;  // position in the chunk (c0 is page-aligned), clamped
    const lp_half* row = head + (size_t)(rows[o / LP_PAGE] + o % LP_PAGE) * (unsigned)kv_dim;
    #pragma unroll
    for (int c = 0; c < C; ++c) {
      const int dim = (c * L + li) * 8;
      r[u][c] = (n < hi && dim < D) ? lp_load16(row + dim) : lp_zero16();
    }
  }
}

template <int D, int G, int CHUNK, int NT>
__device__ void lp_attention_partial(const float* __restrict__ q, const lp_half* __restrict__ cache,
                                     const int* __restrict__ seq, const int* __restrict__ pages,
                                     const int* __restrict__ pos, float* __restrict__ part, int layer, int npages,
                                     int blocks, int kv_heads, int splits, int window, float scale) {
  constexpr int L = LpAttnShape<D>::L, C = LpAttnShape<D>::C;
  constexpr int NG = NT / L;     // position groups per block
  constexpr int NW = NT / WAVE;  // waves per block (a power of two)
  constexpr int U = 4;           // loads in flight per thread
  constexpr int RED = (NW > 1 ? NW / 2 : 0) * G * D;
  constexpr int SC = G * CHUNK;
  static_assert(NT % WAVE == 0 && WAVE % L == 0, "position groups tile the waves");
  static_assert(CHUNK % LP_PAGE == 0, "a chunk is whole pages");
  __shared__ float smem[RED > SC ? RED : SC];  // scores / f16 weights, then the cross-wave reduction
  __shared__ float stat[2 * G];                // m, l per query head
  __shared__ int spage[CHUNK / LP_PAGE];       // the first cache row of each page of the chunk

  const int j = lp_bid(), kvh = lp_bid_y(), r = lp_bid_z();
  const int heads = kv_heads * G;
  const int p = pos[r];
  const int first = window > 0 ? lp_max(0, p - window + 1) : 0;
  const int c0 = j * CHUNK, lo = lp_max(first, c0), hi = lp_min(p + 1, c0 + CHUNK);
  const size_t hstride = (size_t)splits * (D + 2);
  float* outp = part + (((size_t)r * heads + (size_t)kvh * G) * splits + j) * (D + 2);

  if (lo >= hi) {  // an unused slice: (0, -inf, 0) for every head
    for (int i = lp_tid(); i < G * (D + 2); i += NT) {
      const int g = i / (D + 2), c = i % (D + 2);
      outp[g * hstride + c] = c == D ? -lp_inf() : 0.0f;
    }
    return;
  }

  // the pages holding [lo, hi), from the table (no other entry of its row is read: it may be unset)
  const int* table = pages + (size_t)seq[r] * npages + c0 / LP_PAGE;
  for (int i = (lo - c0) / LP_PAGE + lp_tid(); i <= (hi - 1 - c0) / LP_PAGE; i += NT) spage[i] = table[i] * LP_PAGE;

  const int li = lp_tid() % L, pg = lp_tid() / L;
  const int kv_dim = kv_heads * D;
  const lp_half* kb = cache + lp_kv_plane(layer, 0, blocks, kv_dim) + (size_t)kvh * D;
  const lp_half* vb = cache + lp_kv_plane(layer, 1, blocks, kv_dim) + (size_t)kvh * D;

  // this lane's query slices for the G heads, rounded to f16 (zeros past the head)
  float qv[G][C][8] = {};
  lp_attn_slices<D, G>(li, [&](int g, int c, int dim) {
    const float* qp = q + ((size_t)r * heads + kvh * G + g) * D + dim;
    const lp_f4 a = *(const lp_f4*)qp, b = *(const lp_f4*)(qp + 4);
    const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    #pragma unroll
    for (int e = 0; e < 8; ++e) qv[g][c][e] = lp_f16_round(x[e]);
  });
  lp_sync();  // spage is written

  // K pass: scores into shared memory. Loop bounds are block-uniform, so every lane reaches the shuffles.
  float* sc = smem;
  for (int n0 = lo; n0 < hi; n0 += NG * U) {
    lp_u4 kr[U][C];
    lp_attn_load<D, U, NG>(kb, spage, c0, kv_dim, n0, pg, li, hi, kr);
    #pragma unroll
    for (int u = 0; u < U; ++u) {
      float dot[G];
      #pragma unroll
      for (int g = 0; g < G; ++g) dot[g] = 0.0f;
      #pragma unroll
      for (int c = 0; c < C; ++c) {
        float kf[8];
        lp_unpack_h8(kr[u][c], kf);
        #pragma unroll
        for (int e = 0; e < 8; ++e) {
          #pragma unroll
          for (int g = 0; g < G; ++g) dot[g] += qv[g][c][e] * kf[e];  // exact products, f32 sums
        }
      }
      #pragma unroll
      for (int m = L / 2; m > 0; m >>= 1) {
        #pragma unroll
        for (int g = 0; g < G; ++g) dot[g] += lp_shfl_xor(dot[g], m);
      }
      const int n = n0 + pg + u * NG;
      if (li == 0 && n < hi) {
        #pragma unroll
        for (int g = 0; g < G; ++g) sc[g * CHUNK + (n - lo)] = dot[g] * scale;
      }
    }
  }
  lp_sync();

  // softmax statistics per head (one wave per head): m, e = exp(s - m) (stored f16-rounded), l = sum e
  const int npos = hi - lo;
  for (int g = lp_wave(); g < G; g += NW) {
    float* s = sc + g * CHUNK;
    float mx = -lp_inf();
    for (int i = lp_lane(); i < npos; i += WAVE) mx = lp_fmax(mx, s[i]);
    mx = lp_wave_max(mx);
    float sum = 0.0f;
    for (int i = lp_lane(); i < npos; i += WAVE) {
      const float e = lp_exp(s[i] - mx);
      sum += e;
      s[i] = lp_f16_round(e);
    }
    sum = lp_wave_sum(sum);
    if (lp_lane() == 0) {
      stat[g] = mx;
      stat[G + g] = sum;
    }
  }
  lp_sync();

  // V pass: acc[g][slice] += f16(e) * v, the same lane layout as the K pass
  float acc[G][C][8];
  #pragma unroll
  for (int g = 0; g < G; ++g) {
    #pragma unroll
    for (int c = 0; c < C; ++c) {
      #pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][c][e] = 0.0f;
    }
  }
  for (int n0 = lo; n0 < hi; n0 += NG * U) {
    lp_u4 vr[U][C];
    lp_attn_load<D, U, NG>(vb, spage, c0, kv_dim, n0, pg, li, hi, vr);
    #pragma unroll
    for (int u = 0; u < U; ++u) {
      const int n = n0 + pg + u * NG;
      if (n < hi) {
        float w[G];
        #pragma unroll
        for (int g = 0; g < G; ++g) w[g] = sc[g * CHUNK + (n - lo)];
        #pragma unroll
        for (int c = 0; c < C; ++c) {
          float vf[8];
          lp_unpack_h8(vr[u][c], vf);
          #pragma unroll
          for (int g = 0; g < G; ++g) {
            #pragma unroll
            for (int e = 0; e < 8; ++e) acc[g][c][e] += w[g] * vf[e];  // exact products, f32 sums
          }
        }
      }
    }
  }

  // reduce over the position groups of a wave (lane bits >= log2 L) ...
  #pragma unroll
  for (int m = L; m < WAVE; m <<= 1) {
    #pragma unroll
    for (int g = 0; g < G; ++g) {
      #pragma unroll
      for (int c = 0; c < C; ++c) {
        #pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][c][e] += lp_shfl_xor(acc[g][c][e], m);
      }
    }
  }
  // ... then over waves: a halving tree through shared memory (the scores are dead by now)
  const int w = lp_wave(), lane = lp_lane();
  if constexpr (NW > 1) {
    float* red = smem;
    lp_sync();
    for (int half = NW / 2; half >= 1; half >>= 1) {
      if (w >= half && w < 2 * half && lane < L) {
        lp_attn_slices<D, G>(lane, [&](int g, int c, int dim) {
          #pragma unroll
          for (int e = 0; e < 8; ++e) red[((w - half) * G + g) * D + dim + e] = acc[g][c][e];
        });
      }
      lp_sync();
      if (w < half && lane < L) {
        lp_attn_slices<D, G>(lane, [&](int g, int c, int dim) {
          #pragma unroll
          for (int e = 0; e < 8; ++e) acc[g][c][e] += red[(w * G + g) * D + dim + e];
        });
      }
      lp_sync();
    }
  }
  if (w == 0 && lane < L) {
    lp_attn_slices<D, G>(lane, [&](int g, int c, int dim) {
      #pragma unroll
      for (int e = 0; e < 8; ++e) outp[g * hstride + dim + e] = acc[g][c][e];
    });
  }
  if (lp_tid() < G) {
    outp[lp_tid() * hstride + D] = stat[lp_tid()];
    outp[lp_tid() * hstride + D + 1] = stat[G + lp_tid()];
  }
}

// Output t0 + i of row r: the splits combined as numerics.combine does. The numerator adds the
// products acc_j * w_j in split order, rounded one by one as NumPy does (never fused).
__device__ __forceinline__ float lp_attention_combine(const float* __restrict__ part, int r, int heads, int d,
                                                      int splits, int i) {
  const int h = i / d, dim = i % d;
  const float* p = part + ((size_t)r * heads + h) * splits * (d + 2);
  float top = -lp_inf();
  for (int j = 0; j < splits; ++j) top = lp_fmax(top, p[(size_t)j * (d + 2) + d]);
  float num = 0.0f, den = 0.0f;
  for (int j = 0; j < splits; ++j) {
    const float* pj = p + (size_t)j * (d + 2);
    const float m = pj[d];
    if (!lp_isfinite(m)) continue;  // an empty split: weight 0
    const float wj = lp_exp(m - top);
    num = lp_add_rn(num, lp_mul_rn(pj[dim], wj));
    den = lp_add_rn(den, lp_mul_rn(pj[d + 1], wj));
  }
  return num / den;
}

template <int FMT, int TILE>
__device__ void lp_attention_reduce(const float* __restrict__ part, void* out, int rows, int heads, int d,
                                    int splits) {
  static_assert(TILE % 256 == 0, "a tile is whole 8-bit blocks");
  const int k = heads * d, t0 = lp_bid() * TILE, r = lp_bid_y();
  const int kt = lp_min(TILE, k - t0);
  if constexpr (FMT == LP_ACT_F32) {
    for (int i = lp_tid(); i < kt; i += lp_bdim())
      ((float*)out)[(size_t)r * k + t0 + i] = lp_attention_combine(part, r, heads, d, splits, t0 + i);
  } else {
    __shared__ float vals[TILE];
    for (int i = lp_tid(); i < kt; i += lp_bdim()) vals[i] = lp_attention_combine(part, r, heads, d, splits, t0 + i);
    lp_sync();
    lp_store_tile<FMT>([&](int i) { return vals[i]; }, out, rows, k, r, t0, kt);
  }
}
