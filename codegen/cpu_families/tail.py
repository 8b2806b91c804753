"""The fused tail on the CPU (codegen/cpu/tail.h): op `tail_argmax`, the greedy next token of each row:
argmax(pack[format](rmsnorm[eps](x, norm)) . head^T), one int32 per row, the head read by the projections'
row loop (codegen/cpu/matmul.h) with no logit reaching memory.

Arguments: (x, norm, head (held as a projection weight is: matmul.held, the layout the logits' matmul
reads too), out, rows, k, vocab, eps, task_rows, ahead, cols). Members: the matmul family's schedules.
"""

from __future__ import annotations

from llmplan.core.formats import ACTIVATION_FORMAT
from llmplan.core.plan_records import Launch

from ..kernel import Context, Kernel, KernelLaunch, scalar
from .matmul import CpuMatmulError, check_weight, held, schedule, weight_code, weight_token
from .matmul import candidates as candidates  # the head is read as a projection weight: the same members
from .norm import out_format


def kernel(fmt: str, k: int) -> Kernel:
    act = ACTIVATION_FORMAT[fmt.lower()]
    name = f"lp_cpu_tail_argmax_{weight_token(fmt)}"
    code = out_format(act, k, "tail_argmax")
    entry = (f"LP_KERNEL void {name}(const float* x, const float* norm, const void* head, int* out, int rows, int k, "
             f"int vocab, float eps, int task_rows, int ahead, int cols) {{ lp_cpu::tail_argmax<{weight_code(fmt)}, "
             f"{code}>(x, norm, head, out, rows, k, vocab, eps, task_rows, ahead, cols); }}")
    return Kernel(name, "tail_argmax", "tail.h", entry, 0)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    if launch.op != "tail_argmax":
        raise CpuMatmulError(f"the CPU tail family does not implement {launch.op}")
    x, norm, head = launch.args
    a = launch.attrs
    fmt, vocab, k = check_weight(ctx, head, "tail_argmax")
    act = ACTIVATION_FORMAT[fmt.lower()]
    if a["format"] != act:
        raise CpuMatmulError(f"tail_argmax: a {fmt} head takes {act} activations, the op packs {a['format']}")
    rows = ctx.shape(x)[0]
    return [KernelLaunch(kernel(fmt, k), (1,), [x, norm, held(head, fmt), launch.outs[0], scalar(rows), scalar(k),
                                          scalar(vocab), scalar(a["eps"], "f32"),
                                          *(scalar(v) for v in schedule(launch.member))])]
