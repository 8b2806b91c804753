"""The machine's read bandwidth: `threads` threads stream a buffer far larger than the last-level cache,
each its own contiguous share, as a decode step streams its weights. The roofline the CPU benchmarks
divide by (bench_run.py, bench_cpu_kernels.py), measured in the same run as what it judges.

    python scripts/read_bandwidth.py [--threads 2] [--gib 0.5]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import time

import numpy as np

from llmplan.codegen import cpu_build
from llmplan.codegen.host import build_library

_STREAM = r"""
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <thread>
#include <vector>
// the sum of n words (64-byte aligned) read by `threads` threads, each its own contiguous share, a
// 64-byte line a step in two 32-byte loads; ahead > 0 also asks for the line `ahead` bytes on into L2,
// as the decode kernels do
extern "C" uint64_t lp_bench_read(const uint64_t* p, size_t n, int threads, size_t ahead) {
  std::vector<uint64_t> sums(threads);
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
      const size_t lo = n * t / threads / 16 * 16, hi = n * (t + 1) / threads / 16 * 16;
      for (size_t i = lo; i < hi; i += 16) {
        const __m256i* q = (const __m256i*)(p + i);
        if (ahead) {
          _mm_prefetch((const char*)q + ahead, _MM_HINT_T1);
          _mm_prefetch((const char*)q + ahead + 64, _MM_HINT_T1);
        }
        a = _mm256_add_epi64(a, _mm256_load_si256(q));
        b = _mm256_add_epi64(b, _mm256_load_si256(q + 1));
        c = _mm256_add_epi64(c, _mm256_load_si256(q + 2));
        d = _mm256_add_epi64(d, _mm256_load_si256(q + 3));
      }
      alignas(32) uint64_t s[4];
      _mm256_store_si256((__m256i*)s, _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d)));
      sums[t] = s[0] + s[1] + s[2] + s[3];
    });
  for (auto& t : ts) t.join();
  uint64_t total = 0;
  for (uint64_t s : sums) total += s;
  return total;
}
"""
# Each measurement streams the buffer plainly and with the decode kernels' L2 prefetch distance
# (codegen/cpu/rows16.h R16_AHEAD) and takes the faster: on this project's Intel Xeon VMs the plain loop
# reads 28-30 GB/s with 2 threads and the prefetched one 32-34, while a loop left to the compiler read
# 15-19 (clang++-19) or 22-27 (g++): the roofline is the best a read reaches, not one compiler's loop.
AHEAD = (0, 8192)


class ReadBandwidth:
    """A buffer of `gib` GiB (64-byte aligned, its pages touched once) and the streams over it; each call
    is one measurement in GB/s, the best of `reps` streams of each kind (AHEAD)."""

    def __init__(self, threads: int, gib: float = 0.5):
        self.lib = build_library(_STREAM, ["-std=c++20", "-O3", "-mavx2", "-pthread"], "bench", cpu_build.compiler()).load()
        self.lib.lp_bench_read.restype = ctypes.c_uint64
        self.lib.lp_bench_read.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_size_t]
        self.threads = threads
        words = int(gib * 2**30) // 64 * 8
        raw = np.empty(words + 8, np.uint64)
        skip = (-raw.ctypes.data % 64) // 8
        self.buf = raw[skip:skip + words]
        self.buf[...] = 1

    def __call__(self, reps: int = 3) -> float:
        best = float("inf")
        for _ in range(reps):
            for ahead in AHEAD:
                t0 = time.perf_counter()
                total = self.lib.lp_bench_read(self.buf.ctypes.data, self.buf.size, self.threads, ahead)
                best = min(best, time.perf_counter() - t0)
                assert total == self.buf.size  # every word read once
        return self.buf.nbytes / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--gib", type=float, default=0.5)
    args = ap.parse_args()
    print(f"{ReadBandwidth(args.threads, args.gib)(5):.1f} GB/s read with {args.threads} threads")


if __name__ == "__main__":
    main()
