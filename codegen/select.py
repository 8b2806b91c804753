"""Kernels for a plan on a GPU target: which family module serves each lowered launch, every member
it offers, all of them built, and a choice among the members that fit the device.

A family may offer several members for one launch (tile shapes, variants: `members()`), or one
(`launches()`). Every candidate is compiled, so the shape filter decides from the compiler's own
manifests: a member is pruned, with the rule and the limit recorded, when it spills, asks more shared
memory than a block may have, or cannot have one block resident (threads x registers over the register
file). Among the survivors the family's order is the heuristic (fastest first on this target class);
the tune store can override it later.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from llmplan.plans.devices import DeviceFacts

from .build import Build, BuildError, build, gate
from .kernel import Context, Launch
from .targets import Target

# fused-graph op -> family module in codegen/families/
FAMILY_MODULE = {
    "embed": "embed",
    "rmsnorm": "norm", "rmsnorm_pack": "norm", "pack": "norm",
    "matmul": "matvec", "matmul_segmented": "matvec", "matmul_residual": "matvec",
    "rope_kv": "rope_kv", "norm_rope_kv": "rope_kv",
    "attention": "attention_prefill",
    "attention_partial": "attention_decode", "attention_reduce": "attention_decode",
    "attention_reduce_pack": "attention_decode",
    "glu_pack": "glu",
    "add": "elementwise", "mul": "elementwise", "scale": "elementwise", "silu": "elementwise",
    "gelu_tanh": "elementwise", "softcap": "elementwise", "take_rows": "elementwise",
    "tail_argmax": "tail",
}
MATVEC_MAX_ROWS = 8  # more activation rows than this go to the GEMM tiles


def family_module(launch: dict[str, Any], ctx: Context):
    name = FAMILY_MODULE[launch["op"]]
    if name == "matvec":
        rows = ctx.shape(launch["args"][0])[0]
        if not (isinstance(rows, int) and rows <= MATVEC_MAX_ROWS):
            name = "gemm"
    return importlib.import_module(f"llmplan.codegen.families.{name}")


def members(launch: dict[str, Any], ctx: Context) -> dict[str, list[Launch]]:
    mod = family_module(launch, ctx)
    if hasattr(mod, "members"):
        return mod.members(launch, ctx)
    return {"default": mod.launches(launch, ctx)}


@dataclass
class Choice:
    member: str
    launches: list[Launch]
    provenance: str
    pruned: dict[str, str] = field(default_factory=dict)  # member -> why it does not fit


def fits(launches: list[Launch], build_: Build, device: DeviceFacts) -> str | None:
    """Why a member cannot run on the device, or None."""
    for ln in launches:
        m = build_.manifests[ln.kernel.name]
        if m.spill_bytes:
            return f"{ln.kernel.name}: spills {m.spill_bytes} bytes ({m.registers} registers x {m.threads} threads)"
        shared = m.shared_bytes + ln.smem
        if shared > device.smem_per_block_optin:
            return (f"{ln.kernel.name}: {shared} bytes of shared memory over the {device.smem_per_block_optin}-byte "
                    f"per-block limit of {device.arch}")
        if m.registers * m.threads > device.regs_per_multiprocessor:
            return (f"{ln.kernel.name}: {m.threads} threads x {m.registers} registers over the "
                    f"{device.regs_per_multiprocessor}-register file: no resident block")
    return None


def choose(candidates: dict[str, list[Launch]], build_: Build, device: DeviceFacts) -> Choice:
    pruned = {}
    for name, launches in candidates.items():
        why = fits(launches, build_, device)
        if why is None:
            how = "the only member" if len(candidates) == 1 else "first member that fits, in the family's order"
            return Choice(name, launches, f"heuristic: {how}", pruned)
        pruned[name] = why
    raise BuildError(f"no member of {next(iter(candidates.values()))[0].kernel.family} fits {device.arch}: "
                     + "; ".join(f"{n}: {w}" for n, w in pruned.items()))


def select(phases: dict[str, dict[str, Any]], weights: dict[str, tuple[str, tuple[int, ...]]], target: Target,
           device: DeviceFacts, use_cache: bool = True) -> tuple[Build, dict[str, list[Choice]]]:
    """Build every candidate kernel of every launch for `target`, then choose a member per launch."""
    per_phase: dict[str, list[dict[str, list[Launch]]]] = {}
    for phase, p in phases.items():
        ctx = Context(p["buffers"], weights, target)
        per_phase[phase] = [members(launch, ctx) for launch in p["launches"]]
    kernels = [ln.kernel for cands in per_phase.values() for c in cands for launches in c.values() for ln in launches]
    built = build(kernels, target, use_cache, gates=False)
    chosen = {phase: [choose(c, built, device) for c in cands] for phase, cands in per_phase.items()}
    gate([ln.kernel for cs in chosen.values() for c in cs for ln in c.launches], built.manifests, target)
    return built, chosen
