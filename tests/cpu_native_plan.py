"""A stand-in for the runtime's `cpu` driver until the driver interface lands: a model's lowered phases
(plans/compile.py lower_phases) run with the CPU target's compiled kernels (codegen/cpu_families/), as
the executor will run them: one arena laid out as the plan says, the paged f16 K/V cache, weights
read in place from the mapped GGUF, one C call per launch with every argument bound by reference.

NativeModel(gguf).run(phase, state, want) takes the engine's step state (tokens, pos, seq, pages, last)
and returns the phase outputs in `want` (views: copy before the next run); `times` adds up the seconds
of each op's launches. A step's launches are bound once per phase and shape and then replayed with the
state copied into fixed buffers, as the executor's graph contract has it. greedy(prompt ids, n) is
prefill (in chunks) then decode, one sequence. Used by tests/test_cpu_native_plan.py and scripts/bench_cpu_kernels.py.
"""

from __future__ import annotations

import importlib
import json
import math
import time
from collections import defaultdict
from typing import Any

import numpy as np

from llmplan.codegen.cpu_build import CpuLibrary
from llmplan.codegen.cpu_families import FAMILY_MODULE
from llmplan.core.numerics import rope_table
from llmplan.codegen.kernel import Context
from llmplan.core.formats import ACTIVATION_FORMATS, dequantize, planes
from llmplan.core.numerics import PAGE, pages_for
from llmplan.models.model import open_model
from llmplan.plans.compile import limits_for, lower_phases
from llmplan.plans.devices import local_cpu

_DTYPES = {"f32": np.float32, "i32": np.int32, "f16": np.float16, "bf16": np.uint16}


def _nbytes(buf: dict[str, Any], dims: dict[str, int]) -> int:
    shape = [d if isinstance(d, int) else dims[d] for d in buf["shape"]]
    if buf["dtype"] in _DTYPES:
        return math.prod(shape) * np.dtype(_DTYPES[buf["dtype"]]).itemsize
    return planes(ACTIVATION_FORMATS[buf["dtype"].upper()], math.prod(shape[:-1]), shape[-1])[1]


class NativeModel:
    def __init__(self, path: str, ctx: int = 512, chunk: int = 256, isa: str | None = None,
                 threads: int | None = None):
        self.model = open_model(path)
        limits = limits_for(self.model, ctx, chunk, 1)
        phases, _, _, table = lower_phases(self.model, local_cpu(), limits)
        self.ctx, self.chunk = ctx, chunk
        self.phases: dict[str, tuple[dict[str, Any], list]] = {}
        kernels = {}
        for name, p in phases.items():
            context = Context(p["buffers"], table, None, p["dims"])
            lowered = []
            for launch in p["launches"]:
                family = importlib.import_module(f"llmplan.codegen.cpu_families.{FAMILY_MODULE[launch['op']]}")
                native = family.launches(launch, context)
                lowered.append((launch, native))
                kernels.update({ln.kernel.name: ln.kernel for ln in native})
            self.phases[name] = (p, lowered)
        t0 = time.perf_counter()
        self.lib = CpuLibrary(list(kernels.values()), isa)
        self.build_s = time.perf_counter() - t0
        if threads:
            self.lib.set_threads(threads)
        cfg = self.model.config
        self.arena = np.zeros(max(p["arena_bytes"] for p, _ in self.phases.values()), np.uint8)
        self.cache = np.zeros((cfg.n_layers, 2, limits["kv_blocks"], PAGE, cfg.n_kv_heads * cfg.head_dim), np.float16)
        f = self.model.file
        self.blocks = {n: np.frombuffer(f.tensor_bytes(n), np.uint8) for n in table}  # in place: no copy
        self.vectors = {n: dequantize(f.tensor_bytes(n), f.tensors[n].type, tuple(table[n][1]))
                        for n, (_, shape) in table.items() if len(shape) == 1}
        self.tables: dict[str, np.ndarray] = {}
        self._steps: dict[tuple[str, int, int], tuple] = {}
        self.times: dict[str, float] = defaultdict(float)

    def held_bytes(self) -> int:
        """Memory held beyond the mapped file: arena, K/V cache, the float vectors, rope tables (the
        kernels' per-thread scratch, a task's rows unpacked, is under a megabyte)."""
        return (self.arena.nbytes + self.cache.nbytes + sum(v.nbytes for v in self.vectors.values())
                + sum(v.nbytes for v in self.tables.values()))

    def _rope(self, ref: dict[str, Any]) -> np.ndarray:
        key = json.dumps(ref, sort_keys=True)
        if key not in self.tables:
            t = ref["rope_table"]
            factors = None if t["factors"] is None else self.vectors[t["factors"]]
            self.tables[key] = rope_table(self.ctx, t["dims"], t["base"], t["scale"], factors)
        return self.tables[key]

    def _bound(self, phase: str, rows: int, seqs: int):
        """Everything a step of this phase and shape needs, bound once (the executor's graph contract:
        fixed addresses, the step state updated in place): (state arrays, buffer views, calls, dims)."""
        key = (phase, rows, seqs)
        if key not in self._steps:
            p, lowered = self.phases[phase]
            dims = dict(p["dims"], rows=rows, seqs=seqs, blocks=self.cache.shape[2])
            views = [self.arena[b["offset"]:b["offset"] + _nbytes(b, dims)] for b in p["buffers"]]
            state = {"tokens": np.zeros(rows, np.int32), "pos": np.zeros(rows, np.int32), "seq": np.zeros(rows, np.int32),
                     "pages": np.zeros((seqs, dims["pages"]), np.int32), "last": np.zeros(seqs, np.int32)}

            def bind(ref: dict[str, Any]) -> np.ndarray:
                if "buf" in ref:
                    return views[ref["buf"]]
                if "state" in ref:
                    return state[ref["state"]]
                if "cache" in ref:
                    return self.cache
                if "rope_table" in ref:
                    return self._rope(ref)
                return self.blocks[ref["weight"]] if ref.get("layout") == "blocks" else self.vectors[ref["weight"]]

            calls = [(launch, [self.lib.bind(ln, bind, dims)[:2] for ln in native]) for launch, native in lowered]
            self._steps[key] = (state, views, calls, dims)
        return self._steps[key]

    def run(self, phase: str, state: dict[str, np.ndarray], want: set[str]) -> dict[str, np.ndarray]:
        bound, views, calls, dims = self._bound(phase, len(state["tokens"]), len(state["pages"]))
        for name, values in state.items():
            bound[name][...] = values
        for launch, fns in calls:
            if not want.intersection(launch.get("serves", ())):
                continue
            t0 = time.perf_counter()
            for fn, values in fns:
                fn(*values)
            self.times[launch["op"]] += time.perf_counter() - t0
        p = self.phases[phase][0]
        out = {}
        for name, ref in p["outputs"].items():
            if name in want and "buf" in ref:
                b = p["buffers"][ref["buf"]]
                shape = [d if isinstance(d, int) else dims[d] for d in b["shape"]]
                out[name] = views[ref["buf"]].view(_DTYPES[b["dtype"]]).reshape(shape)
            elif name in want and "state" in ref:  # the decode phases' greedy tokens, in the tokens input
                out[name] = bound[ref["state"]]
        return out

    def greedy(self, ids: list[int], n: int, head: str = "next_token") -> tuple[list[int], list[np.ndarray], dict]:
        """Greedy tokens after the prompt `ids` (one sequence, from an empty cache), the rows of `head`
        each step produced, and the seconds prefill and decode took."""
        pages = np.arange(pages_for(self.ctx), dtype=np.int32)[None, :]
        out_ids, rows, t0 = [], [], time.perf_counter()
        for at in range(0, len(ids), self.chunk):
            part = ids[at:at + self.chunk]
            state = {"tokens": np.asarray(part, np.int32), "pos": np.arange(at, at + len(part), dtype=np.int32),
                     "seq": np.zeros(len(part), np.int32), "pages": pages,
                     "last": np.array([len(part) - 1], np.int32)}
            ending = at + len(part) == len(ids)
            res = self.run("prefill", state, {"cache", head} if ending else {"cache"})
        rows.append(res[head][0].copy())
        t1 = time.perf_counter()
        tok = int(res[head][0]) if head == "next_token" else int(np.argmax(res[head][0]))
        for step in range(n):
            out_ids.append(tok)
            if step == n - 1:
                break
            state = {"tokens": np.array([tok], np.int32), "pos": np.array([len(ids) + step], np.int32),
                     "seq": np.zeros(1, np.int32), "pages": pages}
            res = self.run("decode", state, {"cache", head})
            rows.append(res[head][0].copy())
            tok = int(res[head][0]) if head == "next_token" else int(np.argmax(res[head][0]))
        return out_ids, rows, {"prefill_s": t1 - t0, "decode_s": time.perf_counter() - t1}
