"""The compile pipeline: GGUF -> traced phase graphs -> fusion passes -> a kernel per node -> launch
lists over one arena -> the plan file. (`plan compile`, and `plan run MODEL.gguf` on the fly.)"""

from __future__ import annotations

import os
import platform
from typing import Any, Callable

import numpy as np

from llmplan.codegen.build import cache_root
from llmplan.ir.printer import print_graph
from llmplan.ir.trace import PHASES, trace_model
from llmplan.core.errors import InputError
from llmplan.models.model import Model, open_model
from llmplan.core.numerics import pages_for
from llmplan.passes.manager import run_passes

from . import cpu_tuning
from .devices import DeviceFacts, local_cpu
from .lower import layout, lower
from .planfile import model_fingerprint, write_plan
from .tune_store import TuneStore

DEFAULT_CTX = 4096
DEFAULT_CHUNK = 256

# What the CPU backend keeps resident for each way a weight is read, and why (plan inspect shows it).
CPU_RESIDENCY = {
    "matmul": ("f32", "dequantized to float32 at load: NumPy has no int8 GEMV, and float32 BLAS on exactly "
                      "dequantized weights gives the integer block dot products' values (products exact, sums "
                      "in float32)"),
    "rows": ("mapped", "left quantized in the mapped file: only the rows of the step's tokens are dequantized"),
    "vector": ("f32", "norm weights and rope factors, float32 in the file already"),
}

# How GPU kernels read each weight (the launch argument's "layout"); the runtime lays them out at load.
GPU_RESIDENCY = {
    "planar": "field planes (core/formats.planes): each quantized field of all blocks of a row together, "
              "so a lane's 16-byte load reads one field of consecutive blocks",
    "plain": "as in the file: norm weights and rope factors",
}


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


def _residency(phases: dict[str, dict[str, Any]]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for p in phases.values():
        for launch in p["launches"]:
            for i, arg in enumerate(launch["args"]):
                if "weight" not in arg:
                    continue
                if launch["op"] == "embed":
                    how = "rows"
                elif launch["family"] in ("matmul", "tail_argmax") and (launch["op"] != "tail_argmax" or i == 2):
                    how = "matmul"
                else:
                    how = "vector"
                out.setdefault(arg["weight"], {})[how] = CPU_RESIDENCY[how][0]
    return out


# The GPU kernel stage (codegen/select.py), passed in by the caller: plans/ must not import codegen/. It
# takes the phases, the weight table, the device and the tune store it consults.
KernelStage = Callable[[dict[str, dict[str, Any]], dict[str, tuple[str, tuple[int, ...]]], DeviceFacts, TuneStore],
                       Any]


def lower_phases(model: Model, device: DeviceFacts, limits: dict[str, int]):
    """Every phase traced, fused and lowered: (phases, IR texts, declines, weight table)."""
    table = model.weight_table()
    phases, texts, declines = {}, {}, {}
    for phase in PHASES:
        snaps = run_passes(trace_model(model.definition, model.config, table, phase))
        fused = snaps[-1].graph
        texts[phase] = print_graph(fused)
        declines[phase] = [d for s in snaps for d in s.declines]
        dims = _dims(phase, limits)
        dims["splits"] = max((-(-limits["ctx"] // n.attr["chunk"]) for n in fused.order
                              if n.op == "attention_partial"), default=1)
        phases[phase] = lower(fused, device, dims) | {"dims": dims}
    return phases, texts, declines, table


def compile_model(model: Model, device: DeviceFacts, out: str | os.PathLike, ctx: int | None = None,
                  chunk: int = DEFAULT_CHUNK, max_seqs: int = 1, kernels: KernelStage | None = None,
                  tune: TuneStore | None = None) -> dict[str, Any]:
    """Compile `model` for `device` into the plan file `out`; returns a summary for the CLI. GPU targets
    need `kernels`, the codegen stage that builds and chooses their kernels. Measured decisions come
    from the tune store `tune` (none: the heuristics decide)."""
    if device.backend != "cpu" and kernels is None:
        raise InputError(f"--device {device.arch}: no kernel generator was given for {device.backend.upper()}")
    limits = limits_for(model, ctx, chunk, max_seqs)
    store = tune or TuneStore(None)
    phases, texts, declines, table = lower_phases(model, device, limits)
    probed = 0
    if device.backend == "cpu":
        probed = sum(d.probed for d in cpu_tuning.tune(phases, table, device, store))
    gpu = _gpu_kernels(phases, table, device, kernels, store) if device.backend != "cpu" else None
    arena = max(p["arena_bytes"] for p in phases.values())
    residency = _residency(phases) if gpu is None else gpu.pop("residency")
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
        "weights": {name: {"format": fmt, "shape": list(shape), "residency": residency.get(name, {})}
                    for name, (fmt, shape) in table.items()},
        "residency_notes": {k: v[1] for k, v in CPU_RESIDENCY.items()} if gpu is None else GPU_RESIDENCY,
        "declines": declines,
        "kernels": sorted({(l["family"], l["member"]) for p in phases.values() for l in p["launches"]}),
        "tune": {"store": store.describe(), "device_key": device.tune_key, "decisions": tuned_decisions(phases)},
    }
    if gpu is not None:
        body["gpu"] = gpu
        body["kernels"] = sorted(gpu["manifests"])
    size = write_plan(out, header, body)
    summary = {"path": os.fspath(out), "bytes": size, "device": device.key, "arena_bytes": arena,
               "launches": {ph: sum(len(l.get("kernels", [0])) for l in p["launches"]) for ph, p in phases.items()},
               "limits": limits,
               "tune": {"store": store.describe(), "probed": probed, **_tune_counts(body["tune"]["decisions"])}}
    if gpu is not None:
        summary |= {"kernels": len(gpu["manifests"]), "build_seconds": gpu["seconds"], "build_cached": gpu["cached"]}
    return summary


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


def _gpu_kernels(phases: dict[str, dict[str, Any]], table, device: DeviceFacts, stage: KernelStage,
                 store: TuneStore) -> dict[str, Any]:
    """Build and choose the kernels of every launch; attach them to the launches; the plan's gpu section."""
    built, chosen = stage(phases, table, device, store)
    residency: dict[str, dict[str, str]] = {}
    for phase, choices in chosen.items():
        for launch, choice in zip(phases[phase]["launches"], choices):
            launch["member"], launch["provenance"] = choice.member, choice.provenance
            launch["pruned"] = choice.pruned
            if choice.decision:
                launch["decision"] = choice.decision
            launch["kernels"] = [{"name": ln.kernel.name, "grid": [list(g) if isinstance(g, tuple) else g
                                                                   for g in ln.grid],
                                  "block": ln.kernel.block, "smem": ln.smem, "args": ln.args}
                                 for ln in choice.launches]
            for ln in choice.launches:
                for arg in ln.args:
                    if "weight" in arg:
                        how = arg.get("layout", "plain")
                        residency.setdefault(arg["weight"], {})[how] = how
        phases[phase] |= layout(phases[phase], phases[phase]["dims"])  # again, with the kernels' scratch
    used = {k["name"] for p in phases.values() for l in p["launches"] for k in l["kernels"]}
    return {"target": built.target, "compiler": built.compiler, "source": built.source, "binary": built.binary,
            "ptx": built.ptx, "seconds": built.seconds, "cached": built.cached,
            "manifests": {n: vars(m) for n, m in built.manifests.items() if n in used}, "residency": residency}


def plan_for(gguf: str, ctx: int | None = None, max_seqs: int = 1) -> str:
    """The plan `plan run MODEL.gguf` uses: compiled for this machine once, then taken from the cache."""
    model = open_model(gguf)
    device = local_cpu()
    cached = cache_path(model, device, f"ctx{ctx or 'default'}.seqs{max_seqs}")
    if not os.path.exists(cached):
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        compile_model(model, device, cached, ctx, DEFAULT_CHUNK, max_seqs, tune=TuneStore.from_flag(None))
    return cached


def cache_path(model: Model, device: DeviceFacts, limits_key: str) -> str:
    """Where `plan run MODEL.gguf` keeps the plan it compiled on the fly."""
    root = cache_root() / "plans"
    fp = model_fingerprint(model.file)
    name = f"{os.path.basename(model.path)}.{fp['metadata_sha256'][:12]}.{fp['tensors_sha256'][:12]}"
    return str(root / f"{name}.{device.key.replace(':', '_')}.{limits_key}.plan")

