// glu.h: the gated product of a GLU feed-forward packed for the down projection on the CPU (op
// glu_pack; CPU twin runtime/numpy_kernels.py glu_pack): out = pack[FMT](act(gate) * up), the activation
// in float64 rounded once (rows.h activation_row, vectorized; as core/numerics.py), the product in
// float32, packed with the twins' rounding (rows.h pack_row). Rows split over the pool.
#pragma once
#include <vector>

#include "rows.h"

namespace lp_cpu {

template <int ACT, int FMT>
inline void glu_pack(const float* gate, const float* up, void* out, int rows, int k) {
  over_rows(rows, k, [&](int r0, int r1) {
    std::vector<float> v(k);
    for (int r = r0; r < r1; ++r) {
      const float* g = gate + (size_t)r * k;
      const float* u = up + (size_t)r * k;
      activation_row<ACT>(g, u, v.data(), k);
      pack_row<FMT>(v.data(), k, out, rows, r);
    }
  });
}

}  // namespace lp_cpu
