"""Elementwise ops and row gathers on the CPU (codegen/cpu/elementwise.h).

Family "elementwise" (ops add, mul, scale, silu, gelu_tanh, softcap on f32 [rows, k]): binary (x, y,
out, rows, k); unary (x, out, rows, k[, attr]), attr the scale factor or the softcap cap (float32).
Family "take_rows" (out[i] = x[rows[i]] for f32 / i32 / f16 / bf16 rows): (x, rows, out, n, row_bytes).
"""

from __future__ import annotations

import math
from typing import Any

from llmplan.core.formats import SCALAR_BYTES
from llmplan.core.plan_records import Launch

from ..build import BuildError
from ..kernel import Context, Kernel, KernelLaunch, scalar

OPS = {"add": 0, "mul": 1, "scale": 2, "silu": 3, "gelu_tanh": 4, "softcap": 5}
BINARY = ("add", "mul")
ATTR = {"scale": "factor", "softcap": "cap"}


def kernel(op: str) -> Kernel:
    if op not in OPS:
        raise BuildError(f"elementwise: no CPU kernel for op {op}")
    name = f"lp_cpu_ew_{op}"
    body = f"lp_cpu::elementwise<{OPS[op]}>"
    if op in BINARY:
        params, call = "const float* x, const float* y, float* out, int rows, int k", "x, y, out, rows, k, 0.0f"
    elif op in ATTR:
        params, call = "const float* x, float* out, int rows, int k, float attr", "x, nullptr, out, rows, k, attr"
    else:
        params, call = "const float* x, float* out, int rows, int k", "x, nullptr, out, rows, k, 0.0f"
    return Kernel(name, "elementwise", "elementwise.h", f"LP_KERNEL void {name}({params}) {{ {body}({call}); }}", 0)


def take_rows_kernel() -> Kernel:
    entry = ("LP_KERNEL void lp_cpu_take_rows(const void* x, const int* rows, void* out, int n, int row_bytes) "
             "{ lp_cpu::take_rows(x, rows, out, n, row_bytes); }")
    return Kernel("lp_cpu_take_rows", "take_rows", "elementwise.h", entry, 0)


def _row(shape: tuple, what: str) -> tuple[Any, int]:
    """(rows, values per row) of a [rows, ...] operand; the row must have a fixed size."""
    rest = shape[1:] if len(shape) > 1 else ()
    if not all(isinstance(d, int) for d in rest):
        raise BuildError(f"{what}: rows of {shape} do not have a fixed size")
    return (shape[0] if rest else 1), (math.prod(rest) if rest else shape[0])


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    op, a = launch.op, launch.attrs
    out = launch.outs[0]
    if op == "take_rows":
        x, rows = launch.args
        dtype = ctx.dtype(x)
        if dtype not in SCALAR_BYTES:
            raise BuildError(f"take_rows: {dtype} rows are not gathered by a CPU kernel (f32, i32, f16, bf16 only)")
        _, k = _row(ctx.shape(x), "take_rows")
        return [KernelLaunch(take_rows_kernel(), (1,),
                       [x, rows, out, scalar(ctx.shape(out)[0]), scalar(k * SCALAR_BYTES[dtype])])]
    if op not in OPS:
        raise BuildError(f"elementwise: no CPU kernel for op {op}")
    for ref in (*launch.args, out):
        if ctx.dtype(ref) != "f32":
            raise BuildError(f"{op}: operands must be f32, got {ctx.dtype(ref)}")
    rows, k = _row(ctx.shape(launch.args[0]), op)
    args = [launch.args[0]] + ([launch.args[1]] if op in BINARY else []) + [out, scalar(rows), scalar(k)]
    if op in ATTR:
        args.append(scalar(a[ATTR[op]], "f32"))
    return [KernelLaunch(kernel(op), (1,), args)]
