"""Measuring a CPU plan's projection schedules: the NumPy twins' panel sizes (plans/cpu_decisions.py) and
the compiled kernels' task rows, prefetch distances and pass widths (plans/cpu_schedules.py). The
compiler asks through the Probes this module makes; each probe follows tuning/probes.py's rules."""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np

from llmplan.codegen.cpu_families import matmul
from llmplan.core import layouts
from llmplan.core import numerics as num
from llmplan.core.formats import value_bytes
from llmplan.core.plan_records import F32, I32, Buf, KernelCall, Ref, Scratch, State, bound_shape
from llmplan.core.tune_store import Verdict
from llmplan.plans import cpu_decisions
from llmplan.plans.cpu_decisions import DEFAULT, Decision, Panels, Probes, Projection, Strategy
from llmplan.plans.cpu_schedules import EXPERTS, NativeTasks, Schedule, Shape

from . import probes as probe_rules
from .probes import measure, random_operand


def probes(round_seconds: float | None = None, isa=None, every: bool = False) -> Probes:
    """The Probes a compile (or `plan tune`, with `every` and the SIMD-path probe `isa(candidates,
    round_seconds)`) hands the compiler; each candidate is timed `round_seconds` a round."""
    seconds = round_seconds or probe_rules.ROUND_SECONDS

    def projection(kind: Any, d: Decision, cands: list) -> Verdict:
        if kind is Panels:
            return probe_panels(d.projection, cands, seconds)
        return probe_schedules(kind, d, cands, seconds)
    return Probes(projection, isa and (lambda cands: isa(cands, seconds)), every)


def probe_panels(p: Projection, cands: list[Strategy], round_seconds: float) -> Verdict:
    """Time the candidates on the projection's real shapes, with random operands in enough copies to
    stream from memory as in a real step (twice the last-level cache), checked against each row alone."""
    rng = np.random.default_rng(p.k * 1_000_003 + sum(p.ns) * 31 + p.rows)
    ws0 = [rng.random((n, p.k), np.float32) - np.float32(0.5) for n in p.ns]
    copies = max(1, min(64, math.ceil(2 * cpu_decisions.last_level_cache() / (4 * p.k * (sum(p.ns) + p.rows)))))
    ws = [ws0] + [[w.copy() for w in ws0] for _ in range(copies - 1)]
    xs = [rng.random((p.rows, p.k), np.float32) - np.float32(0.5) for _ in range(copies)]
    reference = [np.concatenate([xs[0][r:r + 1] @ w.T for r in range(p.rows)]) for w in ws0]

    def runner(s: Strategy):
        return lambda i: [num.matmul(xs[i % copies], w, s.panel_bytes) for w in ws[i % copies]]

    def check(outs) -> str:
        same = all(np.array_equal(o, r) for o, r in zip(outs, reference))
        return "" if same else "its products differ from each row's own sgemv"

    return measure({s.name: runner(s) for s in cands}, check, DEFAULT.name, round_seconds)


def probe_schedules(kind: NativeTasks, d: Decision, cands: list[Schedule], round_seconds: float) -> Verdict:
    """The compiled kernels' schedules: the plan's own kernel calls from the plan's own library (the one
    the driver loads) on the model's real weights in the layouts the kernels read, over every layer's
    launch of that shape in turn (so the weights stream from memory as in a step), with random
    activations; each candidate's outputs checked bit for bit against the default's before it is timed."""
    shape: Shape = d.projection
    phase, dims = shape.phase, dict(shape.phase.dims, rows=shape.step_rows)
    group = [l for l in d.launches if any(l is x for x in phase.launches)]
    rng = np.random.default_rng(zlib.crc32(d.key.encode()))
    arrays: dict[str, np.ndarray] = {}  # activations and outputs, restored before each check
    if group[0].op in EXPERTS:  # routed as a router routes: each row to `top` distinct experts
        ids = group[0].args[2]
        experts = kind.file.weight(group[0].args[1].name).shape[-1]  # GGUF order: the experts last
        top = phase.buffers[ids.index].shape[1]
        arrays[f"buf{ids.index}"] = np.stack([rng.permutation(experts)[:top] for _ in range(shape.step_rows)]
                                             ).astype(np.int32).view(np.uint8).reshape(-1)
    held: dict[tuple[str, str], np.ndarray] = {}  # weights in the layouts the kernels read

    def bind(ref: Ref) -> np.ndarray:
        if isinstance(ref, State):  # the tail's token mask (at its default: every token), the tokens it writes
            s = phase.state[ref.name]
            return arrays.setdefault(ref.name, np.full(bound_shape(s.shape, dims), s.default or 0, np.int32))
        if isinstance(ref, Buf):
            b = phase.buffers[ref.index]
            return arrays.setdefault(f"buf{ref.index}", random_operand(b.dtype, bound_shape(b.shape, dims), rng))
        if isinstance(ref, Scratch):  # the experts' grouping buffers: written before they are read
            return arrays.setdefault(f"scratch:{ref.name}", np.zeros(value_bytes(ref.dtype, bound_shape(ref.shape, dims)), np.uint8))
        key = (ref.name, ref.layout)
        if key not in held:
            t = kind.file.weight(ref.name)
            made = (ref.layout, kind.file.tensor_bytes(ref.name), t.type.name, tuple(reversed(t.shape)))
            data = matmul.make_held(kind.lib, *made)  # the library's maker where it has one: faster
            held[key] = layouts.make(*made) if data is None else data
        return held[key]

    def arg(r: Ref) -> Any:
        if isinstance(r, I32):
            return dims[r.value] if isinstance(r.value, str) else r.value
        return r.value if isinstance(r, F32) else bind(r).ctypes.data

    def values(k: KernelCall, s: Schedule) -> tuple:
        return (*(arg(r) for r in k.args[:-3]), s.rows, s.ahead, s.cols)

    calls = {c.name: [[(kind.lib.entry(k.name)[0], values(k, c)) for k in l.kernels] for l in group]
             for c in cands}
    snapshot = {n: a.copy() for n, a in arrays.items()}
    outs = [f"buf{r.index}" for r in group[0].outs if isinstance(r, Buf)]

    def runner(c: Schedule):
        def run(i: int):
            if i == 0:  # the check: from the same inputs every time (a residual accumulates in place)
                for n, a in snapshot.items():
                    arrays[n][...] = a
            for fn, vals in calls[c.name][i % len(group)]:
                fn(*vals)
            return [arrays[n].copy() for n in outs] if i == 0 else None
        return run

    runners = {c.name: runner(c) for c in cands}
    reference = runners[kind.default.name](0)

    def check(got) -> str:
        same = all(np.array_equal(g, r, equal_nan=True) for g, r in zip(got, reference))
        return "" if same else "its outputs differ from the default schedule's"

    return measure(runners, check, kind.default.name, round_seconds)
