"""The routed experts' projections on the CPU (codegen/cpu/experts.h): ops matmul_experts and
matmul_experts_residual, every weight format the projections read, in the projections' layouts (Q4_K and
Q6_K as rows16 records, RELAYOUT; the rest in place), so each expert is a projection of its own:
its rows of the [experts, n, k] tensor, read once per step for every row routed to it. Operands and
arguments as codegen/operands.py's experts contract says, then the grouping scratch, then the
projections' schedule (task_rows, ahead, cols; members: the matmul family's). CPU twin:
runtime/numpy_kernels.py experts.

The grouping buffers are the plan's scratch (codegen/kernel.py scratch: placed in the arena, sized for the
phase's bound of rows, live during the launch), with the GPU family's names, layouts and shapes
(codegen/operands.py Experts.grouping): "matmul_experts.groups" i32 [rows, 4 top + 2] (experts.h group_slots),
"matmul_experts.x" in x's activation format [rows, top * k] (the slots' activation rows in group order),
and for matmul_experts_residual "matmul_experts.y" f32 [rows, top * n] (the slots' results before their
weighted sum)."""

from __future__ import annotations

from llmplan.core.formats import FORMATS
from llmplan.core.plan_records import Launch

from .. import operands
from ..build import BuildError
from ..kernel import Context, Kernel, KernelLaunch
from ..operands import MAX_EXPERTS, Arg, declare, experts_params, refs
from . import matmul
from .matmul import SCHEDULE_PARAMS, schedule_args
from .matmul import candidates as candidates  # each expert is read as a projection weight: the same members

# the records experts.h reads (an expert's offset counts 256-value super-blocks): the K-quants'; the
# 32-value blocks' records (rows16_q8.h) are the projections' alone
RELAYOUT = {fmt: matmul.RELAYOUT[fmt] for fmt in ("Q4_K", "Q6_K")}


def layout(fmt: str) -> str:
    return matmul.layout(fmt, RELAYOUT)


def grouping_params(residual: bool) -> tuple[tuple[str, str], ...]:
    """The grouping scratch: groups, the gathered activations, and (residual) the slots' results."""
    return (("int*", "groups"), ("void*", "xg"), *((("float*", "ys"),) if residual else ()))


def kernel(fmt: str, residual: bool) -> Kernel:
    op = "matmul_experts_residual" if residual else "matmul_experts"
    name = f"lp_cpu_{op}_{matmul.weight_token(fmt, RELAYOUT)}"
    call = (f"lp_cpu::matmul_experts<{matmul.weight_code(fmt, RELAYOUT)}, {'true' if residual else 'false'}, {MAX_EXPERTS}>(x, w, ids, "
            f"{'weights, r' if residual else 'nullptr, nullptr'}, y, groups, xg, {'ys' if residual else 'nullptr'}, "
            "rows, k, n, experts, top, sliced, task_rows, ahead, cols)")
    params = (*experts_params(residual), *grouping_params(residual), *SCHEDULE_PARAMS)
    entry = f"LP_KERNEL void {name}({declare(params)}) {{ {call}; }}"
    return Kernel(name, op, "experts.h", entry, 0)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    c = operands.experts(launch, ctx, tuple(FORMATS))
    if c.experts > MAX_EXPERTS:
        raise BuildError(f"{c.op}: {c.experts} experts; the kernel groups up to {MAX_EXPERTS}")
    residual = c.op == "matmul_experts_residual"
    grouping = [Arg(ctype, name, ref) for (ctype, name), ref in zip(grouping_params(residual), c.grouping())]
    return [KernelLaunch(kernel(c.fmt, residual), (1,),
                         refs((*c.args(layout), *grouping, *schedule_args(launch.member))))]
