"""The mixture-of-experts router on the CPU (codegen/cpu/router.h): op moe_router, each row's routed
experts (llama.cpp's argsort order through std::sort itself) and their weights; operands and arguments as
codegen/operands.py's router contract says. CPU twin: runtime/numpy_kernels.py moe_router."""

from __future__ import annotations

from llmplan.core.plan_records import Launch

from .. import operands
from ..kernel import Context, Kernel, KernelLaunch
from ..operands import ROUTER_PARAMS, declare, refs

NAME = "lp_cpu_moe_router"


def kernel() -> Kernel:
    entry = (f"LP_KERNEL void {NAME}({declare(ROUTER_PARAMS)}) "
             "{ lp_cpu::moe_router(x, gate, ids, weights, rows, k, experts, top, norm); }")
    return Kernel(NAME, "moe_router", "router.h", entry, 0)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    return [KernelLaunch(kernel(), (1,), refs(operands.router(launch, ctx).args))]
