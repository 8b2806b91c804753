"""The fused tail on the CPU (codegen/cpu/tail.h): op `tail_argmax`, the greedy next token of each row:
argmax(pack[format](rmsnorm[eps](x, norm)) . head^T), one int32 per row, the head read by the projections'
row loop (codegen/cpu/matmul.h) with no logit reaching memory.

Arguments: (x, norm, head (held as a projection weight is: matmul.held, the layout the logits' matmul
reads too), out, rows, k, vocab, eps, task_rows, ahead, cols). Members: the matmul family's schedules.
"""

from __future__ import annotations

from llmplan.core.formats import ACTIVATION_FORMAT, FORMATS
from llmplan.core.plan_records import Launch

from .. import operands
from ..format_header import act_code
from ..kernel import Context, Kernel, KernelLaunch, scalar
from ..operands import refs
from .matmul import held, schedule_args, weight_code, weight_token
from .matmul import candidates as candidates  # the head is read as a projection weight: the same members


def kernel(fmt: str, k: int) -> Kernel:
    act = ACTIVATION_FORMAT[fmt.lower()]
    name = f"lp_cpu_tail_argmax_{weight_token(fmt)}"
    operands.pack_format(act, k, "tail_argmax")
    entry = (f"LP_KERNEL void {name}(const float* x, const float* norm, const void* head, int* out, int rows, int k, "
             f"int vocab, float eps, int task_rows, int ahead, int cols) {{ lp_cpu::tail_argmax<{weight_code(fmt)}, "
             f"{act_code(act)}>(x, norm, head, out, rows, k, vocab, eps, task_rows, ahead, cols); }}")
    return Kernel(name, "tail_argmax", "tail.h", entry, 0)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    t = operands.tail(launch, ctx, tuple(FORMATS))
    return [KernelLaunch(kernel(t.fmt, t.k), (1,), [t.x, t.norm, held(t.head, t.fmt), t.out, scalar(t.rows),
                                                  scalar(t.k), scalar(t.vocab), scalar(t.eps, "f32"),
                                                  *refs(schedule_args(launch.member))])]
