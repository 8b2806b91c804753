"""Projections on the CPU (codegen/cpu/matmul.h): ops matmul, matmul_segmented, matmul_residual, for
every weight format, at any row count (decode's one row to a prefill chunk). CPU twin:
runtime/numpy_kernels.py matmul.

One call per launch. The kernel splits the out rows of its weights (up to 3 segments, each in its own
format, all taking the same packed x) into tasks of `task_rows` consecutive rows that the pool's
threads take as they come free; each task streams its rows of the weight once for all activation rows.

Operands and arguments as codegen/operands.py's projection contract says (x packed q8_0 / q8_1 / q8_k,
or f16 / bf16 / f32 values for float weights; the residual may be the output itself), the weights in
layout "blocks" (the tensor's bytes in the mapped GGUF) or "rows16" for Q4_K, Q6_K, Q8_0, Q4_0 and Q5_0 (RELAYOUT); then
the schedule: task_rows, ahead, cols.

Members: a schedule, "t<rows>[a<tiles>][c<cols>]": weight rows per task (TASK_ROWS); how many register
tiles ahead the one-row engines of weights read in place prefetch their blocks (AHEAD; 0: none; the
hardware prefetcher does not follow a tile's rows read side by side); how many activation rows a pass
over rows16 records takes (COLS; 0: the SIMD path's own, codegen/cpu/matmul.h CT_R16). Every member gives
the same bits; which is fastest depends on the shape and the machine (the tune store's decision);
without a member, DEFAULT_TASK_ROWS, DEFAULT_AHEAD and DEFAULT_COLS.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from llmplan.core import layouts
from llmplan.core.formats import FORMATS
from llmplan.core.plan_records import Launch, Weight

from .. import format_header, operands
from ..kernel import Context, Kernel, KernelLaunch
from ..operands import declare, i32, projection_params, refs

TASK_ROWS = (8, 16, 32, 64)
DEFAULT_TASK_ROWS = 16
AHEAD = (0, 1, 2, 4)
DEFAULT_AHEAD = 2
COLS = (2, 4, 6)
DEFAULT_COLS = 0
SCHEDULE_PARAMS = (("int", "task_rows"), ("int", "ahead"), ("int", "cols"))


# Formats the projections read in a layout made once at load, not in place: (layout, the kernel's weight
# code, its name in kernel names): rows16 records (codegen/cpu/rows16.h), measured faster than in place
# for every shape of tiny-llama3 and gemma3-270m, one row and 128 (docs/benchmarks.md).
RELAYOUT = {fmt: ("rows16", format_header.rows16_code(fmt), f"{fmt.lower()}_r16") for fmt in ("Q4_K", "Q6_K", "Q8_0", "Q4_0", "Q5_0")}


def layout(fmt: str, relayout: dict = RELAYOUT) -> str:
    """The layout a projection's kernel reads a weight of `fmt` in: `relayout`'s (a family that reads
    fewer formats' records passes its part of RELAYOUT), else the mapped file's blocks in place."""
    return relayout[fmt][0] if fmt in relayout else "blocks"


def held(ref: Weight, fmt: str) -> Weight:
    """A projection's weight as its kernel reads it."""
    return Weight(ref.name, layout(fmt))


def weight_code(fmt: str, relayout: dict = RELAYOUT) -> str:
    """The C++ weight code of a projection weight of format `fmt` as held()."""
    return relayout[fmt][1] if fmt in relayout else format_header.weight_code(fmt)


def weight_token(fmt: str, relayout: dict = RELAYOUT) -> str:
    """Its name in kernel names."""
    return relayout[fmt][2] if fmt in relayout else fmt.lower()


def member(rows: int, ahead: int, cols: int = DEFAULT_COLS) -> str:
    return f"t{rows}" + (f"a{ahead}" if ahead != DEFAULT_AHEAD else "") + (f"c{cols}" if cols != DEFAULT_COLS else "")


# (task rows, ahead, cols): the default first; then each varied alone from the defaults
_D = (DEFAULT_TASK_ROWS, DEFAULT_AHEAD, DEFAULT_COLS)
SCHEDULES = tuple(dict.fromkeys([_D, *((n, *_D[1:]) for n in TASK_ROWS), *((_D[0], a, _D[2]) for a in AHEAD),
                                 *((*_D[:2], c) for c in COLS)]))
MEMBERS = tuple(member(*s) for s in SCHEDULES)


def schedule(member: str) -> tuple[int, int, int]:
    """(weight rows per task, prefetch distance in tiles, activation rows a rows16 pass) of a launch's
    member; the defaults without one."""
    m = re.fullmatch(r"t(\d+)(?:a(\d+))?(?:c(\d+))?", member)
    if not m:
        return _D
    s = (int(m.group(1)), int(m.group(2) or DEFAULT_AHEAD), int(m.group(3) or DEFAULT_COLS))
    if s[0] not in TASK_ROWS or s[1] not in AHEAD or s[2] not in (DEFAULT_COLS, *COLS):
        return _D
    return s


def candidates(launch: Launch, ctx: Context) -> list[str]:
    return list(MEMBERS)


def kernel(formats: tuple[str, ...], residual: bool) -> Kernel:
    """The kernel for these segment formats (one activation format: the contract's check) and epilogue."""
    nseg = len(formats)
    assert 1 <= nseg <= 3 and not (residual and nseg > 1)
    fmts = "_".join(weight_token(f) for f in (formats if len(set(formats)) > 1 else formats[:1]))
    name = f"lp_cpu_matmul_{fmts}_seg{nseg}_res{int(residual)}"
    ws = [f"w{i}" for i in range(nseg)]
    ys = [f"y{i}" for i in range(nseg)]
    pad = lambda xs, none: ", ".join(xs + [none] * (3 - len(xs)))  # noqa: E731
    codes = pad([weight_code(f) for f in formats], "0")
    call = (f"lp_cpu::matmul<{codes}, {nseg}, {'true' if residual else 'false'}>(x, {pad(ws, 'nullptr')}, "
            f"{pad(ys, 'nullptr')}, {'r' if residual else 'nullptr'}, rows, k, "
            f"{pad([f'n{i}' for i in range(nseg)], '0')}, task_rows, ahead, cols)")
    params = declare((*projection_params(nseg, residual), *SCHEDULE_PARAMS))
    entry = f"LP_KERNEL void {name}({params}) {{ {call}; }}"
    return Kernel(name, "matmul", "matmul.h", entry, 0)


def kernel_in_place(fmt: str) -> Kernel:
    """The one-weight projection kernel reading a RELAYOUT format's blocks in place, as plans did before
    the relayout: what scripts/bench_relayout.py measures the records against."""
    k = kernel([fmt], False)
    name = k.name.replace(weight_token(fmt), f"{fmt.lower()}_in_place")
    entry = k.entry.replace(k.name, name).replace(weight_code(fmt), format_header.weight_code(fmt))
    return Kernel(name, k.family, k.source, entry, 0)


def kernel_tile_twin(fmt: str) -> Kernel:
    """The one-weight projection kernel of a RELAYOUT format on the tile engine's scalar twin (codegen/cpu/
    tiles.h: the amx path's code with the tile instructions computed in memory), on every path and row
    count: what the tests hold the amx path's arithmetic to where no AMX is."""
    k = kernel([fmt], False)
    name = k.name.replace(weight_token(fmt), f"{weight_token(fmt)}_tile_twin")
    entry = k.entry.replace(k.name, name).replace(", 1, false>(", ", 1, false, lp_cpu::R16_TWIN>(")
    return Kernel(name, k.family, k.source, entry, 0)


def relayout(fmt: str) -> Kernel:
    """The entry point that makes a RELAYOUT weight's records at load from the file's blocks, row groups
    [g0, g1) a call (codegen/cpu/rows16.h r16_make_groups): the runtime's cpu driver calls it, where
    core/layouts.py's NumPy making (the reference it is tested against) is several times slower."""
    name = f"lp_cpu_make_{weight_token(fmt)}"
    entry = (f"LP_KERNEL void {name}(const void* blocks, int rows, int k, int g0, int g1, void* out) {{ "
             f"lp_cpu::r16_make_groups<lp_cpu::R16Rec<{weight_code(fmt)}>::type>(blocks, rows, k, g0, g1, out); }}")
    return Kernel(name, "matmul", "matmul.h", entry, 0)


def make_held(lib: Any, layout: str, blocks: np.ndarray, fmt: str, shape: tuple[int, ...],
              consumed: layouts.Consumed = lambda lo, hi: None) -> np.ndarray | None:
    """A weight in `layout` made by a built library's relayout entry point (a codegen/cpu_build.CpuLibrary
    holding relayout(fmt)) from its file bytes, in core/layouts.rows16_chunks, saying which bytes it is done
    with as core/layouts.make does; None where this layout is not the format's RELAYOUT or `lib` lacks it."""
    if RELAYOUT.get(fmt, ("",))[0] != layout or not lib.has(name := relayout(fmt).name):
        return None
    rows, k = math.prod(shape[:-1]), shape[-1]
    out, fn = np.empty(layouts.layout_bytes(layout, fmt, shape), np.uint8), lib.entry(name)[0]
    for g0, g1, lo, hi in layouts.rows16_chunks(fmt, shape):
        fn(blocks.ctypes.data, rows, k, g0, g1, out.ctypes.data)
        consumed(lo, hi)
    return out


def schedule_args(member: str):
    """The schedule's arguments (SCHEDULE_PARAMS) of a launch's member."""
    return tuple(i32(name, v) for (_, name), v in zip(SCHEDULE_PARAMS, schedule(member)))


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    c = operands.projection(launch, ctx, tuple(FORMATS))
    return [KernelLaunch(kernel(c.formats, c.residual is not None), (1,),
                         refs((*c.args(layout), *schedule_args(launch.member))))]
