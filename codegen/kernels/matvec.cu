// matvec.cu: decode-time projections: y = x . W^T for activations of at most a few rows (decode: one
// row; batched decode: up to 8). CPU twin: runtime/numpy_kernels.py matmul (ops matmul,
// matmul_segmented, matmul_residual): x_values @ dequantize(W)^T in float32, plus r for the residual.
//
// Launch geometry: grid (ceil(out rows / waves per block), ceil(rows / C)); one wave per output row
// (several waves per block), block y serving activation columns [C * y, C * y + C). The out rows of a
// segmented launch are those of all its weights one after another (q|k|v, gate|up): a wave finds its
// segment and reads that weight in that weight's format; all segments read the same packed x.
//
// Why it is fast: decode is memory-bound, so every weight byte is read once per step, with 16-byte
// loads by consecutive lanes of consecutive 16-byte chunks of the planar quant plane (quant.cuh says
// how each format's blocks split over lanes), and one pass over a weight row serves all C activation
// columns (the activations, a few KB, stay in L1/L2). The arithmetic is integer: lp_dot4 of the
// weight's quants with the activation's int8 values, per-block scales applied in float, a butterfly of
// shuffles to sum the lanes.
#include "quant.cuh"

// out rows [0, n) of one weight; y, r: [cols, n] from this block's first column
template <int F, bool RES, int C>
__device__ __forceinline__ void lp_matvec_rows(const void* w, int row, int n, const LpX& x, int ncols, float* y,
                                               const float* r) {
  const LpWeight<F> wt(w, n, x.k);
  float acc[C];
  lp_row_dot<F, C>(wt, row, x, ncols, acc);
  // lane c stores column c: every lane holds every column's total
  #pragma unroll
  for (int c = 0; c < C; ++c) {
    if (c < ncols && lp_lane() == c) {
      const size_t at = (size_t)c * n + row;
      if constexpr (RES) y[at] = r[at] + acc[c];
      else y[at] = acc[c];
    }
  }
}

// F0..F2: the segments' formats (NSEG of them); RES: y0 = r + x . W0^T; C: activation columns per block.
template <int F0, int F1, int F2, int NSEG, bool RES, int C>
__device__ void lp_matvec(const void* x, const void* w0, const void* w1, const void* w2, float* y0, float* y1,
                          float* y2, const float* r, int rows, int k, int n0, int n1, int n2) {
  constexpr int ACT = LpWeight<F0>::ACT;
  static_assert(NSEG == 1 || LpWeight<F1>::ACT == ACT, "segments must take the same activations");
  static_assert(NSEG < 3 || LpWeight<F2>::ACT == ACT, "segments must take the same activations");
  static_assert(!RES || NSEG == 1, "the residual epilogue has one weight");
  const int col0 = lp_bid_y() * C, ncols = lp_min(C, rows - col0);
  const LpX xs = lp_x<ACT>(x, rows, k, col0);
  const size_t off = (size_t)col0;
  int row = lp_bid() * lp_waves() + lp_wave();  // whole waves take or skip a row: the shuffles stay uniform
  if (row < n0) {
    lp_matvec_rows<F0, RES, C>(w0, row, n0, xs, ncols, y0 + off * n0, RES ? r + off * n0 : nullptr);
    return;
  }
  row -= n0;
  if constexpr (NSEG >= 2) {
    if (row < n1) {
      lp_matvec_rows<F1, false, C>(w1, row, n1, xs, ncols, y1 + off * n1, nullptr);
      return;
    }
    row -= n1;
  }
  if constexpr (NSEG >= 3) {
    if (row < n2) lp_matvec_rows<F2, false, C>(w2, row, n2, xs, ncols, y2 + off * n2, nullptr);
  }
}
