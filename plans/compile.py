"""The compile pipeline: GGUF -> traced phase graphs -> fusion passes -> a kernel per node -> launch
lists over one arena -> the plan file. (`plan compile`, and `plan run MODEL.gguf` on the fly.)"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import platform
import time
from typing import Any

import numpy as np

from llmplan.codegen import cpu_build
from llmplan.codegen.build import cache_root
from llmplan.codegen.targets import target_for
from llmplan.core.build_id import build_id
from llmplan.core.console import Progress, plural
from llmplan.core.devices import DeviceFacts, local_cpu
from llmplan.core.errors import InputError
from llmplan.core.layouts import LAYOUTS, layout_bytes
from llmplan.core.numerics import PAGE, pages_for
from llmplan.core.plan_records import (
    CacheInfo,
    GpuSection,
    KernelCall,
    KernelInfo,
    LayoutInfo,
    Limits,
    ModelRef,
    Phase,
    PlanBody,
    PlanHeader,
    TunedDecision,
    TuneRecord,
    Weight,
    WeightInfo,
)
from llmplan.core.planfile import FORMAT_VERSION, model_fingerprint, read_header, write_plan
from llmplan.core.tune_store import TuneStore
from llmplan.ir.printer import print_graph
from llmplan.ir.trace import PHASES, trace_model, weight_table
from llmplan.models.info import decode_bytes_per_token
from llmplan.models.model import Model, open_model
from llmplan.passes.manager import run_passes

from . import cpu_decisions, cpu_native, cpu_schedules
from .lower import layout, lower
from .select import select

DEFAULT_CTX = 4096
DEFAULT_CHUNK = 256

def limits_for(model: Model, ctx: int | None, chunk: int, max_seqs: int) -> Limits:
    ctx = min(model.config.context_length, DEFAULT_CTX) if ctx is None else ctx
    if not 1 <= ctx <= model.config.context_length:
        raise InputError(f"--ctx {ctx} is outside 1..{model.config.context_length} (the model's context)")
    if not 1 <= chunk <= ctx:
        raise InputError(f"--chunk {chunk} must be between 1 and the context ({ctx})")
    if max_seqs < 1:
        raise InputError(f"--max-seqs must be at least 1, got {max_seqs}")
    return Limits(ctx, chunk, max_seqs, max_seqs * pages_for(ctx))


def _dims(phase: str, limits: Limits) -> dict[str, int]:
    """Each symbol's bound in a phase: rows of a step, sequences, pages per sequence, cache blocks."""
    seqs = limits.max_seqs
    return {"rows": limits.chunk if phase == "prefill" else seqs, "seqs": seqs, "pages": pages_for(limits.ctx),
            "blocks": limits.kv_blocks, "ctx": limits.ctx}


def weight_layouts(phases: dict[str, Phase], table: dict[str, tuple[str, tuple[int, ...]]]):
    """Each weight's device layouts, as the kernels of every phase read it: {name: {layout: LayoutInfo}}."""
    out: dict[str, dict[str, LayoutInfo]] = {}
    for p in phases.values():
        for launch in p.launches:
            for k in launch.kernels:
                for arg in k.args:
                    if isinstance(arg, Weight):
                        fmt, shape = table[arg.name]
                        out.setdefault(arg.name, {})[arg.layout] = LayoutInfo(LAYOUTS[arg.layout].version,
                                                                              layout_bytes(arg.layout, fmt, shape))
    return out


def device_memory(model: Model, layouts: dict[str, dict[str, LayoutInfo]], limits: Limits,
                  arena: int) -> dict[str, int]:
    """What a plan's run holds in device memory (on a GPU; on the CPU the weights stay in the mapped
    file): the weights in every layout its kernels read, the K/V cache at the plan's blocks, the arena."""
    c = model.config
    out = {"weights": sum(v.bytes for how in layouts.values() for v in how.values()),
           "kv_cache": c.n_layers * 2 * limits.kv_blocks * PAGE * c.kv_dim * 2,  # f16 K and V
           "arena": arena}
    return out | {"total": sum(out.values())}


def cache_descriptor(model: Model) -> CacheInfo:
    """The paged K/V cache every cache argument names; `blocks` is how many the engine allocates."""
    c = model.config
    return CacheInfo("f16", (c.n_layers, 2, "blocks", PAGE, c.kv_dim), PAGE,
                     "[layer, K or V, block, position in the block, kv_heads x head_dim features]")


def lower_phases(model: Model, device: DeviceFacts, limits: Limits):
    """Every phase traced, fused and lowered: (phases, IR texts, declines, weight table)."""
    table = model.weight_table()
    phases, texts, declines = {}, {}, {}
    for phase in PHASES:
        traced = trace_model(model.definition, model.config, model.weight_table(), phase, limits.ctx)
        table |= weight_table(traced)  # with the views of tensors stored fused (core/weight_views.py)
        snaps = run_passes(traced)
        fused = snaps[-1].graph
        texts[phase] = print_graph(fused)
        declines[phase] = [d for s in snaps for d in s.declines]
        dims = _dims(phase, limits)
        dims["splits"] = max((-(-limits.ctx // n.attr["chunk"]) for n in fused.order
                              if n.op == "attention_partial"), default=1)
        phases[phase] = lower(fused, device, dims)
    return phases, texts, declines, table


def compile_model(model: Model, device: DeviceFacts, out: str | os.PathLike, ctx: int | None = None,
                  chunk: int = DEFAULT_CHUNK, max_seqs: int = 1, tune: TuneStore | None = None,
                  isa: str | None = None, progress: Progress | None = None,
                  probes: cpu_decisions.Probes | None = None) -> dict[str, Any]:
    """Compile `model` for `device` into the plan file `out`; returns a summary for the CLI. Measured
    decisions come from the tune store `tune` (none: the heuristics decide). A CPU plan runs the
    compiled kernels for SIMD path `isa` (default the tune store's, else this machine's best) where the
    C++ compiler is present, else the NumPy twins (plans/cpu_native.py). `probes` (tuning/) measure the
    decisions the store lacks; without them the heuristics decide. `progress` shows the phases."""
    limits = limits_for(model, ctx, chunk, max_seqs)
    store = tune or TuneStore(None)
    phase = progress.phase if progress else lambda what: contextlib.nullcontext()
    with phase(f"trace, fuse and lower {plural(len(PHASES), 'phase')}"):
        phases, texts, declines, table = lower_phases(model, device, limits)
    probed = 0
    cpu, isa_decision = None, {}
    if device.backend == "cpu":
        with phase("choose kernels (probing the decisions the tune store lacks)" if probes else "choose kernels"):
            cpu, decisions, _ = choose_cpu_kernels(model, phases, table, device, store, isa, probes)
            probed = sum(d.probed for d in decisions)
            isa_decision = {d.key: TunedDecision(d.strategy.name, d.provenance, d.phases)
                            for d in decisions if isinstance(d.strategy, cpu_native.SimdPath)}
    gpu = None
    if device.backend != "cpu":
        with phase(f"choose and build kernels for {device.arch}"):
            gpu = _gpu_kernels(phases, table, device, store)
    arena = max(p.arena_bytes for p in phases.values())
    layouts = weight_layouts(phases, table)
    memory = device_memory(model, layouts, limits, arena)
    if device.backend != "cpu" and memory["total"] > device.memory_gib * 2**30:
        raise InputError(f"the plan needs {memory['total'] / 2**30:.2f} GiB on {device.name}, which has "
                         f"{device.memory_gib} GiB (weights {memory['weights'] / 2**30:.2f}, K/V cache "
                         f"{memory['kv_cache'] / 2**30:.2f} for {limits.kv_blocks} blocks, arena "
                         f"{memory['arena'] / 2**30:.2f}): a smaller --ctx or --max-seqs shrinks the K/V cache")
    header = PlanHeader(FORMAT_VERSION, "0.1.0", device,
                        {"python": platform.python_version(), "numpy": np.__version__},
                        ModelRef(os.path.abspath(model.path), model.config.name, model.config.arch,
                                 model_fingerprint(model.file)), limits)
    kernels, section = gpu if gpu is not None else cpu
    body = PlanBody(
        config=model.config.to_dict(), ir=texts, phases=phases, arena_bytes=arena, cache=cache_descriptor(model),
        weights={name: WeightInfo(fmt, tuple(shape), layouts.get(name, {})) for name, (fmt, shape) in table.items()},
        declines=declines, kernels=kernels,
        tune=TuneRecord(store.describe(), device.tune_key, isa_decision | tuned_decisions(phases)),
        device_memory=memory, decode_bytes_per_token=decode_bytes_per_token(model.weights, model.config),
        cpu=section if gpu is None else None, gpu=section if gpu is not None else None)
    with phase(f"write {os.fspath(out)}"):
        size = write_plan(out, header, body)
    summary = {"path": os.fspath(out), "bytes": size, "device": device.key, "arena_bytes": arena,
               "launches": {ph: sum(len(l.kernels) for l in p.launches) for ph, p in phases.items()},
               "limits": dataclasses.asdict(limits),
               "tune": {"store": store.describe(), "probed": probed, **_tune_counts(body.tune.decisions)}}
    if body.cpu is not None:
        summary["cpu"] = {k: v for k, v in dataclasses.asdict(body.cpu).items() if k != "source" and v}
    if body.gpu is not None:
        summary |= {"kernels": len(body.gpu.manifests), "build_seconds": body.gpu.seconds,
                    "build_cached": body.gpu.cached}
    return summary


def choose_cpu_kernels(model: Model, phases: dict[str, Phase], table, device: DeviceFacts, store: TuneStore,
                       isa: str | None = None, probes: cpu_decisions.Probes | None = None):
    """A CPU plan's kernels and their measured decisions: the compiled kernels for SIMD path `isa` (else
    the tune store's, or the one `probes.isa` measures: plans/cpu_native.choose_isa) with their task rows
    (plans/cpu_schedules.py; the plan's library is built here, cached, and measured by `probes`) where the C++
    compiler is, else the NumPy twins with their panels (plans/cpu_decisions.py). Returns (the plan's cpu
    section and kernel table, the decisions (the SIMD path's first), the build id the task rows were
    measured on)."""
    if not cpu_build.available():
        return (cpu_native.fallback(), cpu_decisions.tune(phases, table, device, store, probes=probes),
                cpu_decisions.build_id())
    kernels = cpu_native.lower_native(phases, table)
    source = cpu_build.render(list(kernels.values()))
    isa, why, chosen = cpu_native.choose_isa(isa, model.config.arch, phases, table, source, device, store,
                                             probes and probes.isa)
    cpu = cpu_native.section(kernels, source, isa, why)
    lib = cpu_build.CpuLibrary(source, {n: k.params for n, k in cpu[0].items()}, isa)
    kind = cpu_schedules.NativeTasks(lib, model.file, phases)
    tasks = cpu_decisions.tune(phases, table, device, store, kind, probes)
    return cpu, [chosen] * (chosen is not None) + tasks, kind.build_id()


def tuned_decisions(phases: dict[str, Phase]) -> dict[str, TunedDecision]:
    """The decisions the tune store was consulted for (decision key -> member, provenance, launches per
    phase): what `plan inspect` shows."""
    out: dict[str, TunedDecision] = {}
    for phase, p in phases.items():
        for launch in p.launches:
            if launch.decision:
                d = out.setdefault(launch.decision, TunedDecision(launch.member, launch.provenance, {}))
                d.launches[phase] = d.launches.get(phase, 0) + 1
    return out


def _tune_counts(decisions: dict[str, TunedDecision]) -> dict[str, int]:
    kinds = [d.provenance.split(":")[0] for d in decisions.values()]
    return {"decisions": len(kinds), **{k: kinds.count(k) for k in ("measured", "tie", "heuristic")}}


def _gpu_kernels(phases: dict[str, Phase], table, device: DeviceFacts,
                 store: TuneStore) -> tuple[dict[str, KernelInfo], GpuSection]:
    """Build and choose the kernels of every launch (plans/select.py: the tune store's measured members
    where it has them); attach them to the launches; the plan's kernel table and gpu section."""
    built, chosen = select(phases, table, target_for(device.arch), device, store=store)
    kernels: dict[str, KernelInfo] = {}
    for phase, choices in chosen.items():
        for launch, choice in zip(phases[phase].launches, choices):
            launch.member, launch.provenance, launch.pruned = choice.member, choice.provenance, choice.pruned
            launch.decision = choice.decision
            launch.kernels = [KernelCall(ln.kernel.name, ln.grid, ln.kernel.block, ln.smem, [_plain(a) for a in ln.args])
                              for ln in choice.launches]
            for ln in choice.launches:
                kernels[ln.kernel.name] = KernelInfo(list(ln.kernel.params), ln.kernel.block)
        layout(phases[phase])  # again, with the kernels' scratch
    return kernels, GpuSection(built.target, built.source, built.binary,
                               {n: vars(m) for n, m in built.manifests.items() if n in kernels},
                               built.compiler, built.ptx, built.seconds, built.cached)


def _plain(arg):
    """A family names a weight's layout where it is not the file's own bytes; the plan always names it."""
    return Weight(arg.name, "plain") if isinstance(arg, Weight) and not arg.layout else arg


def plan_for(gguf: str, ctx: int | None = None, max_seqs: int = 1, device: DeviceFacts | None = None,
             progress: Progress | None = None) -> str:
    """The plan `plan run MODEL.gguf` uses: compiled once for `device` (default this machine's CPU; a GPU
    target for the emulated GPU), then taken from the cache. It takes the tune store's entries but
    probes nothing (the heuristic decides the rest, and `progress` says how to measure them). A CPU plan
    is cached apart by its kernels, so the first run after a C++ compiler is installed compiles anew."""
    model = open_model(gguf)
    device = device or local_cpu()
    kernels = "" if device.backend != "cpu" else ".native" if cpu_build.available() else ".numpy"
    cached = cache_path(model, device, f"ctx{ctx or 'default'}.seqs{max_seqs}{kernels}")
    if not _readable(cached):
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        other_builds = glob.escape(cached.removesuffix(f"{build_id()}.plan")) + "?" * len(build_id()) + ".plan"
        for stale in glob.glob(other_builds):
            os.remove(stale)  # other code's plans for these limits
        t0 = time.perf_counter()
        s = compile_model(model, device, cached, ctx, DEFAULT_CHUNK, max_seqs, TuneStore.from_flag(None),
                          progress=progress)
        if progress:
            progress.note(f"compiled {gguf} for {device.key} in {time.perf_counter() - t0:.1f} s, cached as {cached}")
            if s["tune"]["heuristic"] and device.backend == "cpu":
                progress.note(f"{plural(s['tune']['heuristic'], 'tuning decision')} by heuristic: plan tune {gguf} "
                              "measures them for this machine, and the next run compiles with them")
    return cached


def _readable(plan: str) -> bool:
    """Whether a cached plan is there and this llmplan reads it (one left by another version is not)."""
    try:
        read_header(plan)
        return True
    except (OSError, InputError):
        return False


def drop_cached_plans(model: Model) -> None:
    """Forget the plans `plan run` compiled on the fly for this model and this CPU (whatever their
    limits): after `plan tune`, the next run compiles with the measured decisions."""
    for path in glob.glob(os.path.join(glob.escape(str(cache_root() / "plans")),
                                       glob.escape(_cache_stem(model, local_cpu())) + ".*.plan")):
        os.remove(path)


def cache_path(model: Model, device: DeviceFacts, limits_key: str, build: str | None = None) -> str:
    """Where `plan run MODEL.gguf` keeps the plan it compiled on the fly, by the llmplan code that compiled
    it (core/build_id.py; this code's by default): a plan made by other code (another version, another
    checkout) is compiled again, not reused."""
    return str(cache_root() / "plans" / f"{_cache_stem(model, device)}.{limits_key}.{build or build_id()}.plan")


def _cache_stem(model: Model, device: DeviceFacts) -> str:
    """The model and the device."""
    fp = model_fingerprint(model.file)
    return (f"{os.path.basename(model.path)}.{fp['metadata_sha256'][:12]}.{fp['tensors_sha256'][:12]}."
            f"{device.key.replace(':', '_')}")

