"""The compile pipeline: GGUF -> traced phase graphs -> fusion passes -> a kernel per node -> launch
lists over one arena -> the plan file. (`plan compile`, and `plan run MODEL.gguf` on the fly.)"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import platform
import time
from typing import Any

import numpy as np

from llmplan.codegen import cpu_build
from llmplan.codegen.build import cache_root
from llmplan.codegen.targets import target_for
from llmplan.core.console import Progress, plural
from llmplan.core.devices import DeviceFacts, local_cpu
from llmplan.core.errors import InputError
from llmplan.core.layouts import LAYOUTS, layout_bytes
from llmplan.core.numerics import PAGE, pages_for
from llmplan.core.planfile import model_fingerprint, read_header, write_plan
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

def limits_for(model: Model, ctx: int | None, chunk: int, max_seqs: int) -> dict[str, int]:
    ctx = min(model.config.context_length, DEFAULT_CTX) if ctx is None else ctx
    if not 1 <= ctx <= model.config.context_length:
        raise InputError(f"--ctx {ctx} is outside 1..{model.config.context_length} (the model's context)")
    if not 1 <= chunk <= ctx:
        raise InputError(f"--chunk {chunk} must be between 1 and the context ({ctx})")
    if max_seqs < 1:
        raise InputError(f"--max-seqs must be at least 1, got {max_seqs}")
    return {"ctx": ctx, "chunk": chunk, "max_seqs": max_seqs, "kv_blocks": max_seqs * pages_for(ctx)}


def _dims(phase: str, limits: dict[str, int]) -> dict[str, int]:
    """Each symbol's bound in a phase: rows of a step, sequences, pages per sequence, cache blocks."""
    seqs = limits["max_seqs"]
    return {"rows": limits["chunk"] if phase == "prefill" else seqs, "seqs": seqs, "pages": pages_for(limits["ctx"]),
            "blocks": limits["kv_blocks"], "ctx": limits["ctx"]}


def weight_layouts(phases: dict[str, dict[str, Any]], table: dict[str, tuple[str, tuple[int, ...]]]):
    """Each weight's device layouts, as the kernels of every phase read it: {name: {layout: {version, bytes}}}."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for p in phases.values():
        for launch in p["launches"]:
            for k in launch["kernels"]:
                for arg in k["args"]:
                    if "weight" in arg:
                        name, how = arg["weight"], arg["layout"]
                        fmt, shape = table[name]
                        out.setdefault(name, {})[how] = {"version": LAYOUTS[how].version,
                                                         "bytes": layout_bytes(how, fmt, shape)}
    return out


def device_memory(model: Model, layouts: dict[str, dict[str, dict[str, int]]], limits: dict[str, int],
                  arena: int) -> dict[str, int]:
    """What a plan's run holds in device memory (on a GPU; on the CPU the weights stay in the mapped
    file): the weights in every layout its kernels read, the K/V cache at the plan's blocks, the arena."""
    c = model.config
    out = {"weights": sum(v["bytes"] for how in layouts.values() for v in how.values()),
           "kv_cache": c.n_layers * 2 * limits["kv_blocks"] * PAGE * c.kv_dim * 2,  # f16 K and V
           "arena": arena}
    return out | {"total": sum(out.values())}


def cache_descriptor(model: Model) -> dict[str, Any]:
    """The paged K/V cache every cache argument names; `blocks` is how many the engine allocates."""
    c = model.config
    return {"dtype": "f16", "shape": [c.n_layers, 2, "blocks", PAGE, c.kv_dim], "page": PAGE,
            "layout": "[layer, K or V, block, position in the block, kv_heads x head_dim features]"}


def lower_phases(model: Model, device: DeviceFacts, limits: dict[str, int]):
    """Every phase traced, fused and lowered: (phases, IR texts, declines, weight table)."""
    table = model.weight_table()
    phases, texts, declines = {}, {}, {}
    for phase in PHASES:
        traced = trace_model(model.definition, model.config, model.weight_table(), phase, limits["ctx"])
        table |= weight_table(traced)  # with the views of tensors stored fused (core/weight_views.py)
        snaps = run_passes(traced)
        fused = snaps[-1].graph
        texts[phase] = print_graph(fused)
        declines[phase] = [d for s in snaps for d in s.declines]
        dims = _dims(phase, limits)
        dims["splits"] = max((-(-limits["ctx"] // n.attr["chunk"]) for n in fused.order
                              if n.op == "attention_partial"), default=1)
        phases[phase] = lower(fused, device, dims) | {"dims": dims}
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
            isa_decision = {d.key: {"member": d.strategy.name, "provenance": d.provenance, "launches": d.phases}
                            for d in decisions if isinstance(d.strategy, cpu_native.SimdPath)}
    gpu = None
    if device.backend != "cpu":
        with phase(f"choose and build kernels for {device.arch}"):
            gpu = _gpu_kernels(phases, table, device, store)
    arena = max(p["arena_bytes"] for p in phases.values())
    layouts = weight_layouts(phases, table)
    memory = device_memory(model, layouts, limits, arena)
    if device.backend != "cpu" and memory["total"] > device.memory_gib * 2**30:
        raise InputError(f"the plan needs {memory['total'] / 2**30:.2f} GiB on {device.name}, which has "
                         f"{device.memory_gib} GiB (weights {memory['weights'] / 2**30:.2f}, K/V cache "
                         f"{memory['kv_cache'] / 2**30:.2f} for {limits['kv_blocks']} blocks, arena "
                         f"{memory['arena'] / 2**30:.2f}): a smaller --ctx or --max-seqs shrinks the K/V cache")
    header = {
        "llmplan": "0.1.0",
        "device": device.to_dict(),
        "toolchain": {"python": platform.python_version(), "numpy": np.__version__},
        "model": {"path": os.path.abspath(model.path), "name": model.config.name, "arch": model.config.arch,
                  "fingerprint": model_fingerprint(model.file)},
        "limits": limits,
    }
    body = {
        "config": model.config.to_dict(),
        "ir": texts,
        "phases": phases,
        "arena_bytes": arena,
        "device_memory": memory,
        "decode_bytes_per_token": decode_bytes_per_token(model.weights, model.config.tied_output),
        "cache": cache_descriptor(model),
        "weights": {name: {"format": fmt, "shape": list(shape), "layouts": layouts.get(name, {})}
                    for name, (fmt, shape) in table.items()},
        "declines": declines,
        "kernels": gpu.pop("kernels") if gpu else cpu.pop("kernels"),
        "tune": {"store": store.describe(), "device_key": device.tune_key,
                 "decisions": isa_decision | tuned_decisions(phases)},
    }
    if gpu is not None:
        body["gpu"] = gpu
    else:
        body["cpu"] = cpu["cpu"]
    with phase(f"write {os.fspath(out)}"):
        size = write_plan(out, header, body)
    summary = {"path": os.fspath(out), "bytes": size, "device": device.key, "arena_bytes": arena,
               "launches": {ph: sum(len(l.get("kernels", [0])) for l in p["launches"]) for ph, p in phases.items()},
               "limits": limits,
               "tune": {"store": store.describe(), "probed": probed, **_tune_counts(body["tune"]["decisions"])}}
    if cpu is not None:
        summary["cpu"] = {k: v for k, v in cpu["cpu"].items() if k != "source"}
    if gpu is not None:
        summary |= {"kernels": len(gpu["manifests"]), "build_seconds": gpu["seconds"], "build_cached": gpu["cached"]}
    return summary


def choose_cpu_kernels(model: Model, phases: dict[str, dict[str, Any]], table, device: DeviceFacts, store: TuneStore,
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
    lib = cpu_build.CpuLibrary(source, {n: k["params"] for n, k in cpu["kernels"].items()}, isa)
    kind = cpu_schedules.NativeTasks(lib, model.file, phases)
    tasks = cpu_decisions.tune(phases, table, device, store, kind, probes)
    return cpu, [chosen] * (chosen is not None) + tasks, kind.build_id()


def tuned_decisions(phases: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The decisions the tune store was consulted for (decision key -> member, provenance, launches per
    phase): what `plan inspect` shows."""
    out: dict[str, dict[str, Any]] = {}
    for phase, p in phases.items():
        for launch in p["launches"]:
            if "decision" in launch:
                d = out.setdefault(launch["decision"], {"member": launch["member"], "provenance": launch["provenance"],
                                                        "launches": {}})
                d["launches"][phase] = d["launches"].get(phase, 0) + 1
    return out


def _tune_counts(decisions: dict[str, dict[str, Any]]) -> dict[str, int]:
    kinds = [d["provenance"].split(":")[0] for d in decisions.values()]
    return {"decisions": len(kinds), **{k: kinds.count(k) for k in ("measured", "tie", "heuristic")}}


def _gpu_kernels(phases: dict[str, dict[str, Any]], table, device: DeviceFacts, store: TuneStore) -> dict[str, Any]:
    """Build and choose the kernels of every launch (plans/select.py: the tune store's measured members
    where it has them); attach them to the launches; the plan's gpu section and its kernel table."""
    built, chosen = select(phases, table, target_for(device.arch), device, store=store)
    kernels: dict[str, dict[str, Any]] = {}
    for phase, choices in chosen.items():
        for launch, choice in zip(phases[phase]["launches"], choices):
            launch["member"], launch["provenance"] = choice.member, choice.provenance
            launch["pruned"] = choice.pruned
            if choice.decision:
                launch["decision"] = choice.decision
            launch["kernels"] = [{"name": ln.kernel.name, "grid": [list(g) if isinstance(g, tuple) else g
                                                                   for g in ln.grid],
                                  "block": ln.kernel.block, "smem": ln.smem, "args": [_plain(a) for a in ln.args]}
                                 for ln in choice.launches]
            for ln in choice.launches:
                kernels[ln.kernel.name] = {"params": list(ln.kernel.params), "block": ln.kernel.block}
        phases[phase] |= layout(phases[phase], phases[phase]["dims"])  # again, with the kernels' scratch
    return {"target": built.target, "compiler": built.compiler, "source": built.source, "binary": built.binary,
            "ptx": built.ptx, "seconds": built.seconds, "cached": built.cached,
            "manifests": {n: vars(m) for n, m in built.manifests.items() if n in kernels}, "kernels": kernels}


def _plain(arg: dict[str, Any]) -> dict[str, Any]:
    """A family names a weight's layout where it is not the file's own bytes; the plan always names it."""
    return arg | {"layout": "plain"} if "weight" in arg and "layout" not in arg else arg


def plan_for(gguf: str, ctx: int | None = None, max_seqs: int = 1, device: DeviceFacts | None = None,
             progress: Progress | None = None) -> str:
    """The plan `plan run MODEL.gguf` uses: compiled once for `device` (default this machine's CPU; a GPU
    target for the emulated GPU), then taken from the cache. It takes the tune store's entries but
    probes nothing (the heuristic decides the rest, and `progress` says how to measure them)."""
    model = open_model(gguf)
    device = device or local_cpu()
    cached = cache_path(model, device, f"ctx{ctx or 'default'}.seqs{max_seqs}")
    if not _readable(cached):
        os.makedirs(os.path.dirname(cached), exist_ok=True)
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


def cache_path(model: Model, device: DeviceFacts, limits_key: str) -> str:
    """Where `plan run MODEL.gguf` keeps the plan it compiled on the fly."""
    return str(cache_root() / "plans" / f"{_cache_stem(model, device)}.{limits_key}.plan")


def _cache_stem(model: Model, device: DeviceFacts) -> str:
    """The model, the device and the weight layouts' versions: a plan whose layouts this runtime no longer
    makes is compiled again, not refused."""
    fp = model_fingerprint(model.file)
    versions = "".join(f"{name}{lay.version}" for name, lay in sorted(LAYOUTS.items()))
    return (f"{os.path.basename(model.path)}.{fp['metadata_sha256'][:12]}.{fp['tensors_sha256'][:12]}."
            f"{device.key.replace(':', '_')}.{hashlib.sha256(versions.encode()).hexdigest()[:8]}")

