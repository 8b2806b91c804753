// elementwise.cu: float32 elementwise ops and row gathers (CPU twins runtime/numpy_kernels.py
// elementwise and take_rows).
//
// lp_elementwise<OP, VEC>: out = x + y (add), x * y (mul), x * factor (scale), silu(x), gelu_tanh(x),
// tanh(x / cap) * cap (softcap) over f32 [rows, k]. Grid (ceil(k / (THREADS * VEC)), rows); each
// thread handles VEC consecutive values (VEC = 4: 128-bit loads and stores, when k % 4 == 0).
// add, mul and scale are exact (the twin's single float32 operation); silu, gelu_tanh and softcap are
// float32 through fused.cuh's lp_exp-based functions where the twin uses float64 and rounds once
// (a few ulp; see fused.cuh). The divide x / cap is float32 where the twin's is float64.
//
// lp_take_rows<VB>: out[i] = x[rows[i]] for rows of `row_bytes` bytes, VB bytes per thread per step
// (16: 128-bit copies when the row size allows). Grid (ceil(row_bytes / (THREADS * VB)), n).
//
// Both are pure streams: every byte is read and written once, coalesced, at full bandwidth.
#include "fused.cuh"

enum { LP_EW_ADD = 0, LP_EW_MUL = 1, LP_EW_SCALE = 2, LP_EW_SILU = 3, LP_EW_GELU_TANH = 4, LP_EW_SOFTCAP = 5 };

template <int OP> __device__ __forceinline__ float lp_ew(float x, float y, float attr) {
  if constexpr (OP == LP_EW_ADD) return x + y;
  else if constexpr (OP == LP_EW_MUL) return x * y;
  else if constexpr (OP == LP_EW_SCALE) return x * attr;
  else if constexpr (OP == LP_EW_SILU) return lp_silu(x);
  else if constexpr (OP == LP_EW_GELU_TANH) return lp_gelu_tanh(x);
  else return lp_tanh(x / attr) * attr;
}

template <int OP, int VEC>
__device__ void lp_elementwise(const float* __restrict__ x, const float* __restrict__ y, float* __restrict__ out,
                               int k, float attr) {
  constexpr bool BINARY = OP == LP_EW_ADD || OP == LP_EW_MUL;
  const size_t row = (size_t)lp_bid_y() * k;
  const int i = (lp_bid() * lp_bdim() + lp_tid()) * VEC;
  if (i >= k) return;
  if constexpr (VEC == 4) {
    const lp_f4 a = *(const lp_f4*)(x + row + i);
    lp_f4 b = {0.0f, 0.0f, 0.0f, 0.0f};
    if constexpr (BINARY) b = *(const lp_f4*)(y + row + i);
    const lp_f4 o = {lp_ew<OP>(a.x, b.x, attr), lp_ew<OP>(a.y, b.y, attr), lp_ew<OP>(a.z, b.z, attr),
                     lp_ew<OP>(a.w, b.w, attr)};
    *(lp_f4*)(out + row + i) = o;
  } else {
    out[row + i] = lp_ew<OP>(x[row + i], BINARY ? y[row + i] : 0.0f, attr);
  }
}

template <int VB> struct LpChunk;
template <> struct LpChunk<16> { typedef lp_u4 T; };
template <> struct LpChunk<4> { typedef uint32_t T; };
template <> struct LpChunk<2> { typedef uint16_t T; };
template <> struct LpChunk<1> { typedef uint8_t T; };

template <int VB>
__device__ void lp_take_rows(const void* __restrict__ x, const int* __restrict__ rows, void* __restrict__ out,
                             int row_bytes) {
  typedef typename LpChunk<VB>::T T;
  const int i = lp_bid() * lp_bdim() + lp_tid(), n = row_bytes / VB;
  if (i >= n) return;
  const size_t src = (size_t)rows[lp_bid_y()] * n, dst = (size_t)lp_bid_y() * n;
  ((T*)out)[dst + i] = ((const T*)x)[src + i];
}
