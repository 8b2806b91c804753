// pool.h: the CPU target's thread pool: created once (lp_cpu_set_threads), then every kernel launch is
// one C call that fans its tasks out over the same threads (the caller is one of them).
//
// lp_parallel(tasks, f) runs f(t) for t in [0, tasks), each task exactly once, on whichever thread
// claims it next, and returns when all are done. Results never depend on which thread ran a task: a
// kernel's tasks write disjoint outputs, and any combination across tasks is done afterwards in task
// order. A launch is a ticket (generation, task count, next task) in one atomic word; threads claim
// runs of tasks by compare-and-swap on it, so a worker that wakes late (on a shared machine the OS may
// not run it for milliseconds) can only claim tasks of the launch it saw, and the caller waits for the
// tasks to be done, never for a worker that has none. Between launches the workers spin for a short while (a
// decode step is hundreds of launches a few microseconds apart), then sleep on a condition variable.
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
      ticket_.store(pack(gen_ + 1, 0, 0));
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
    ticket_.store(pack(gen_, tasks, 0));  // sequentially consistent with the load below (a sleeper misses no
    if (sleeping_.load() > 0) {             // launch: it counts itself before it checks the ticket)
      std::lock_guard<std::mutex> lock(m_);
      cv_.notify_all();
    }
    claim(gen_);
    while (done_.load(std::memory_order_acquire) != tasks) pause();
  }

 private:
  // ticket: generation (24 bits), task count (20 bits), next task (20 bits)
  static constexpr uint64_t GEN_MASK = (1u << 24) - 1, FIELD = (1u << 20) - 1;
  static uint64_t pack(uint64_t gen, uint64_t tasks, uint64_t next) { return gen << 40 | tasks << 20 | next; }
  static uint64_t gen_of(uint64_t t) { return t >> 40; }

  // run the tasks of launch `gen` that nobody has claimed yet, a run of them per claim: an eighth of
  // what is left per thread (the two atomics bounce between cores, ~0.1-0.2 us each, against ~1 us for
  // a decode task; the head has 16k tasks), so the runs shrink towards the end and the threads still
  // finish together
  void claim(uint64_t gen) {
    const uint64_t share = 8 * (uint64_t)threads();
    uint64_t t = ticket_.load(std::memory_order_acquire);
    while (gen_of(t) == gen && (t & FIELD) < (t >> 20 & FIELD)) {
      const uint64_t next = t & FIELD, run = std::max<uint64_t>(1, ((t >> 20 & FIELD) - next) / share);
      if (!ticket_.compare_exchange_weak(t, t + run, std::memory_order_acq_rel)) continue;
      for (uint64_t i = 0; i < run; ++i) fn_(ctx_, (int)(next + i));
      done_.fetch_add((int)run, std::memory_order_release);
      t = ticket_.load(std::memory_order_acquire);
    }
  }
  void work() {
    uint64_t seen = gen_of(ticket_.load());
    for (;;) {
      // spin a little for the next launch, then sleep until one comes
      const auto until = std::chrono::steady_clock::now() + SPIN;
      while (gen_of(ticket_.load(std::memory_order_acquire)) == seen && std::chrono::steady_clock::now() < until) pause();
      if (gen_of(ticket_.load(std::memory_order_acquire)) == seen) {
        std::unique_lock<std::mutex> lock(m_);
        sleeping_.fetch_add(1);
        cv_.wait(lock, [&] { return gen_of(ticket_.load()) != seen; });
        sleeping_.fetch_sub(1);
      }
      if (stop_) return;
      seen = gen_of(ticket_.load(std::memory_order_acquire));
      claim(seen);
    }
  }
  static void pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  static constexpr std::chrono::microseconds SPIN{100};

  std::vector<std::thread> workers_;
  std::mutex m_;
  std::condition_variable cv_;
  std::atomic<uint64_t> ticket_{0};
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

// more tasks than a ticket can count are folded: task t runs tasks t, t + MAX, ...
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
