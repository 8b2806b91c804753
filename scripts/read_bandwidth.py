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
#include <stddef.h>
#include <stdint.h>
#include <thread>
#include <vector>
// the sum of n words read by `threads` threads, each its own contiguous share
extern "C" uint64_t lp_bench_read(const uint64_t* p, size_t n, int threads) {
  std::vector<uint64_t> sums(threads);
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      uint64_t s[8] = {0};
      for (size_t i = n * t / threads; i + 8 <= n * (t + 1) / threads; i += 8)
        for (int j = 0; j < 8; ++j) s[j] += p[i + j];
      sums[t] = s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
    });
  for (auto& t : ts) t.join();
  uint64_t total = 0;
  for (uint64_t s : sums) total += s;
  return total;
}
"""


class ReadBandwidth:
    """A buffer of `gib` GiB (its pages touched once) and the stream over it; each call is one
    measurement in GB/s, the best of `reps` streams."""

    def __init__(self, threads: int, gib: float = 0.5):
        self.lib = build_library(_STREAM, ["-std=c++20", "-O3", "-mavx2", "-pthread"], "bench", cpu_build.compiler()).load()
        self.lib.lp_bench_read.restype = ctypes.c_uint64
        self.lib.lp_bench_read.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.threads = threads
        self.buf = np.ones(int(gib * 2**30) // 8, np.uint64)

    def __call__(self, reps: int = 3) -> float:
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            self.lib.lp_bench_read(self.buf.ctypes.data, self.buf.size, self.threads)
            best = min(best, time.perf_counter() - t0)
        return self.buf.nbytes / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--gib", type=float, default=0.5)
    args = ap.parse_args()
    print(f"{ReadBandwidth(args.threads, args.gib)(5):.1f} GB/s read with {args.threads} threads")


if __name__ == "__main__":
    main()
