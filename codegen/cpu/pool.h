// pool.h: the CPU target's thread pool: created once (lp_cpu_set_threads), then every kernel launch is
// one C call that fans its tasks out over the same threads (the caller is one of them).
//
// lp_parallel(tasks, f) runs f(t) for t in [0, tasks), each task exactly once, on whichever thread
// claims it, and returns when all are done. Results never depend on which thread ran a task: a
// kernel's tasks write disjoint outputs, and any combination across tasks is done afterwards in task
// order. Each thread owns a contiguous share of a launch's tasks and runs it front to back, so it reads
// its part of a weight as one stream (claims that interleave the threads' runs restart the hardware
// prefetcher at every run: a 1.7 MB projection streamed from memory at the same speed on two threads
// as on one); a thread done with its share takes the back half of another's, so the threads still
// finish together on a machine whose OS runs one of them late. A share is (generation, front, back) in
// one atomic word, so a worker that wakes late (the OS may not run it for milliseconds) can only claim
// tasks of the launch it saw, and the caller waits for the tasks to be done, never for a worker that
// has none. Between launches the workers spin for a short while (a decode step is hundreds of launches
// a few microseconds apart), then sleep on a condition variable.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "host.h"

namespace lp_cpu {

class Pool {
 public:
  explicit Pool(int threads) : shares_(new Share[threads < 1 ? 1 : threads]) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { work(i); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
      ticket_.store(gen_ + 1);
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  int threads() const { return (int)workers_.size() + 1; }

  template <class F> void run(int tasks, F& f) {
    if (tasks <= 0) return;
    if (tasks == 1 || workers_.empty()) {
      for (int t = 0; t < tasks; ++t) f(t);
      return;
    }
    fn_ = [](void* c, int t) { (*(F*)c)(t); };
    ctx_ = &f;
    done_.store(0, std::memory_order_relaxed);
    gen_ = (gen_ + 1) & GEN_MASK;
    const uint64_t n = threads();
    for (uint64_t i = 0; i < n; ++i) shares_[i].w.store(pack(gen_, tasks * i / n, tasks * (i + 1) / n), std::memory_order_relaxed);
    ticket_.store(gen_);  // publishes the shares; sequentially consistent with the load below (a sleeper
    if (sleeping_.load() > 0) {  // misses no launch: it counts itself before it checks the ticket)
      std::lock_guard<std::mutex> lock(m_);
      cv_.notify_all();
    }
    claim(gen_, 0);
    while (done_.load(std::memory_order_acquire) != tasks) pause();
  }

 private:
  // a share: generation (24 bits), front and back task (20 bits each); a cache line of its own, since
  // its owner claims from it all launch long
  static constexpr uint64_t GEN_MASK = (1u << 24) - 1, FIELD = (1u << 20) - 1;
  struct alignas(64) Share {
    std::atomic<uint64_t> w{0};
  };
  static uint64_t pack(uint64_t gen, uint64_t front, uint64_t back) { return gen << 40 | front << 20 | back; }
  static uint64_t gen_of(uint64_t w) { return w >> 40; }
  static uint64_t front_of(uint64_t w) { return w >> 20 & FIELD; }
  static uint64_t back_of(uint64_t w) { return w & FIELD; }

  // thread `me`'s part of launch `gen`: its own share from the front, an eighth of what is left per claim
  // (so the back stays free for a thief), then the back half of each other share that has tasks left
  void claim(uint64_t gen, int me) {
    while (take(gen, me, true)) {
    }
    const int n = threads();
    for (int k = 1; k < n; ++k)
      while (take(gen, (me + k) % n, false)) {
      }
  }
  // one run of share i's tasks: false once the share is empty or belongs to a later launch
  bool take(uint64_t gen, int i, bool own) {
    std::atomic<uint64_t>& w = shares_[i].w;
    uint64_t s = w.load(std::memory_order_acquire), first, run;
    do {
      if (gen_of(s) != gen || front_of(s) >= back_of(s)) return false;
      const uint64_t left = back_of(s) - front_of(s);
      run = std::max<uint64_t>(1, own ? left / 8 : left / 2);
      first = own ? front_of(s) : back_of(s) - run;
    } while (!w.compare_exchange_weak(s, own ? s + (run << 20) : s - run, std::memory_order_acq_rel));
    for (uint64_t t = first; t < first + run; ++t) fn_(ctx_, (int)t);
    done_.fetch_add((int)run, std::memory_order_release);
    return true;
  }
  void work(int me) {
    uint64_t seen = ticket_.load();
    for (;;) {
      // spin a little for the next launch, then sleep until one comes
      const auto until = std::chrono::steady_clock::now() + SPIN;
      while (ticket_.load(std::memory_order_acquire) == seen && std::chrono::steady_clock::now() < until) pause();
      if (ticket_.load(std::memory_order_acquire) == seen) {
        std::unique_lock<std::mutex> lock(m_);
        sleeping_.fetch_add(1);
        cv_.wait(lock, [&] { return ticket_.load() != seen; });
        sleeping_.fetch_sub(1);
      }
      if (stop_) return;
      seen = ticket_.load(std::memory_order_acquire);
      claim(seen, me);
    }
  }
  static void pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  static constexpr std::chrono::microseconds SPIN{100};

  std::unique_ptr<Share[]> shares_;  // one a thread, the caller's first
  std::vector<std::thread> workers_;
  std::mutex m_;
  std::condition_variable cv_;
  std::atomic<uint64_t> ticket_{0};  // the last launch's generation
  std::atomic<int> done_{0}, sleeping_{0};
  uint64_t gen_ = 0;  // the caller's: the last launch's generation
  bool stop_ = false;
  void (*fn_)(void*, int) = nullptr;
  void* ctx_ = nullptr;
};

inline Pool*& pool_slot() {
  static Pool* p = nullptr;
  return p;
}

inline Pool& pool() {
  Pool*& p = pool_slot();
  if (!p) p = new Pool((int)std::max(1u, std::thread::hardware_concurrency()));
  return *p;
}

// more tasks than a share's 20-bit fields count are folded: task t runs tasks t, t + MAX, ...
constexpr int MAX_TASKS = (1 << 20) - 1;

template <class F> inline void lp_parallel(int tasks, F f) {
  if (tasks <= MAX_TASKS) return pool().run(tasks, f);
  auto folded = [&](int t) {
    for (int u = t; u < tasks; u += MAX_TASKS) f(u);
  };
  pool().run(MAX_TASKS, folded);
}

}  // namespace lp_cpu

// The pool's size (the calling thread included); a new size replaces the pool. Not to be called while
// a kernel runs.
LP_KERNEL void lp_cpu_set_threads(int threads) {
  lp_cpu::Pool*& p = lp_cpu::pool_slot();
  if (p && p->threads() == threads) return;
  delete p;
  p = new lp_cpu::Pool(threads < 1 ? 1 : threads);
}

LP_KERNEL int lp_cpu_threads() { return lp_cpu::pool().threads(); }
