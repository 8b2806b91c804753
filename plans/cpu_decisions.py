"""The CPU backend's measured decisions, and the NumPy twins' own: the panel size of each projection.

tune() is the decision loop for both CPU kernel sets: the store's entries, probes for what is missing,
the provenance in each launch. What it decides is a `kind`: Panels here (the NumPy twins, the plans
compiled where no C++ compiler is), the compiled kernels' task rows in plans/cpu_schedules.py.

Every projection (matmul, matmul_segmented, matmul_residual, and the fused tail's output head) computes
each activation row as its own BLAS sgemv over panels of weight rows (core/numerics.matmul), so its
bits never depend on the rows beside it. The panel (how many weight rows the batch's rows share while
they are in cache: 256 KiB, 1 MiB, 4 MiB, or one panel over all of w) changes the speed with the shape
(K, the weights' N, the phase's rows: max_seqs for batched decode, the chunk for prefill) and with the
machine (BLAS's threads: small panels win on one core, large ones on several), never the bits. A
single row is one sgemv over all of w: decode with one sequence has nothing to decide.

The heuristic, when the store has no entry (or is off), is numerics' default, 4 MiB panels ("p4m").
Not candidates, and why: float BLAS matrix-matrix products over several rows (their row results depend
on the batch); integer block dot products on the packed bytes (their float sums round differently from
the dequantized sgemv: every candidate must give the same bits); sharing the panels out among a pool of
threads with BLAS single-threaded (measured on gemma3-270m, 2 cores: twice as slow for a decode step's
projections, slower at 8 rows, 7% faster for a prefill chunk's but only with BLAS single-threaded for
the whole step: mixed with BLAS's threads in one step, their spin-waiting slows the pool).

The chosen panel travels in the launch: its member (the strategy's name) and attrs["strategy"], the
arguments runtime/numpy_kernels.py passes to numerics.matmul.
"""

from __future__ import annotations

import glob
import hashlib
import inspect
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from tqdm import tqdm

from llmplan.core import numerics as num
from llmplan.core.devices import DeviceFacts
from llmplan.core.plan_records import Buffer, Launch, Phase
from llmplan.core.tune_store import TuneStore, Verdict, provenance, record

PANELS = (256 << 10, 1 << 20, 4 << 20, 0)  # 0: one panel over all of w


@dataclass(frozen=True)
class Strategy:
    panel_bytes: int

    @property
    def name(self) -> str:
        p = self.panel_bytes
        return "all" if p <= 0 else f"p{p >> 20}m" if p % (1 << 20) == 0 else f"p{p >> 10}k"

    def attrs(self) -> dict[str, int]:
        return {"panel_bytes": self.panel_bytes}


DEFAULT = Strategy(num.PANEL_BYTES)


@dataclass(frozen=True)
class Projection:
    """What a projection's best strategy depends on."""

    k: int
    ns: tuple[int, ...]  # out rows of each weight (several: a segmented launch)
    rows: int  # activation rows: the phase's bound

    @property
    def key(self) -> str:
        return f"cpu:matmul:k{self.k}:n{'+'.join(map(str, self.ns))}:rows{self.rows}"


def projection(launch: Launch, buffers: list[Buffer], dims: dict[str, int],
               weights: dict[str, tuple[str, tuple[int, ...]]]) -> Projection | None:
    """The projection a launch computes, or None for a launch that is not one."""
    op, args = launch.op, launch.args
    if op in ("matmul", "matmul_segmented"):
        ws = args[1:]
    elif op == "matmul_residual":
        ws = args[1:2]
    elif op == "tail_argmax":
        ws = args[2:3]
    else:
        return None
    rows = buffers[args[0].index].shape[0]
    shapes = [weights[w.name][1] for w in ws]
    return Projection(shapes[0][1], tuple(s[0] for s in shapes), rows if isinstance(rows, int) else dims[rows])


def candidates(p: Projection) -> list[Strategy]:
    """The default first, then every other panel size that splits this shape's weights differently."""
    if p.rows == 1:
        return [DEFAULT]  # one sgemv over all of w, whatever the panel
    seen: dict[tuple, Strategy] = {}
    for s in [DEFAULT] + [Strategy(panel) for panel in PANELS]:
        seen.setdefault(tuple(num.panel_rows(s.panel_bytes, 4 * p.k, n) for n in p.ns), s)
    return list(seen.values())


def build_id() -> str:
    """What the measurements measured: the projection code, NumPy and its BLAS library."""
    blas = np.show_config(mode="dicts").get("Build Dependencies", {}).get("blas", {})
    try:
        code = [inspect.getsource(f) for f in (num.matmul, num.panel_rows)]
    except OSError:  # installed without sources: the bytecode stands for them
        code = [f.__code__.co_code for f in (num.matmul, num.panel_rows)]
    return hashlib.sha256(repr((code, np.__version__, blas.get("name"), blas.get("version"))).encode()).hexdigest()[:16]


def last_level_cache() -> int:
    """Bytes of this machine's largest CPU cache (32 MiB where /sys does not say)."""
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path) as f:
                text = f.read().strip()
            sizes.append(int(text[:-1]) << 10 if text.endswith("K") else int(text))
        except (OSError, ValueError):
            pass
    return max(sizes, default=32 << 20)


@dataclass
class Decision:
    key: str
    projection: Any  # what the best strategy depends on (a Projection; the compiled kernels' own)
    launches: list[Launch] = field(default_factory=list)
    phases: dict[str, int] = field(default_factory=dict)  # launches per phase
    strategy: Any = DEFAULT  # a Strategy (or the compiled kernels' Schedule)
    provenance: str = ""
    entry: str | None = None  # the store entry it was taken from
    probed: bool = False
    replaced: str = ""  # why the entry a probe replaced was not usable ("" when there was none)
    entry_data: dict[str, Any] | None = None


class Panels:
    """The NumPy twins' decision (this module's): the panel of each projection."""

    default = DEFAULT
    single = "one row: a single sgemv over all of w, nothing to decide"

    @staticmethod
    def projection(launch, buffers, dims, weights) -> Projection | None:
        return projection(launch, buffers, dims, weights)

    @staticmethod
    def candidates(p: Projection) -> list[Strategy]:
        return candidates(p)

    @staticmethod
    def build_id() -> str:
        return build_id()

    @staticmethod
    def apply(launch: Launch, s: Strategy) -> None:
        launch.member, launch.attrs["strategy"] = s.name, s.attrs()


@dataclass(frozen=True)
class Probes:
    """What measures a CPU plan's missing decisions (tuning/cpu_schedules.py makes one; the compiler only
    calls it): `projection(kind, decision, candidates)` times a projection's candidates, `isa(candidates)`
    a decode step on each SIMD path; with `every`, decisions that have an entry are measured again
    (`plan tune`)."""

    projection: Callable[[Any, "Decision", list], Verdict]
    isa: Callable[[list[str]], Verdict] | None = None
    every: bool = False


def tune(phases: dict[str, Phase], weights: dict[str, tuple[str, tuple[int, ...]]], device: DeviceFacts,
         store: TuneStore, kind: Any = Panels, probes: Probes | None = None) -> list[Decision]:
    """Decide every projection of a CPU plan and write it into the launches; returns the decisions
    (projections with more than one candidate). `kind` is what is decided: the NumPy twins' panels
    (Panels), or the compiled kernels' task rows (plans/cpu_schedules.py). An entry in the store
    decides; a decision without a usable entry is measured by `probes` and recorded (all of them with
    `probes.every`); without probes, the heuristic decides."""
    decisions: dict[str, Decision] = {}
    for phase, p in phases.items():
        for launch in p.launches:
            proj = kind.projection(launch, p.buffers, p.dims, weights)
            if proj is None:
                continue
            kind.apply(launch, kind.default)
            if len(kind.candidates(proj)) == 1:
                launch.provenance = kind.single
                continue
            d = decisions.setdefault(proj.key, Decision(proj.key, proj, strategy=kind.default))
            d.launches.append(launch)
            d.phases[phase] = d.phases.get(phase, 0) + 1
    bid = kind.build_id()
    todo = []
    for d in decisions.values():
        cands = kind.candidates(d.projection)
        look = store.load(device.tune_key, d.key, bid)
        every = probes is not None and probes.every
        if look.entry is not None and not every and look.entry["winner"] in {s.name for s in cands}:
            _take(d, look.id, look.entry, cands)
        elif probes is not None:
            d.replaced = look.why if look.why not in ("missing", "off") else ""
            todo.append((d, cands))
        else:
            d.provenance = f"heuristic: no entry ({'not probed' if store.enabled else 'tune store off'})"
    for d, cands in tqdm(todo, desc="probing", unit="decision", disable=None, file=sys.stderr):
        entry = record(probes.projection(kind, d, cands), device.tune_key, d.key, bid)
        _take(d, store.save(entry), entry, cands)
        d.probed = True
    for d in decisions.values():
        for launch in d.launches:
            kind.apply(launch, d.strategy)
            launch.provenance, launch.decision = d.provenance, d.key
    return list(decisions.values())


def _take(d: Decision, eid: str, entry: dict[str, Any], cands: list[Strategy]) -> None:
    d.strategy = next(s for s in cands if s.name == entry["winner"])
    d.provenance, d.entry, d.entry_data = provenance(eid, entry), eid, entry
