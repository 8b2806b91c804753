"""The CPU backend's executor: one arena, the K/V planes, and a walk over a phase's launch list.

Every argument of a launch is a reference from the plan (step state, cache, weight, or an arena
buffer at an offset); the executor binds the buffer's symbolic dimensions for this step (rows, seqs)
and hands the kernel NumPy views. Nothing here knows the IR.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from llmplan.core.formats import ACTIVATION_FORMATS, planes
from llmplan.core.numerics import PAGE

from .cpu_kernels import KERNELS, Packed
from .cpu_weights import CpuWeights

_DTYPES = {"f32": np.dtype(np.float32), "i32": np.dtype(np.int32), "f16": np.dtype(np.float16),
           "bf16": np.dtype(np.uint16)}


def _view(arena: np.ndarray, buf: dict[str, Any], dims: dict[str, int]) -> np.ndarray | Packed:
    shape = [d if isinstance(d, int) else dims[d] for d in buf["shape"]]
    at = buf["offset"]
    if buf["dtype"] in _DTYPES:
        dtype = _DTYPES[buf["dtype"]]
        return arena[at:at + math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)
    fmt = ACTIVATION_FORMATS[buf["dtype"].upper()]
    ps, _ = planes(fmt, math.prod(shape[:-1]), shape[-1])
    return Packed(buf["dtype"], {p.name: arena[at + p.offset:at + p.offset + p.nbytes].view(p.dtype).reshape(p.shape)
                                 for p in ps})


class CpuExecutor:
    def __init__(self, body: dict[str, Any], kv_blocks: int, weights: CpuWeights):
        """The K/V cache holds `kv_blocks` blocks of PAGE positions of every layer."""
        cfg = body["config"]
        self.phases = body["phases"]
        self.weights = weights
        self.arena = np.zeros(body["arena_bytes"], np.uint8)
        self.cache = np.zeros((cfg["n_layers"], 2, kv_blocks, PAGE, cfg["n_kv_heads"] * cfg["head_dim"]), np.float16)
        self.poison = False  # tests: fill buffers with NaN before each launch writes them

    def _arg(self, ref: dict[str, Any], family: str, state, views):
        if "buf" in ref:
            return views[ref["buf"]]
        if "state" in ref:
            return state[ref["state"]]
        if "cache" in ref:
            return self.cache
        name = ref["weight"]
        return self.weights.rows[name] if family == "embed_rows" else self.weights.f32[name]

    def run(self, phase: str, state: dict[str, np.ndarray], want: set[str]) -> dict[str, np.ndarray]:
        """Run the launches of `phase` that the outputs in `want` need; returns those outputs (views:
        copy them before the next run)."""
        p = self.phases[phase]
        rows = len(state["tokens"])
        dims = dict(p["dims"], rows=rows, seqs=len(state["pages"]), blocks=self.cache.shape[2])
        views = [_view(self.arena, b, dims) for b in p["buffers"]]
        for launch in p["launches"]:
            if not want.intersection(launch.get("serves", ())):
                continue
            args = [self._arg(r, launch["family"], state, views) for r in launch["args"]]
            outs = [self.cache if "cache" in r else views[r["buf"]] for r in launch["outs"]]
            if self.poison:
                for o in outs:
                    target = o["d"] if isinstance(o, Packed) else o
                    if o is not self.cache and target.dtype.kind == "f":
                        target[...] = np.nan
            KERNELS[launch["family"]](launch["op"], launch["attrs"], outs, *args)
        return {name: self.cache if "cache" in ref else views[ref["buf"]]
                for name, ref in p["outputs"].items() if name in want}
