"""Elementwise ops and row gathers (codegen/kernels/elementwise.cu); operands and arguments as
codegen/operands.py's elementwise and take_rows contracts say.

Family "elementwise" (ops add, mul, scale, silu, gelu_tanh, softcap on f32 [rows, k]): grid
(ceil(k / (THREADS * VEC)), rows), THREADS threads, VEC = 4 consecutive values per thread (128-bit
loads and stores) when k % 4 == 0, else 1.

Family "take_rows" (op take_rows: out[i] = x[rows[i]], x f32 / i32 / f16 / bf16 rows): grid
(ceil(row_bytes / (THREADS * VB)), n), VB = 16, 4, 2 or 1 bytes per copy, the widest that divides the
row. Packed (8-bit block) rows are not gathered here: their planes would each need their own copy (no
plan gathers them today).

Both are pure streams, read once and written once with coalesced (vector) accesses.
"""

from __future__ import annotations

from llmplan.core.plan_records import Launch, grid_dim

from .. import operands
from ..build import BuildError
from ..kernel import Context, Kernel, KernelLaunch
from ..operands import declare, refs

THREADS = 256


def kernel(op: str, vec: int) -> Kernel:
    name = f"lp_ew_{op}_v{vec}"
    params = operands.elementwise_params(op)
    y = "y" if op in operands.EW_BINARY else "nullptr"
    attr = "attr" if op in operands.EW_ATTR else "0.0f"
    entry = (f"LP_KERNEL void __launch_bounds__({THREADS}) {name}({declare(params)}) "
             f"{{ lp_elementwise<{operands.EW_OPS[op]}, {vec}>(x, {y}, out, k, {attr}); }}")
    return Kernel(name, "elementwise", "elementwise.cu", entry, THREADS, ("load128",) if vec == 4 else ())


def take_rows_kernel(vb: int) -> Kernel:
    if vb not in (1, 2, 4, 16):
        raise BuildError(f"take_rows: no {vb}-byte copy")
    name = f"lp_take_rows_b{vb}"
    entry = (f"LP_KERNEL void __launch_bounds__({THREADS}) {name}({declare(operands.TAKE_ROWS_PARAMS)}) "
             f"{{ lp_take_rows<{vb}>(x, rows, out, row_bytes); }}")
    return Kernel(name, "take_rows", "elementwise.cu", entry, THREADS, ("load128",) if vb == 16 else ())


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    if launch.op == "take_rows":
        c = operands.take_rows(launch, ctx)
        vb = next(b for b in (16, 4, 2, 1) if c.row_bytes % b == 0)
        return [KernelLaunch(take_rows_kernel(vb), (grid_dim(c.row_bytes, THREADS * vb), grid_dim(c.n)),
                             refs(c.args))]
    c = operands.elementwise(launch, ctx)
    vec = 4 if c.k % 4 == 0 else 1
    return [KernelLaunch(kernel(c.op, vec), (grid_dim(c.k, THREADS * vec), grid_dim(c.rows)), refs(c.args))]
