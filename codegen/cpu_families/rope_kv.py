"""Rotary embedding + K/V cache write on the CPU (codegen/cpu/rope_kv.h): ops rope_kv and norm_rope_kv,
the GPU kernel's arithmetic: (cos, sin) from the runtime's rope table (core/numerics.py rope_table;
the {"rope_table": ...} argument of codegen/families/rope_kv.py), the rotation in float32 with one rounding per
operation, so rope_kv.py's rope_f32 is its exact NumPy form.

Arguments: (q, k, v, pos, seq, pages, cache, table, [q_norm, k_norm,] q_out, rows, heads, kv_heads, d,
dims, layer, pages, blocks[, eps]); `pages` (the page table's row length) and `blocks` (the cache's) are
symbols the runtime binds.
"""

from __future__ import annotations

from llmplan.core.op_traits import ops_of
from llmplan.core.plan_records import Launch

from ..build import BuildError
from ..families.rope_kv import MODES, table_ref
from ..kernel import Context, Kernel, KernelLaunch, scalar


def kernel(mode: str, norm: bool) -> Kernel:
    if mode not in MODES:
        raise BuildError(f"rope_kv: rotation mode {mode!r} is not one of {', '.join(MODES)}")
    name = f"lp_cpu_{'norm_' if norm else ''}rope_kv_{mode}"
    ptrs = ("const float* q, const float* k, const float* v, const int* pos, const int* seq, const int* pages, "
            "lp_half* cache, const float* table, ")
    sizes = "int rows, int heads, int kv_heads, int d, int dims, int layer, int npages, int blocks"
    call = "rows, heads, kv_heads, d, dims, layer, npages, blocks"
    if norm:
        params = f"{ptrs}const float* q_norm, const float* k_norm, float* q_out, {sizes}, float eps"
        call = f"table, q_norm, k_norm, q_out, {call}, eps"
    else:
        params = f"{ptrs}float* q_out, {sizes}"
        call = f"table, nullptr, nullptr, q_out, {call}, 0.0f"
    template = f"lp_cpu::rope_kv<{MODES[mode]}, {'true' if norm else 'false'}>"
    entry = f"LP_KERNEL void {name}({params}) {{ {template}(q, k, v, pos, seq, pages, cache, {call}); }}"
    return Kernel(name, "rope_kv", "rope_kv.h", entry, 0)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    op, a = launch.op, launch.attrs
    if op not in ops_of("rope_kv"):
        raise BuildError(f"rope_kv: no CPU kernel for op {op}")
    q, k, v, pos, seq, pages, cache = launch.args[:7]
    extra = launch.args[7:]
    rows, width = ctx.shape(q)
    heads, kv_heads, dims = a["heads"], a["kv_heads"], a["dims"]
    d = width // heads
    if width % heads or dims % 2 or not 0 < dims <= d:
        raise BuildError(f"rope_kv: {heads} heads of {width} features cannot rotate {dims} dims")
    norm = op == "norm_rope_kv"
    factors = None if norm or not extra else extra[0].name
    args = [q, k, v, pos, seq, pages, cache, table_ref(a, factors)]
    if norm:
        if ctx.shape(extra[0])[0] != d or ctx.shape(extra[1])[0] != d:
            raise BuildError(f"norm_rope_kv: q/k norm weights must have head_dim {d} values")
        args += [extra[0], extra[1]]
    args += [launch.outs[0], scalar(rows), scalar(heads), scalar(kv_heads), scalar(d), scalar(dims),
             scalar(a["layer"]), scalar("pages"), scalar("blocks")]
    if norm:
        args.append(scalar(a["eps"], "f32"))
    return [KernelLaunch(kernel(a["mode"], norm), (1,), args)]
