"""The CPU backend's measured decisions, and the NumPy twins' own: the panel size of each projection.

tune() is the decision loop for both CPU kernel sets: the store's entries, probes for what is missing,
the provenance in each launch. What it decides is a `kind`: Panels here (the NumPy twins, the plans
compiled where no C++ compiler is), the compiled kernels' task rows in plans/cpu_native_tuning.py.

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
arguments runtime/cpu_kernels.py passes to numerics.matmul.
"""

from __future__ import annotations

import glob
import hashlib
import inspect
import math
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from llmplan.core import numerics as num

from . import probes
from .devices import DeviceFacts
from .probes import Verdict, measure, provenance, record
from .tune_store import TuneStore

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


def projection(launch: dict[str, Any], buffers: list[dict[str, Any]], dims: dict[str, int],
               weights: dict[str, tuple[str, tuple[int, ...]]]) -> Projection | None:
    """The projection a launch computes, or None for a launch that is not one."""
    op, args = launch["op"], launch["args"]
    if op in ("matmul", "matmul_segmented"):
        ws = args[1:]
    elif op == "matmul_residual":
        ws = args[1:2]
    elif op == "tail_argmax":
        ws = args[2:3]
    else:
        return None
    rows = buffers[args[0]["buf"]]["shape"][0]
    shapes = [weights[w["weight"]][1] for w in ws]
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


def probe(p: Projection, cands: list[Strategy], round_seconds: float) -> Verdict:
    """Time the candidates on the projection's real shapes, with random operands in enough copies to
    stream from memory as in a real step (twice the last-level cache), checked against each row alone."""
    rng = np.random.default_rng(p.k * 1_000_003 + sum(p.ns) * 31 + p.rows)
    ws0 = [rng.random((n, p.k), np.float32) - np.float32(0.5) for n in p.ns]
    copies = max(1, min(64, math.ceil(2 * last_level_cache() / (4 * p.k * (sum(p.ns) + p.rows)))))
    ws = [ws0] + [[w.copy() for w in ws0] for _ in range(copies - 1)]
    xs = [rng.random((p.rows, p.k), np.float32) - np.float32(0.5) for _ in range(copies)]
    reference = [np.concatenate([xs[0][r:r + 1] @ w.T for r in range(p.rows)]) for w in ws0]

    def runner(s: Strategy):
        return lambda i: [num.matmul(xs[i % copies], w, s.panel_bytes) for w in ws[i % copies]]

    def check(outs) -> str:
        same = all(np.array_equal(o, r) for o, r in zip(outs, reference))
        return "" if same else "its products differ from each row's own sgemv"

    return measure({s.name: runner(s) for s in cands}, check, DEFAULT.name, round_seconds)


@dataclass
class Decision:
    key: str
    projection: Any  # what the best strategy depends on (a Projection; the compiled kernels' own)
    launches: list[dict[str, Any]] = field(default_factory=list)
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
    def probe(d: Decision, cands: list[Strategy], round_seconds: float) -> Verdict:
        return probe(d.projection, cands, round_seconds)

    @staticmethod
    def apply(launch: dict[str, Any], s: Strategy) -> None:
        launch["member"], launch["attrs"]["strategy"] = s.name, s.attrs()


def tune(phases: dict[str, dict[str, Any]], weights: dict[str, tuple[str, tuple[int, ...]]], device: DeviceFacts,
         store: TuneStore, measure_all: bool = False, round_seconds: float | None = None,
         kind: Any = Panels) -> list[Decision]:
    """Decide every projection of a CPU plan and write it into the launches; returns the decisions
    (projections with more than one candidate). `kind` is what is decided: the NumPy twins' panels
    (Panels), or the compiled kernels' task rows (plans/cpu_native_tuning.py). An entry in the store
    decides; a decision without a usable entry is probed and recorded (with `measure_all`, every one
    is: `plan tune`); with the store off and not `measure_all`, the heuristic decides. Each probe times
    every candidate for `round_seconds` a round (probes.ROUND_SECONDS by default)."""
    decisions: dict[str, Decision] = {}
    for phase, p in phases.items():
        for launch in p["launches"]:
            proj = kind.projection(launch, p["buffers"], p["dims"], weights)
            if proj is None:
                continue
            kind.apply(launch, kind.default)
            if len(kind.candidates(proj)) == 1:
                launch["provenance"] = kind.single
                continue
            d = decisions.setdefault(proj.key, Decision(proj.key, proj, strategy=kind.default))
            d.launches.append(launch)
            d.phases[phase] = d.phases.get(phase, 0) + 1
    bid = kind.build_id()
    todo = []
    for d in decisions.values():
        cands = kind.candidates(d.projection)
        look = store.load(device.tune_key, d.key, bid)
        if look.entry is not None and not measure_all and look.entry["winner"] in {s.name for s in cands}:
            _take(d, look.id, look.entry, cands)
        elif store.probes or measure_all:
            d.replaced = look.why if look.why not in ("missing", "off") else ""
            todo.append((d, cands))
        else:
            d.provenance = f"heuristic: no entry ({'not probed' if store.enabled else 'tune store off'})"
    for d, cands in tqdm(todo, desc="probing", unit="decision", disable=None, file=sys.stderr):
        v = kind.probe(d, cands, round_seconds or probes.ROUND_SECONDS)
        entry = record(v, device.tune_key, d.key, bid)
        _take(d, store.save(entry), entry, cands)
        d.probed = True
    for d in decisions.values():
        for launch in d.launches:
            kind.apply(launch, d.strategy)
            launch["provenance"], launch["decision"] = d.provenance, d.key
    return list(decisions.values())


def _take(d: Decision, eid: str, entry: dict[str, Any], cands: list[Strategy]) -> None:
    d.strategy = next(s for s in cands if s.name == entry["winner"])
    d.provenance, d.entry, d.entry_data = provenance(eid, entry), eid, entry
