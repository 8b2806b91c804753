"""Kernels for a plan on a GPU target: which family module serves each lowered launch, every member
it offers, all of them built, and a choice among the members that fit the device.

A family may offer several members for one launch (tile shapes, split counts, column counts: its
`candidates()`), each turned into launches by its `launches()`. Candidates are compiled before they are
judged, so the shape filter decides from the compiler's own manifests: a member is pruned, with the rule and the limit
recorded, when it spills, asks more shared memory than a block may have, or cannot have one block
resident (threads x registers over the register file). Among the survivors the tune store decides:
an entry for the device's tune key, this launch's decision key and the build id (a hash of the rendered
sources of all the launch's candidates) puts its winner first; without one the family's order is the
heuristic (fastest first on this target class), and the plan records which it was. GPU entries are
written on the device by `plan tune --device cuda|hip` (tuning/gpu_members.py). Kernel choice lives
here, in the planner; codegen/ holds the families' templates, rendering and compiling.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
from dataclasses import dataclass, field

from llmplan.codegen.build import Build, BuildError, Manifest, build, gate, render
from llmplan.codegen.kernel import Context, Kernel, KernelLaunch
from llmplan.codegen.targets import Target
from llmplan.core.devices import DeviceFacts
from llmplan.core.op_traits import MODULES
from llmplan.core.plan_records import Buf, Launch, Phase, Ref, Weight
from llmplan.core.tune_store import TuneStore, provenance

MATVEC_MAX_ROWS = 8  # more activation rows than this go to the GEMM tiles


def family_module(launch: Launch, ctx: Context):
    """The codegen/families/ module of a launch's kernel family (core/op_traits.py MODULES); of two, the
    first serves up to MATVEC_MAX_ROWS activation rows, the second more."""
    few, *more = MODULES[launch.family].gpu
    name = more[0] if more and ctx.bound(ctx.shape(launch.args[0])[0]) > MATVEC_MAX_ROWS else few
    try:
        return importlib.import_module(f"llmplan.codegen.families.{name}")
    except ModuleNotFoundError:
        raise BuildError(f"no GPU kernel family implements op {launch.op!r} ({name}) yet") from None


def members(launch: Launch, ctx: Context) -> dict[str, list[KernelLaunch]]:
    """Member name -> its launches, in the family's order of preference; one "default" member for a
    family that offers no choice (no `candidates()`)."""
    mod = family_module(launch, ctx)
    names = mod.candidates(launch, ctx) if hasattr(mod, "candidates") else [None]
    return {name or "default": mod.launches(dataclasses.replace(launch, member=name or ""), ctx) for name in names}


@dataclass
class Choice:
    member: str
    launches: list[KernelLaunch]
    provenance: str
    pruned: dict[str, str] = field(default_factory=dict)  # member -> why it does not fit
    decision: str = ""  # the tune-store decision key, for a launch with several members


def decision_key(launch: Launch, ctx: Context) -> str:
    """What a measured answer for this launch depends on: family, op, operand types and the phase's
    bounds of their symbolic dims, and attributes (but the layer index)."""
    def operand(ref: Ref) -> str:
        if isinstance(ref, (Buf, Weight)):
            return f"{ctx.dtype(ref)}[{'x'.join(str(ctx.bound(d)) for d in ctx.shape(ref))}]"
        return ref.KIND  # step state, the cache
    parts = [family_module(launch, ctx).__name__.rsplit(".", 1)[1], launch.op,
             ",".join(operand(r) for r in launch.args)]
    attrs = ",".join(f"{k}={v}" for k, v in sorted(launch.attrs.items()) if k != "layer")
    return ":".join(parts + [attrs] if attrs else parts)


@functools.lru_cache(maxsize=None)
def build_id(kernels: tuple[Kernel, ...]) -> str:
    """The hash of the rendered sources of a decision's candidates: the code a measurement measured."""
    return hashlib.sha256(render(list(kernels)).encode()).hexdigest()[:16]


def _consult(store: TuneStore | None, device: DeviceFacts, launch: Launch, ctx: Context,
             cands: list[tuple[str, list[KernelLaunch]]]) -> tuple[str, list[tuple[str, list[KernelLaunch]]], str]:
    """(decision key, the candidates in the order to try, the store's provenance for the first or "")."""
    key = decision_key(launch, ctx)
    if store is None or not store.enabled:
        return key, cands, ""
    look = store.load(device.tune_key, key, build_id(tuple(ln.kernel for _, lns in cands for ln in lns)))
    names = [n for n, _ in cands]
    if look.entry is None or look.entry["winner"] not in names:
        return key, cands, ""
    won = names.index(look.entry["winner"])
    return key, [cands[won]] + cands[:won] + cands[won + 1:], provenance(look.id, look.entry)


def fits(launches: list[KernelLaunch], manifests: dict[str, Manifest], device: DeviceFacts) -> str | None:
    """Why a member cannot run on the device, or None."""
    for ln in launches:
        m = manifests[ln.kernel.name]
        if m.spill_bytes:
            return f"{ln.kernel.name}: spills {m.spill_bytes} bytes ({m.registers} registers x {m.threads} threads)"
        if m.threads > device.max_threads_per_block:
            return (f"{ln.kernel.name}: {m.threads} threads over the {device.max_threads_per_block}-thread per-block "
                    f"limit of {device.arch}")
        shared = m.shared_bytes + ln.smem
        if shared > device.smem_per_block_optin:
            return (f"{ln.kernel.name}: {shared} bytes of shared memory over the {device.smem_per_block_optin}-byte "
                    f"per-block limit of {device.arch}")
        if m.registers * m.threads > device.regs_per_multiprocessor:
            return (f"{ln.kernel.name}: {m.threads} threads x {m.registers} registers over the "
                    f"{device.regs_per_multiprocessor}-register file: no resident block")
    return None


def select(phases: dict[str, Phase], weights: dict[str, tuple[str, tuple[int, ...]]], target: Target,
           device: DeviceFacts, use_cache: bool = True,
           store: TuneStore | None = None) -> tuple[Build, dict[str, list[Choice]]]:
    """Choose a member per launch and build the chosen kernels for `target`.

    Candidates are built in rounds, each launch's next member only after its previous one was pruned,
    so a plan whose first choices all fit (the usual case) compiles each kernel it runs once and nothing
    else; after a prune the chosen set is built again as the plan's one translation unit."""
    todo: list[tuple[list[tuple[str, list[KernelLaunch]]], dict[str, str], list]] = []
    chosen: dict[str, list[Choice | None]] = {}
    for phase, p in phases.items():
        ctx = Context(p.buffers, weights, target, p.dims, device.multiprocessors)
        chosen[phase] = [None] * len(p.launches)
        for i, launch in enumerate(p.launches):
            cands = list(members(launch, ctx).items())
            key, measured = "", ""
            if len(cands) > 1:
                key, cands, measured = _consult(store, device, launch, ctx, cands)
            todo.append((cands, {}, [phase, i, key, measured]))
    manifests: dict[str, Manifest] = {}
    built = None
    while todo:
        kernels = [ln.kernel for cands, _, _ in todo for ln in cands[0][1]]
        if any(k.name not in manifests for k in kernels):
            built = build(kernels, target, use_cache, gates=False)
            manifests |= built.manifests
        left = []
        for cands, pruned, (phase, i, key, measured) in todo:
            (name, launches), *rest = cands
            why = fits(launches, manifests, device)
            if why is None:
                if measured and not pruned:
                    how = measured
                elif not rest and not pruned:
                    how = "heuristic: the only member"
                else:
                    note = "the measured winner does not fit, " if measured else "no entry, " if key else ""
                    how = f"heuristic: {note}first member that fits, in the family's order"
                chosen[phase][i] = Choice(name, launches, how, pruned, key)
                continue
            pruned[name] = why
            if not rest:
                raise BuildError(f"no member of {launches[0].kernel.family} fits {device.arch}: "
                                 + "; ".join(f"{n}: {w}" for n, w in pruned.items()))
            left.append((rest, pruned, (phase, i, key, measured)))
        todo = left
    final = [ln.kernel for cs in chosen.values() for c in cs for ln in c.launches]
    if {k.name for k in final} != set(built.manifests):
        built = build(final, target, use_cache, gates=False)
    gate(final, built.manifests, target)
    return built, chosen
