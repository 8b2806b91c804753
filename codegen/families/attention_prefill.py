"""Prefill attention (codegen/kernels/flash_attention.cu): op `attention` over the f16 K/V cache.

What it computes: core/numerics.py attention, the CPU twin's (runtime/numpy_kernels.py attention):
causal attention of every query row over its own sequence's cache positions [first, pos] (sliding
window when window > 0), read through the sequence's row of the page table (position p in block
pages[seq, p // PAGE], offset p % PAGE), query head h reading K/V head h // (heads / kv_heads); Q
rounded to f16, scores in f32 times scale, softmax weights rounded to f16 where they meet V. Online
softmax (flash) differs from the twin's softmax over 256-position slices only in rounding order.

Members (`launch.member`):
  flash  family "flash_attention", lp_attention_flash_d<D>: f16 matrix cores (mma.sync m16n8k16 on sm_80+,
      WMMA f16 16x16x16 on gfx11), expects "hmma". Head dims 64, 128, 256. A block serves one K/V head
      and BQ = 16 * NW query vectors (BQ // G rows x the G = heads / kv_heads query heads sharing it):
      block 32 * NW threads, grid (ceil(rows / (BQ // G)), kv_heads). D=64: NW 4, BKV 64; D=128: NW 4,
      BKV 32; D=256: NW 2, BKV 16 (K/V tile positions: whole 16-position pages, gathered through the
      page table). gfx942 declares the family unsupported.
  rows   family "attention_rows", lp_attention_rows_d<D>: no matrix cores, every target. Block 128 threads
      per (row, query head), grid (rows, heads); head dims that are a multiple of the wave width, <= 256.
Shared memory is static (no dynamic bytes): shared_bytes(member, head_dim, wave).

Operands and arguments as codegen/operands.py's attention contract says (the page table is [seqs,
pages], the cache [layers, 2, blocks, PAGE, kv_heads * D]).

Why it is fast: attention over a prefill chunk is compute-bound; the flash member reads each K/V tile
once for BQ query vectors (all query heads of a GQA group together), keeps the scores in registers and
runs both products on matrix cores, and its waves skip tiles outside their rows' causal ranges.
"""

from __future__ import annotations

from llmplan.core.numerics import PAGE
from llmplan.core.plan_records import Launch, grid_dim

from .. import operands
from ..build import BuildError
from ..kernel import Context, Kernel, KernelLaunch
from ..operands import attention_params, declare, refs

SOURCE = "flash_attention.cu"
FLASH = {64: (4, 64), 128: (4, 32), 256: (2, 16)}  # head dim -> (waves, K/V positions per tile)
ROWS_THREADS = 128
MEMBERS = ("flash", "rows")


def flash_rows_per_block(head_dim: int, group: int) -> int:
    """Query rows per flash block: the block's 16 * NW query vectors hold every head of the group."""
    return 16 * FLASH[head_dim][0] // group


def members(target, head_dim: int, group: int = 1) -> list[str]:
    """The members `target` builds for this head dim and GQA group size."""
    out = []
    if ("flash_attention" not in target.unsupported and head_dim in FLASH
            and flash_rows_per_block(head_dim, group) >= 1):
        out.append("flash")
    if head_dim % target.wave == 0 and head_dim <= 256:
        out.append("rows")
    return out


def shared_bytes(member: str, head_dim: int, wave: int = 32) -> int:
    """Static shared memory of the member's kernel (flash_attention.cu); dynamic shared memory is 0."""
    if member == "flash":
        nw, bkv = FLASH[head_dim]
        bq, qw, vw = 16 * nw, head_dim // 2 + 4, bkv // 2 + 4
        return 4 * (bq * qw + bkv * qw + head_dim * vw + 3 * bq + nw + 2 * bkv // PAGE)
    nwr = ROWS_THREADS // wave
    return 4 * (head_dim + 2 * nwr + nwr * head_dim)


_PARAMS = declare(attention_params("attention"))
_CALL = ", ".join(name for _, name in attention_params("attention"))


def kernel(member: str, head_dim: int) -> Kernel:
    if member == "flash":
        if head_dim not in FLASH:
            raise BuildError(f"flash attention: head dim {head_dim} (supported: {', '.join(map(str, FLASH))})")
        threads = 32 * FLASH[head_dim][0]
        name = f"lp_attention_flash_d{head_dim}"
        entry = (f"LP_KERNEL void __launch_bounds__({threads}) {name}({_PARAMS}) "
                 f"{{ lp_attention_flash<{head_dim}>({_CALL}); }}")
        return Kernel(name, "flash_attention", SOURCE, entry, threads, ("hmma",))
    if member == "rows":
        if head_dim % 32 or head_dim > 256:
            raise BuildError(f"row attention: head dim {head_dim} must be a multiple of 32 up to 256")
        name = f"lp_attention_rows_d{head_dim}"
        entry = (f"LP_KERNEL void __launch_bounds__({ROWS_THREADS}) {name}({_PARAMS}) "
                 f"{{ lp_attention_rows<{head_dim}>({_CALL}); }}")
        return Kernel(name, "attention_rows", SOURCE, entry, ROWS_THREADS)
    raise BuildError(f"attention member {member!r} is not one of {', '.join(MEMBERS)}")


def candidates(launch: Launch, ctx: Context) -> list[str]:
    """The members for this launch's head dim and group, matrix cores first."""
    a = launch.attrs
    d = ctx.shape(launch.args[0])[1] // a["heads"]
    return members(ctx.target, d, a["heads"] // a["kv_heads"])


def default_member(target, head_dim: int, group: int) -> str:
    avail = members(target, head_dim, group)
    if not avail:
        raise BuildError(f"attention: no member for head dim {head_dim} on {target.name}")
    return avail[0]


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    c = operands.attention(launch, ctx)
    if c.op != "attention":
        raise BuildError(f"prefill attention: op {c.op!r} is not attention")
    group = c.heads // c.kv_heads
    member = launch.member
    if member in ("", "numpy"):
        member = default_member(ctx.target, c.d, group)
    if member not in MEMBERS:
        raise BuildError(f"attention member {member!r} is not one of {', '.join(MEMBERS)}")
    if member not in members(ctx.target, c.d, group):
        raise BuildError(f"attention member {member!r} has no kernel for head dim {c.d}, group {group} on "
                         f"{ctx.target.name}" + (f": {ctx.target.unsupported['flash_attention']}"
                                                 if member == "flash" and "flash_attention" in
                                                 ctx.target.unsupported else ""))
    if member == "flash":
        grid = (grid_dim(c.rows, flash_rows_per_block(c.d, group)), c.kv_heads)
    else:
        grid = (grid_dim(c.rows), c.heads)
    return [KernelLaunch(kernel(member, c.d), grid, refs(c.args))]
