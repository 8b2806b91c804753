"""Timing a GPU decision's candidates on a driver (plans/gpu_tuning.py says what is decided; this runs
it): the candidates' kernels loaded as a small plan body, operands at the phase's bounds (the model's
own weights in the layout each kernel reads; activations and the outputs' initial contents random),
each candidate checked against the default member's output, then timed by plans/probes.measure, each
call synchronized so device time counts."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from llmplan.core import layouts
from llmplan.core.formats import value_bytes
from llmplan.core.numerics import ORDER_NMSE
from llmplan.models.gguf import GGUFFile
from llmplan.plans.gpu_tuning import GpuDecision
from llmplan.plans.probes import Verdict, disagreement, measure, random_operand

from .driver import Call, Driver, Region, Scalar


class ProbeRunner:
    def __init__(self, driver: Driver, device: dict[str, Any], model: GGUFFile, table: dict[str, tuple],
                 built: Any, decisions: list[GpuDecision]):
        self.driver, self.model, self.table = driver, model, table
        kernels = {ln.kernel.name: ln for d in decisions for lns in d.candidates.values() for ln in lns}
        body = {"kernels": {n: {"params": list(ln.kernel.params), "block": ln.kernel.block} for n, ln in kernels.items()},
                "gpu": {"binary": built.binary, "source": built.source},
                "phases": {"probe": {"launches": [{"kernels": [{"name": n, "smem": ln.smem}
                                                                for n, ln in kernels.items()]}]}}}
        driver.load(body, {"device": device})
        self.weights: dict[tuple[str, str], Region] = {}

    def _weight(self, ref: dict[str, Any]) -> Region:
        key = (ref["weight"], ref.get("layout", "plain"))
        if key not in self.weights:
            fmt, shape = self.table[key[0]]
            data = layouts.make(key[1], self.model.tensor_bytes(key[0]), fmt, tuple(shape))
            self.weights[key] = Region(self.driver.put(data), 0, data.nbytes, "u8", (data.nbytes,))
        return self.weights[key]

    def verdict(self, d: GpuDecision, round_seconds: float) -> Verdict:
        rng = np.random.default_rng(zlib.crc32(d.key.encode()))
        buffers = self._buffers(d, rng)
        outs = [buffers[("buf", r["buf"])] for r in d.launch["outs"]]
        # every check starts the outputs from the same contents (matmul_residual adds into its output; a
        # member that leaves part unwritten then differs from the default there)
        initial = {id(r): random_operand(r.dtype, r.shape, rng) for r in outs}
        calls = {name: [self._call(name, ln, buffers, d.dims) for ln in lns] for name, lns in d.candidates.items()}

        def runner(name: str):
            def run(i: int):
                if i == 0:
                    for r in outs:
                        self.driver.write(r, initial[id(r)])
                for call in calls[name]:
                    self.driver.launch(call)
                if i == 0:
                    return [self.driver.read(r).result() for r in outs]
                self.driver.sync()
                return None
            return run

        default = next(iter(d.candidates))
        want = runner(default)(0)

        def check(got: list[np.ndarray]) -> str:
            return next(filter(None, (disagreement(g, w, ORDER_NMSE) for g, w in zip(got, want))), "")

        return measure({name: runner(name) for name in d.candidates}, check, default, round_seconds)

    def _buffers(self, d: GpuDecision, rng: np.random.Generator) -> dict[tuple, Region]:
        """Every buffer and scratch any candidate names, at the phase's bounds."""
        out: dict[tuple, Region] = {}
        for name, lns in d.candidates.items():
            for ln in lns:
                for ref in ln.args:
                    if "buf" in ref and ("buf", ref["buf"]) not in out:
                        b = d.buffers[ref["buf"]]
                        shape = tuple(s if isinstance(s, int) else d.dims[s] for s in b["shape"])
                        data = random_operand(b["dtype"], shape, rng)
                        out[("buf", ref["buf"])] = Region(self.driver.put(data), 0, data.nbytes, b["dtype"], shape)
                    elif "scratch" in ref and ("scratch", name, ref["scratch"]) not in out:  # shared by a member's launches
                        shape = tuple(s if isinstance(s, int) else d.dims[s] for s in ref["shape"])
                        n = value_bytes(ref["dtype"], shape)
                        out[("scratch", name, ref["scratch"])] = Region(self.driver.alloc(n), 0, n, ref["dtype"], shape)
        return out

    def _call(self, member: str, ln: Any, buffers: dict[tuple, Region], dims: dict[str, int]) -> Call:
        args: list[Region | Scalar] = []
        for ref in ln.args:
            if "buf" in ref:
                args.append(buffers[("buf", ref["buf"])])
            elif "scratch" in ref:
                args.append(buffers[("scratch", member, ref["scratch"])])
            elif "weight" in ref:
                args.append(self._weight(ref))
            else:
                kind, v = next(iter(ref.items()))
                args.append(Scalar(kind, dims[v] if isinstance(v, str) else v))
        grid = [g if isinstance(g, int) else -(-dims[g[0]] // g[1]) for g in ln.grid]
        return Call(ln.kernel.name, tuple(grid + [1] * (3 - len(grid))), ln.kernel.block, ln.smem, args)
