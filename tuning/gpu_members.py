"""Measuring a GPU plan's decisions on the device: for every launch whose family offers several members
(GEMM tile shapes and split-K, mat-vec variants: plans/select.py), the members that fit the device,
timed on the device and recorded in the tune store under the key and build id select.py consults
(`plan tune --device cuda|hip`).

The probe rules are tuning/probes.py's: every candidate's output is checked first, here against the
default member's on the same random operands within the accumulation-order bound (core/numerics.py
ORDER_NMSE: members sum in different orders, so bit equality is not theirs to keep), then five
interleaved rounds, medians, a lead under 3% a tie. The candidates' kernels are loaded as a small plan
body on a driver, their operands at the phase's bounds (the model's own weights in the layout each
kernel reads; activations, the K/V cache and the outputs' initial contents random; the step state a
full context's last rows, `probe_step`), each call synchronized so device time counts.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llmplan.codegen.build import Build, build
from llmplan.codegen.kernel import Context, KernelLaunch
from llmplan.codegen.targets import target_for
from llmplan.core import layouts
from llmplan.core.devices import DeviceFacts
from llmplan.core.formats import value_bytes
from llmplan.core.numerics import ORDER_NMSE, PAGE
from llmplan.core.plan_records import (
    Buf,
    Buffer,
    Cache,
    CacheInfo,
    GpuSection,
    KernelCall,
    KernelInfo,
    Launch,
    Limits,
    ModelRef,
    Phase,
    PlanBody,
    PlanHeader,
    Scratch,
    State,
    StateInput,
    TuneRecord,
    Weight,
    bound_shape,
)
from llmplan.core.planfile import FORMAT_VERSION
from llmplan.core.tune_store import TuneStore, Verdict, provenance, record
from llmplan.models.gguf import GGUFFile
from llmplan.plans.select import build_id, decision_key, fits, members
from llmplan.runtime.driver import Call, Driver, Region, Scalar

from .probes import disagreement, measure, random_operand


@dataclass
class GpuDecision:
    key: str
    build_id: str
    phase: str
    launch: Launch  # the first lowered launch it decides (operand types and shapes)
    buffers: list[Buffer]  # its phase's buffers (dtype, shape)
    state: dict[str, StateInput]  # its phase's step state
    dims: dict[str, int]  # the phase's bounds: the shapes it is timed at
    candidates: dict[str, list[KernelLaunch]]  # those that fit, the family's order: the first is the default
    pruned: dict[str, str] = field(default_factory=dict)
    phases: dict[str, int] = field(default_factory=dict)  # launches per phase
    verdict: Verdict | None = None
    entry: str = ""
    provenance: str = ""


def decisions(phases: dict[str, Phase], table, device: DeviceFacts) -> tuple[list[GpuDecision], Build]:
    """Every decision of the plan for `device` with more than one member that fits, and one build of
    all their candidates."""
    target = target_for(device.arch)
    found: dict[str, GpuDecision] = {}
    for phase, p in phases.items():
        ctx = Context(p.buffers, table, target, p.dims, device.multiprocessors)
        for launch in p.launches:
            cands = members(launch, ctx)
            if len(cands) < 2:
                continue
            key = decision_key(launch, ctx)
            if key not in found:
                bid = build_id(tuple(ln.kernel for lns in cands.values() for ln in lns))
                found[key] = GpuDecision(key, bid, phase, launch, p.buffers, p.state, p.dims, cands)
            found[key].phases[phase] = found[key].phases.get(phase, 0) + 1
    kernels = {ln.kernel.name: ln.kernel for d in found.values() for lns in d.candidates.values() for ln in lns}
    built = build(list(kernels.values()), target, gates=False)
    for d in found.values():
        for name, lns in list(d.candidates.items()):
            why = fits(lns, built.manifests, device)
            if why:
                d.pruned[name] = why
                del d.candidates[name]
    return [d for d in found.values() if len(d.candidates) > 1], built


def keep(d: GpuDecision, v: Verdict, device: DeviceFacts, store: TuneStore) -> None:
    """Record a decision's verdict in the store (its id, even with the store off: TuneStore.save)."""
    entry = record(v, device.tune_key, d.key, d.build_id)
    d.verdict = v
    d.entry = store.save(entry)
    d.provenance = provenance(d.entry, entry)


def _probe_plan(device: DeviceFacts, built: Build, kernels: dict[str, KernelLaunch]) -> tuple[PlanHeader, PlanBody]:
    """A plan holding only the candidates' kernels, for the driver to load: one launch calling each."""
    calls = [KernelCall(n, (), ln.kernel.block, ln.smem, []) for n, ln in kernels.items()]
    phase = Phase([Launch("probe", "probe", {}, [], [], calls)], [], {}, {}, [])
    body = PlanBody({}, {}, {"probe": phase}, 0, CacheInfo("f16", (), PAGE, ""), {}, {},
                    {n: KernelInfo(list(ln.kernel.params), ln.kernel.block) for n, ln in kernels.items()},
                    TuneRecord("off", device.tune_key, {}),
                    gpu=GpuSection(built.target, built.source, built.binary,
                                   {n: vars(m) for n, m in built.manifests.items() if n in kernels}))
    return PlanHeader(FORMAT_VERSION, "", device, {}, ModelRef("", "", "", {}), Limits(0, 0, 0, 0)), body


def probe_step(state: dict[str, StateInput], dims: dict[str, int]) -> dict[str, np.ndarray]:
    """A step for the candidates that read the step state (attention): the rows split evenly over the
    phase's sequences, each sequence's rows the last of a full context (the most K/V to read, the bound
    the phase is timed at) on pages of its own; any other input its default, else zeros."""
    rows, seqs, ctx = dims["rows"], dims.get("seqs", 1), dims["ctx"]
    per = max(1, rows // seqs)
    seq = np.minimum(np.arange(rows) // per, seqs - 1)
    known = {"seq": seq, "pos": ctx - per + np.arange(rows) % per,
             "last": np.minimum(np.arange(1, seqs + 1) * per, rows) - 1}
    if "pages" in dims:
        known["pages"] = np.arange(seqs * dims["pages"]).reshape(seqs, dims["pages"])
    out = {}
    for name, s in state.items():
        shape = bound_shape(s.shape, dims)
        fill = known.get(name, np.full(shape, s.default or 0))
        out[name] = np.ascontiguousarray(np.broadcast_to(fill, shape), dtype={"i32": np.int32, "f32": np.float32}[s.dtype])
    return out


class ProbeRunner:
    def __init__(self, driver: Driver, device: DeviceFacts, model: GGUFFile, table: dict[str, tuple],
                 built: Build, decisions: list[GpuDecision], cache: CacheInfo):
        self.driver, self.model, self.table, self.cache = driver, model, table, cache
        kernels = {ln.kernel.name: ln for d in decisions for lns in d.candidates.values() for ln in lns}
        header, body = _probe_plan(device, built, kernels)
        driver.load(body, header)
        self.weights: dict[tuple[str, str], Region] = {}
        self.caches: dict[tuple[int, ...], Region] = {}

    def _weight(self, ref: Weight) -> Region:
        key = (ref.name, ref.layout or "plain")
        if key not in self.weights:
            fmt, shape = self.table[key[0]]
            data = layouts.make(key[1], self.model.tensor_bytes(key[0]), fmt, tuple(shape))
            self.weights[key] = Region(self.driver.put(data), 0, data.nbytes, "u8", (data.nbytes,))
        return self.weights[key]

    def _cache(self, shape: tuple[int, ...], rng: np.random.Generator) -> Region:
        """A random K/V cache of `shape`, made once for every decision that reads one at that size."""
        if shape not in self.caches:
            data = random_operand(self.cache.dtype, shape, rng)
            self.caches[shape] = Region(self.driver.put(data), 0, data.nbytes, self.cache.dtype, shape)
        return self.caches[shape]

    def verdict(self, d: GpuDecision, round_seconds: float) -> Verdict:
        rng = np.random.default_rng(zlib.crc32(d.key.encode()))
        buffers = self._buffers(d, rng)
        outs = [buffers[r] for r in d.launch.outs]
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
        out: dict[Any, Region] = {}
        step = probe_step(d.state, d.dims)
        for name, lns in d.candidates.items():
            for ln in lns:
                for ref in ln.args:
                    if isinstance(ref, Buf) and ref not in out:
                        b = d.buffers[ref.index]
                        shape = bound_shape(b.shape, d.dims)
                        data = random_operand(b.dtype, shape, rng)
                        out[ref] = Region(self.driver.put(data), 0, data.nbytes, b.dtype, shape)
                    elif isinstance(ref, Scratch) and (name, ref.name) not in out:  # shared by a member's launches
                        shape = bound_shape(ref.shape, d.dims)
                        n = value_bytes(ref.dtype, shape)
                        out[(name, ref.name)] = Region(self.driver.alloc(n), 0, n, ref.dtype, shape)
                    elif isinstance(ref, State) and ref not in out:
                        data = step[ref.name]
                        out[ref] = Region(self.driver.put(data), 0, data.nbytes, d.state[ref.name].dtype, data.shape)
                    elif isinstance(ref, Cache) and ref not in out:
                        out[ref] = self._cache(bound_shape(self.cache.shape, d.dims), rng)
        return out

    def _call(self, member: str, ln: Any, buffers: dict[tuple, Region], dims: dict[str, int]) -> Call:
        args: list[Region | Scalar] = []
        for ref in ln.args:
            if isinstance(ref, Buf):
                args.append(buffers[ref])
            elif isinstance(ref, Scratch):
                args.append(buffers[(member, ref.name)])
            elif isinstance(ref, (State, Cache)):
                args.append(buffers[ref])
            elif isinstance(ref, Weight):
                args.append(self._weight(ref))
            else:
                args.append(Scalar(ref.KIND, dims[ref.value] if isinstance(ref.value, str) else ref.value))
        grid = [g if isinstance(g, int) else -(-dims[g[0]] // g[1]) for g in ln.grid]
        return Call(ln.kernel.name, tuple(grid + [1] * (3 - len(grid))), ln.kernel.block, ln.smem, args)
