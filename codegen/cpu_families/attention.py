"""Causal attention over the paged K/V cache on the CPU (codegen/cpu/attention.h): attention (prefill:
every slice of a row computed and combined in one launch), attention_partial, then attention_reduce /
attention_reduce_pack (decode: one task per row, K/V head and slice, so one long row fills the pool).
Both run the same slice and combine code, so a row gets the same bits in prefill and decode.

Arguments: attention(q, cache, seq, pages, pos, out, rows, layer, pages, blocks, heads, kv_heads, d,
window, chunk, scale) with chunk = core/numerics.py SLICE; attention_partial(q, cache, seq, pages, pos,
part, rows, layer, pages, blocks, heads, kv_heads, d, splits, window, chunk, scale); attention_reduce
(part, out, rows, heads, d, splits). `pages`, `blocks`, `rows` and `splits` are symbols the runtime binds.
"""

from __future__ import annotations

from typing import Any

from llmplan.core.numerics import PAGE, SLICE
from llmplan.core.plan_records import Launch

from ..build import BuildError
from ..kernel import Context, Kernel, KernelLaunch, scalar
from .norm import out_format

MAX_GROUP = 16  # query heads per K/V head: the kernels keep G heads' sums in registers (attention.h)
_ATTN = "const float* q, const lp_half* cache, const int* seq, const int* pages, const int* pos"
_ARGS = "int layer, int npages, int blocks, int heads, int kv_heads, int d"
_STRUCT = "{q, cache, seq, pages, pos, layer, npages, blocks, heads, kv_heads, d, window, chunk, scale}"


def attention_kernel(group: int) -> Kernel:
    """`attention` for `group` query heads per K/V head."""
    name = f"lp_cpu_attention_g{group}"
    entry = (f"LP_KERNEL void {name}({_ATTN}, float* out, int rows, {_ARGS}, int window, int chunk, "
             f"float scale) {{ lp_cpu::attention<{group}>({_STRUCT}, out, rows); }}")
    return Kernel(name, "attention", "attention.h", entry, 0)


def partial_kernel(group: int) -> Kernel:
    name = f"lp_cpu_attention_partial_g{group}"
    entry = (f"LP_KERNEL void {name}({_ATTN}, float* part, int rows, {_ARGS}, int splits, "
             f"int window, int chunk, float scale) {{ lp_cpu::attention_partial<{group}>({_STRUCT}, part, rows, "
             "splits); }")
    return Kernel(name, "attention_partial", "attention.h", entry, 0)


def reduce_kernel(fmt: str, k: int) -> Kernel:
    code = out_format(fmt, k, "attention_reduce")
    name = "lp_cpu_attention_reduce_f32" if fmt == "f32" else f"lp_cpu_attention_reduce_pack_{fmt}"
    entry = (f"LP_KERNEL void {name}(const float* part, void* out, int rows, int heads, int d, int splits) "
             f"{{ lp_cpu::attention_reduce<{code}>(part, out, rows, heads, d, splits); }}")
    return Kernel(name, "attention_reduce", "attention.h", entry, 0)


def _check(a: dict[str, Any], heads: int, d: int, chunk: int, width: int) -> None:
    kv_heads = a["kv_heads"]
    if heads != a["heads"] or heads % kv_heads or width != heads * d:
        raise BuildError(f"attention: {a['heads']} heads / {kv_heads} K/V heads of {d} do not fit {width} query "
                         "features")
    if heads // kv_heads > MAX_GROUP:
        raise BuildError(f"attention: {heads // kv_heads} query heads per K/V head (the kernels take {MAX_GROUP})")
    if chunk % PAGE or chunk <= 0:
        raise BuildError(f"attention: chunk {chunk} is not whole {PAGE}-position pages")


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    op, a = launch.op, launch.attrs
    if op in ("attention", "attention_partial"):
        q, cache, seq, pages, pos = launch.args
        out = launch.outs[0]
        rows, width = ctx.shape(q)
        heads = a["heads"]
        if op == "attention":
            d, chunk = width // heads, SLICE
        else:
            _, heads, splits, dp2 = ctx.shape(out)
            d, chunk = dp2 - 2, a["chunk"]
        _check(a, heads, d, chunk, width)
        common = [scalar(a["layer"]), scalar("pages"), scalar("blocks"), scalar(heads), scalar(a["kv_heads"]),
                  scalar(d)]
        tail = [scalar(a["window"]), scalar(chunk), scalar(a["scale"], "f32")]
        group = heads // a["kv_heads"]
        if op == "attention":
            return [KernelLaunch(attention_kernel(group), (1,),
                           [q, cache, seq, pages, pos, out, scalar(rows), *common, *tail])]
        return [KernelLaunch(partial_kernel(group), (1,),
                       [q, cache, seq, pages, pos, out, scalar(rows), *common, scalar(splits), *tail])]
    if op in ("attention_reduce", "attention_reduce_pack"):
        part, out = launch.args[0], launch.outs[0]
        rows, heads, splits, dp2 = ctx.shape(part)
        d = dp2 - 2
        fmt = a["format"] if op == "attention_reduce_pack" else "f32"
        return [KernelLaunch(reduce_kernel(fmt, heads * d), (1,),
                       [part, out, scalar(rows), scalar(heads), scalar(d), scalar(splits)])]
    raise BuildError(f"attention: no CPU kernel for op {op}")
