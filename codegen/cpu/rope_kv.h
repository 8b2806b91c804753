// rope_kv.h: rotary position embedding of queries and keys and the K/V cache write on the CPU (ops
// rope_kv and norm_rope_kv; CPU twin runtime/numpy_kernels.py rope_kv), the GPU kernel's arithmetic
// (codegen/kernels/rope_kv.cu): (cos, sin) from the runtime's float32 table [positions, dims / 2, 2]
// (codegen/families/rope_kv.py rope_table), the rotation in float32 with one rounding per operation
// (y0 = x0 c - x1 s, y1 = x0 s + x1 c; the library is built without FMA contraction), mode 0 ("norm")
// pairs (2i, 2i + 1), mode 1 ("neox") pairs (i, i + dims / 2), features from dims on passed through.
// With NORM each head is first RMS-normalised (rows.h rms_scale, then (x * scale) * w); with BIAS (not
// with NORM) the projections' biases are added first, one float32 addition each. Query heads go
// to q_out; key heads, rotated, and value heads go to the paged f16 cache at position pos[r] of
// sequence seq[r] (block pages[seq[r] * npages + pos[r] / 16], offset pos[r] % 16; common.cuh). Rows
// split over the pool.
#pragma once
#include "rows.h"

namespace lp_cpu {

template <int MODE, bool NORM, bool BIAS>
inline void rope_kv(const float* q, const float* k, const float* v, const int* pos, const int* seq, const int* pages,
                    lp_half* cache, const float* table, const float* q_norm, const float* k_norm, const float* q_bias,
                    const float* k_bias, const float* v_bias, float* q_out, int rows, int heads, int kv_heads, int d,
                    int dims, int layer, int npages, int blocks, float eps) {
  static_assert(!(NORM && BIAS), "no model adds biases before per-head norms");
  const int kv_dim = kv_heads * d, half = dims / 2;
  // head x of d values (normalised first with NORM, its bias b added first with BIAS) rotated for position
  // p into y (float or f16)
  auto rotate = [&](const float* x, const float* w, const float* b, int p, auto* y) {
    const float scale = NORM ? rms_scale(x, d, eps) : 1.0f;
    auto value = [&](int f) {
      if constexpr (NORM) return (x[f] * scale) * w[f];
      else if constexpr (BIAS) return x[f] + b[f];
      else return x[f];
    };
    auto put = [&](int f, float val) {
      if constexpr (sizeof(*y) == 4) y[f] = val;
      else y[f] = lp_f2h(val);
    };
    const float* cs = table + (size_t)p * half * 2;
    for (int i = 0; i < half; ++i) {
      const int i0 = MODE == 0 ? 2 * i : i, i1 = MODE == 0 ? 2 * i + 1 : i + half;
      const float x0 = value(i0), x1 = value(i1), c = cs[2 * i], s = cs[2 * i + 1];
      // x0 c - x1 s as a sum, which rounds alike: g++ 12 vectorizes the difference beside the sum below
      // into one fused vfmaddsub, -ffp-contract=off notwithstanding
      put(i0, x0 * c + -x1 * s);
      put(i1, x0 * s + x1 * c);
    }
    for (int f = dims; f < d; ++f) put(f, value(f));
  };
  over_rows(rows, (heads + 2 * kv_heads) * d, [&](int r0, int r1) {
    for (int r = r0; r < r1; ++r) {
      const int p = pos[r];
      const int block = pages[(size_t)seq[r] * npages + p / LP_PAGE];
      const size_t at = lp_kv_row(block, p % LP_PAGE, kv_dim);
      for (int h = 0; h < heads; ++h)
        rotate(q + ((size_t)r * heads + h) * d, q_norm, BIAS ? q_bias + (size_t)h * d : nullptr, p,
               q_out + ((size_t)r * heads + h) * d);
      for (int h = 0; h < kv_heads; ++h) {
        rotate(k + ((size_t)r * kv_heads + h) * d, k_norm, BIAS ? k_bias + (size_t)h * d : nullptr, p,
               cache + lp_kv_plane(layer, 0, blocks, kv_dim) + at + (size_t)h * d);
        const float* vr = v + ((size_t)r * kv_heads + h) * d;
        lp_half* vo = cache + lp_kv_plane(layer, 1, blocks, kv_dim) + at + (size_t)h * d;
        for (int f = 0; f < d; ++f) vo[f] = lp_f2h(BIAS ? vr[f] + v_bias[(size_t)h * d + f] : vr[f]);
      }
    }
  });
}

}  // namespace lp_cpu
