// experts.cu: the routed experts' projections (ops matmul_experts, matmul_experts_residual; CPU twin
// runtime/numpy_kernels.py experts, core/numerics.py matmul_experts and moe_sum).
//
// lp_matmul_experts: grid (top * ceil(n / waves per block), rows), one wave per output row as the mat-vec
// (matvec.cu): block (j * tiles + t, row) serves slot s = row * top + j, whose expert e = ids[s] the router
// wrote to the device,
// so the launch is the same whatever the routing (graph replay and pipelined decode keep working). The
// wave reads row e * n + r of the [experts * n, k] weight (its planar planes: quant.cuh LpWeight over
// experts * n rows) against the slot's activation row (x's row, or the slot's own k-wide slice where x
// holds one per slot: `sliced`), so a step reads the routed experts' rows and no others. Out: y [slots, n].
//
// lp_moe_weighted_sum (kernel lp_moe_sum_residual): grid (ceil(n / THREADS), rows): out = r + (y_0 * w_0 +
// y_1 * w_1 + ...), slot after slot, every product and sum rounded alone (lp_mul_rn, lp_add_rn: the twin's
// order); r may be out.
//
// More rows: lp_moe_group and lp_moe_gather group the slots by expert and gather their activation rows;
// then the grouped mat-vec (lp_matmul_experts_grouped, a few rows) or, for a prefill chunk, one GEMM per
// expert over its rows (lp_moe_tiles, lp_gemm_experts: gemm.cu's tiles, so a row's sums are the dense GEMM's).
#include "quant.cuh"
#include "gemm.cu"

template <int F>
__device__ void lp_matmul_experts(const void* x, const void* w, const int* ids, float* y, int rows, int k, int n,
                                  int experts, int top, int sliced) {
  constexpr int ACT = LpWeight<F>::ACT;
  const int tiles = (n + lp_waves() - 1) / lp_waves();
  const int s = lp_bid_y() * top + lp_bid() / tiles, e = ids[s];
  const int row = lp_bid() % tiles * lp_waves() + lp_wave();  // whole waves take or skip a row: the shuffles stay uniform
  if (row >= n || e < 0 || e >= experts) return;
  const LpX xs = lp_x<ACT>(x, sliced ? rows * top : rows, k, sliced ? s : s / top);
  const LpWeight<F> wt(w, experts * n, k);
  float acc[1];
  lp_row_dot<F, 1>(wt, (size_t)e * n + row, xs, 1, acc);
  if (lp_lane() == 0) y[(size_t)s * n + row] = acc[0];
}

__device__ void lp_moe_weighted_sum(const float* y, const float* weights, const float* r, float* out, int n, int top) {
  const int row = lp_bid_y(), i = lp_bid() * lp_bdim() + lp_tid();
  if (i >= n) return;
  const float* wr = weights + (size_t)row * top;
  const float* yr = y + (size_t)row * top * n + i;
  float s = lp_mul_rn(yr[0], wr[0]);
  for (int j = 1; j < top; ++j) s = lp_add_rn(s, lp_mul_rn(yr[(size_t)j * n], wr[j]));
  out[(size_t)row * n + i] = lp_add_rn(r[(size_t)row * n + i], s);
}

// --- batched rows grouped by expert (decode-batch and prefill) --------------------------------------------
//
// The groups scratch (int32), written by lp_moe_group for S = rows * top slots: [0] the group count G;
// [1, 1 + S) each group's expert, ascending; [1 + S, 2 + 2S) each group's first position (G + 1 of them);
// [2 + 2S, 2 + 3S) the slots in group order (within a group, slot order); [2 + 3S, 2 + 4S) each slot's
// position (LP_UNUSED: an id out of range, no group). 4S + 2 ints in all (codegen/families/experts.py group_ints).
constexpr int LP_UNUSED = -2;  // not -1: poison mode's mark of an int left unwritten

// grid (1,), THREADS threads: the scratch (rows * (4 top + 2) ints) first filled with LP_UNUSED, so that
// what no group uses holds a value too (poison mode checks every int of it); then thread t counts and places the slots of experts t, t + THREADS, ... (a
// pass over the ids each), thread 0 scanning the counts in expert order between the two passes. No atomics:
// the grouping is the same every run. MAX_E: the most experts a model has (the shared array's size).
template <int THREADS, int MAX_E>
__device__ void lp_moe_group(const int* ids, int* groups, int rows, int experts, int top) {
  __shared__ int first[MAX_E + 1];
  const int S = rows * top;
  for (int i = lp_tid(); i < rows * (4 * top + 2); i += THREADS) groups[i] = LP_UNUSED;
  lp_sync();
  for (int e = lp_tid(); e < experts; e += THREADS) {
    int count = 0;
    for (int s = 0; s < S; ++s) count += ids[s] == e;
    first[e + 1] = count;
  }
  lp_sync();
  if (lp_tid() == 0) {
    int g = 0;
    first[0] = 0;
    for (int e = 0; e < experts; ++e) {
      if (first[e + 1] > 0) {
        groups[1 + g] = e;
        groups[1 + S + g] = first[e];
        ++g;
      }
      first[e + 1] += first[e];
    }
    groups[0] = g;
    groups[1 + S + g] = first[experts];
  }
  lp_sync();
  for (int e = lp_tid(); e < experts; e += THREADS) {
    int at = first[e];
    for (int s = 0; s < S; ++s) {
      if (ids[s] != e) continue;
      groups[2 + 2 * S + at] = s;
      groups[2 + 3 * S + s] = at++;
    }
  }
}

// grid (top, rows), THREADS threads: slot s = row * top + j's activation row (x's row, or its own slice:
// `sliced`) copied into row position[s] of the packed [S, k] buffer xg, plane by plane
template <int ACT, int THREADS>
__device__ void lp_moe_gather(const void* x, const int* groups, void* xg, int rows, int k, int top, int sliced) {
  const int S = rows * top, s = lp_bid_y() * top + lp_bid(), at = groups[2 + 3 * S + s];
  if (at < 0) return;
  const int src = sliced ? s : s / top, from = sliced ? S : rows;
  if constexpr (ACT == LP_ACT_F16) {
    const lp_half* a = (const lp_half*)x + (size_t)src * k;
    lp_half* b = (lp_half*)xg + (size_t)at * k;
    for (int i = lp_tid(); i < k; i += THREADS) b[i] = a[i];
  } else {
    const Q8Rows a = lp_q8_rows((void*)x, from, k, ACT), b = lp_q8_rows(xg, S, k, ACT);
    for (int i = lp_tid(); i < k; i += THREADS) b.qs[(size_t)at * k + i] = a.qs[(size_t)src * k + i];
    if constexpr (ACT == LP_ACT_Q8_K) {
      for (int i = lp_tid(); i < k / 256; i += THREADS)
        ((float*)b.d)[(size_t)at * (k / 256) + i] = ((const float*)a.d)[(size_t)src * (k / 256) + i];
      for (int i = lp_tid(); i < k / 16; i += THREADS) b.bsums[(size_t)at * (k / 16) + i] = a.bsums[(size_t)src * (k / 16) + i];
    } else {
      for (int i = lp_tid(); i < k / 32; i += THREADS) {
        ((lp_half*)b.d)[(size_t)at * (k / 32) + i] = ((const lp_half*)a.d)[(size_t)src * (k / 32) + i];
        if constexpr (ACT == LP_ACT_Q8_1) b.s[(size_t)at * (k / 32) + i] = a.s[(size_t)src * (k / 32) + i];
      }
    }
  }
}

// grid (top * ceil(n / waves per block), rows), one wave per output row of one group: block (j * tiles + t,
// r) serves group g = r * top + j (blocks past the group count return), expert groups[1 + g]; the wave reads
// that expert's row once for every C of the group's slots (their rows adjacent in xg), so one pass over an
// expert's rows serves up to C rows routed to it. Out: y [S, n] at each slot's own row.
template <int F, int C>
__device__ void lp_matmul_experts_grouped(const void* xg, const void* w, const int* groups, float* y, int rows, int k,
                                          int n, int experts, int top) {
  constexpr int ACT = LpWeight<F>::ACT;
  const int S = rows * top, tiles = (n + lp_waves() - 1) / lp_waves();
  const int g = lp_bid_y() * top + lp_bid() / tiles;
  if (g >= groups[0]) return;
  const int row = lp_bid() % tiles * lp_waves() + lp_wave();  // whole waves take or skip a row
  if (row >= n) return;
  const int e = groups[1 + g], last = groups[2 + S + g];
  const int* order = groups + 2 + 2 * S;
  const LpWeight<F> wt(w, experts * n, k);
  for (int c0 = groups[1 + S + g]; c0 < last; c0 += C) {
    const int ncols = lp_min(C, last - c0);
    const LpX xs = lp_x<ACT>(xg, S, k, c0);
    float acc[C];
    lp_row_dot<F, C>(wt, (size_t)e * n + row, xs, ncols, acc);
    #pragma unroll
    for (int c = 0; c < C; ++c)
      if (c < ncols && lp_lane() == c) y[(size_t)order[c0 + c] * n + row] = acc[c];
  }
}

// --- prefill: one GEMM tile per TR rows of a group -------------------------------------------------------
//
// The tile table (int32, codegen/families/experts_gemm.py most_tiles(): 1 + 3 MOST ints), written by
// lp_moe_tiles from the groups: [0] the tile count T, then tile b's expert, first position and rows (up to
// TR) at 1 + 3b; what no tile uses LP_UNUSED. A group of c rows makes ceil(c / TR) tiles, so
// T <= ceil(S / TR) + min(experts, S) = MOST, the fixed grid's tile rows.

// grid (1,), THREADS threads: thread 0 walks the groups in order (a few hundred at most), then every thread
// fills the rest
template <int TR, int THREADS>
__device__ void lp_moe_tiles(const int* groups, int* tiles, int rows, int top, int most) {
  __shared__ int count;
  const int S = rows * top;
  if (lp_tid() == 0) {
    int t = 0;
    for (int g = 0; g < groups[0]; ++g) {
      const int e = groups[1 + g], last = groups[2 + S + g];
      for (int p = groups[1 + S + g]; p < last; p += TR, ++t) {
        tiles[1 + 3 * t] = e;
        tiles[2 + 3 * t] = p;
        tiles[3 + 3 * t] = lp_min(TR, last - p);
      }
    }
    tiles[0] = count = t;
  }
  lp_sync();
  for (int i = 1 + 3 * count + lp_tid(); i < 1 + 3 * most; i += THREADS) tiles[i] = LP_UNUSED;
}

// grid (ceil(n / TW), MOST): block (x, b) computes output columns x TW .. x TW + TW - 1 of tile b (blocks
// past the tile count return): the tile's gathered rows (adjacent in xg, group order) against its expert's
// weight rows e n + ... of the planar [experts * n, k] weight, with gemm.cu's tile (lp_gemm_acc: the dense
// GEMM's order of sums for every row, wherever it sits in the tile and whichever rows share it). Each
// result goes to its slot's own row of y [S, n], as the grouped mat-vec writes it.
template <int TR, int TW, int KIND, int F>
__device__ void lp_gemm_experts(const void* xg, const void* w, const int* groups, const int* tiles, float* y, int rows,
                                int k, int n, int experts, int top) {
  __shared__ char smem[LpGemmSmem<TR, TW, F>::BYTES] __attribute__((aligned(16)));
  const int b = lp_bid_y();
  if (b >= tiles[0]) return;
  const int e = tiles[1 + 3 * b], p0 = tiles[2 + 3 * b], count = tiles[3 + 3 * b];
  const int S = rows * top, w0 = lp_bid() * TW;
  const int* order = groups + 2 + 2 * S;
  float acc[LpGemmCfg<TR, TW, KIND>::ACC];
  lp_gemm_acc<TR, TW, KIND, F>(lp_weight_planes<F>(w, experts * n, k), e * n + w0, e * n + n,
                               lp_gemm_xsrc<F>(xg, S, k), p0, p0 + count, k, 0, lp_gemm_ktiles<F>(k), smem, acc);
  lp_gemm_store<TR, TW, KIND>(acc, [&](int r, int c, float v) {
    if (r < count && w0 + c < n) y[(size_t)order[p0 + r] * n + w0 + c] = v;
  });
}
