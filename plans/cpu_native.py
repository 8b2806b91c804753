"""The CPU plan's kernels: every launch lowered to its compiled family (codegen/cpu_families/) where this
machine has the C++ compiler, else the NumPy twins plans/lower.py gave it, and the plan's record of which
and why (its `cpu` section).

A native launch's kernel call is one C call (grid [1], block 1: the kernel fans its work out over the
library's thread pool); projections, the tail's head and the embedding read their weights in place
({"layout": "blocks"}), norm vectors as float32 ({"layout": "f32"}: a few KiB a layer). The section
holds the host translation unit and its SIMD path, so the driver builds (once, cached by source, flags
and compiler) exactly what the plan names. The SIMD path is a tune-store decision (choose_isa), taken
before the task rows (plans/cpu_schedules.py), which are measured on it.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from dataclasses import dataclass
from typing import Callable

from llmplan.codegen import cpu_build
from llmplan.codegen.cpu_families import matmul
from llmplan.codegen.kernel import Context, Kernel
from llmplan.core.devices import DeviceFacts
from llmplan.core.errors import InputError
from llmplan.core.op_traits import MODULES
from llmplan.core.plan_records import CpuSection, KernelCall, KernelInfo, Phase, Weight
from llmplan.core.tune_store import TIE, TuneStore, Verdict, provenance, record

from . import cpu_decisions
from .lower import layout


def _vector(ref):
    """A weight argument the family leaves unnamed is a float vector (norms): held as float32."""
    return Weight(ref.name, "f32") if isinstance(ref, Weight) and not ref.layout else ref


def lower_native(phases: dict[str, Phase], table: dict[str, tuple[str, tuple[int, ...]]]) -> dict[str, Kernel]:
    """Replace every launch's NumPy call with its compiled kernel calls and place the scratch they ask for
    in each phase's arena (plans/lower.py layout, as for the GPU); returns the kernels by name."""
    kernels: dict[str, Kernel] = {}
    relaid = {lay for lay, _, _ in matmul.RELAYOUT.values()}
    for p in phases.values():
        ctx = Context(p.buffers, table, None, p.dims)
        for launch in p.launches:
            family = importlib.import_module(f"llmplan.codegen.cpu_families.{MODULES[launch.family].cpu}")
            calls = family.launches(launch, ctx)
            launch.kernels = [KernelCall(ln.kernel.name, ln.grid, 1, 0, [_vector(a) for a in ln.args]) for ln in calls]
            if not launch.decision:
                launch.member = "native"
                launch.provenance = f"cpu target: the {launch.family} family's compiled kernel"
            kernels.update({ln.kernel.name: ln.kernel for ln in calls})
            # the records the driver makes at load, with the plan's own code (matmul.relayout)
            made = [matmul.relayout(table[a.name][0]) for ln in calls for a in ln.args
                    if isinstance(a, Weight) and a.layout in relaid]
            kernels.update({k.name: k for k in made})
        layout(p)  # again, with the kernels' scratch (the experts' grouping buffers)
    return kernels


def section(kernels: dict[str, Kernel], source: str, isa: str, why: str) -> tuple[dict[str, KernelInfo], CpuSection]:
    """The plan's kernel table (name -> parameter types) and its `cpu` section: the kernels' translation
    unit (cpu_build.render), its SIMD path and `why` that one."""
    cxx = cpu_build.compiler()
    return ({name: KernelInfo(list(k.params), 1) for name, k in sorted(kernels.items())},
            CpuSection("native", f"the CPU target's compiled kernels, SIMD path {isa} ({why}; this machine runs "
                                 f"{', '.join(cpu_build.host_isas())}), built with {cxx.describe()}",
                       isa, cxx.identity, source))


@dataclass(frozen=True)
class SimdPath:
    """A candidate of the SIMD-path decision (a cpu_decisions.Decision's strategy)."""

    name: str


def isa_candidates() -> list[str]:
    """The SIMD paths `plan tune` compares, the heuristic's (this machine's best) first: every one this
    machine runs but scalar, a reference path that stands in only where it is the only one."""
    return [isa for isa in reversed(cpu_build.host_isas()) if isa != "scalar"] or ["scalar"]


def choose_isa(isa: str | None, arch: str, phases: dict[str, Phase], table, source: str,
               device: DeviceFacts, store: TuneStore, probe: Callable[[list[str]], Verdict] | None = None,
               ) -> tuple[str, str, cpu_decisions.Decision | None]:
    """The SIMD path a plan is built for, why (the plan's cpu section says it), and its tune decision
    (None where there is nothing to decide: `isa` given, or one candidate). `isa` if this machine runs
    it; else the store's entry for this decode step (keyed by its ops, attributes and weight shapes, and
    the context) if its winner is a candidate here; else, with `probe` (`plan tune`: tuning/cpu_isa.py
    times a whole decode step on each candidate, checked against the default's within the kernel-test
    bounds, not bit for bit: the paths round differently), a measurement, recorded; else the heuristic,
    this machine's best. The entry holds for the plan's translation unit, every path's flags and the
    compiler (its build id)."""
    if isa is not None:
        if isa not in cpu_build.host_isas():
            raise InputError(f"--isa {isa}: this machine runs {', '.join(cpu_build.host_isas())}")
        return isa, f"--isa {isa}", None
    step = [(l.op, l.attrs, [table[a.name] for a in l.args if isinstance(a, Weight)])
            for l in phases["decode"].launches]
    key = (f"cpu:isa:{arch}:decode-{hashlib.sha256(json.dumps(step).encode()).hexdigest()[:12]}"
           f":ctx{phases['decode'].dims['ctx']}")
    build_id = hashlib.sha256("\0".join([source, repr((cpu_build.FLAGS, cpu_build.ISAS)),
                                         cpu_build.compiler().identity]).encode()).hexdigest()[:16]
    cands = isa_candidates()
    look = store.load(device.tune_key, key, build_id)
    winner = look.entry["winner"] if look.entry else None
    unusable = (f"ignored: it chose {winner}, which this machine does not run" if winner and winner not in cands
                else look.why if look.why not in ("missing", "off") else "")
    if len(cands) == 1:
        only = "the only path" + (" besides the scalar reference" if cands[0] != "scalar" else "")
        return cands[0], "; ".join(filter(None, [only, unusable and f"entry {look.id} {unusable}"])), None
    d = cpu_decisions.Decision(key, None, phases={ph: len(p.launches) for ph, p in phases.items()},
                            strategy=SimdPath(cands[0]))
    if probe is not None:
        entry = record(probe(cands), device.tune_key, key, build_id)
        d.entry, d.entry_data, d.probed, d.replaced = store.save(entry), entry, True, unusable
    elif look.entry is not None and not unusable:
        d.entry, d.entry_data = look.id, look.entry
    else:
        d.provenance = "heuristic: " + (f"entry {look.id} {unusable}" if unusable else
                                        f"no entry ({'plan tune measures it' if store.enabled else 'tune store off'})")
        return cands[0], f"heuristic, the best this machine runs: {d.provenance.removeprefix('heuristic: ')}", d
    e, w = d.entry_data, d.entry_data["winner"]
    d.strategy, d.provenance = SimdPath(w), provenance(d.entry, e)
    m = e["medians"]
    other = e["default"] if w != e["default"] else min((n for n in m if n != w), key=m.__getitem__, default=None)
    if other is None:
        why = f"the others disagree with it ({'; '.join(f'{n}: {r}' for n, r in e['rejected'].items())})"
    elif e["tie"]:
        why = f"stands: {other} measured within {TIE:.0%} of it"
    else:
        why = f"measured {m[other] / m[w] - 1:.0%} faster than {other} over a decode step"
    return w, f"tuned: {w} {why} (entry {d.entry})", d


def fallback() -> tuple[dict[str, KernelInfo], CpuSection]:
    """The plan's record when the NumPy twins stay (runtime/numpy_kernels.py: projections dequantized to
    float32 at load)."""
    return {}, CpuSection("numpy", cpu_build.no_compiler())
