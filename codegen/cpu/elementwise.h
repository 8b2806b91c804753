// elementwise.h: float32 elementwise ops and row gathers on the CPU (CPU twins runtime/numpy_kernels.py
// elementwise and take_rows).
//
// elementwise<OP>: out = x + y (add), x * y (mul), x * factor (scale), silu(x), gelu_tanh(x),
// tanh(x / cap) * cap (softcap) over f32 [rows, k]: add, mul and scale are the twin's single float32
// operation; silu, gelu_tanh (rows.h activation_row) and softcap are computed in float64 and rounded
// once, as the twin does.
// take_rows: out[i] = x[rows[i]] for rows of `row_bytes` bytes. Both split rows over the pool.
#pragma once
#include <string.h>

#include "rows.h"

namespace lp_cpu {

enum { EW_ADD = 0, EW_MUL = 1, EW_SCALE = 2, EW_SILU = 3, EW_GELU_TANH = 4, EW_SOFTCAP = 5 };

template <int OP> inline float ew(float x, float y, float attr) {
  if constexpr (OP == EW_ADD) return x + y;
  else if constexpr (OP == EW_MUL) return x * y;
  else if constexpr (OP == EW_SCALE) return x * attr;
  else return (float)(tanh((double)x / (double)attr) * (double)attr);
}

template <int OP>
inline void elementwise(const float* x, const float* y, float* out, int rows, int k, float attr) {
  over_rows(rows, k, [&](int r0, int r1) {
    if constexpr (OP == EW_SILU || OP == EW_GELU_TANH) {
      for (int r = r0; r < r1; ++r)
        activation_row<OP == EW_SILU ? ACT_SILU : ACT_GELU_TANH>(x + (size_t)r * k, nullptr, out + (size_t)r * k, k);
    } else {
      for (size_t i = (size_t)r0 * k; i < (size_t)r1 * k; ++i) out[i] = ew<OP>(x[i], y ? y[i] : 0.0f, attr);
    }
  });
}

inline void take_rows(const void* x, const int* rows, void* out, int n, int row_bytes) {
  for (int i = 0; i < n; ++i)
    memcpy((char*)out + (size_t)i * row_bytes, (const char*)x + (size_t)rows[i] * row_bytes, row_bytes);
}

}  // namespace lp_cpu
