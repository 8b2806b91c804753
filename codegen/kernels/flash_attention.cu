// flash_attention.cu: prefill attention over the f16 K/V cache, compute-bound.
//
// What it computes: core/numerics.py attention. Query row r (heads of D values) attends over sequence
// seq[r]'s positions [first, pos[r]] (first = pos[r] - window + 1 when window > 0, else 0) in the
// cache's layer; query head h reads K/V head h / (heads / kv_heads). The cache is paged (common.cuh):
// position p of sequence s is in block pages[s * npages + p / LP_PAGE], offset p % LP_PAGE. Q is rounded
// to f16, scores are f32 dot products times `scale`, softmax in f32 (online: running max and sum,
// rescaled as the max grows), the exp weights are rounded to f16 where they meet V, products accumulate
// in f32, out = acc / sum of the unrounded weights. The twin combines 256-position slices and rounds
// exp(s - the slice's max) to f16 where this kernel rounds exp(s - running max): an accumulation-order
// difference (NMSE well under 5e-4).
//
// lp_attention_flash<D>: matrix cores (mma.sync m16n8k16 f16 on sm_80+, WMMA f16 16x16x16 on gfx11).
//   A block serves one K/V head and BQ = 16 * NW query vectors: RQ = BQ / G consecutive rows x the
//   G = heads / kv_heads query heads that share the K/V head (GQA: K/V are read once for the group).
//   grid = (ceil(rows / RQ), kv_heads), NW waves of 32. Each wave owns 16 query vectors; S = Q K^T and
//   O += P V run on f16 fragments with f32 accumulators, P kept in registers (mma.cuh's LpRowMma: gfx11
//   computes S^T = K Q^T and O^T = V^T P^T so that one lane owns one query vector). K tiles [BKV][D]
//   and V tiles stored transposed [D][BKV] sit in shared memory (rows padded by 16 bytes:
//   conflict-free fragment loads).
//   Rows of different sequences may share a tile (a chunk spans sequences): the block walks the distinct
//   sequences of its tile in turn, each over the union of its rows' ranges, with every other row masked.
//   K/V tiles are whole pages (BKV is a multiple of LP_PAGE; a walk starts at a page boundary), gathered
//   through the page table: each tile's blocks sit in shared memory, read from the table one tile ahead
//   (during the previous tile's loads), so no global load of the table is in a tile's address chain.
//   Positions of a tile outside the walk's range load as zeros (V must be finite where P is 0).
//   Shared memory (static): D=64: NW 4, BKV 64; D=128: NW 4, BKV 32; D=256: NW 2, BKV 16 (LpFlashCfg).
// lp_attention_rows<D>: no matrix cores, every target. One block of 128 threads per (row, query head):
//   each wave takes WAVE-position chunks (one score per lane, then the chunk's weights meet V with lanes
//   split over D), and the waves' partial (max, sum, acc) combine at the end.
//
// Why it is fast: prefill attention is compute-bound; the flash kernel reads each K/V tile once per
// block of BQ query vectors (all GQA heads together), keeps scores in registers (never in memory) and
// does both products on matrix cores; waves skip K/V tiles outside their own rows' causal ranges.
#include "common.cuh"
#include "mma.cuh"

#define LP_BIG 0x7fffffff

template <int D> struct LpFlashCfg;
template <> struct LpFlashCfg<64> { static constexpr int NW = 4, BKV = 64; };
template <> struct LpFlashCfg<128> { static constexpr int NW = 4, BKV = 32; };
template <> struct LpFlashCfg<256> { static constexpr int NW = 2, BKV = 16; };

// rows of 32-bit words in shared memory as mma.cuh's fragment loaders read them; at(row, w) is the
// address of word w of a row (a lambda on the __shared__ array itself: its address space stays in view)
template <class At> struct LpWordRows {
  At at;
  __device__ __forceinline__ int word(int row, int w) const { return (int)*at(row, w); }
  template <int W> __device__ __forceinline__ void words(int row, int w0, int (&r)[W]) const {
    const unsigned* p = at(row, w0);
    #pragma unroll
    for (int j = 0; j < W; ++j) r[j] = (int)p[j];
  }
};
template <class At> __device__ __forceinline__ LpWordRows<At> lp_word_rows(At at) { return {at}; }

__device__ __forceinline__ int lp_wave_min_i(int v) {
  #pragma unroll
  for (int m = WAVE / 2; m > 0; m >>= 1) v = lp_min(v, lp_shfl_xor(v, m));
  return v;
}

// min over the block of int values; every thread gets it (scratch: one int per wave)
__device__ __forceinline__ int lp_block_min_i(int v, int* scratch) {
  v = lp_wave_min_i(v);
  if (lp_lane() == 0) scratch[lp_wave()] = v;
  lp_sync();
  int m = LP_BIG;
  for (int w = 0; w < lp_waves(); ++w) m = lp_min(m, scratch[w]);
  lp_sync();
  return m;
}

__device__ __forceinline__ int lp_first_position(int p, int window) { return window > 0 ? lp_max(0, p - window + 1) : 0; }

// ---- flash (matrix cores) ----------------------------------------------------------------------
template <int D>
__device__ __forceinline__ void lp_attention_flash(const float* __restrict__ q, const lp_half* __restrict__ cache,
                                   const int* __restrict__ seq, const int* __restrict__ pages,
                                   const int* __restrict__ posv, float* __restrict__ out, int rows, int heads,
                                   int kv_heads, int npages, int blocks, int layer, float scale, int window) {
#if defined(LP_FRAGMENTS)
  typedef LpRowMma M;  // S = Q K^T and O += P V over the wave's 16 query vectors (mma.cuh)
  constexpr int NW = LpFlashCfg<D>::NW, BKV = LpFlashCfg<D>::BKV, BQ = 16 * NW, THREADS = 32 * NW;
  constexpr int QW = D / 2 + 4;    // words per Q / K row in shared memory (16 bytes of padding)
  constexpr int VW = BKV / 2 + 4;  // words per transposed V row
  constexpr int SF = BKV / M::N, OF = D / M::N;  // S and O fragments of a lane
  __shared__ unsigned sq[BQ * QW];
  __shared__ unsigned sk[BKV * QW];
  __shared__ unsigned svt[D * VW];
  __shared__ int sseq[BQ], spos[BQ], sfirst[BQ], sred[NW];
  constexpr int TP = BKV / LP_PAGE;  // pages per K/V tile
  // a tile's loads per thread: KL of K (rows KR apart), VL pairs of V (chunks VC apart)
  constexpr int KR = THREADS / (D / 8), KL = BKV / KR, VC = THREADS / (BKV / 2), VL = D / 8 / VC;
  static_assert(BKV % LP_PAGE == 0, "a K/V tile is whole pages");
  static_assert(KR * (D / 8) == THREADS && KL * KR == BKV && VC * (BKV / 2) == THREADS && VL * VC == D / 8,
                "the threads tile the K/V tiles");
  __shared__ int sblk[2][TP];  // the blocks of this tile's pages and of the next tile's
  const auto qt = lp_word_rows([](int row, int w) { return &sq[row * QW + w]; });
  const auto kt = lp_word_rows([](int row, int w) { return &sk[row * QW + w]; });
  const auto vt = lp_word_rows([](int row, int w) { return &svt[row * VW + w]; });

  const int tid = lp_tid(), wave = lp_wave(), lane = lp_lane();
  const int G = heads / kv_heads, kvh = lp_bid_y(), RQ = BQ / G;
  const int r0 = lp_bid() * RQ, kvdim = kv_heads * D, qdim = heads * D;

  for (int v = tid; v < BQ; v += THREADS) {
    const int row = r0 + v / G;
    const bool ok = v < RQ * G && row < rows;
    const int p = ok ? posv[row] : -1;
    sseq[v] = ok ? seq[row] : -1;
    spos[v] = p;
    sfirst[v] = ok ? lp_first_position(p, window) : LP_BIG;
  }
  // Q tile, rounded to f16: vector v = (row r0 + v / G, head kvh * G + v % G)
  for (int i = tid; i < BQ * (D / 8); i += THREADS) {
    const int v = i / (D / 8), c = i % (D / 8);
    const int row = r0 + v / G;
    unsigned w[4] = {0u, 0u, 0u, 0u};
    if (v < RQ * G && row < rows) {  // two 16-byte loads of f32, rounded to f16 pairs
      const float* src = q + (size_t)row * qdim + (size_t)(kvh * G + v % G) * D + c * 8;
      const lp_u4 lo = lp_load16(src), hi = lp_load16(src + 4);
      #pragma unroll
      for (int j = 0; j < 2; ++j) {
        w[j] = lp_pack_h2(lp_as_float((int)lo.w[2 * j]), lp_as_float((int)lo.w[2 * j + 1]));
        w[2 + j] = lp_pack_h2(lp_as_float((int)hi.w[2 * j]), lp_as_float((int)hi.w[2 * j + 1]));
      }
    }
    #pragma unroll
    for (int j = 0; j < 4; ++j) sq[v * QW + c * 4 + j] = w[j];
  }
  lp_sync();

  const lp_half* kbase = cache + lp_kv_plane(layer, 0, blocks, kvdim) + (size_t)kvh * D;
  const lp_half* vbase = cache + lp_kv_plane(layer, 1, blocks, kvdim) + (size_t)kvh * D;

  // the wave's vectors are wv .. wv + 15; a lane holds M::SLOTS of them, wv + M::row(h)
  const int wv = wave * 16;
  const int my_v = wv + (lane & 15);  // for the wave's range: lanes 0..15 and 16..31 repeat
  LpFragAcc o[OF];
  #pragma unroll
  for (int i = 0; i < OF; ++i)
    #pragma unroll
    for (int e = 0; e < LP_FRAG_EL; ++e) o[i][e] = 0.0f;
  float m[M::SLOTS], l[M::SLOTS];
  #pragma unroll
  for (int h = 0; h < M::SLOTS; ++h) {
    m[h] = -__builtin_inff();
    l[h] = 0.0f;
  }

  int prev = -1;
  #pragma unroll 1
  while (true) {
    // the next sequence of the tile, and the union of its rows' ranges
    int cand = LP_BIG;
    for (int v = tid; v < BQ; v += THREADS)
      if (sseq[v] > prev) cand = lp_min(cand, sseq[v]);
    const int S = lp_block_min_i(cand, sred);
    if (S == LP_BIG) break;
    int lo = LP_BIG, hi_neg = LP_BIG;
    for (int v = tid; v < BQ; v += THREADS)
      if (sseq[v] == S) {
        lo = lp_min(lo, sfirst[v]);
        hi_neg = lp_min(hi_neg, -(spos[v] + 1));
      }
    lo = lp_block_min_i(lo, sred);
    const int hi_end = -lp_block_min_i(hi_neg, sred);
    // this wave's own range (a wave skips tiles no row of its own needs)
    const bool mine = sseq[my_v] == S;
    const int wlo = lp_wave_min_i(mine ? sfirst[my_v] : LP_BIG);
    const int whi = -lp_wave_min_i(mine ? -(spos[my_v] + 1) : LP_BIG);
    // S's page table row: only the pages holding [lo, hi_end) are read (the others may be unset)
    const int* table = pages + (size_t)S * npages;
    const int first_page = lo / LP_PAGE, last_page = (hi_end - 1) / LP_PAGE;
    if (tid < TP) sblk[0][tid] = first_page + tid <= last_page ? table[first_page + tid] : 0;

    int buf = 0;
    #pragma unroll 1
    for (int j0 = first_page * LP_PAGE; j0 < hi_end; j0 += BKV, buf ^= 1) {
      lp_sync();  // the previous tile is consumed; this tile's blocks are in sblk[buf]
      const int* blk = sblk[buf];
      if (tid < TP) {  // the next tile's blocks, published by the barrier after the loads
        const int pn = j0 / LP_PAGE + TP + tid;
        sblk[buf ^ 1][tid] = pn <= last_page ? table[pn] : 0;
      }
      // Thread t loads chunk kc = t % (D / 8) of the K rows t / (D / 8) + k * KR, then the V pairs at
      // positions vrow, vrow + 1 of the chunks t / (BKV / 2) + k * VC (16 bytes each). Each phase reads
      // its rows' blocks from shared memory before it stores anything: a shared load after the tile's
      // shared stores would wait for them, and its global load with it. So the K loads are all in
      // flight at once, and so are the V loads, after the K stores (one phase's loads at a time bounds
      // the registers).
      const int kc = tid % (D / 8), vrow = 2 * (tid % (BKV / 2));
      int kblk[KL];
      #pragma unroll
      for (int k = 0; k < KL; ++k) kblk[k] = blk[(tid / (D / 8) + k * KR) / LP_PAGE];
      #pragma unroll
      for (int k = 0; k < KL; ++k) {
        const int r = tid / (D / 8) + k * KR, p = j0 + r;
        const lp_half* src = kbase + lp_kv_row(kblk[k], r % LP_PAGE, kvdim) + kc * 8;
        const lp_u4 v = p >= lo && p < hi_end ? lp_load16(src) : lp_zero16();
        #pragma unroll
        for (int j = 0; j < 4; ++j) sk[r * QW + kc * 4 + j] = v.w[j];
      }
      // V transposed: word vrow / 2 of row d holds positions vrow, vrow + 1 (one page: the tile starts on
      // one); zeros outside the range, where P is 0
      const int vblk = blk[vrow / LP_PAGE], pv = j0 + vrow;
      #pragma unroll
      for (int k = 0; k < VL; ++k) {
        const int c = tid / (BKV / 2) + k * VC;
        const lp_half* src = vbase + lp_kv_row(vblk, vrow % LP_PAGE, kvdim) + c * 8;
        const lp_u4 v0 = pv >= lo && pv < hi_end ? lp_load16(src) : lp_zero16();
        const lp_u4 v1 = pv + 1 >= lo && pv + 1 < hi_end ? lp_load16(src + kvdim) : lp_zero16();
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
          svt[(c * 8 + 2 * j) * VW + vrow / 2] = (v0.w[j] & 0xFFFFu) | (v1.w[j] << 16);
          svt[(c * 8 + 2 * j + 1) * VW + vrow / 2] = (v0.w[j] >> 16) | (v1.w[j] & 0xFFFF0000u);
        }
      }
      lp_sync();
      if (j0 >= whi || j0 + BKV <= wlo) continue;  // nothing in this tile for this wave's rows

      // S = Q K^T: element e of fragment f is position M::col(j0 + f * M::N, e) of slot e / M::ROW_EL
      LpFragAcc st[SF];
      #pragma unroll
      for (int f = 0; f < SF; ++f)
        #pragma unroll
        for (int e = 0; e < LP_FRAG_EL; ++e) st[f][e] = 0.0f;
      #pragma unroll 2
      for (int kd = 0; kd < D / 16; ++kd) {
        const M::Rows a = M::rows(qt, wv, 8 * kd);
        #pragma unroll
        for (int f = 0; f < SF; ++f) M::mma(st[f], a, M::cols(kt, f * M::N, 8 * kd));
      }
      // mask, scale, online softmax
      float s[SF][LP_FRAG_EL], mx[M::SLOTS];
      #pragma unroll
      for (int h = 0; h < M::SLOTS; ++h) {
        const int v = wv + M::row(h);
        const int vs = sseq[v], vf = sfirst[v], vp = spos[v];
        mx[h] = -__builtin_inff();
        #pragma unroll
        for (int f = 0; f < SF; ++f)
          #pragma unroll
          for (int e = M::ROW_EL * h; e < M::ROW_EL * (h + 1); ++e) {
            const int p = M::col(j0 + f * M::N, e);
            const bool ok = vs == S && p >= vf && p <= vp;
            const float x = ok ? st[f][e] * scale : -__builtin_inff();
            s[f][e] = x;
            mx[h] = lp_fmax(mx[h], x);
          }
      }
      float alpha[M::SLOTS];
      #pragma unroll
      for (int h = 0; h < M::SLOTS; ++h) {
        mx[h] = M::max(mx[h]);
        const float mn = lp_fmax(m[h], mx[h]);
        alpha[h] = mn == -__builtin_inff() ? 1.0f : lp_exp(m[h] - mn);
        m[h] = mn;
      }
      float sum[M::SLOTS];
      #pragma unroll
      for (int h = 0; h < M::SLOTS; ++h) sum[h] = 0.0f;
      #pragma unroll
      for (int f = 0; f < SF; ++f)
        #pragma unroll
        for (int e = 0; e < LP_FRAG_EL; ++e) {
          const float x = s[f][e];
          const float p = x == -__builtin_inff() ? 0.0f : lp_exp(x - m[e / M::ROW_EL]);
          s[f][e] = p;
          sum[e / M::ROW_EL] += p;
        }
      #pragma unroll
      for (int h = 0; h < M::SLOTS; ++h) {
        sum[h] = M::sum(sum[h]);
        l[h] = l[h] * alpha[h] + sum[h];
      }
      #pragma unroll
      for (int nd = 0; nd < OF; ++nd)
        #pragma unroll
        for (int e = 0; e < LP_FRAG_EL; ++e) o[nd][e] *= alpha[e / M::ROW_EL];
      // O += P V, 16 positions of P at a time: element e of fragment nd is dimension M::col(nd * M::N, e)
      #pragma unroll
      for (int kk = 0; kk < BKV / 16; ++kk) {
        const M::Rows a = M::rows_of(&s[kk * 16 / M::N]);
        #pragma unroll
        for (int nd = 0; nd < OF; ++nd) M::mma(o[nd], a, M::cols(vt, nd * M::N, 8 * kk));
      }
    }
    prev = S;
  }

  // out = acc / sum, rows of this tile only
  #pragma unroll
  for (int h = 0; h < M::SLOTS; ++h) {
    const int v = wv + M::row(h);
    const int row = r0 + v / G;
    if (v < RQ * G && row < rows) {
      float* dst = out + (size_t)row * qdim + (size_t)(kvh * G + v % G) * D;
      #pragma unroll
      for (int nd = 0; nd < OF; ++nd)
        #pragma unroll
        for (int e = M::ROW_EL * h; e < M::ROW_EL * (h + 1); ++e) dst[M::col(nd * M::N, e)] = o[nd][e] / l[h];
    }
  }
#else
  (void)q; (void)cache; (void)seq; (void)pages; (void)posv; (void)out; (void)rows; (void)heads; (void)kv_heads;
  (void)npages; (void)blocks; (void)layer; (void)scale; (void)window;
  __builtin_trap();  // no matrix cores here: the family declares itself unsupported (codegen/targets.py)
#endif
}

// ---- rows (no matrix cores) --------------------------------------------------------------------
// grid (rows, heads), 128 threads. Wave w takes WAVE-position chunks w, w + NWR, ...: lane l scores
// position base + l against the f16-rounded query (from shared memory), then the chunk's weights
// (f16-rounded) meet V with each lane holding D / WAVE output values. Lane l looks up the block of
// position base + l (one chunk ahead, so the table read is in flight while the chunk computes) and
// hands it to the other lanes with a shuffle when they read that position's V row.
template <int D>
__device__ __forceinline__ void lp_attention_rows(const float* __restrict__ q, const lp_half* __restrict__ cache,
                                  const int* __restrict__ seq, const int* __restrict__ pages,
                                  const int* __restrict__ posv, float* __restrict__ out, int rows, int heads,
                                  int kv_heads, int npages, int blocks, int layer, float scale, int window) {
  static_assert(D % WAVE == 0 && D <= 256, "head dim: a multiple of the wave width, up to 256");
  constexpr int NWR = 128 / WAVE, DL = D / WAVE;  // waves; output values per lane
  __shared__ float sq[D];
  __shared__ float sm[NWR], sl[NWR];
  __shared__ float sacc[NWR][D];
  const int row = lp_bid(), h = lp_bid_y(), wave = lp_wave(), lane = lp_lane();
  (void)rows;
  const int kvh = h / (heads / kv_heads), kvdim = kv_heads * D;
  for (int i = lp_tid(); i < D; i += lp_bdim()) sq[i] = lp_h2f(lp_f2h(q[(size_t)row * heads * D + (size_t)h * D + i]));
  lp_sync();
  const int p = posv[row], lo = lp_first_position(p, window), hi_end = p + 1;
  const lp_half* kb = cache + lp_kv_plane(layer, 0, blocks, kvdim) + (size_t)kvh * D;
  const lp_half* vb = cache + lp_kv_plane(layer, 1, blocks, kvdim) + (size_t)kvh * D;
  const int* table = pages + (size_t)seq[row] * npages;
  auto block_of = [&](int pl) { return pl < hi_end ? table[pl / LP_PAGE] : 0; };  // the table past hi_end: unset
  float m = -__builtin_inff(), l = 0.0f, acc[DL];
  #pragma unroll
  for (int i = 0; i < DL; ++i) acc[i] = 0.0f;
  int blk = block_of(lo + wave * WAVE + lane);
  #pragma unroll 1
  for (int c0 = lo + wave * WAVE; c0 < hi_end; c0 += NWR * WAVE) {
    const int pl = c0 + lane;
    const int next = block_of(pl + NWR * WAVE);
    float s = -__builtin_inff();
    if (pl < hi_end) {
      const lp_half* kr = kb + lp_kv_row(blk, pl % LP_PAGE, kvdim);
      float dot = 0.0f;
      #pragma unroll 4
      for (int c = 0; c < D / 8; ++c) {
        const lp_u4 kw = lp_load16(kr + c * 8);
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
          dot = __builtin_fmaf(sq[c * 8 + 2 * j], lp_half_lo(kw.w[j]), dot);
          dot = __builtin_fmaf(sq[c * 8 + 2 * j + 1], lp_half_hi(kw.w[j]), dot);
        }
      }
      s = dot * scale;
    }
    const float mn = lp_fmax(m, lp_wave_max(s));
    const float alpha = mn == -__builtin_inff() ? 1.0f : lp_exp(m - mn);
    m = mn;
    const float pw = s == -__builtin_inff() ? 0.0f : lp_exp(s - m);
    l = l * alpha + lp_wave_sum(pw);
    const float pr = lp_h2f(lp_f2h(pw));  // the weight as it meets V
    #pragma unroll
    for (int i = 0; i < DL; ++i) acc[i] *= alpha;
    const int n = lp_min(WAVE, hi_end - c0);
    #pragma unroll 1
    for (int j = 0; j < n; ++j) {
      const float pj = lp_shfl(pr, j);
      const lp_half* vr = vb + lp_kv_row(lp_shfl(blk, j), (c0 + j) % LP_PAGE, kvdim) + lane * DL;
      #pragma unroll
      for (int i = 0; i < DL; ++i) acc[i] = __builtin_fmaf(pj, lp_h2f(vr[i]), acc[i]);
    }
    blk = next;
  }
  if (lane == 0) {
    sm[wave] = m;
    sl[wave] = l;
  }
  #pragma unroll
  for (int i = 0; i < DL; ++i) sacc[wave][lane * DL + i] = acc[i];
  lp_sync();
  float top = -__builtin_inff();
  for (int w = 0; w < NWR; ++w) top = lp_fmax(top, sm[w]);
  float total = 0.0f;
  for (int w = 0; w < NWR; ++w) total += sm[w] == -__builtin_inff() ? 0.0f : sl[w] * lp_exp(sm[w] - top);
  for (int i = lp_tid(); i < D; i += lp_bdim()) {
    float a = 0.0f;
    for (int w = 0; w < NWR; ++w) a += sm[w] == -__builtin_inff() ? 0.0f : sacc[w][i] * lp_exp(sm[w] - top);
    out[(size_t)row * heads * D + (size_t)h * D + i] = a / total;
  }
}
