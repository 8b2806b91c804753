// norm.cu: RMSNorm (f32 out), RMSNorm + pack, and pack. One block per row.
//
// The norm follows the CPU twin's order: squares in float summed in double, mean and scale in
// float, then (x * scale) * w. Packing is common.cuh's.
#include "common.cuh"

// mean of squares over `group` values starting at x, with the whole block; returns 1/sqrt(mean+eps)
__device__ __forceinline__ float lp_rms_scale(const float* x, int group, float eps, double* scratch) {
  double acc = 0.0;
  for (int i = lp_tid(); i < group; i += lp_bdim()) {
    const float v = x[i];
    acc += (double)(v * v);
  }
  const double total = lp_block_sum(acc, scratch);
  const float mean = (float)(total / group);
  return 1.0f / lp_sqrt(mean + eps);
}

// y[row] = rmsnorm(x[row]) over groups of `group` values (the whole row, or each head)
__device__ void lp_rmsnorm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                           int k, int group, float eps) {
  __shared__ double scratch[32];
  const int row = lp_bid();
  for (int g0 = 0; g0 < k; g0 += group) {
    const float* xr = x + (size_t)row * k + g0;
    const float scale = lp_rms_scale(xr, group, eps, scratch);
    for (int i = lp_tid(); i < group; i += lp_bdim()) y[(size_t)row * k + g0 + i] = (xr[i] * scale) * w[i];
  }
}

template <int FMT>
__device__ void lp_rmsnorm_pack(const float* __restrict__ x, const float* __restrict__ w, void* out, int rows, int k,
                                float eps) {
  __shared__ double scratch[32];
  const int row = lp_bid();
  const float* xr = x + (size_t)row * k;
  const float scale = lp_rms_scale(xr, k, eps, scratch);
  lp_pack_row<FMT>([&](int i) { return (xr[i] * scale) * w[i]; }, k, row, lp_q8_rows(out, rows, k, FMT));
}

template <int FMT>
__device__ void lp_pack(const float* __restrict__ x, void* out, int rows, int k) {
  const int row = lp_bid();
  const float* xr = x + (size_t)row * k;
  lp_pack_row<FMT>([&](int i) { return xr[i]; }, k, row, lp_q8_rows(out, rows, k, FMT));
}
