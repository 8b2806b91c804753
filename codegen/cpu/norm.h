// norm.h: RMSNorm (f32 out), RMSNorm + pack, and pack on the CPU (CPU twins runtime/numpy_kernels.py
// rmsnorm, rmsnorm_pack, pack). Rows split over the pool (rows.h over_rows); the arithmetic is the
// twins': rows.h rms_scale, then (x * scale) * w in float, packed by rows.h pack_row.
#pragma once
#include <vector>

#include "rows.h"

namespace lp_cpu {

// y[r] = rmsnorm(x[r]) over groups of `group` values (the whole row, or each head)
inline void rmsnorm(const float* x, const float* w, float* y, int rows, int k, int group, float eps) {
  over_rows(rows, k, [&](int r0, int r1) {
    for (int r = r0; r < r1; ++r)
      for (int g0 = 0; g0 < k; g0 += group) {
        const float* xr = x + (size_t)r * k + g0;
        const float scale = rms_scale(xr, group, eps);
        float* yr = y + (size_t)r * k + g0;
        for (int i = 0; i < group; ++i) yr[i] = (xr[i] * scale) * w[i];
      }
  });
}

// out = pack[FMT](rmsnorm(x, w)) over whole rows
template <int FMT> inline void rmsnorm_pack(const float* x, const float* w, void* out, int rows, int k, float eps) {
  over_rows(rows, k, [&](int r0, int r1) {
    std::vector<float> v(k);
    for (int r = r0; r < r1; ++r) {
      const float* xr = x + (size_t)r * k;
      const float scale = rms_scale(xr, k, eps);
      for (int i = 0; i < k; ++i) v[i] = (xr[i] * scale) * w[i];
      pack_row<FMT>(v.data(), k, out, rows, r);
    }
  });
}

template <int FMT> inline void pack(const float* x, void* out, int rows, int k) {
  over_rows(rows, k, [&](int r0, int r1) {
    for (int r = r0; r < r1; ++r) pack_row<FMT>(x + (size_t)r * k, k, out, rows, r);
  });
}

}  // namespace lp_cpu
