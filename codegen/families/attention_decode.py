"""Split-context decode attention (codegen/kernels/attention_decode.cu): attention_partial, then
attention_reduce / attention_reduce_pack.

attention_partial: one block per (split, K/V head, row), grid (splits, kv_heads, rows), THREADS
threads; the kernel is specialised on head_dim D, group G = heads / kv_heads and the chunk (the
split's positions), so the G query heads' slices sit in registers and each K/V row of the slice is
read once, with 128-bit loads, for all of them. The cache is paged (core/numerics.py PAGE): the
chunk must be whole pages (256 positions: 16), whose blocks each partial block reads from the page
table once. Decode is memory bound: the slice's K and V bytes are the traffic, read once at full
coalescing; the grid fills the GPU from one sequence once the context spans a few chunks.

attention_reduce[_pack]: grid (ceil(heads * D / TILE), rows), REDUCE_THREADS threads; each block
combines TILE outputs of one row over all splits (skipping empty ones) and stores them as f32, or
packs them (q8_0, q8_1, q8_k through common.cuh's lp_pack_row; f16; bf16) for the output projection.

Operands and arguments as codegen/operands.py's attention contract says.
"""

from __future__ import annotations

from llmplan.core.numerics import PAGE
from llmplan.core.plan_records import Launch, grid_dim

from .. import operands
from ..build import BuildError
from ..format_header import act_code
from ..kernel import Context, Kernel, KernelLaunch
from ..operands import attention_params, declare, refs

REDUCE_THREADS = 256
TILE = 256  # outputs per reduce block: whole q8_0 / q8_1 / q8_k blocks
MAX_SHARED = 32768  # bytes of static shared memory a partial kernel may use (scores or reduction)


def partial_threads(d: int, group: int) -> int:
    """Threads of the partial kernel: 256 (8 waves of 32, 4 of 64) unless the cross-wave reduction
    of G x D floats over half the waves would pass MAX_SHARED on a wave32 target; then 128."""
    return 256 if 4 * group * d * 4 <= MAX_SHARED else 128


def partial_kernel(d: int, group: int, chunk: int) -> Kernel:
    """The attention_partial kernel for head_dim d, group heads per K/V head and chunk positions."""
    if d % 8 or d <= 0:
        raise BuildError(f"attention_partial: head_dim {d} is not a multiple of 8 (16-byte K/V slices)")
    if d > 256 * 4:
        raise BuildError(f"attention_partial: head_dim {d} is over 1024")
    if chunk % PAGE or chunk <= 0:
        raise BuildError(f"attention_partial: chunk {chunk} is not whole {PAGE}-position pages")
    threads = partial_threads(d, group)
    waves32 = threads // 32
    shared = max(waves32 // 2 * group * d, group * chunk) * 4
    if shared > MAX_SHARED:
        raise BuildError(f"attention_partial: {group} heads per K/V head x head_dim {d} x chunk {chunk} need "
                         f"{shared} bytes of shared memory (at most {MAX_SHARED})")
    name = f"lp_attention_partial_d{d}_g{group}_c{chunk}"
    entry = (f"LP_KERNEL void __launch_bounds__({threads}) {name}({declare(attention_params('attention_partial'))}) {{ "
             f"lp_attention_partial<{d}, {group}, {chunk}, {threads}>(q, cache, seq, pages, pos, part, layer, npages, "
             "blocks, kv_heads, splits, window, scale); }")
    return Kernel(name, "attention_partial", "attention_decode.cu", entry, threads, ("load128",))


def reduce_kernel(fmt: str) -> Kernel:
    """attention_reduce (fmt f32) or attention_reduce_pack to fmt (every activation format: fused.cuh
    lp_store_tile)."""
    name = "lp_attention_reduce_f32" if fmt == "f32" else f"lp_attention_reduce_pack_{fmt}"
    params = declare(attention_params("attention_reduce"))
    entry = (f"LP_KERNEL void __launch_bounds__({REDUCE_THREADS}) {name}({params}) {{ lp_attention_reduce<{act_code(fmt)}, {TILE}>(part, out, rows, "
             "heads, d, splits); }")
    return Kernel(name, "attention_reduce", "attention_decode.cu", entry, REDUCE_THREADS)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    c = operands.attention(launch, ctx)
    if c.op == "attention_partial":
        grid = (grid_dim(c.splits), c.kv_heads, grid_dim(c.rows))
        return [KernelLaunch(partial_kernel(c.d, c.heads // c.kv_heads, c.chunk), grid, refs(c.args))]
    if c.op in ("attention_reduce", "attention_reduce_pack"):
        return [KernelLaunch(reduce_kernel(c.fmt), (grid_dim(c.heads * c.d, TILE), grid_dim(c.rows)), refs(c.args))]
    raise BuildError(f"attention_decode: no kernel for op {c.op}")
