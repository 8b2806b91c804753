"""The compiled CPU kernels' measured decision: each projection's schedule, the weight rows per thread
task, the one-row engines' prefetch distance and the activation rows a pass over rows16 records takes.

The matmul and tail kernels (codegen/cpu_families/matmul.py, tail.py) split a projection's out rows
into tasks of `task_rows` consecutive rows (each of the pool's threads runs a contiguous share of them,
then takes the back half of a share not yet done: codegen/cpu/pool.h), and with one activation row
(decode) prefetch each weight block `ahead` register tiles before they read it (weights read in
place), and over rows16 records (codegen/cpu/rows16.h) take `cols` activation rows a pass; every
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

The routed experts' projections (codegen/cpu_families/experts.py) run each expert's rows on the same
engines, so they take the same schedules, decided per kernel, K, N and the rows routed to an expert on
average (Shape); tuning/cpu_schedules.py probes them with each row routed to distinct experts, as a
router routes.

A schedule travels as the launch's member and as its kernel calls' last three arguments (task_rows,
ahead, cols: the last parameters of both families' kernels). tuning/cpu_schedules.py measures them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from llmplan.codegen import cpu_build
from llmplan.codegen.cpu_build import CpuLibrary
from llmplan.codegen.cpu_families import matmul
from llmplan.core.op_traits import ops_of
from llmplan.core.plan_records import I32, Launch, Phase, Weight
from llmplan.models.gguf import GGUFFile

from . import cpu_decisions


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


EXPERTS = ops_of("experts")  # each routed expert's rows a projection of its own


@dataclass(frozen=True)
class Shape:
    """What a projection's best schedule depends on: its kernel (formats, segments, epilogue), K, each
    segment's N, the rows one pass over the weight serves (the phase's; an expert's: the phase's rows x
    the routed slots / the experts, at least 1, the rows routed to it on average); `phase` is where its
    launches' buffers are described, `step_rows` the phase's rows a probe runs them with."""

    kernel: str
    projection: cpu_decisions.Projection
    phase: Phase = field(compare=False, hash=False, repr=False)
    step_rows: int = field(default=0, compare=False, hash=False)

    @property
    def key(self) -> str:
        p = self.projection
        return f"cpu:{self.kernel}:k{p.k}:n{'+'.join(map(str, p.ns))}:rows{p.rows}"


class NativeTasks:
    """The decision kind cpu_decisions.tune takes for a plan on the compiled kernels."""

    single = ""  # every projection has candidates

    def __init__(self, lib: CpuLibrary, file: GGUFFile, phases: dict[str, Phase]):
        self.lib, self.file, self.phases = lib, file, phases
        self.default = IN_CACHE if file.size <= cpu_decisions.last_level_cache() else DEFAULT

    def projection(self, launch, buffers, dims, weights) -> Shape | None:
        phase = next(ph for ph in self.phases.values() if ph.buffers is buffers)
        if launch.op in EXPERTS:
            experts, n, k = weights[launch.args[1].name][1]
            rows, top = buffers[launch.args[2].index].shape  # the expert ids
            rows = rows if isinstance(rows, int) else dims[rows]
            p = cpu_decisions.Projection(k, (n,), max(1, -(-rows * top // experts)))
            return Shape(launch.kernels[0].name, p, phase, rows)
        p = cpu_decisions.projection(launch, buffers, dims, weights)
        return None if p is None else Shape(launch.kernels[0].name, p, phase, p.rows)

    def candidates(self, shape: Shape) -> list[Schedule]:
        """The heuristic's schedule first (the reference the others are checked against), then those that
        can differ from it here."""
        kernel = next(l.kernels[0] for l in shape.phase.launches if l.kernels[0].name == shape.kernel)
        held = {a.layout for a in kernel.args if isinstance(a, Weight) and a.layout != "f32"}  # not the norm

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
        text = "\0".join([*(p.read_text() for p in sources), self.lib.isa, self.lib.library.compiler.identity])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @staticmethod
    def apply(launch: Launch, s: Schedule) -> None:
        launch.member = s.name
        for k in launch.kernels:
            k.args[-3:] = [I32(s.rows), I32(s.ahead), I32(s.cols)]
