// embed.h: the embedding gather on the CPU (CPU twin runtime/numpy_kernels.py embed): out row r = row
// tokens[r] of the table, read in place from the mapped file and dequantized value by value with
// quant.cuh's LpWeight<F>::value (the dequantizer's float32 operations in its order: bit-exact with
// core/formats.dequantize). A token outside the table yields a NaN row (as the GPU kernel).
#pragma once
#include "quant.cuh"
#include "rows.h"

namespace lp_cpu {

template <int F> inline void embed(const void* table, const int* tokens, float* out, int rows, int vocab, int k) {
  const LpWeight<F, LP_BLOCKS> w(table, vocab, k);
  over_rows(rows, k, [&](int r0, int r1) {
    for (int r = r0; r < r1; ++r) {
      const int tok = tokens[r];
      float* o = out + (size_t)r * k;
      const bool inside = tok >= 0 && tok < vocab;
      for (int i = 0; i < k; ++i) o[i] = inside ? w.value((size_t)tok, i) : __builtin_nanf("");
    }
  });
}

}  // namespace lp_cpu
