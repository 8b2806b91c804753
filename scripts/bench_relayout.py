"""Whether the rows16 relayout pays: each relaid-out format's projection kernel on its rows16 records
against the same kernel reading the file's blocks in place, per shape, activation rows and SIMD path.

    python scripts/bench_relayout.py [--threads 2] [--isa avx512,avx2] [--shapes 5632x1024,1024x1024,1024x2816]
                                     [--rows 1,128] [--formats Q4_K,Q6_K] [--json]

Random weights of each format in codegen/cpu_families/matmul.RELAYOUT (or --formats), random
activations in the format it takes; both kernels are built from the
same headers into one library and run alternately, the best of 7 rounds each (this VM's speed drifts
minute to minute, so the two sides are never measured far apart). The shapes default to tiny-llama3's
gate|up, q and down projections.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "tests")]

from kernel_inputs import random_activation, random_blocks  # noqa: E402  (tests/)
from llmplan.codegen import cpu_build  # noqa: E402
from llmplan.codegen.cpu_families import matmul  # noqa: E402
from llmplan.core import layouts  # noqa: E402
from llmplan.core.formats import ACTIVATION_FORMAT  # noqa: E402


def measure(isa: str, threads: int, shapes: list[tuple[int, int]], row_counts: list[int], formats: list[str]) -> list[dict]:
    kernels = {fmt: (matmul.kernel([fmt], False), matmul.kernel_in_place(fmt)) for fmt in formats}
    lib = cpu_build.CpuLibrary.from_kernels([k for pair in kernels.values() for k in pair], isa)
    lib.set_threads(threads)
    rng = np.random.default_rng(0)
    out = []
    for fmt, (held, plain) in kernels.items():
        for n, k in shapes:
            raw = random_blocks(rng, fmt, n, k).view(np.uint8).reshape(-1)
            weights = {held.name: layouts.make("rows16", raw, fmt, (n, k)), plain.name: raw}
            for rows in row_counts:
                x, _ = random_activation(rng, ACTIVATION_FORMAT[fmt.lower()], rows, k)
                y = np.zeros((rows, n), np.float32)
                calls = {name: (lib.entry(name)[0], (x.ctypes.data, w.ctypes.data, y.ctypes.data, rows, k, n,
                                                     matmul.DEFAULT_TASK_ROWS, matmul.DEFAULT_AHEAD, matmul.DEFAULT_COLS))
                         for name, w in weights.items()}
                reps = max(1, int(2e6 // (rows * n * k // 64)))  # about the same time a round at every shape
                best = {name: float("inf") for name in calls}
                for _ in range(7):
                    for name, (fn, args) in calls.items():
                        t0 = time.perf_counter()
                        for _ in range(reps):
                            fn(*args)
                        best[name] = min(best[name], (time.perf_counter() - t0) / reps)
                out.append({"format": fmt, "isa": isa, "n": n, "k": k, "rows": rows,
                            "rows16_us": round(best[held.name] * 1e6, 1), "in_place_us": round(best[plain.name] * 1e6, 1),
                            "speedup": round(best[plain.name] / best[held.name], 2)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isa", default=",".join(i for i in cpu_build.host_isas() if i != "scalar"))
    ap.add_argument("--shapes", default="5632x1024,1024x1024,1024x2816", help="N x K of each projection")
    ap.add_argument("--rows", default="1,128", help="activation rows")
    ap.add_argument("--formats", default=",".join(matmul.RELAYOUT), help="of matmul.RELAYOUT")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rows = [int(r) for r in args.rows.split(",")]
    formats = args.formats.split(",")
    results = [r for isa in args.isa.split(",") for r in measure(isa, args.threads, shapes, rows, formats)]
    if args.json:
        print(json.dumps({"threads": args.threads, "results": results}, indent=2))
        return
    for r in results:
        print(f"{r['format']} {r['isa']:6} n={r['n']:5} k={r['k']:5} rows={r['rows']:4}: rows16 {r['rows16_us']:9.1f} us   "
              f"in place {r['in_place_us']:9.1f} us   {r['speedup']:.2f}x")


if __name__ == "__main__":
    main()
