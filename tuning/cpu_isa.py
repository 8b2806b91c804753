"""Timing a CPU plan's SIMD paths (plans/cpu_native.py decides with the verdict; this measures it).

What is timed is what `plan run` gets: a whole greedy decode step (one sequence, the fused tail's token)
as the cpu driver replays it, every kernel call bound once. One engine holds the plan (its arena, K/V
cache and step-state slots serve every candidate); each candidate is the plan's own translation unit
built for its path, its calls bound to the same memory, on the same number of threads. The step decodes
at the middle of the plan's context (the average step of a sequence that fills it) over a K/V cache of
random values.

The paths sum floats in different orders (lane widths), so their bits may differ and the candidates
are not checked bit for bit against the default, as the task rows are: each candidate's step is run
launch by launch against the default's from the same inputs, and everything a launch writes must agree
with the default's within docs/numerics.md's kernel-test bounds (core/numerics.py: ORDER_NMSE for the
accumulation-order-sensitive families, EXACT_NMSE for the rest); the fused tail's token must be equal.
"""

from __future__ import annotations

import os
from typing import Callable

import numpy as np

from llmplan.codegen.cpu_build import CpuLibrary
from llmplan.core.numerics import EXACT_NMSE, ORDER_NMSE, pages_for
from llmplan.core.tune_store import Verdict
from llmplan.runtime.drivers.cpu import view
from llmplan.runtime.engine import Engine
from llmplan.runtime.numpy_kernels import values

from .probes import disagreement, measure

ORDER_SENSITIVE = {"matmul", "attention_decode", "tail"}  # float sums over K or positions, in lanes
# One decision for the whole plan, and a step of a few threads is slowed by any other work on the machine
# for as long as it runs: many short interleaved rounds, so that such bursts miss the median (5 rounds
# of 25 ms chose wrongly by 50% on a tiny model beside another job; 25 rounds agreed run after run).
ROUNDS = 25


def verdict(plan: str | os.PathLike, candidates: list[str], round_seconds: float) -> Verdict:
    """Time a decode step of `plan` on each SIMD path in `candidates` (the default first)."""
    engine = Engine.load(plan)
    ex, driver = engine.executor, engine.executor.driver
    params = {name: k.params for name, k in engine.body.kernels.items()}
    libs = {isa: CpuLibrary(engine.body.cpu.source, params, isa) for isa in candidates}
    for lib in libs.values():
        lib.set_threads(driver.lib.threads())
    ctx = engine.header.limits.ctx
    state = {"tokens": np.array([1], np.int32), "pos": np.array([ctx // 2], np.int32),
             "seq": np.zeros(1, np.int32), "pages": np.arange(pages_for(ctx), dtype=np.int32)[None, :]}
    rng = np.random.default_rng(0)
    driver.write(ex.cache, rng.standard_normal(ex.cache.shape, np.float32).astype(np.float16))
    dims = ex.step_dims("decode", 1, 1)
    calls = ex.calls("decode", dims, {"cache", "next_token"})
    steps: dict[str, list[tuple[int, Callable[[], None]]]] = {}
    for isa, lib in libs.items():
        driver.lib = lib  # the driver binds each call to the library it holds
        steps[isa] = [(i, driver.prepare(call)) for i, call in calls]
    default = candidates[0]

    def against_default(isa: str) -> str:
        """Launch by launch from the default's state: the candidate's writes, undone, then the default's."""
        ex.write_state("decode", state, dims)
        launches = ex.phases["decode"].launches
        for i in dict.fromkeys(i for i, _ in calls):
            written = ex.written("decode", launches[i], dims, state)

            def run(path: str) -> list[np.ndarray]:
                for j, fn in steps[path]:
                    if j == i:
                        fn()
                return [np.array(values(view(r)), np.float64) for _, r in written]

            before = [driver.read(r).result() for _, r in written]
            got = run(isa)
            for (_, r), b in zip(written, before):
                driver.write(r, b)
            want = run(default)
            bound = ORDER_NMSE if launches[i].family in ORDER_SENSITIVE else EXACT_NMSE
            for (what, r), g, w in zip(written, got, want):
                why = (("" if np.array_equal(g, w) else "its tokens differ") if r.dtype == "i32"
                       else disagreement(g, w, bound))
                if why:
                    return f"decode launch {i} ({launches[i]['op']}), {what}: {why}"
        return ""

    def runner(isa: str):
        def run(i: int):
            if i == 0:  # the check (and warm-up), from the same state every time
                return "" if isa == default else against_default(isa)
            for _, fn in steps[isa]:
                fn()
            return None
        return run

    return measure({isa: runner(isa) for isa in candidates}, lambda why: why, default, round_seconds, ROUNDS)
