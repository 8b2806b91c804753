"""The compiled CPU kernels' measured decision: each projection's schedule, the weight rows per thread
task, the one-row engines' prefetch distance and the activation rows a pass over rows16 records takes.

The matmul and tail kernels (codegen/cpu_families/matmul.py, tail.py) split a projection's out rows
into tasks of `task_rows` consecutive rows that the pool's threads take as they come free, and with one
activation row (decode) prefetch each weight block `ahead` register tiles before they read it (weights
read in place), and over rows16 records (codegen/cpu/rows16.h) take `cols` activation rows a pass; every
member (t8 .. t64, t16a0 .. t16a4, t16c2 .. t16c6: each varied alone from the defaults) gives the same
bits, since each row's dot products are summed in one fixed order. Members that cannot differ from the
default for a projection are not measured: a prefetch distance where every weight is in rows16 records,
a pass width where none is or with one activation row. Which is fastest depends on the
shape (K, N, the phase's rows) and the machine (cores, caches, memory latency): few large tasks leave
threads idle at the end of a decode step's small projections, many small ones pay more for claiming
them; a weight streamed from memory wants its blocks requested early, one held in cache does not. The
heuristic without an entry is t16, 2 tiles ahead (the family's default) for a model larger than this
machine's last-level cache, none for one that fits in it (tiny-llama3's 17 MB in a 32 MB cache:
its one-row projections measured 12-24% faster without).

A probe runs the plan's own kernel calls from the plan's own library (the one the driver loads), on
the model's real weights in the layouts the kernels read, over every layer's launch of that shape in
turn (so the weights stream from memory as in a step), with random activations; each candidate's
outputs are checked bit for bit against the default's before it is timed. A schedule travels as the
launch's member and as its kernel calls' last three arguments (task_rows, ahead, cols: the last
parameters of both families' kernels).
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llmplan.codegen import cpu_build, toolchain
from llmplan.codegen.cpu_build import CpuLibrary
from llmplan.codegen.cpu_families import matmul
from llmplan.core import layouts
from llmplan.models.gguf import GGUFFile

from . import cpu_tuning
from .probes import Verdict, measure, random_operand


@dataclass(frozen=True)
class Schedule:
    rows: int  # weight rows per task
    ahead: int  # prefetch distance in register tiles
    cols: int = matmul.DEFAULT_COLS  # activation rows a pass over rows16 records

    @property
    def name(self) -> str:
        return matmul.member(self.rows, self.ahead, self.cols)


DEFAULT = Schedule(matmul.DEFAULT_TASK_ROWS, matmul.DEFAULT_AHEAD)
IN_CACHE = Schedule(matmul.DEFAULT_TASK_ROWS, 0)  # the heuristic where the whole model fits the cache


@dataclass(frozen=True)
class Shape:
    """What a projection's best schedule depends on: its kernel (formats, segments, epilogue), K, each
    segment's N, the phase's rows; `phase` is where its launches' buffers are described."""

    kernel: str
    projection: cpu_tuning.Projection
    phase: dict[str, Any] = field(compare=False, hash=False, repr=False)

    @property
    def key(self) -> str:
        p = self.projection
        return f"cpu:{self.kernel}:k{p.k}:n{'+'.join(map(str, p.ns))}:rows{p.rows}"


class NativeTasks:
    """The decision kind cpu_tuning.tune takes for a plan on the compiled kernels."""

    single = ""  # every projection has candidates

    def __init__(self, lib: CpuLibrary, file: GGUFFile, phases: dict[str, dict[str, Any]]):
        self.lib, self.file, self.phases = lib, file, phases
        self.default = IN_CACHE if file.size <= cpu_tuning.last_level_cache() else DEFAULT

    def projection(self, launch, buffers, dims, weights) -> Shape | None:
        p = cpu_tuning.projection(launch, buffers, dims, weights)
        if p is None:
            return None
        phase = next(ph for ph in self.phases.values() if ph["buffers"] is buffers)
        return Shape(launch["kernels"][0]["name"], p, phase)

    def candidates(self, shape: Shape) -> list[Schedule]:
        """The heuristic's schedule first (the reference the others are checked against), then those that
        can differ from it here."""
        kernel = next(l["kernels"][0] for l in shape.phase["launches"] if l["kernels"][0]["name"] == shape.kernel)
        held = {a["layout"] for a in kernel["args"] if "weight" in a and a["layout"] != "f32"}  # not the norm

        def runs(s: Schedule) -> tuple:  # what the kernels do differently under s
            return (s.rows, s.ahead if "blocks" in held else None,
                    s.cols if "rows16" in held and shape.projection.rows > 1 else None)

        seen: dict[tuple, Schedule] = {}
        for s in [self.default, *(Schedule(*s) for s in matmul.SCHEDULES)]:
            seen.setdefault(runs(s), s)
        return list(seen.values())

    def build_id(self) -> str:
        """What the measurements measured: the CPU kernels' sources, the SIMD path, the compiler."""
        sources = sorted(cpu_build.CPU_DIR.glob("*.h"))
        text = "\0".join([*(p.read_text() for p in sources), self.lib.isa, toolchain.version(toolchain.clang())])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @staticmethod
    def apply(launch: dict[str, Any], s: Schedule) -> None:
        launch["member"] = s.name
        for k in launch["kernels"]:
            k["args"][-3:] = [{"i32": s.rows}, {"i32": s.ahead}, {"i32": s.cols}]

    def probe(self, d: cpu_tuning.Decision, cands: list[Schedule], round_seconds: float) -> Verdict:
        shape: Shape = d.projection
        phase, dims = shape.phase, dict(shape.phase["dims"], rows=shape.projection.rows)
        group = [l for l in d.launches if any(l is x for x in phase["launches"])]
        rng = np.random.default_rng(zlib.crc32(d.key.encode()))
        arrays: dict[str, np.ndarray] = {}  # activations and outputs, restored before each check
        held: dict[tuple[str, str], np.ndarray] = {}  # weights in the layouts the kernels read

        def bind(ref: dict[str, Any]) -> np.ndarray:
            if "state" in ref:  # the tail's token mask (at its default: every token), the tokens it writes
                s = phase["state"][ref["state"]]
                return arrays.setdefault(ref["state"], np.full([x if isinstance(x, int) else dims[x]
                                                                for x in s["shape"]], s.get("default", 0), np.int32))
            if "buf" in ref:
                b = phase["buffers"][ref["buf"]]
                shp = tuple(x if isinstance(x, int) else dims[x] for x in b["shape"])
                return arrays.setdefault(f"buf{ref['buf']}", random_operand(b["dtype"], shp, rng))
            key = (ref["weight"], ref["layout"])
            if key not in held:
                t = self.file.tensors[ref["weight"]]
                made = (ref["layout"], self.file.tensor_bytes(ref["weight"]), t.type.name, tuple(reversed(t.shape)))
                data = matmul.make_held(self.lib, *made)  # the library's maker where it has one: faster
                held[key] = layouts.make(*made) if data is None else data
            return held[key]

        def arg(r: dict[str, Any]) -> Any:
            if "i32" in r:
                return dims[r["i32"]] if isinstance(r["i32"], str) else r["i32"]
            return r["f32"] if "f32" in r else bind(r).ctypes.data

        def values(k: dict[str, Any], s: Schedule) -> tuple:
            return (*(arg(r) for r in k["args"][:-3]), s.rows, s.ahead, s.cols)

        calls = {c.name: [[(self.lib.entry(k["name"])[0], values(k, c)) for k in l["kernels"]] for l in group]
                 for c in cands}
        snapshot = {n: a.copy() for n, a in arrays.items()}
        outs = [f"buf{r['buf']}" for r in group[0]["outs"] if "buf" in r]

        def runner(c: Schedule):
            def run(i: int):
                if i == 0:  # the check: from the same inputs every time (a residual accumulates in place)
                    for n, a in snapshot.items():
                        arrays[n][...] = a
                for fn, vals in calls[c.name][i % len(group)]:
                    fn(*vals)
                return [arrays[n].copy() for n in outs] if i == 0 else None
            return run

        runners = {c.name: runner(c) for c in cands}
        reference = runners[self.default.name](0)

        def check(got) -> str:
            same = all(np.array_equal(g, r, equal_nan=True) for g, r in zip(got, reference))
            return "" if same else "its outputs differ from the default schedule's"

        return measure(runners, check, self.default.name, round_seconds)
