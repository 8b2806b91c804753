// router.h: the mixture-of-experts router on the CPU (op moe_router; CPU twin runtime/numpy_kernels.py
// moe_router, core/numerics.py route): the gate logits x . gate^T of every row as a projection (matmul.h's
// row loop on the f32 gate, its default schedule), then per row their softmax (exp of the difference to
// the row's max in float64 by common.cuh lp_exp64, the GPU's and the twin's own, their float64 sum in
// expert order, each p rounded to float), the experts ordered by std::sort with
// ggml's comparator (p[a] > p[b]: llama.cpp's CPU argsort, so equal probabilities come out in its order),
// the first `top` of them and their p, divided by their float sum (a float64 sum rounded) when `norm`.
// Rows split over the pool.
#pragma once
#include <math.h>

#include <algorithm>
#include <vector>

#include "matmul.h"
#include "rows.h"

namespace lp_cpu {

inline void moe_router(const float* x, const float* gate, int* ids, float* weights, int rows, int k, int experts, int top,
                       int norm) {
  std::vector<float> logits((size_t)rows * experts);
  const void* w[1] = {gate};
  const int n[1] = {experts};
  project<LP_FMT_F32, 0, 0, 1>(x, w, n, rows, k, 0, 0, 0, [&](int, int, int e, int r, float v) {
    logits[(size_t)r * experts + e] = v;
  });
  over_rows(rows, 64 * experts, [&](int r0, int r1) {
    std::vector<float> p(experts);
    std::vector<double> e(experts);
    std::vector<int> order(experts);
    for (int r = r0; r < r1; ++r) {
      const float* lr = logits.data() + (size_t)r * experts;
      double most = -INFINITY;
      for (int i = 0; i < experts; ++i) most = std::max(most, (double)lr[i]);
      double sum = 0.0;
      for (int i = 0; i < experts; ++i) sum += e[i] = lp_exp64((double)lr[i] - most);
      for (int i = 0; i < experts; ++i) p[i] = (float)(e[i] / sum);
      for (int i = 0; i < experts; ++i) order[i] = i;
      std::sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
      double chosen = 0.0;
      for (int j = 0; j < top; ++j) chosen += p[order[j]];
      const float total = (float)chosen;
      for (int j = 0; j < top; ++j) {
        ids[(size_t)r * top + j] = order[j];
        weights[(size_t)r * top + j] = norm ? p[order[j]] / total : p[order[j]];
      }
    }
  });
}

}  // namespace lp_cpu
