// prefill_emu.h: vendor.h for the host, to run llmplan kernels on the CPU in tests (no GPU needed).
//
// Every GPU thread of a block is a fiber (ucontext) on the calling OS thread; blocks run one after
// another, so __shared__ variables are plain statics. A fiber runs until it reaches a barrier:
// lp_sync() for the block, a wave barrier for shuffles and matrix fragments (values are exchanged
// through a per-wave buffer between two wave barriers). A barrier some lanes never reach aborts with a
// message instead of hanging. Matrix-core fragments (mma.sync, RDNA3 WMMA) are emulated with the
// register layouts codegen/kernels/mma.cuh documents, so a kernel's fragment indexing, scaling and
// epilogues are tested against the CPU twins; only the vendors' instructions themselves are not.
//
// Build with -DLP_EMU_MMA (mma.sync layouts), -DLP_EMU_WMMA (gfx11 layouts) or neither (no matrix
// cores); WAVE is 32.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <ucontext.h>
#include <functional>
#include <vector>

#define LP_HIP 1
#define LP_EMULATED 1
#define WAVE 32
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(n)
#define __builtin_amdgcn_sched_barrier(x) ((void)0)

namespace lp_emu {
struct Fiber {
  ucontext_t ctx;
  bool done = false;
  const unsigned* gen = nullptr;  // waiting while *gen == at
  unsigned at = 0;
};
struct Block {
  int bx = 0, by = 0, bz = 0, threads = 0, cur = 0;
  ucontext_t main;
  std::vector<Fiber> fibers;
  std::vector<std::vector<char>> stacks;
  int block_arrived = 0;
  unsigned block_gen = 0;
  std::vector<int> wave_arrived;
  std::vector<unsigned> wave_gen;
  std::function<void()> body;
  uint64_t xchg[64][WAVE][16];  // per wave, per lane: up to 16 words of a fragment or shuffle
};
inline Block g;

inline void wait(bool wave) {
  const int w = g.cur / WAVE;
  int& arrived = wave ? g.wave_arrived[w] : g.block_arrived;
  unsigned& gen = wave ? g.wave_gen[w] : g.block_gen;
  if (++arrived == (wave ? WAVE : g.threads)) {
    arrived = 0;
    ++gen;
    return;
  }
  Fiber& f = g.fibers[g.cur];
  f.gen = &gen;
  f.at = gen;
  swapcontext(&f.ctx, &g.main);
}

inline void trampoline() {
  g.body();
  g.fibers[g.cur].done = true;  // back to g.main through uc_link
}

// run `body` as every thread of every block of the grid
inline void launch(int gx, int gy, int gz, int threads, std::function<void()> body) {
  g.threads = threads;
  g.body = std::move(body);
  g.fibers.assign(threads, Fiber());
  g.stacks.resize(threads);
  for (auto& s : g.stacks) s.resize(512 * 1024);
  for (int z = 0; z < gz; ++z)
    for (int y = 0; y < gy; ++y)
      for (int x = 0; x < gx; ++x) {
        g.bx = x; g.by = y; g.bz = z;
        g.block_arrived = 0;
        g.wave_arrived.assign((threads + WAVE - 1) / WAVE, 0);
        g.wave_gen.assign((threads + WAVE - 1) / WAVE, 0);
        for (int t = 0; t < threads; ++t) {
          Fiber& f = g.fibers[t];
          f = Fiber();
          getcontext(&f.ctx);
          f.ctx.uc_stack.ss_sp = g.stacks[t].data();
          f.ctx.uc_stack.ss_size = g.stacks[t].size();
          f.ctx.uc_link = &g.main;
          makecontext(&f.ctx, trampoline, 0);
        }
        int alive = threads;
        while (alive > 0) {
          bool progress = false;
          for (int t = 0; t < threads; ++t) {
            Fiber& f = g.fibers[t];
            if (f.done || (f.gen && *f.gen == f.at)) continue;
            f.gen = nullptr;
            g.cur = t;
            swapcontext(&g.main, &f.ctx);
            progress = true;
            if (f.done) --alive;
          }
          if (!progress) {
            fprintf(stderr, "prefill_emu: deadlock (a barrier some threads never reach)\n");
            abort();
          }
        }
      }
}
inline void wave_sync() { wait(true); }
inline int tid() { return g.cur; }
}  // namespace lp_emu

inline int lp_tid() { return lp_emu::g.cur; }
inline int lp_bid() { return lp_emu::g.bx; }
inline int lp_bid_y() { return lp_emu::g.by; }
inline int lp_bid_z() { return lp_emu::g.bz; }
inline int lp_bdim() { return lp_emu::g.threads; }
inline void lp_sync() { lp_emu::wait(false); }

typedef _Float16 lp_half;
inline float lp_h2f(lp_half h) { return (float)h; }
inline lp_half lp_f2h(float f) { return (lp_half)f; }

inline int lp_lane() { return lp_tid() % WAVE; }
inline int lp_wave() { return lp_tid() / WAVE; }
inline int lp_waves() { return lp_bdim() / WAVE; }

template <typename T> inline T lp_shfl(T v, int src) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "32- or 64-bit values");
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof(T));
  auto& x = lp_emu::g.xchg[lp_wave()];
  x[lp_lane()][0] = bits;
  lp_emu::wave_sync();
  bits = x[src & (WAVE - 1)][0];
  lp_emu::wave_sync();
  T out;
  memcpy(&out, &bits, sizeof(T));
  return out;
}
template <typename T> inline T lp_shfl_xor(T v, int mask) { return lp_shfl(v, lp_lane() ^ mask); }

inline int lp_dot4(int a, int b, int c) {
  for (int i = 0; i < 4; ++i) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
  return c;
}
inline int lp_atomic_add(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }

#define LP_KERNEL extern "C"

inline float lp_sqrt(float x) { return __builtin_sqrtf(x); }
inline float lp_exp(float x) { return __builtin_expf(x); }
inline float lp_abs(float x) { return __builtin_fabsf(x); }
inline float lp_fmax(float a, float b) { return __builtin_fmaxf(a, b); }
inline float lp_rint(float x) { return __builtin_rintf(x); }
template <typename T> inline T lp_min(T a, T b) { return a < b ? a : b; }
template <typename T> inline T lp_max(T a, T b) { return a < b ? b : a; }
template <typename T> inline T lp_wave_sum(T v) {
  for (int m = WAVE / 2; m > 0; m >>= 1) v += lp_shfl_xor(v, m);
  return v;
}
template <typename T> inline T lp_wave_max(T v) {
  for (int m = WAVE / 2; m > 0; m >>= 1) v = lp_max(v, lp_shfl_xor(v, m));
  return v;
}

// ---- matrix fragments ----------------------------------------------------------------------------
// Gather every lane's registers of one fragment operand into the wave's exchange buffer.
namespace lp_emu {
template <int N> inline void put(int slot, const int* regs) {
  for (int i = 0; i < N; ++i) g.xchg[g.cur / WAVE][g.cur % WAVE][slot + i] = (uint32_t)regs[i];
}
inline uint32_t reg(int lane, int slot) { return (uint32_t)g.xchg[g.cur / WAVE][lane][slot]; }
inline int8_t s8(uint32_t w, int byte) { return (int8_t)(w >> (8 * byte)); }
inline float f16(uint32_t w, int half) {
  const uint16_t h = (uint16_t)(w >> (16 * half));
  _Float16 x;
  memcpy(&x, &h, 2);
  return (float)x;
}
}  // namespace lp_emu

#if defined(LP_EMU_MMA)
#define LP_MMA 1
inline int lp_frag_row(int e) { return (lp_lane() >> 2) + ((e >> 1) << 3); }
inline int lp_frag_col(int e) { return ((lp_lane() & 3) << 1) + (e & 1); }

// PTX ISA fragment layouts (g = lane / 4, t = lane % 4): m16n8k32 s8 A element (r, k) is byte k % 4 of
// register (r >= 8) + 2 (k >= 16) of lane (r % 8) * 4 + (k % 16) / 4; B element (k, n) byte k % 4 of
// register (k >= 16) of lane n * 4 + (k % 16) / 4. m16n8k16 s8: A register (r >= 8), B one register.
// m16n8k16 f16: A element (r, k) half k % 2 of register (r >= 8) + 2 (k >= 8) of lane (r % 8) * 4 + (k % 8) / 2.
inline void lp_mma_i8_k32(int (&d)[4], const int (&a)[4], const int (&b)[2], const int (&c)[4]) {
  using namespace lp_emu;
  put<4>(0, a);
  put<2>(4, b);
  wave_sync();
  int out[4];
  for (int e = 0; e < 4; ++e) {
    const int r = lp_frag_row(e), n = lp_frag_col(e);
    int acc = c[e];
    for (int k = 0; k < 32; ++k) {
      const int ka = (k % 16) / 4, hi = k >= 16;
      const int av = s8(reg((r % 8) * 4 + ka, (r >= 8) + 2 * hi), k % 4);
      const int bv = s8(reg(n * 4 + ka, 4 + hi), k % 4);
      acc += av * bv;
    }
    out[e] = acc;
  }
  wave_sync();
  for (int e = 0; e < 4; ++e) d[e] = out[e];
}

inline void lp_mma_i8_k16(int (&d)[4], const int (&a)[2], int b, const int (&c)[4]) {
  using namespace lp_emu;
  put<2>(0, a);
  put<1>(2, &b);
  wave_sync();
  int out[4];
  for (int e = 0; e < 4; ++e) {
    const int r = lp_frag_row(e), n = lp_frag_col(e);
    int acc = c[e];
    for (int k = 0; k < 16; ++k) {
      const int av = s8(reg((r % 8) * 4 + k / 4, r >= 8), k % 4);
      const int bv = s8(reg(n * 4 + k / 4, 2), k % 4);
      acc += av * bv;
    }
    out[e] = acc;
  }
  wave_sync();
  for (int e = 0; e < 4; ++e) d[e] = out[e];
}

inline void lp_mma_f16_k16(float (&d)[4], const int (&a)[4], const int (&b)[2]) {
  using namespace lp_emu;
  put<4>(0, a);
  put<2>(4, b);
  wave_sync();
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int r = lp_frag_row(e), n = lp_frag_col(e);
    float acc = d[e];
    for (int k = 0; k < 16; ++k) {
      const int ka = (k % 8) / 2, hi = k >= 8;
      acc += f16(reg((r % 8) * 4 + ka, (r >= 8) + 2 * hi), k % 2) * f16(reg(n * 4 + ka, 4 + hi), k % 2);
    }
    out[e] = acc;
  }
  wave_sync();
  for (int e = 0; e < 4; ++e) d[e] = out[e];
}
#endif

#if defined(LP_EMU_WMMA)
#define LP_WMMA 1
typedef int lp_v4i __attribute__((ext_vector_type(4)));
typedef int lp_v8i __attribute__((ext_vector_type(8)));
typedef float lp_v8f __attribute__((ext_vector_type(8)));
typedef _Float16 lp_v16h __attribute__((ext_vector_type(16)));
inline int lp_frag_row(int e) { return 2 * e + (lp_lane() >> 4); }
inline int lp_frag_col(int e) { return lp_lane() & 15; }

// A: lane l holds row l % 16 (k 0..15), B: lane l holds column l % 16; lanes 16..31 repeat 0..15
// (the emulation reads lanes 0..15 only). D element e of lane l: (2e + l / 16, l % 16).
namespace lp_emu {
// lanes 16..31 must hold what lanes 0..15 hold (slots [0, n))
inline void check_repeated(int n) {
  const int lane = g.cur % WAVE;
  if (lane >= 16)
    for (int i = 0; i < n; ++i)
      if (reg(lane, i) != reg(lane - 16, i)) __builtin_trap();
}
}  // namespace lp_emu

inline lp_v8i lp_wmma_i8(lp_v4i a, lp_v4i b, lp_v8i c) {
  using namespace lp_emu;
  int ar[4] = {a[0], a[1], a[2], a[3]}, br[4] = {b[0], b[1], b[2], b[3]};
  put<4>(0, ar);
  put<4>(4, br);
  wave_sync();
  check_repeated(8);
  lp_v8i out;
  for (int e = 0; e < 8; ++e) {
    const int r = lp_frag_row(e), n = lp_frag_col(e);
    int acc = c[e];
    for (int k = 0; k < 16; ++k) acc += s8(reg(r, k / 4), k % 4) * s8(reg(n, 4 + k / 4), k % 4);
    out[e] = acc;
  }
  wave_sync();
  return out;
}

inline lp_v8f lp_wmma_f16(lp_v16h a, lp_v16h b, lp_v8f c) {
  using namespace lp_emu;
  const lp_v8i aw = __builtin_bit_cast(lp_v8i, a), bw = __builtin_bit_cast(lp_v8i, b);
  int ar[8], br[8];
  for (int i = 0; i < 8; ++i) { ar[i] = aw[i]; br[i] = bw[i]; }
  put<8>(0, ar);
  put<8>(8, br);
  wave_sync();
  check_repeated(16);
  lp_v8f out;
  for (int e = 0; e < 8; ++e) {
    const int r = lp_frag_row(e), n = lp_frag_col(e);
    float acc = c[e];
    for (int k = 0; k < 16; ++k) acc += f16(reg(r, k / 2), k % 2) * f16(reg(n, 8 + k / 2), k % 2);
    out[e] = acc;
  }
  wave_sync();
  return out;
}
#endif
