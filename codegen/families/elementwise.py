"""Elementwise ops and row gathers (codegen/kernels/elementwise.cu).

Family "elementwise" (ops add, mul, scale, silu, gelu_tanh, softcap on f32 [rows, k]): grid
(ceil(k / (THREADS * VEC)), rows), THREADS threads, VEC = 4 consecutive values per thread (128-bit
loads and stores) when k % 4 == 0, else 1. Arguments: binary (x, y, out, k); unary (x, out, k[, attr])
with attr the scale factor or the softcap cap (float32).

Family "take_rows" (op take_rows: out[i] = x[rows[i]], x f32 / i32 / f16 / bf16 rows): grid
(ceil(row_bytes / (THREADS * VB)), n), VB = 16, 4, 2 or 1 bytes per copy, the widest that divides the
row. Arguments (x, rows, out, row_bytes). Packed (8-bit block) rows are not gathered here: their
planes would each need their own copy (no plan gathers them today).

Both are pure streams, read once and written once with coalesced (vector) accesses.
"""

from __future__ import annotations

import math
from typing import Any

from llmplan.core.formats import SCALAR_BYTES
from llmplan.core.plan_records import Launch, grid_dim

from ..build import BuildError
from ..kernel import Context, Kernel, KernelLaunch, scalar

THREADS = 256
OPS = {"add": 0, "mul": 1, "scale": 2, "silu": 3, "gelu_tanh": 4, "softcap": 5}
BINARY = ("add", "mul")
ATTR = {"scale": "factor", "softcap": "cap"}


def kernel(op: str, vec: int) -> Kernel:
    if op not in OPS:
        raise BuildError(f"elementwise: no kernel for op {op}")
    name = f"lp_ew_{op}_v{vec}"
    body = f"lp_elementwise<{OPS[op]}, {vec}>"
    if op in BINARY:
        params, call = "const float* x, const float* y, float* out, int k", "x, y, out, k, 0.0f"
    elif op in ATTR:
        params, call = "const float* x, float* out, int k, float attr", "x, nullptr, out, k, attr"
    else:
        params, call = "const float* x, float* out, int k", "x, nullptr, out, k, 0.0f"
    entry = f"LP_KERNEL void __launch_bounds__({THREADS}) {name}({params}) {{ {body}({call}); }}"
    return Kernel(name, "elementwise", "elementwise.cu", entry, THREADS, ("load128",) if vec == 4 else ())


def take_rows_kernel(vb: int) -> Kernel:
    if vb not in (1, 2, 4, 16):
        raise BuildError(f"take_rows: no {vb}-byte copy")
    name = f"lp_take_rows_b{vb}"
    entry = (f"LP_KERNEL void __launch_bounds__({THREADS}) {name}(const void* x, const int* rows, void* out, "
             f"int row_bytes) {{ lp_take_rows<{vb}>(x, rows, out, row_bytes); }}")
    return Kernel(name, "take_rows", "elementwise.cu", entry, THREADS, ("load128",) if vb == 16 else ())


def _row(shape: tuple, what: str) -> tuple[Any, int]:
    """(rows, values per row) of a [rows, ...] operand; the row must have a fixed size."""
    rest = shape[1:] if len(shape) > 1 else ()
    k = math.prod(rest) if rest else 1
    if not all(isinstance(d, int) for d in rest):
        raise BuildError(f"{what}: rows of {shape} do not have a fixed size")
    return (shape[0] if len(shape) > 1 else 1), (k if rest else shape[0])


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    op, a = launch.op, launch.attrs
    out = launch.outs[0]
    if op == "take_rows":
        x, rows = launch.args
        dtype = ctx.dtype(x)
        if dtype not in SCALAR_BYTES:
            raise BuildError(f"take_rows: {dtype} rows are not gathered by a kernel (f32, i32, f16, bf16 only)")
        _, k = _row(ctx.shape(x), "take_rows")
        n = ctx.shape(out)[0]
        row_bytes = k * SCALAR_BYTES[dtype]
        vb = next(b for b in (16, 4, 2, 1) if row_bytes % b == 0)
        return [KernelLaunch(take_rows_kernel(vb), (grid_dim(row_bytes, THREADS * vb), grid_dim(n)),
                       [x, rows, out, scalar(row_bytes)])]
    if op not in OPS:
        raise BuildError(f"elementwise: no kernel for op {op}")
    x = launch.args[0]
    for ref in (*launch.args, out):
        if ctx.dtype(ref) != "f32":
            raise BuildError(f"{op}: operands must be f32, got {ctx.dtype(ref)}")
    rows, k = _row(ctx.shape(x), op)
    vec = 4 if k % 4 == 0 else 1
    args = [x] + ([launch.args[1]] if op in BINARY else []) + [out, scalar(k)]
    if op in ATTR:
        args.append(scalar(a[ATTR[op]], "f32"))
    return [KernelLaunch(kernel(op, vec), (grid_dim(k, THREADS * vec), grid_dim(rows)), args)]
