"""The fused tail on the CPU (codegen/cpu/tail.h): op `tail_argmax`, the next token of each row:
argmax(pack[format](rmsnorm[eps](x, norm)) . head^T) over the tokens the row's mask allows, one int32 per
row, the head read by the projections' row loop (codegen/cpu/matmul.h) with no logit reaching memory.

Arguments: (x, norm, head (held as a projection weight is: matmul.held, the layout the logits' matmul
reads too), mask (the step state's, i32 [rows, ceil(vocab / 32)]), out, rows, k, vocab, eps, task_rows,
ahead, cols). Members: the matmul family's schedules.
"""

from __future__ import annotations

from typing import Any

from llmplan.core.formats import ACTIVATION_FORMAT

from ..kernel import Context, Kernel, Launch, scalar
from .matmul import CpuMatmulError, check_weight, held, schedule, weight_code, weight_token
from .matmul import candidates as candidates  # the head is read as a projection weight: the same members
from .norm import out_format


def kernel(fmt: str, k: int) -> Kernel:
    act = ACTIVATION_FORMAT[fmt.lower()]
    name = f"lp_cpu_tail_argmax_{weight_token(fmt)}"
    code = out_format(act, k, "tail_argmax")
    entry = (f"LP_KERNEL void {name}(const float* x, const float* norm, const void* head, const uint32_t* mask, "
             f"int* out, int rows, int k, int vocab, float eps, int task_rows, int ahead, int cols) "
             f"{{ lp_cpu::tail_argmax<{weight_code(fmt)}, {code}>(x, norm, head, mask, out, rows, k, vocab, eps, "
             f"task_rows, ahead, cols); }}")
    return Kernel(name, "tail_argmax", "tail.h", entry, 0)


def launches(launch: dict[str, Any], ctx: Context) -> list[Launch]:
    if launch["op"] != "tail_argmax":
        raise CpuMatmulError(f"the CPU tail family does not implement {launch['op']}")
    x, norm, head, mask = launch["args"]
    a = launch["attrs"]
    fmt, vocab, k = check_weight(ctx, head, "tail_argmax")
    act = ACTIVATION_FORMAT[fmt.lower()]
    if a["format"] != act:
        raise CpuMatmulError(f"tail_argmax: a {fmt} head takes {act} activations, the op packs {a['format']}")
    rows = ctx.shape(x)[0]
    return [Launch(kernel(fmt, k), (1,), [x, norm, held(head, fmt), mask, launch["outs"][0], scalar(rows), scalar(k),
                                          scalar(vocab), scalar(a["eps"], "f32"),
                                          *(scalar(v) for v in schedule(launch))])]
