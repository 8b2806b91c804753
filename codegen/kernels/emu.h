// emu.h: codegen/kernels/vendor.h for the host: the emulated GPU that runs llmplan's GPU kernels on a CPU.
//
// codegen/emu.py renders a GPU plan's kernels (or a test's) with this header in place of vendor.h (same
// names, same meaning) and compiles them as host C++ with clang. Every lane of a block is a fiber on an
// OS thread; `__shared__` variables are thread-local statics, one copy per thread running blocks. A
// lane runs until it has to wait: at lp_sync() for the whole block; at a shuffle or a matrix fragment
// for the 32 lanes around it (NVIDIA's warp, whose shuffles name all 32 lanes; on wave 64, the
// half-wave: the kernels' 32-lane groups); at a shuffle also for its source lane to have posted the
// value of the same shuffle (on wave 64 the source may be in the other half, which need not take part
// otherwise: CDNA's bpermute reads any active lane). A lane's shuffles are counted from the block's
// last lp_sync, and the n-th shuffle of a lane reads the n-th of its source. So lanes advance in
// lock-step exactly where the GPU needs them to, and a barrier some lanes never reach (a shuffle or
// lp_sync in divergent code, or after some lanes returned) is reported as an error instead of hanging.
// Where the two halves of a wave of 64 took different numbers of shuffles, a later shuffle across the
// halves would pair the wrong ones (the GPU pairs them by instruction): that is reported too, and the
// halves must meet at lp_sync first.
//
// Switching. A lane enters its fiber once through swapcontext and from then on switches with
// _setjmp/_longjmp, which save no signal mask: glibc's swapcontext makes an rt_sigprocmask system call
// on every switch (millions per decode step), the jumps make none and give the same bits.
//
// Blocks run on several threads (lp_emu_set_threads; the grid's blocks are handed out one at a time),
// each thread with its own block state and lane stacks. Kernels that combine blocks do it through
// lp_atomic_add, which is atomic here too.
//
// Build options: -DWAVE=64 emulates CDNA's wave (32 otherwise). -DLP_EMU_MMA (mma.sync, sm_80+) or
// -DLP_EMU_WMMA (RDNA3 WMMA) emulates matrix-core fragments with the register layouts
// codegen/kernels/mma.cuh documents, so a kernel's fragment indexing, scaling and epilogues are checked;
// only the vendors' instructions themselves are not. The kernels' LP_HIP branches are the ones taken:
// they need only clang builtins, which the host clang has too.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>
#include <ucontext.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#define LP_EMU 1
#define LP_HIP 1
#ifndef WAVE
#define WAVE 32
#endif
#if (defined(LP_EMU_MMA) || defined(LP_EMU_WMMA)) && WAVE != 32
#error "matrix-core fragments are wave32"
#endif
#define __global__
#define __device__
#define __shared__ static thread_local
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __builtin_amdgcn_sched_barrier(x) ((void)0)
#define LP_KERNEL extern "C"

namespace lp_emu {
constexpr int GROUP = 32;             // lanes that meet at a shuffle or fragment
constexpr int SLOTS = 16;             // words a lane posts for a fragment: an operand pair
constexpr size_t STACK = 512 * 1024;  // per lane: the flash kernels keep large register tiles

struct Post {
  uint64_t bits;
  int kind;  // the xor mask of lp_shfl_xor, -1 for lp_shfl: what the lanes meeting at a shuffle share
};

struct Lane {
  ucontext_t ctx;
  jmp_buf jb;
  bool started = false;
  bool done = false;
  const unsigned* wait_gen = nullptr;  // at a barrier: waiting while *wait_gen == wait_at
  unsigned wait_at = 0;
  int wait_src = -1;                   // at a shuffle: waiting until lane wait_src has posted wait_n values
  size_t wait_n = 0;
  std::vector<Post> posts;             // this lane's shuffles since the last lp_sync
  uint64_t slots[SLOTS];               // this lane's registers of the current fragment operation
};

struct Block {
  int bid[3] = {0, 0, 0}, threads = 0, cur = 0;
  ucontext_t main;
  jmp_buf main_jb;
  std::vector<Lane> lanes;
  std::vector<ucontext_t> proto;  // getcontext once per lane slot
  std::vector<std::unique_ptr<char[]>> stacks;
  int block_arrived = 0;
  unsigned block_gen = 0;
  std::vector<int> group_arrived;
  std::vector<unsigned> group_gen;
  const std::function<void()>* body = nullptr;
  const char* error = nullptr;  // the first failed check of this block
};
// the block the calling thread is running
inline thread_local Block* tls = nullptr;
inline Block& G() { return *tls; }

inline void fail(const char* message) {
  if (!G().error) G().error = message;
}

inline bool waiting(const Lane& l) {
  return (l.wait_gen && *l.wait_gen == l.wait_at) || (l.wait_src >= 0 && G().lanes[l.wait_src].posts.size() < l.wait_n);
}

// back to the scheduler until this lane may go on
inline void yield() {
  Lane& lane = G().lanes[G().cur];
  if (waiting(lane) && !_setjmp(lane.jb)) _longjmp(G().main_jb, 1);
  lane.wait_gen = nullptr;
  lane.wait_src = -1;
}

// `size` lanes arrive before any goes on; true for the lane that arrives last
inline bool meet(int& arrived, unsigned& gen, int size) {
  if (++arrived == size) {
    arrived = 0;
    ++gen;
    return true;
  }
  G().lanes[G().cur].wait_gen = &gen;
  G().lanes[G().cur].wait_at = gen;
  yield();
  return false;
}

inline void group_barrier() { meet(G().group_arrived[G().cur / GROUP], G().group_gen[G().cur / GROUP], GROUP); }

inline void block_barrier() {
  if (meet(G().block_arrived, G().block_gen, G().threads))
    for (Lane& l : G().lanes) l.posts.clear();  // no shuffle is in flight: every lane is here
}

// until lane src has posted n shuffle values
inline void wait_post(int src, size_t n) {
  G().lanes[G().cur].wait_src = src;
  G().lanes[G().cur].wait_n = n;
  yield();
}

inline void trampoline() {
  (*G().body)();
  G().lanes[G().cur].done = true;
  _longjmp(G().main_jb, 1);  // never through uc_link: G().main may be stale
}

// Block (x, y, z) of the grid, as every lane of it, on the calling thread; an error message or null.
inline const char* run_block(Block& b, const std::function<void()>* body, int threads, int x, int y, int z) {
  tls = &b;
  b.threads = threads;
  b.body = body;
  b.error = nullptr;
  b.lanes.resize(threads);
  while ((int)b.stacks.size() < threads) {
    b.stacks.emplace_back(new char[STACK]);
    b.proto.emplace_back();
    getcontext(&b.proto.back());
  }
  b.bid[0] = x, b.bid[1] = y, b.bid[2] = z;
  b.block_arrived = 0;
  b.group_arrived.assign(threads / GROUP, 0);
  b.group_gen.assign(threads / GROUP, 0);
  for (int t = 0; t < threads; ++t) {
    Lane& l = b.lanes[t];
    l = Lane();
    l.ctx = b.proto[t];
    l.ctx.uc_mcontext.fpregs = &l.ctx.__fpregs_mem;  // a copied ucontext_t points at its own FP state
    l.ctx.uc_stack.ss_sp = b.stacks[t].get();
    l.ctx.uc_stack.ss_size = STACK;
    l.ctx.uc_link = &b.main;
    makecontext(&l.ctx, trampoline, 0);
  }
  int alive = threads;
  while (alive > 0) {
    bool progress = false;
    for (int t = 0; t < threads; ++t) {
      Lane& l = b.lanes[t];
      if (l.done || waiting(l)) continue;
      b.cur = t;
      if (!_setjmp(b.main_jb)) {
        if (!l.started) {
          l.started = true;
          swapcontext(&b.main, &l.ctx);
        } else {
          _longjmp(l.jb, 1);
        }
      }
      progress = true;
      if (l.done) --alive;
    }
    if (!progress) return "deadlock: some lanes wait at a barrier (lp_sync or a shuffle) others never reach";
  }
  return b.error;
}

// The threads that run a launch's blocks: the caller and `size() - 1` workers, each with its own
// Block. Never destroyed (the workers outlive every launch and are detached at creation).
struct Pool {
  std::mutex m;
  std::condition_variable work, done;
  std::vector<std::unique_ptr<Block>> blocks;  // [0]: the caller's
  unsigned generation = 0;
  int busy = 0;
  // the current launch
  const std::function<void()>* body = nullptr;
  int gx = 0, gy = 0, threads = 0, total = 0;
  std::atomic<int> next{0};
  const char* error = nullptr;

  void run(Block& b) {
    for (int i; (i = next.fetch_add(1)) < total;) {
      const char* e = run_block(b, body, threads, i % gx, i / gx % gy, i / (gx * gy));
      if (e) {
        std::lock_guard<std::mutex> lock(m);
        if (!error) error = e;
        next = total;
      }
    }
  }

  void worker(Block* b, unsigned seen) {
    std::unique_lock<std::mutex> lock(m);
    for (;;) {
      work.wait(lock, [&] { return generation != seen; });
      seen = generation;
      lock.unlock();
      run(*b);
      lock.lock();
      if (--busy == 0) done.notify_one();
    }
  }

  void resize(int n) {
    while ((int)blocks.size() < n) {
      blocks.emplace_back(new Block());
      if (blocks.size() > 1) std::thread(&Pool::worker, this, blocks.back().get(), generation).detach();
    }
  }
};
inline Pool* pool = new Pool();
inline int pool_threads = 1;

// Runs body() as every lane of every block; returns an error message or null.
inline const char* launch(int gx, int gy, int gz, int threads, int smem_bytes, std::function<void()> body) {
  if (threads % WAVE) return "block is not a whole number of waves";
  if (smem_bytes) return "dynamic shared memory is not emulated";
  Pool& p = *pool;
  const int total = gx * gy * gz, n = total < pool_threads ? total : pool_threads;
  p.resize(n > 1 ? n : 1);
  p.body = &body, p.gx = gx, p.gy = gy, p.threads = threads, p.total = total, p.error = nullptr;
  p.next = 0;
  if (n > 1) {
    std::lock_guard<std::mutex> lock(p.m);
    p.busy = (int)p.blocks.size() - 1;
    ++p.generation;
    p.work.notify_all();
  }
  p.run(*p.blocks[0]);
  if (n > 1) {
    std::unique_lock<std::mutex> lock(p.m);
    p.done.wait(lock, [&] { return p.busy == 0; });
  }
  return p.error;
}

// slot `slot` of lane `lane` of this lane's wave
inline uint32_t reg(int lane, int slot) { return (uint32_t)G().lanes[G().cur / WAVE * WAVE + lane].slots[slot]; }
}  // namespace lp_emu

// how many threads run a launch's blocks (1: the caller's alone)
extern "C" void lp_emu_set_threads(int n) { lp_emu::pool_threads = n < 1 ? 1 : n; }

// --- vendor.h's interface ----------------------------------------------------------------------------

typedef _Float16 lp_half;
inline float lp_h2f(lp_half h) { return (float)h; }
inline lp_half lp_f2h(float f) { return (lp_half)f; }

inline int lp_tid() { return lp_emu::G().cur; }
inline int lp_bid() { return lp_emu::G().bid[0]; }
inline int lp_bid_y() { return lp_emu::G().bid[1]; }
inline int lp_bid_z() { return lp_emu::G().bid[2]; }
inline int lp_bdim() { return lp_emu::G().threads; }
inline void lp_sync() { lp_emu::block_barrier(); }

inline int lp_lane() { return lp_tid() % WAVE; }
inline int lp_wave() { return lp_tid() / WAVE; }
inline int lp_waves() { return lp_bdim() / WAVE; }

namespace lp_emu {
// this lane's value, and the value of lane `from` at the same shuffle
inline uint64_t exchange(uint64_t bits, int from, int kind) {
  std::vector<Post>& posts = G().lanes[G().cur].posts;
  posts.push_back({bits, kind});
  const size_t n = posts.size();
  group_barrier();
  wait_post(from, n);
  const Post& p = G().lanes[from].posts[n - 1];
  if (p.kind != kind) fail("shuffles out of step: the halves of a wave took different numbers (meet at lp_sync first)");
  return p.bits;
}

template <typename T> inline T shuffle(T v, int src, int kind) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "32- or 64-bit values");
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof(T));
  bits = exchange(bits, lp_wave() * WAVE + (src & (WAVE - 1)), kind);
  T out;
  memcpy(&out, &bits, sizeof(T));
  return out;
}
}  // namespace lp_emu

template <typename T> inline T lp_shfl(T v, int src) { return lp_emu::shuffle(v, src, -1); }
template <typename T> inline T lp_shfl_xor(T v, int mask) { return lp_emu::shuffle(v, lp_lane() ^ mask, mask); }

inline int lp_dot4(int a, int b, int c) {
  for (int i = 0; i < 4; ++i) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
  return c;
}
inline int lp_atomic_add(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }

// v_perm_b32 (vendor.h), for the selectors the kernels use: bytes 0..7 of hi:lo
inline uint32_t lp_perm(uint32_t hi, uint32_t lo, uint32_t sel) {
  const uint64_t both = (uint64_t)hi << 32 | lo;
  uint32_t out = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t s = (sel >> (8 * i)) & 0xFF;
    if (s > 7) lp_emu::fail("lp_perm: a v_perm_b32 selector byte above 7 is not emulated");
    out |= (uint32_t)(both >> (8 * (s & 7)) & 0xFF) << (8 * i);
  }
  return out;
}

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

// --- matrix fragments (mma.cuh's interface) ----------------------------------------------------------
#if defined(LP_EMU_MMA)
#define LP_MMA 1
inline int lp_frag_row(int e) { return (lp_lane() >> 2) + ((e >> 1) << 3); }
inline int lp_frag_col(int e) { return ((lp_lane() & 3) << 1) + (e & 1); }
#elif defined(LP_EMU_WMMA)
#define LP_WMMA 1
typedef int lp_v4i __attribute__((ext_vector_type(4)));
typedef int lp_v8i __attribute__((ext_vector_type(8)));
typedef float lp_v8f __attribute__((ext_vector_type(8)));
typedef _Float16 lp_v16h __attribute__((ext_vector_type(16)));
inline int lp_frag_row(int e) { return 2 * e + (lp_lane() >> 4); }
inline int lp_frag_col(int e) { return lp_lane() & 15; }
#endif

#if defined(LP_EMU_MMA) || defined(LP_EMU_WMMA)
namespace lp_emu {
inline int8_t s8(uint32_t w, int byte) { return (int8_t)(w >> (8 * byte)); }
inline float f16(uint32_t w, int half) {
  const uint16_t h = (uint16_t)(w >> (16 * half));
  _Float16 x;
  memcpy(&x, &h, 2);
  return (float)x;
}

// One fragment operation: every lane posts its NA registers of A (slots 0..) and NB of B (slots NA..),
// the wave meets, each lane forms its E accumulator elements, d[e] += sum over k < K of
// term(row, column, k) read from the posted registers, and the wave meets again before anyone posts anew.
template <int NA, int NB, int K, int E, typename T, class Term>
inline void fragment(const int* a, const int* b, T (&d)[E], Term term) {
  Lane& me = G().lanes[G().cur];
  for (int i = 0; i < NA; ++i) me.slots[i] = (uint32_t)a[i];
  for (int i = 0; i < NB; ++i) me.slots[NA + i] = (uint32_t)b[i];
  group_barrier();
#if defined(LP_EMU_WMMA)  // lanes 16..31 must hold what lanes 0..15 hold (the emulation reads lanes 0..15)
  if (lp_lane() >= 16)
    for (int i = 0; i < NA + NB; ++i)
      if (reg(lp_lane(), i) != reg(lp_lane() - 16, i)) fail("wmma: lanes 16..31 do not repeat lanes 0..15");
#endif
  T out[E];
  for (int e = 0; e < E; ++e) {
    out[e] = d[e];
    for (int k = 0; k < K; ++k) out[e] += term(lp_frag_row(e), lp_frag_col(e), k);
  }
  group_barrier();
  for (int e = 0; e < E; ++e) d[e] = out[e];
}
}  // namespace lp_emu
#endif

#if defined(LP_EMU_MMA)
// PTX ISA fragment layouts (g = lane / 4, t = lane % 4): m16n8k32 s8 A element (r, k) is byte k % 4 of
// register (r >= 8) + 2 (k >= 16) of lane (r % 8) * 4 + (k % 16) / 4; B element (k, n) byte k % 4 of
// register (k >= 16) of lane n * 4 + (k % 16) / 4. m16n8k16 s8: A register (r >= 8), B one register.
// m16n8k16 f16: A element (r, k) half k % 2 of register (r >= 8) + 2 (k >= 8) of lane (r % 8) * 4 + (k % 8) / 2.
inline void lp_mma_i8_k32(int (&d)[4], const int (&a)[4], const int (&b)[2], const int (&c)[4]) {
  int acc[4] = {c[0], c[1], c[2], c[3]};
  lp_emu::fragment<4, 2, 32>(a, b, acc, [](int r, int n, int k) {
    using namespace lp_emu;
    const int lane = (k % 16) / 4, hi = k >= 16;
    return s8(reg((r % 8) * 4 + lane, (r >= 8) + 2 * hi), k % 4) * s8(reg(n * 4 + lane, 4 + hi), k % 4);
  });
  for (int e = 0; e < 4; ++e) d[e] = acc[e];
}

inline void lp_mma_i8_k16(int (&d)[4], const int (&a)[2], int b, const int (&c)[4]) {
  int acc[4] = {c[0], c[1], c[2], c[3]};
  lp_emu::fragment<2, 1, 16>(a, &b, acc, [](int r, int n, int k) {
    using namespace lp_emu;
    return s8(reg((r % 8) * 4 + k / 4, r >= 8), k % 4) * s8(reg(n * 4 + k / 4, 2), k % 4);
  });
  for (int e = 0; e < 4; ++e) d[e] = acc[e];
}

inline void lp_mma_f16_k16(float (&d)[4], const int (&a)[4], const int (&b)[2]) {
  lp_emu::fragment<4, 2, 16>(a, b, d, [](int r, int n, int k) {
    using namespace lp_emu;
    const int lane = (k % 8) / 2, hi = k >= 8;
    return f16(reg((r % 8) * 4 + lane, (r >= 8) + 2 * hi), k % 2) * f16(reg(n * 4 + lane, 4 + hi), k % 2);
  });
}
#endif

#if defined(LP_EMU_WMMA)
// A: lane l holds row l % 16 (k 0..15), B: lane l holds column l % 16; lanes 16..31 repeat 0..15.
// D element e of lane l: (2e + l / 16, l % 16).
inline lp_v8i lp_wmma_i8(lp_v4i a, lp_v4i b, lp_v8i c) {
  const int ar[4] = {a[0], a[1], a[2], a[3]}, br[4] = {b[0], b[1], b[2], b[3]};
  int acc[8];
  for (int e = 0; e < 8; ++e) acc[e] = c[e];
  lp_emu::fragment<4, 4, 16>(ar, br, acc, [](int r, int n, int k) {
    using namespace lp_emu;
    return s8(reg(r, k / 4), k % 4) * s8(reg(n, 4 + k / 4), k % 4);
  });
  for (int e = 0; e < 8; ++e) c[e] = acc[e];
  return c;
}

inline lp_v8f lp_wmma_f16(lp_v16h a, lp_v16h b, lp_v8f c) {
  const lp_v8i aw = __builtin_bit_cast(lp_v8i, a), bw = __builtin_bit_cast(lp_v8i, b);
  int ar[8], br[8];
  float acc[8];
  for (int i = 0; i < 8; ++i) {
    ar[i] = aw[i];
    br[i] = bw[i];
    acc[i] = c[i];
  }
  lp_emu::fragment<8, 8, 16>(ar, br, acc, [](int r, int n, int k) {
    using namespace lp_emu;
    return f16(reg(r, k / 2), k % 2) * f16(reg(n, 8 + k / 2), k % 2);
  });
  for (int e = 0; e < 8; ++e) c[e] = acc[e];
  return c;
}
#endif
