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
#include "quant.cuh"

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
