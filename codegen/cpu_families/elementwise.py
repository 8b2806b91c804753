"""Elementwise ops and row gathers on the CPU (codegen/cpu/elementwise.h); operands and arguments as
codegen/operands.py's elementwise and take_rows contracts say, then the row count (`rows`, `n`) the
kernel splits over the pool."""

from __future__ import annotations

from llmplan.core.plan_records import Launch

from .. import operands
from ..kernel import Context, Kernel, KernelLaunch
from ..operands import declare, i32, refs


def kernel(op: str) -> Kernel:
    name = f"lp_cpu_ew_{op}"
    y = "y" if op in operands.EW_BINARY else "nullptr"
    attr = "attr" if op in operands.EW_ATTR else "0.0f"
    entry = (f"LP_KERNEL void {name}({declare((*operands.elementwise_params(op), ('int', 'rows')))}) "
             f"{{ lp_cpu::elementwise<{operands.EW_OPS[op]}>(x, {y}, out, rows, k, {attr}); }}")
    return Kernel(name, "elementwise", "elementwise.h", entry, 0)


def take_rows_kernel() -> Kernel:
    entry = (f"LP_KERNEL void lp_cpu_take_rows({declare((*operands.TAKE_ROWS_PARAMS, ('int', 'n')))}) "
             "{ lp_cpu::take_rows(x, rows, out, n, row_bytes); }")
    return Kernel("lp_cpu_take_rows", "take_rows", "elementwise.h", entry, 0)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    if launch.op == "take_rows":
        c = operands.take_rows(launch, ctx)
        return [KernelLaunch(take_rows_kernel(), (1,), refs((*c.args, i32("n", c.n))))]
    c = operands.elementwise(launch, ctx)
    return [KernelLaunch(kernel(c.op), (1,), refs((*c.args, i32("rows", c.rows))))]
