// tail.cu: the fused tail, the next token of each row: argmax of pack(rmsnorm(x, norm)) . head^T over
// the tokens the row's mask allows (one bit per token, bit t % 32 of word t / 32; a free row's mask
// allows all). CPU twin: runtime/numpy_kernels.py tail_argmax.
//
// Three kernels:
//  1. lp_tail_pack: grid (rows); one block per row writes pack(rmsnorm(x, norm)) to a scratch buffer
//     laid out as packed activations (core/formats.planes; f16: [rows, k] halves). The q8 formats are
//     norm.cu's lp_rmsnorm_pack itself; f16 uses the same norm (lp_rms_scale) then rounds to f16.
//  2. lp_tail_logits: grid (ceil(vocab / slice), ceil(rows / C)); the waves of a block take the head rows
//     of its vocabulary slice, one row per wave (quant.cuh's lp_row_dot, exactly as the mat-vec), and
//     keep the best allowed (logit, index) per activation row; each block writes its best to
//     part[row][block] (lp_no_best where its slice allows nothing).
//  3. lp_tail_reduce: grid (rows); one block reduces a row's partial bests to one int32.
// "Best" is np.argmax's order (common.cuh lp_better): the largest value, a NaN before any number, the lower index
// on ties; it is a total order, so the split into slices and waves cannot change the answer.
//
// Why it is fast: the head is the largest weight a decode step reads, and kernel 2 reads it once with
// the mat-vec's 16-byte loads and integer dots; the logits never reach memory (one (value, index)
// pair per block and row does). The norm runs once per row (kernel 1), not once per block: it reads
// the row and has IEEE divisions and square roots whose slow paths, in the same kernel as the dot
// loop, made ptxas spill.
#include "norm.cu"
#include "quant.cuh"

// out row lp_bid() = pack[ACT](rmsnorm(x, norm)); out: packed activations [rows, k] (f16: halves)
template <int ACT>
__device__ void lp_tail_pack(const float* __restrict__ x, const float* __restrict__ norm, void* out, int rows, int k,
                             float eps) {
  if constexpr (ACT == LP_ACT_F16) {
    __shared__ double scratch[32];
    const int row = lp_bid();
    const float* xr = x + (size_t)row * k;
    const float scale = lp_rms_scale(xr, k, eps, scratch);
    for (int i = lp_tid(); i < k; i += lp_bdim()) ((lp_half*)out)[(size_t)row * k + i] = lp_f2h((xr[i] * scale) * norm[i]);
  } else {
    lp_rmsnorm_pack<ACT>(x, norm, out, rows, k, eps);
  }
}

// HF: the head's format; C: activation rows per block. xp: kernel 1's packed rows.
template <int HF, int C>
__device__ void lp_tail_logits(const void* xp, const void* head, const unsigned* __restrict__ mask,
                               LpBest* __restrict__ part, int rows, int k, int vocab, int slice) {
  constexpr int ACT = LpWeight<HF>::ACT;
  __shared__ LpBest wave_best[32 * C];
  const int col0 = lp_bid_y() * C, ncols = lp_min(C, rows - col0);
  const LpX xs = lp_x<ACT>(xp, rows, k, col0);
  const LpWeight<HF> w(head, vocab, k);

  // each wave: head rows first + wave, + waves, ...; its best logit per column. Every wave makes the same
  // number of rounds (a wave past the end redoes the slice's last row, which changes no best): the
  // compiler then sees the shuffles in uniform control flow (nvcc spilled around its divergence paths).
  const int first = lp_bid() * slice, end = lp_min(vocab, first + slice);
  LpBest best[C];
  #pragma unroll
  for (int c = 0; c < C; ++c) best[c] = lp_no_best();
  for (int r0 = first; r0 < end; r0 += lp_waves()) {
    const int row = lp_min(r0 + lp_wave(), end - 1);
    float logit[C];
    lp_row_dot<HF, C>(w, row, xs, ncols, logit);  // every lane holds every column's logit
    const size_t words = ((size_t)vocab + 31) / 32;
    #pragma unroll
    for (int c = 0; c < C; ++c) {
      const bool allowed = c < ncols && (mask[(size_t)(col0 + c) * words + row / 32] >> (row % 32) & 1u);
      if (allowed && lp_better(logit[c], row, best[c].v, best[c].i)) best[c] = {logit[c], row};
    }
  }
  if (lp_lane() == 0) {
    #pragma unroll
    for (int c = 0; c < C; ++c) wave_best[lp_wave() * C + c] = best[c];
  }
  lp_sync();

  // the block's best per column: part[row][block]
  const int c = lp_tid();
  if (c < ncols) {
    LpBest b = lp_no_best();
    for (int wv = 0; wv < lp_waves(); ++wv) {
      const LpBest o = wave_best[wv * C + c];
      if (lp_better(o.v, o.i, b.v, b.i)) b = o;
    }
    const int blocks = (vocab + slice - 1) / slice;
    part[(size_t)(col0 + c) * blocks + lp_bid()] = b;
  }
}

// out[row] = the index of the best of part[row][0 .. blocks)
__device__ void lp_tail_reduce(const LpBest* __restrict__ part, int* __restrict__ out, int blocks) {
  __shared__ LpBest wave_best[32];
  const int row = lp_bid();
  LpBest b = lp_no_best();
  for (int j = lp_tid(); j < blocks; j += lp_bdim()) {
    const LpBest o = part[(size_t)row * blocks + j];
    if (lp_better(o.v, o.i, b.v, b.i)) b = o;
  }
  #pragma unroll
  for (int m = WAVE / 2; m > 0; m >>= 1) {
    const float v = lp_shfl_xor(b.v, m);
    const int i = lp_shfl_xor(b.i, m);
    if (lp_better(v, i, b.v, b.i)) b = {v, i};
  }
  if (lp_lane() == 0) wave_best[lp_wave()] = b;
  lp_sync();
  if (lp_tid() == 0) {
    for (int wv = 1; wv < lp_waves(); ++wv)
      if (lp_better(wave_best[wv].v, wave_best[wv].i, b.v, b.i)) b = wave_best[wv];
    out[row] = b.i;
  }
}
