"""The mixture-of-experts router (codegen/kernels/router.cu): op moe_router, each row's routed experts in
llama.cpp's argsort order and their weights, into device buffers the expert projections read (the launch
sequence never depends on the routing). Grid (rows,), THREADS threads. Operands and arguments as
codegen/operands.py's router contract says. CPU twin: runtime/numpy_kernels.py moe_router."""

from __future__ import annotations

from llmplan.core.plan_records import Launch, grid_dim

from .. import operands
from ..build import BuildError
from ..kernel import Context, Kernel, KernelLaunch
from ..operands import MAX_EXPERTS, ROUTER_PARAMS, declare, refs

THREADS = 64
NAME = "lp_moe_router"


def kernel() -> Kernel:
    entry = (f"LP_KERNEL void __launch_bounds__({THREADS}) {NAME}({declare(ROUTER_PARAMS)}) "
             f"{{ lp_moe_router<{THREADS}, {MAX_EXPERTS}>(x, gate, ids, weights, rows, k, experts, top, norm); }}")
    return Kernel(NAME, "moe_router", "router.cu", entry, THREADS)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    c = operands.router(launch, ctx)
    if c.experts > MAX_EXPERTS:
        raise BuildError(f"moe_router: {c.experts} experts; the kernel routes up to {MAX_EXPERTS}")
    return [KernelLaunch(kernel(), (grid_dim(c.rows),), refs(c.args))]
