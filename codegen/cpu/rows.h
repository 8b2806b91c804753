// rows.h: what the CPU kernels that write activation rows share: storing a row in any activation
// format with the twins' rounding (core/numerics.py pack_blocks / packed_values), the RMS norm's scale
// in the twins' order, the activations in float64 as the twins compute them, and the split of rows over
// the pool's threads.
//
// Packing a row (pack_row): q8_0 / q8_1: per 32 values amax = max |x| (NaN if any value is: NumPy's max),
// d = amax / 127, q = rint(x * (127 / amax)) (0 where amax is 0), d stored as f16, q8_1's s = f16(d * sum q);
// q8_k: per 256 values the first value of largest magnitude mx (a NaN first, as np.argmax), iscale =
// -127 / mx, d = 1 / iscale, q = min(127, rint(iscale * x)), the 16-value sums; f16 round to nearest even;
// bf16 through fused.cuh's lp_f2bf; f32 as is. The row lands in the field planes of a [rows, k] buffer
// (common.cuh lp_q8_rows) or at row `row` of a plain [rows, k] array.
#pragma once
#include <math.h>

#include "fused.cuh"
#include "pool.h"

namespace lp_cpu {

// output formats: common.cuh's q8 codes, then fused.cuh's LP_OUT_F16, LP_OUT_BF16, LP_OUT_F32
template <int FMT> inline void pack_row(const float* v, int k, void* out, int rows, int row) {
  if constexpr (FMT == LP_OUT_Q8_0 || FMT == LP_OUT_Q8_1) {
    const Q8Rows q = lp_q8_rows(out, rows, k, FMT);
    for (int b = 0; b < k / 32; ++b) {
      const float* x = v + 32 * b;
      float amax = 0.0f;
      for (int i = 0; i < 32; ++i) {
        const float a = lp_abs(x[i]);
        if (a > amax || a != a) amax = a != a || amax != amax ? __builtin_nanf("") : a;
      }
      const float d = amax / 127.0f;
      const float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
      int8_t* qs = q.qs + (size_t)row * k + 32 * b;
      int sum = 0;
      for (int i = 0; i < 32; ++i) {
        const float r = lp_rint(x[i] * inv);
        qs[i] = r == r ? (int8_t)r : 0;
        sum += qs[i];
      }
      const size_t blk = (size_t)row * (k / 32) + b;
      ((lp_half*)q.d)[blk] = lp_f2h(d);
      if constexpr (FMT == LP_OUT_Q8_1) q.s[blk] = lp_f2h(d * (float)sum);
    }
  } else if constexpr (FMT == LP_OUT_Q8_K) {
    const Q8Rows q = lp_q8_rows(out, rows, k, 2);
    for (int b = 0; b < k / 256; ++b) {
      const float* x = v + 256 * b;
      float best = -1.0f, mx = 0.0f;
      for (int i = 0; i < 256; ++i) {
        const float a = lp_abs(x[i]);
        if (best != best) break;  // a NaN came first: it is the argmax
        if (a > best || a != a) best = a, mx = x[i];
      }
      const float iscale = mx != 0.0f ? -127.0f / mx : 0.0f;
      const float d = mx != 0.0f ? 1.0f / iscale : 0.0f;
      int8_t* qs = q.qs + (size_t)row * k + 256 * b;
      for (int i = 0; i < 256; ++i) {
        const float r = lp_rint(iscale * x[i]);
        qs[i] = r == r ? (int8_t)lp_min(127.0f, r) : 0;
      }
      for (int j = 0; j < 16; ++j) {
        int sum = 0;
        for (int i = 0; i < 16; ++i) sum += qs[16 * j + i];
        q.bsums[((size_t)row * (k / 256) + b) * 16 + j] = (int16_t)sum;
      }
      ((float*)q.d)[(size_t)row * (k / 256) + b] = d;
    }
  } else {
    const size_t at = (size_t)row * k;
    for (int i = 0; i < k; ++i) {
      if constexpr (FMT == LP_OUT_F16) ((lp_half*)out)[at + i] = lp_f2h(v[i]);
      else if constexpr (FMT == LP_OUT_BF16) ((uint16_t*)out)[at + i] = lp_f2bf(v[i]);
      else ((float*)out)[at + i] = v[i];
    }
  }
}

// 1 / sqrt(mean(x^2) + eps) over n values: squares in float summed in double, mean and the rest in
// float (core/numerics.py rmsnorm; norm.cu lp_rms_scale)
inline float rms_scale(const float* x, int n, float eps) {
  double acc = 0.0;
  for (int i = 0; i < n; ++i) acc += (double)(x[i] * x[i]);
  const float mean = (float)(acc / n);
  return 1.0f / lp_sqrt(mean + eps);
}

// the activations as core/numerics.py computes them: in float64, rounded once
inline float silu(float x) {
  const double v = x;
  return (float)(v / (1.0 + exp(-v)));
}
inline float gelu_tanh(float x) {
  const double v = x;
  return (float)(0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * (v * v * v)))));
}
enum { ACT_SILU = 0, ACT_GELU_TANH = 1 };
template <int ACT> inline float activation(float x) { return ACT == ACT_SILU ? silu(x) : gelu_tanh(x); }

// f(r0, r1) over row ranges of about `work` values each (rows of k values): small launches (a decode
// step's one row) stay on the calling thread
constexpr size_t ROW_TASK_VALUES = 1 << 15;
template <class F> inline void over_rows(int rows, int k, F f) {
  const int per = (int)lp_max<size_t>(1, ROW_TASK_VALUES / lp_max(1, k));
  const int tasks = (rows + per - 1) / per;
  lp_parallel(tasks, [&](int t) { f(t * per, lp_min(rows, (t + 1) * per)); });
}

}  // namespace lp_cpu
