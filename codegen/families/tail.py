"""The fused tail (codegen/kernels/tail.cu): op `tail_argmax`, the greedy next token of each row:
argmax(pack[format](rmsnorm[eps](x, norm)) . head^T), one int32 per row.

The head is the largest weight a decode step reads: launch 2 reads it once, as the mat-vec reads a
weight, and keeps only one (logit, index) pair per block and row, so no logits reach memory. CPU
twin: runtime/numpy_kernels.py tail_argmax. Three launches:
  1. lp_tail_pack_<format>: grid (rows,), THREADS threads; args x, norm, the packed scratch, rows, k, eps.
  2. lp_tail_logits_<head format>_c<C>: grid (ceil(vocab / SLICE), ceil(rows / C)), WAVES waves (as the
     mat-vec); args the packed scratch, the head ({"weight": name, "layout": "planar"}), the pairs
     scratch, rows, k, vocab, SLICE.
  3. lp_tail_argmax_reduce: grid (rows,), THREADS threads; args the pairs scratch, out, the block count
     of launch 2.

Two scratch buffers (codegen/kernel.py scratch; packed formats laid out as field planes, as an arena
value of that type) carry values between the launches:
  "tail_argmax.x"     dtype the activation format, shape [rows, k]: launch 1 -> launch 2;
  "tail_argmax.part"  dtype "f32", shape [rows, blocks, 2]: (f32 logit, i32 index bits) pairs,
                      launch 2 -> launch 3.

Members: "c1".."c8", the activation rows one pass over the head serves (as matvec.columns).
"""

from __future__ import annotations

from typing import Any

from llmplan.core.formats import ACTIVATION_FORMAT, ACTIVATIONS
from llmplan.core.plan_records import Launch, Weight, grid_dim

from .. import operands
from ..format_header import act_code, weight_code
from ..kernel import Context, Kernel, KernelLaunch, scalar, scratch
from .matvec import FORMATS, columns, launch_bounds, piece
from .matvec import candidates as candidates  # the head is read as a mat-vec weight: the same column rule

THREADS = 256
WAVES = 4  # waves per block of launch 2, as the mat-vec
SLICE = 64  # vocabulary rows per block of launch 2: ~2000 blocks for a 128K vocabulary (enough waves to
# keep the head streaming), while the pairs scratch stays 1/64 of the logits
# the activations the heads take (as the mat-vec's weights) -> their codes
ACT_CODES = {a: act_code(a) for a in ACTIVATIONS if a in {ACTIVATION_FORMAT[f.lower()] for f in FORMATS}}
REDUCE = "lp_tail_argmax_reduce"


def pack_kernel(act: str) -> Kernel:
    name = f"lp_tail_pack_{act}"
    entry = (f"LP_KERNEL void __launch_bounds__({THREADS}) {name}(const float* x, const float* norm, void* out, "
             f"int rows, int k, float eps) {{ lp_tail_pack<{ACT_CODES[act]}>(x, norm, out, rows, k, eps); }}")
    return Kernel(name, "tail_argmax", "tail.cu", entry, THREADS)


def logits_kernel(fmt: str, c: int, target: Any) -> Kernel:
    name = f"lp_tail_logits_{fmt.lower()}_c{c}"
    threads = WAVES * target.wave
    entry = (f"LP_KERNEL void {launch_bounds(threads, target)} {name}(const void* x, const void* head, LpBest* part, "
             f"int rows, int k, int vocab, int slice) "
             f"{{ lp_tail_logits<{weight_code(fmt)}, {c}>(x, head, part, rows, k, vocab, slice); }}")
    expects = ("dot4", "load128") if fmt != "F16" else ("load128",)
    return Kernel(name, "tail_argmax", "tail.cu", entry, threads, expects)


def reduce_kernel() -> Kernel:
    entry = (f"LP_KERNEL void __launch_bounds__({THREADS}) {REDUCE}(const LpBest* part, int* out, int blocks) "
             f"{{ lp_tail_reduce(part, out, blocks); }}")
    return Kernel(REDUCE, "tail_argmax", "tail.cu", entry, THREADS)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    t = operands.tail(launch, ctx, FORMATS, piece)
    c = columns(launch.member, t.rows)
    blocks = -(-t.vocab // SLICE)
    packed = scratch("tail_argmax.x", t.act, [t.rows, t.k])
    part = scratch("tail_argmax.part", "f32", [t.rows, blocks, 2])
    return [
        KernelLaunch(pack_kernel(t.act), (grid_dim(t.rows),),
                     [t.x, t.norm, packed, scalar(t.rows), scalar(t.k), scalar(t.eps, "f32")]),
        KernelLaunch(logits_kernel(t.fmt, c, ctx.target), (blocks, grid_dim(t.rows, c)),
                     [packed, Weight(t.head.name, "planar"), part, scalar(t.rows), scalar(t.k), scalar(t.vocab),
                      scalar(SLICE)]),
        KernelLaunch(reduce_kernel(), (grid_dim(t.rows),), [part, t.out, scalar(blocks)]),
    ]
