"""Wave mat-vec (codegen/kernels/matvec.cu): the decode-time projections matmul, matmul_segmented and
matmul_residual for activations of at most a few rows.

One wave per output row, WAVES waves per block; grid (ceil(out rows / WAVES), ceil(rows / C)): block y
serves activation columns [C*y, C*y + C) with one pass over each weight row. A segmented launch covers
the out rows of all its weights (up to 3, each in its own format, all taking the same packed x).
Decode is memory-bound: each weight byte is read once per step with 16-byte loads by consecutive lanes,
and the arithmetic is integer dot products on the quants (codegen/kernels/quant.cuh). CPU twin:
runtime/numpy_kernels.py matmul.

Members: "c1".."c8", the activation columns one pass serves (C). The planner picks the member; a launch
without one gets C = its row count when that is a number (capped at 8), else MAX_COLUMNS: one pass
over the weights for any batched decode step up to 8 sequences.

Operands and arguments as codegen/operands.py's projection contract says, the weights in the "planar"
relayout (the kernel computes the planes of core/formats.planes(FORMATS[fmt], rows=out, k=in) itself).
"""

from __future__ import annotations

import re
from typing import Any

from llmplan.core import formats as core_formats
from llmplan.core.plan_records import Launch, grid_dim

from .. import operands
from ..format_header import weight_code
from ..kernel import Context, Kernel, KernelLaunch
from ..operands import declare, projection_params, refs

# weight formats the kernels read (quant.cuh has no dot product for F32 and BF16), each taking the
# activation format of core/formats.py ACTIVATION_FORMAT
FORMATS = tuple(f for f in core_formats.FORMATS if f not in ("F32", "BF16"))
F16_PIECE = 8  # F16 rows are read 8 values (16 bytes) at a time: their length must be a multiple
WAVES = 4  # waves per block
MAX_COLUMNS = 8
MEMBERS = tuple(f"c{c}" for c in range(1, MAX_COLUMNS + 1))


def piece(fmt: str) -> int:
    """The values a row's length must be a multiple of: whole blocks, F16_PIECE for F16."""
    return F16_PIECE if fmt == "F16" else core_formats.FORMATS[fmt].block


def columns(member: str, rows: int | str) -> int:
    """C, the activation columns one pass serves: the member's, else as the module docstring says."""
    m = re.fullmatch(r"c([1-8])", member)
    if m:
        return int(m.group(1))
    return max(1, min(rows, MAX_COLUMNS)) if isinstance(rows, int) else MAX_COLUMNS


def candidates(launch: Launch, ctx: Context) -> list[str]:
    """One pass over the weights serves every row the phase can have (up to MAX_COLUMNS)."""
    return [f"c{max(1, min(ctx.bound(ctx.shape(launch.args[0])[0]), MAX_COLUMNS))}"]


def launch_bounds(threads: int, target: Any) -> str:
    """__launch_bounds__(threads), with an explicit minimum of 1 block per SM on NVIDIA: with the one-
    argument form, ptxas (CUDA 13) trades a few spilled bytes for occupancy in the row loop now and then
    (the tail's head loop: one to eight of its 88 format x column kernels per arch; the mat-vec's Q2_K
    with 8 columns on sm_89); with the minimum stated it does not. (The HIP macro of vendor.h takes one
    argument.)"""
    return f"__launch_bounds__({threads}, 1)" if target.nvidia else f"__launch_bounds__({threads})"


def kernel(formats: tuple[str, ...], residual: bool, c: int, target: Any) -> Kernel:
    """The kernel for these segment formats (one activation format: the contract's check), epilogue and
    column count, on this target."""
    nseg = len(formats)
    assert 1 <= nseg <= 3 and 1 <= c <= MAX_COLUMNS and not (residual and nseg > 1)
    fmts = "_".join(f.lower() for f in (formats if len(set(formats)) > 1 else formats[:1]))
    name = f"lp_matvec_{fmts}_seg{nseg}_res{int(residual)}_c{c}"
    threads = WAVES * target.wave
    ws = [f"w{i}" for i in range(nseg)]
    ys = [f"y{i}" for i in range(nseg)]
    pad = lambda xs, none: ", ".join(xs + [none] * (3 - len(xs)))  # noqa: E731
    codes = pad([weight_code(f) for f in formats], "0")
    ns = pad([f"n{i}" for i in range(nseg)], "0")
    call = (f"lp_matvec<{codes}, {nseg}, {'true' if residual else 'false'}, {c}>(x, {pad(ws, 'nullptr')}, "
            f"{pad(ys, 'nullptr')}, {'r' if residual else 'nullptr'}, rows, k, {ns})")
    params = declare(projection_params(nseg, residual))
    entry = f"LP_KERNEL void {launch_bounds(threads, target)} {name}({params}) {{ {call}; }}"
    quantized = any(f != "F16" for f in formats)
    return Kernel(name, "matmul", "matvec.cu", entry, threads,
                  ("dot4", "load128") if quantized else ("load128",))


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    c = operands.projection(launch, ctx, FORMATS, piece)
    kern = kernel(c.formats, c.residual is not None, columns(launch.member, c.rows), ctx.target)
    grid = (grid_dim(sum(c.ns), WAVES), grid_dim(c.rows, columns(launch.member, c.rows)))
    return [KernelLaunch(kern, grid, refs(c.args(lambda fmt: "planar")))]
