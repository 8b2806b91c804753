"""Causal attention over the paged K/V cache on the CPU (codegen/cpu/attention.h): attention (prefill:
every slice of a row computed and combined in one launch), attention_partial, then attention_reduce /
attention_reduce_pack (decode: one task per row, K/V head and slice, so one long row fills the pool).
Both run the same slice and combine code, so a row gets the same bits in prefill and decode.

Operands and arguments as codegen/operands.py's attention contract says, then what the CPU kernels take
beyond a GPU grid's: attention (d, chunk), attention_partial (rows, heads, d, chunk), with chunk the
positions per slice (core/numerics.py SLICE for attention).
"""

from __future__ import annotations

from llmplan.core.plan_records import Launch

from .. import operands
from ..build import BuildError
from ..format_header import act_code
from ..kernel import Context, Kernel, KernelLaunch
from ..operands import attention_params, declare, i32, refs

MAX_GROUP = 16  # query heads per K/V head: the kernels keep G heads' sums in registers (attention.h)
_STRUCT = "{q, cache, seq, pages, pos, layer, npages, blocks, heads, kv_heads, d, window, chunk, scale}"
EXTRA = {"attention": ("d", "chunk"), "attention_partial": ("rows", "heads", "d", "chunk")}


def _params(op: str) -> str:
    return declare((*attention_params(op), *(("int", name) for name in EXTRA[op])))


def attention_kernel(group: int) -> Kernel:
    """`attention` for `group` query heads per K/V head."""
    name = f"lp_cpu_attention_g{group}"
    entry = f"LP_KERNEL void {name}({_params('attention')}) {{ lp_cpu::attention<{group}>({_STRUCT}, out, rows); }}"
    return Kernel(name, "attention", "attention.h", entry, 0)


def partial_kernel(group: int) -> Kernel:
    name = f"lp_cpu_attention_partial_g{group}"
    entry = (f"LP_KERNEL void {name}({_params('attention_partial')}) "
             f"{{ lp_cpu::attention_partial<{group}>({_STRUCT}, part, rows, splits); }}")
    return Kernel(name, "attention_partial", "attention.h", entry, 0)


def reduce_kernel(fmt: str) -> Kernel:
    """attention_reduce (fmt f32) or attention_reduce_pack to fmt (every activation format)."""
    name = "lp_cpu_attention_reduce_f32" if fmt == "f32" else f"lp_cpu_attention_reduce_pack_{fmt}"
    entry = (f"LP_KERNEL void {name}({declare(attention_params('attention_reduce'))}) "
             f"{{ lp_cpu::attention_reduce<{act_code(fmt)}>(part, out, rows, heads, d, splits); }}")
    return Kernel(name, "attention_reduce", "attention.h", entry, 0)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    c = operands.attention(launch, ctx)
    if c.op in ("attention_reduce", "attention_reduce_pack"):
        return [KernelLaunch(reduce_kernel(c.fmt), (1,), refs(c.args))]
    group = c.heads // c.kv_heads
    if group > MAX_GROUP:
        raise BuildError(f"attention: {group} query heads per K/V head (the kernels take {MAX_GROUP})")
    values = {"rows": c.rows, "heads": c.heads, "d": c.d, "chunk": c.chunk}
    extra = tuple(i32(name, values[name]) for name in EXTRA[c.op])
    kern = attention_kernel(group) if c.op == "attention" else partial_kernel(group)
    return [KernelLaunch(kern, (1,), refs((*c.args, *extra)))]
