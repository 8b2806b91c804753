// embed.cu: the embedding gather. CPU twin: runtime/numpy_kernels.py embed (out = rows tokens[r] of the
// table, dequantized by core/formats.dequantize).
//
// Launch geometry: one block per token row; thread t writes values t, t + block, ... of the row.
// Each value is LpWeight<F>::value (quant.cuh): the dequantizer's float32 operations in its order, so the
// result is bit-exact with the CPU twin. A token outside the table reads nothing and yields NaNs.
//
// Why this design: the gather moves one table row (a few KB) per token, so it is latency-bound and
// tiny next to the projections; per-element dequantization keeps each value checkable against
// formats.py line by line, and the f32 stores of a row are coalesced.
#include "quant.cuh"

template <int F>
__device__ void lp_embed(const void* table, const int* tokens, float* out, int vocab, int k) {
  const int row = lp_bid();
  const int tok = tokens[row];
  const LpWeight<F> w(table, vocab, k);
  float* o = out + (size_t)row * k;
  const bool inside = tok >= 0 && tok < vocab;
  for (int i = lp_tid(); i < k; i += lp_bdim()) o[i] = inside ? w.value((size_t)tok, i) : __builtin_nanf("");
}
