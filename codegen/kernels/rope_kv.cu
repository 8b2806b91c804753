// rope_kv.cu: rotary position embedding of queries and keys and the K/V cache write, in one launch
// (ops rope_kv and norm_rope_kv; CPU twin runtime/numpy_kernels.py rope_kv).
//
// Grid (heads + kv_heads, rows), THREADS threads: block x < heads rotates query head x of row r into
// q_out; block heads + h rotates key head h and writes it, and value head h, as f16 into the paged
// cache (common.cuh lp_kv_plane / lp_kv_row) at position pos[r] of sequence seq[r]: block
// pages[seq[r] * npages + pos[r] / LP_PAGE] (npages: the page table's row length), offset
// pos[r] % LP_PAGE. With NORM (Gemma 3, Qwen3), each head is first RMS-normalised with q_norm / k_norm,
// with norm.cu's own arithmetic (lp_rms_scale: squares summed in double, then (x * scale) * w in float),
// exactly as numerics.rmsnorm. With BIAS (Qwen2; not with NORM) the projections' biases q_bias, k_bias,
// v_bias are added first, one float32 addition, as bias_add computes them.
//
// The rotation reads (cos, sin) for position pos[r] from a table [positions, dims / 2] of float32
// pairs that the runtime computes once with NumPy in float64, as numerics.rope does, and rounds to
// float32 (codegen/families/rope_kv.py rope_table): no sin/cos on the device (AMD builds have no
// device math library, and float32 sin of a large angle would be far less accurate). The rotation
// itself is float32, one IEEE rounding per operation in a fixed order that is never fused into FMAs:
//   y0 = x0 * c - x1 * s,  y1 = x0 * s + x1 * c
// so the device equals rope_kv.py's rope_f32 (NumPy, float32) bit for bit, and is within float32
// rounding of the float64 twin (see rope_kv.py for the measured error). MODE 0 ("norm") rotates
// pairs (2i, 2i + 1), MODE 1 ("neox") pairs (i, i + dims / 2); features from dims on pass through.
//
// Fast enough by construction: it moves (heads + 2 kv_heads) x D floats per row once, one block per
// head so the per-head norm is a block reduction, and its loads and stores are coalesced.
#include "fused.cuh"
#include "norm.cu"

template <int MODE, bool NORM, bool BIAS>
__device__ void lp_rope_kv(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                           const int* __restrict__ pos, const int* __restrict__ seq,
                           const int* __restrict__ pages, lp_half* __restrict__ cache,
                           const float* __restrict__ table, const float* __restrict__ q_norm,
                           const float* __restrict__ k_norm, const float* __restrict__ q_bias,
                           const float* __restrict__ k_bias, const float* __restrict__ v_bias,
                           float* __restrict__ q_out, int heads, int kv_heads, int d, int dims, int layer,
                           int npages, int blocks, float eps) {
  static_assert(!(NORM && BIAS), "no model adds biases before per-head norms");
  __shared__ double scratch[32];
  const int hb = lp_bid(), r = lp_bid_y();
  const bool is_q = hb < heads;  // block-uniform
  const int h = is_q ? hb : hb - heads;
  const float* x = is_q ? q + ((size_t)r * heads + h) * d : k + ((size_t)r * kv_heads + h) * d;
  const float* w = is_q ? q_norm : k_norm;
  const float* b = BIAS ? (is_q ? q_bias : k_bias) + (size_t)h * d : nullptr;
  float scale = 1.0f;
  if constexpr (NORM) scale = lp_rms_scale(x, d, eps, scratch);
  auto value = [&](int f) -> float {
    if constexpr (NORM) return (x[f] * scale) * w[f];
    else if constexpr (BIAS) return lp_add_rn(x[f], b[f]);
    else return x[f];
  };

  const int p = pos[r];
  const int kv_dim = kv_heads * d;
  // K/V blocks look up the position's page once; query blocks never touch the cache or the table
  const int block = is_q ? 0 : pages[(size_t)seq[r] * npages + p / LP_PAGE];
  const size_t row = lp_kv_row(block, p % LP_PAGE, kv_dim) + (size_t)h * d;
  const size_t krow = lp_kv_plane(layer, 0, blocks, kv_dim) + row;
  const size_t vrow = lp_kv_plane(layer, 1, blocks, kv_dim) + row;
  float* qo = q_out + ((size_t)r * heads + h) * d;
  auto store = [&](int f, float y) {
    if (is_q) qo[f] = y;
    else cache[krow + f] = lp_f2h(y);
  };

  const int half = dims / 2;
  const lp_f2* cs = (const lp_f2*)table + (size_t)p * half;
  for (int i = lp_tid(); i < half; i += lp_bdim()) {
    const int i0 = MODE == 0 ? 2 * i : i, i1 = MODE == 0 ? 2 * i + 1 : i + half;
    const float x0 = value(i0), x1 = value(i1);
    const lp_f2 t = cs[i];
    store(i0, lp_sub_rn(lp_mul_rn(x0, t.x), lp_mul_rn(x1, t.y)));
    store(i1, lp_add_rn(lp_mul_rn(x0, t.y), lp_mul_rn(x1, t.x)));
  }
  for (int f = dims + lp_tid(); f < d; f += lp_bdim()) store(f, value(f));
  if (!is_q) {
    const float* vr = v + ((size_t)r * kv_heads + h) * d;
    const float* vb = BIAS ? v_bias + (size_t)h * d : nullptr;
    for (int f = lp_tid(); f < d; f += lp_bdim()) {
      if constexpr (BIAS) cache[vrow + f] = lp_f2h(lp_add_rn(vr[f], vb[f]));
      else cache[vrow + f] = lp_f2h(vr[f]);
    }
  }
}
