"""RMSNorm, RMSNorm + pack, and pack on the CPU (codegen/cpu/norm.h): ops rmsnorm, rmsnorm_pack, pack,
one call per launch, rows split over the pool. Operands and arguments as codegen/operands.py's norm
contract says, rmsnorm's then its row count. Output formats: every activation format (q8_0, q8_1, q8_k
as field planes; f16, bf16, f32 values)."""

from __future__ import annotations

from llmplan.core.plan_records import Launch

from .. import operands
from ..format_header import act_code
from ..kernel import Context, Kernel, KernelLaunch
from ..operands import declare, i32, refs


def kernel(op: str, fmt: str) -> Kernel:
    """rmsnorm (fmt f32), rmsnorm_pack or pack to `fmt`."""
    params = operands.norm_params(op)
    if op == "rmsnorm":
        name, params, call = "lp_cpu_rmsnorm_f32", (*params, ("int", "rows")), "rmsnorm(x, w, y, rows, k, group, eps)"
    elif op == "rmsnorm_pack":
        name, call = f"lp_cpu_rmsnorm_pack_{fmt}", f"rmsnorm_pack<{act_code(fmt)}>(x, w, out, rows, k, eps)"
    else:
        name, call = f"lp_cpu_pack_{fmt}", f"pack<{act_code(fmt)}>(x, out, rows, k)"
    return Kernel(name, op, "norm.h", f"LP_KERNEL void {name}({declare(params)}) {{ lp_cpu::{call}; }}", 0)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    c = operands.norm(launch, ctx)
    extra = (i32("rows", c.rows),) if c.op == "rmsnorm" else ()
    return [KernelLaunch(kernel(c.op, c.fmt), (1,), refs((*c.args, *extra)))]
