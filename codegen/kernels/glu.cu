// glu.cu: the gated product of a GLU feed-forward packed for the down projection (op glu_pack; CPU
// twin runtime/numpy_kernels.py glu_pack): out = pack[FMT](act(gate) * up), act silu or gelu_tanh.
//
// Grid (ceil(k / TILE), rows), THREADS threads: each block computes TILE consecutive values of one row
// and stores them in the output format with fused.cuh's lp_store_tile (8-bit blocks through common.cuh's
// lp_pack_row on the tile's slice of the field planes, exactly the twins' rounding; or f16 / bf16).
// TILE is a multiple of 256, so tiles are whole q8_0 / q8_1 / q8_k blocks.
//
// Numerics: the twin evaluates the activation in float64 and rounds it to float32; here it is float32
// through lp_exp (fused.cuh: silu = x / (1 + exp(-x)), gelu_tanh = x / (1 + exp(-2y)), each a few ulp
// from the float64 value, see there), then the float32 product with up as in the twin. Packing is
// exact given its inputs, so a packed value differs from the twin's only where a few-ulp difference
// moves a value across a rounding boundary of its block (one quantum, rarely).
//
// Decode is memory bound and this kernel reads gate and up once each (coalesced) and writes the
// packed row once; splitting rows into tiles spreads one decode row over many blocks.
#include "fused.cuh"

template <int ACT, int FMT, int TILE>
__device__ void lp_glu_pack(const float* __restrict__ gate, const float* __restrict__ up, void* out, int rows, int k) {
  const int t0 = lp_bid() * TILE, r = lp_bid_y();
  const int kt = lp_min(TILE, k - t0);
  const float* g = gate + (size_t)r * k + t0;
  const float* u = up + (size_t)r * k + t0;
  lp_store_tile<FMT>([&](int i) { return lp_act<ACT>(g[i]) * u[i]; }, out, rows, k, r, t0, kt);
}
