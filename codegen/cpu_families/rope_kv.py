"""Rotary embedding + K/V cache write on the CPU (codegen/cpu/rope_kv.h): ops rope_kv and norm_rope_kv,
the GPU kernel's arithmetic: (cos, sin) from the runtime's rope table (core/numerics.py rope_table;
the {"rope_table": ...} argument of codegen/families/rope_kv.py), the rotation in float32 with one rounding per
operation, so rope_kv.py's rope_f32 is its exact NumPy form. Operands and arguments as
codegen/operands.py's rope_kv contract says, then the row count.
"""

from __future__ import annotations

from llmplan.core.plan_records import Launch

from .. import operands
from ..kernel import Context, Kernel, KernelLaunch
from ..operands import ROPE_MODES, declare, i32, refs, rope_kv_call, rope_kv_params


def kernel(mode: str, norm: bool, bias: bool = False) -> Kernel:
    name = f"lp_cpu_{'norm_' if norm else ''}rope_kv_{mode}{'_bias' if bias else ''}"
    flags, pointers, eps = rope_kv_call(norm, bias)
    call = (f"lp_cpu::rope_kv<{ROPE_MODES[mode]}, {flags}>(q, k, v, pos, seq, pages, cache, table, {pointers}, "
            f"q_out, rows, heads, kv_heads, d, dims, layer, npages, blocks, {eps})")
    entry = f"LP_KERNEL void {name}({declare((*rope_kv_params(norm, bias), ('int', 'rows')))}) {{ {call}; }}"
    return Kernel(name, "rope_kv", "rope_kv.h", entry, 0)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    c = operands.rope_kv(launch, ctx)
    return [KernelLaunch(kernel(c.mode, c.norm, c.bias), (1,), refs((*c.args, i32("rows", c.rows))))]
