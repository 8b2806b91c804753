"""The GPU plan's measured decisions: for every launch whose family offers several members (GEMM tile
shapes and split-K, mat-vec variants: plans/select.py), the members that fit the device, to be timed on
the device itself and recorded in the tune store under the key and build id select.py consults.

The probe rules are plans/probes.py's: every candidate's output is checked first (here against the
default member's on the same random operands, within DESIGN.md's accumulation-order bound: members
sum in different orders, so bit equality is not theirs to keep), then five interleaved rounds, medians,
a lead under 3% a tie. Running the candidates is the runtime's (runtime/probe_runner.py), driven by
`plan tune --device cuda`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmplan.codegen.build import Build, build
from llmplan.codegen.kernel import Context, Launch
from llmplan.codegen.targets import target_for

from .devices import DeviceFacts
from .probes import Verdict, provenance, record
from .select import build_id, decision_key, fits, members
from .tune_store import TuneStore


@dataclass
class GpuDecision:
    key: str
    build_id: str
    phase: str
    launch: dict[str, Any]  # the first lowered launch it decides (operand types and shapes)
    buffers: list[dict[str, Any]]  # its phase's buffers (dtype, shape)
    dims: dict[str, int]  # the phase's bounds: the shapes it is timed at
    candidates: dict[str, list[Launch]]  # those that fit, the family's order: the first is the default
    pruned: dict[str, str] = field(default_factory=dict)
    phases: dict[str, int] = field(default_factory=dict)  # launches per phase
    verdict: Verdict | None = None
    entry: str = ""
    provenance: str = ""


def decisions(phases: dict[str, dict[str, Any]], table, device: DeviceFacts) -> tuple[list[GpuDecision], Build]:
    """Every decision of the plan for `device` with more than one member that fits, and one build of
    all their candidates."""
    target = target_for(device.arch)
    found: dict[str, GpuDecision] = {}
    for phase, p in phases.items():
        ctx = Context(p["buffers"], table, target, p["dims"], device.multiprocessors)
        for launch in p["launches"]:
            cands = members(launch, ctx)
            if len(cands) < 2:
                continue
            key = decision_key(launch, ctx)
            if key not in found:
                bid = build_id(tuple(ln.kernel for lns in cands.values() for ln in lns))
                found[key] = GpuDecision(key, bid, phase, launch, p["buffers"], p["dims"], cands)
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
