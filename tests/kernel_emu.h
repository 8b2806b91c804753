// kernel_emu.h: runs llmplan's GPU kernels on the CPU, for tests on machines without a GPU.
//
// It stands in for codegen/kernels/vendor.h (same names, same meaning): the kernel source is compiled
// as host C++ by clang, and every lane of a block is a fiber (ucontext) on one OS thread. A lane runs
// until it reaches a barrier (lp_sync for the block, or a shuffle, which exchanges values through a
// per-lane slot between two wave barriers), so lanes advance in lock-step exactly where the GPU
// needs them to. Blocks run one after another, so `__shared__` variables are plain statics.
// A barrier that some lanes never reach (a shuffle or lp_sync in divergent code, or after some lanes
// returned) is reported as an error instead of hanging. WAVE is 32 unless the build defines it (64
// emulates CDNA).
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <functional>
#include <vector>

#define LP_EMU 1
#ifndef WAVE
#define WAVE 32
#endif
#define __global__
#define __device__
#define __shared__ static
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define LP_KERNEL extern "C"

struct LpEmuLane {
  ucontext_t ctx;
  bool done = false;
  const unsigned* wait_gen = nullptr;  // waiting until *wait_gen != wait_at
  unsigned wait_at = 0;
};

struct LpEmu {
  int grid[3] = {1, 1, 1}, block = 0, bid[3] = {0, 0, 0};
  int cur = 0;
  std::vector<LpEmuLane> lanes;
  std::vector<std::vector<char>> stacks;
  ucontext_t main;
  int block_arrived = 0;
  unsigned block_gen = 0;
  std::vector<int> wave_arrived;
  std::vector<unsigned> wave_gen;
  std::vector<uint64_t> slots;
  std::function<void()> body;
  const char* error = nullptr;
};
static LpEmu lp_emu;

static void lp_emu_wait(bool wave) {
  LpEmuLane& lane = lp_emu.lanes[lp_emu.cur];
  const int w = lp_emu.cur / WAVE;
  int& arrived = wave ? lp_emu.wave_arrived[w] : lp_emu.block_arrived;
  unsigned& gen = wave ? lp_emu.wave_gen[w] : lp_emu.block_gen;
  const int size = wave ? WAVE : lp_emu.block;
  if (++arrived == size) {
    arrived = 0;
    ++gen;
    return;
  }
  lane.wait_gen = &gen;
  lane.wait_at = gen;
  swapcontext(&lane.ctx, &lp_emu.main);
}

static void lp_emu_trampoline() {
  lp_emu.body();
  lp_emu.lanes[lp_emu.cur].done = true;  // returns to lp_emu.main through uc_link
}

// Runs body() as every lane of every block; returns an error message or null.
static const char* lp_emu_launch(int gx, int gy, int gz, int block, int smem_bytes, std::function<void()> body) {
  if (block % WAVE) return "block is not a whole number of waves";
  LpEmu& e = lp_emu;
  e.grid[0] = gx, e.grid[1] = gy, e.grid[2] = gz, e.block = block;
  e.body = std::move(body);
  if (smem_bytes) return "dynamic shared memory is not emulated";
  e.lanes.assign(block, LpEmuLane());
  e.stacks.resize(block);
  for (auto& s : e.stacks) s.resize(256 * 1024);
  e.slots.assign(block, 0);
  for (int z = 0; z < gz; ++z)
    for (int y = 0; y < gy; ++y)
      for (int x = 0; x < gx; ++x) {
        e.bid[0] = x, e.bid[1] = y, e.bid[2] = z;
        e.block_arrived = 0;
        e.wave_arrived.assign(block / WAVE, 0);
        e.wave_gen.assign(block / WAVE, 0);
        for (int t = 0; t < block; ++t) {
          LpEmuLane& l = e.lanes[t];
          l = LpEmuLane();
          getcontext(&l.ctx);
          l.ctx.uc_stack.ss_sp = e.stacks[t].data();
          l.ctx.uc_stack.ss_size = e.stacks[t].size();
          l.ctx.uc_link = &e.main;
          makecontext(&l.ctx, lp_emu_trampoline, 0);
        }
        int alive = block;
        while (alive > 0) {
          bool progress = false;
          for (int t = 0; t < block; ++t) {
            LpEmuLane& l = e.lanes[t];
            if (l.done || (l.wait_gen && *l.wait_gen == l.wait_at)) continue;
            l.wait_gen = nullptr;
            e.cur = t;
            swapcontext(&e.main, &l.ctx);
            progress = true;
            if (l.done) --alive;
          }
          if (!progress) return "deadlock: some lanes wait at a barrier (lp_sync or a shuffle) others never reach";
        }
      }
  return nullptr;
}

// --- vendor.h's interface ----------------------------------------------------------------------------

typedef _Float16 lp_half;
inline float lp_h2f(lp_half h) { return (float)h; }
inline lp_half lp_f2h(float f) { return (lp_half)f; }

inline int lp_tid() { return lp_emu.cur; }
inline int lp_bid() { return lp_emu.bid[0]; }
inline int lp_bid_y() { return lp_emu.bid[1]; }
inline int lp_bid_z() { return lp_emu.bid[2]; }
inline int lp_bdim() { return lp_emu.block; }
inline void lp_sync() { lp_emu_wait(false); }

template <typename T> inline T lp_shfl(T v, int src) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "32- or 64-bit values");
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof(T));
  lp_emu.slots[lp_emu.cur] = bits;
  lp_emu_wait(true);
  const int base = lp_emu.cur / WAVE * WAVE;
  bits = lp_emu.slots[base + ((src % WAVE) + WAVE) % WAVE];
  lp_emu_wait(true);
  T out;
  memcpy(&out, &bits, sizeof(T));
  return out;
}
template <typename T> inline T lp_shfl_xor(T v, int mask) { return lp_shfl(v, (lp_emu.cur % WAVE) ^ mask); }

inline int lp_dot4(int a, int b, int c) {
  for (int i = 0; i < 4; ++i) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
  return c;
}
inline int lp_atomic_add(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }

inline int lp_lane() { return lp_tid() % WAVE; }
inline int lp_wave() { return lp_tid() / WAVE; }
inline int lp_waves() { return lp_bdim() / WAVE; }

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
