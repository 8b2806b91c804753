// pool.h: the CPU target's thread pool: created once (lp_cpu_set_threads), then every kernel launch is
// one C call that fans its tasks out over the same threads (the caller is one of them).
//
// lp_parallel(tasks, f) runs f(t) for t in [0, tasks), each task exactly once, on whichever thread
// takes it next (an atomic counter: a thread slowed by another process on a shared machine simply
// takes fewer tasks), and returns when all are done. Results never depend on which thread ran a task:
// a kernel's tasks write disjoint outputs, and any combination across tasks is done afterwards in task
// order. Between launches the workers spin for a short while (a decode step is hundreds of launches a
// few microseconds apart), then sleep on a condition variable.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "host.h"

namespace lp_cpu {

class Pool {
 public:
  explicit Pool(int threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
      gen_.fetch_add(1);
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
    tasks_ = tasks;
    next_.store(0);
    busy_.store((int)workers_.size());
    {
      std::lock_guard<std::mutex> lock(m_);
      gen_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    take();
    while (busy_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
  }

 private:
  void take() {
    for (int t; (t = next_.fetch_add(1)) < tasks_;) fn_(ctx_, t);
  }
  void work() {
    uint64_t seen = 0;
    for (;;) {
      // spin a little for the next launch, then sleep until one comes
      const auto until = std::chrono::steady_clock::now() + SPIN;
      while (gen_.load(std::memory_order_acquire) == seen && std::chrono::steady_clock::now() < until) spin_pause();
      if (gen_.load(std::memory_order_acquire) == seen) {
        std::unique_lock<std::mutex> lock(m_);
        cv_.wait(lock, [&] { return gen_.load() != seen; });
      }
      seen = gen_.load(std::memory_order_acquire);
      if (stop_) return;
      take();
      busy_.fetch_sub(1, std::memory_order_release);
    }
  }
  static void spin_pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  static constexpr std::chrono::microseconds SPIN{100};

  std::vector<std::thread> workers_;
  std::mutex m_;
  std::condition_variable cv_;
  std::atomic<uint64_t> gen_{0};
  std::atomic<int> next_{0}, busy_{0};
  bool stop_ = false;
  void (*fn_)(void*, int) = nullptr;
  void* ctx_ = nullptr;
  int tasks_ = 0;
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

template <class F> inline void lp_parallel(int tasks, F f) { pool().run(tasks, f); }

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
