"""The routed experts' projections on the CPU (codegen/cpu/experts.h): ops matmul_experts and
matmul_experts_residual, every weight format the projections read, in the projections' layouts (Q4_K and
Q6_K as rows16 records, RELAYOUT; the rest in place), so each expert is a projection of its own:
its rows of the [experts, n, k] tensor, read once per step for every row routed to it. Operands and
arguments as codegen/operands.py's experts contract says, then the projections' schedule (task_rows,
ahead, cols; members: the matmul family's). CPU twin: runtime/numpy_kernels.py experts."""

from __future__ import annotations

from llmplan.core.formats import FORMATS
from llmplan.core.plan_records import Launch

from .. import operands
from ..kernel import Context, Kernel, KernelLaunch
from ..operands import declare, experts_params, refs
from . import matmul
from .matmul import SCHEDULE_PARAMS, schedule_args
from .matmul import candidates as candidates  # each expert is read as a projection weight: the same members

# the records experts.h reads (an expert's offset counts 256-value super-blocks): the K-quants'; the
# 32-value blocks' records (rows16_q8.h) are the projections' alone
RELAYOUT = {fmt: matmul.RELAYOUT[fmt] for fmt in ("Q4_K", "Q6_K")}


def layout(fmt: str) -> str:
    return matmul.layout(fmt, RELAYOUT)


def kernel(fmt: str, residual: bool) -> Kernel:
    op = "matmul_experts_residual" if residual else "matmul_experts"
    name = f"lp_cpu_{op}_{matmul.weight_token(fmt, RELAYOUT)}"
    call = (f"lp_cpu::matmul_experts<{matmul.weight_code(fmt, RELAYOUT)}, {'true' if residual else 'false'}>(x, w, ids, "
            f"{'weights, r' if residual else 'nullptr, nullptr'}, y, rows, k, n, experts, top, sliced, task_rows, "
            "ahead, cols)")
    entry = f"LP_KERNEL void {name}({declare((*experts_params(residual), *SCHEDULE_PARAMS))}) {{ {call}; }}"
    return Kernel(name, op, "experts.h", entry, 0)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    c = operands.experts(launch, ctx, tuple(FORMATS))
    return [KernelLaunch(kernel(c.fmt, c.op == "matmul_experts_residual"), (1,),
                         refs((*c.args(layout), *schedule_args(launch.member))))]
