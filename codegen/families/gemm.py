"""Prefill projections (codegen/kernels/gemm.cu): matmul, matmul_segmented and matmul_residual when the
activation has many rows (a prefill chunk), as tiled GEMMs on integer matrix cores.

What it computes: out[rows, n] = x . dequantize(W)^T (+ r for matmul_residual; one output per weight
for matmul_segmented, up to three weights, each in its own format), the CPU twin's
(runtime/numpy_kernels.py matmul) sums up to float accumulation order: integer sub-block dot products
(exact) scaled by the weight's and activation's block scales, weight mins through the activation's
block sums. F16 weights (f16 activations) use f16 matrix cores with f32 accumulators.

Members (`launch.member`, grammar `<kind>_<TR>x<TW>[_k<splits>]`):
  mma_128x128, mma_64x128, mma_64x64  family "gemm_mma": TR activation rows x TW weight rows per block on
      mma.sync m16n8k32 / m16n8k16 s8 (sm_80+) or WMMA iu8 16x16x16 (gfx11); F16 weights on f16 m16n8k16 /
      WMMA f16. expects "imma" ("hmma" for F16). gfx942 declares the family unsupported (no MFMA yet).
  dot4_64x64  family "gemm_dot4": the same tiles and loaders with lp_dot4 micro-tiles (8 rows x 4
      weights per thread); every target builds it. expects "dot4" (none for F16: plain f32 FMAs).
  A `_k<S>` suffix (S >= 2) splits k over S blocks in z: each writes its partial float tile to a
  workspace and a second kernel, lp_gemm_fixup_seg<N>_res<R> (family "gemm_fixup"), sums the S partials
  and applies the epilogue (segment outputs, residual add).

The same tiles (gemm.cu lp_gemm_acc) run a mixture of experts' prefill, one GEMM per expert over its
gathered rows: codegen/families/experts_gemm.py.

Launch geometry: block 2 * TW threads; grid (sum_i ceil(n_i / TW), ceil(rows / TR), S). The fix-up runs
on grid (ceil(sum n_i / 256), rows) with 256 threads. Shared memory is static (no dynamic bytes, no
opt-in): shared_bytes(member, formats), at most 45.5 KiB (Q2_K at 128x128), under every target's
default per-block limit (48 KiB CUDA, 64 KiB LDS gfx11/gfx942).

Operands and arguments as codegen/operands.py's projection contract says, then, for a split launch, the
workspace and the split count; weights are read in the "planar" relayout (core/formats.planes of the
weight's format with rows = n, k = in features), activations in the arena's field planes.

The workspace of a split launch is not a value of the graph: it is a scratch reference (codegen/kernel.py
scratch) {"scratch": "gemm_splitk", "dtype": "f32", "shape": [S, rows, sum n_i]}, the same dict in both
launches; no initialization needed (every split writes its whole partial tile, zeros where its k range
is empty).

Why it is fast: prefill is compute-bound. The k loop runs on matrix cores from XOR-swizzled shared
memory tiles (conflict-free fragment loads), integer sums reach float without conversion instructions,
and the next k-tile's 16-byte global loads are in flight while the current tile is multiplied; the
weights stay quantized in memory (the unpacking to int8 happens per tile in shared memory).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from llmplan.core.formats import ACTIVATION_FORMAT, FORMATS
from llmplan.core.plan_records import Launch, Ref, Weight, grid_dim

from .. import operands
from ..build import BuildError
from ..format_header import weight_code
from ..kernel import Context, Kernel, KernelLaunch, scalar, scratch
from ..operands import declare, projection_params, refs
from . import matvec

SOURCE = "gemm.cu"
SPLIT_PARAMS = (("float*", "ws"), ("int", "splits"))


class WeightFormat(NamedTuple):
    """What the tiles take from core/formats.py for a weight format."""

    code: str  # formats.h
    block: int  # values per block
    sub: int  # values per integer sub-sum (per scale)
    has_min: bool
    act: str  # the activation format


# the weight formats the tiles read: the mat-vec's (no f32 / bf16 tiles are written)
WEIGHT_FORMATS: dict[str, WeightFormat] = {
    name.lower(): WeightFormat(weight_code(name), FORMATS[name].block, FORMATS[name].sub, FORMATS[name].has_min,
                               ACTIVATION_FORMAT[name.lower()])
    for name in matvec.FORMATS
}

FIXUP_THREADS = 256
MAX_SPLITS = 8
MIN_SPLIT_K = 1024  # inputs per split: fewer leave too few k-tiles to hide the loads behind the products


@dataclass(frozen=True)
class Member:
    kind: str  # "mma" or "dot4"
    rows: int  # TR: activation rows per block
    cols: int  # TW: weight rows (output columns) per block

    @property
    def name(self) -> str:
        return f"{self.kind}_{self.rows}x{self.cols}"

    @property
    def family(self) -> str:
        return "gemm_mma" if self.kind == "mma" else "gemm_dot4"

    @property
    def threads(self) -> int:
        return 2 * self.cols


MEMBERS: dict[str, Member] = {m.name: m for m in [
    Member("mma", 128, 128), Member("mma", 64, 128), Member("mma", 64, 64), Member("dot4", 64, 64)]}


def parse_member(member: str) -> tuple[Member, int]:
    """'mma_128x128_k4' -> (MEMBERS['mma_128x128'], 4); no suffix means no split."""
    m = re.fullmatch(r"((?:mma|dot4)_\d+x\d+)(?:_k(\d+))?", member)
    if not m or m.group(1) not in MEMBERS:
        raise BuildError(f"gemm member {member!r} is not one of {', '.join(MEMBERS)} (optionally _k<splits>)")
    splits = int(m.group(2) or 1)
    if splits < 1:
        raise BuildError(f"gemm member {member!r}: splits must be at least 1")
    return MEMBERS[m.group(1)], splits


def members(target) -> list[str]:
    """The members `target` builds (without split suffixes)."""
    return [n for n, m in MEMBERS.items() if m.family not in target.unsupported]


def candidates(launch: Launch, ctx: Context) -> list[str]:
    """Every member the target builds, in the heuristic's order (largest tile first), each split over k
    until its blocks cover the device's multiprocessors once: a prefill chunk is short, so a 128x128 tile
    over a 4096-wide projection of 256 rows makes only 64 blocks for an H100's 132."""
    x, weights = launch.args[0], _weights(launch)
    rows, k = ctx.bound(ctx.shape(x)[0]), ctx.shape(x)[1]
    ns = [ctx.shape(w)[0] for w in weights]
    out = []
    for name in members(ctx.target):
        m = MEMBERS[name]
        tiles = sum(-(-n // m.cols) for n in ns) * -(-rows // m.rows)
        splits = min(MAX_SPLITS, -(-ctx.multiprocessors // tiles), k // MIN_SPLIT_K)
        out.append(name if splits < 2 else f"{name}_k{splits}")
    return out


def _weights(launch: Launch) -> list[Weight]:
    args = launch.args
    return list(args[1:]) if launch.op == "matmul_segmented" else [args[1]]


def default_member(target) -> str:
    """The heuristic when the planner names no member: matrix cores where the target has them."""
    return "mma_128x128" if "gemm_mma" not in target.unsupported else "dot4_64x64"


def shared_bytes(member: str | Member, formats: list[str] | tuple[str, ...]) -> int:
    """Static shared memory of the member's kernel for these segment formats (gemm.cu LpGemmSmem, the
    largest over segments); dynamic shared memory is always 0."""
    m = member if isinstance(member, Member) else parse_member(member)[0]
    out = 0
    for fmt in formats:
        _, _, sub, has_min, act = WEIGHT_FORMATS[fmt]
        nsb = 0 if act == "f16" else 128 // sub
        nxd = 0 if act == "f16" else (1 if act == "q8_k" else 4)
        b = (m.cols + m.rows) * 128 + m.cols * nsb * 4 * (2 if has_min else 1) + m.rows * nxd * 4
        b += m.rows * nsb * 4 if has_min else 0
        out = max(out, b)
    return out


def kernel(member: str | Member, formats: tuple[str, ...], residual: bool = False, split: bool = False) -> Kernel:
    """The GEMM kernel for segment weight formats `formats` (1 to 3, one activation format: the contract's
    check)."""
    m = member if isinstance(member, Member) else parse_member(member)[0]
    assert 1 <= len(formats) <= 3 and not (residual and len(formats) > 1)
    codes = [WEIGHT_FORMATS[f].code for f in formats]
    codes += [codes[0]] * (3 - len(codes))
    name = f"lp_gemm_{m.name}_{'_'.join(formats)}_res{int(residual)}{'_sk' if split else ''}"
    call = ["x", "rows", "k"]
    for i in range(3):
        call += [f"w{i}", f"n{i}", f"y{i}"] if i < len(formats) else ["nullptr", "0", "nullptr"]
    call += ["r" if residual else "nullptr", *(["ws", "splits"] if split else ["nullptr", "1"])]
    params = declare((*projection_params(len(formats), residual), *(SPLIT_PARAMS if split else ())))
    targs = [m.rows, m.cols, 0 if m.kind == "mma" else 1, *codes, len(formats), int(residual), int(split)]
    entry = (f"LP_KERNEL void __launch_bounds__({m.threads}) {name}({params}) "
             f"{{ lp_gemm<{', '.join(map(str, targs))}>({', '.join(call)}); }}")
    f16 = WEIGHT_FORMATS[formats[0]].act == "f16"
    expects = (("hmma",) if f16 else ("imma",)) if m.kind == "mma" else (() if f16 else ("dot4",))
    return Kernel(name, m.family, SOURCE, entry, m.threads, expects)


def fixup_kernel(segments: int, residual: bool) -> Kernel:
    name = f"lp_gemm_fixup_seg{segments}_res{int(residual)}"
    params = ["const float* ws", "int splits", "int rows"]
    call = ["ws", "splits", "rows"]
    for i in range(3):
        if i < segments:
            params += [f"float* o{i}", f"int n{i}"]
            call += [f"o{i}", f"n{i}"]
        else:
            call += ["nullptr", "0"]
    if residual:
        params.append("const float* r")
    call.append("r" if residual else "nullptr")
    entry = (f"LP_KERNEL void __launch_bounds__({FIXUP_THREADS}) {name}({', '.join(params)}) "
             f"{{ lp_gemm_fixup<{segments}, {int(residual)}>({', '.join(call)}); }}")
    return Kernel(name, "gemm_fixup", SOURCE, entry, FIXUP_THREADS)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    c = operands.projection(launch, ctx, matvec.FORMATS, matvec.piece)
    member = launch.member
    if member in ("", "numpy"):
        member = default_member(ctx.target)
    m, splits = parse_member(member)
    if m.family in ctx.target.unsupported:
        raise BuildError(f"gemm member {m.name} has no kernel for {ctx.target.name}: "
                         f"{ctx.target.unsupported[m.family]}")
    residual = c.residual is not None
    kern = kernel(m, tuple(f.lower() for f in c.formats), residual, splits > 1)
    args = refs(c.args(lambda fmt: "planar"))
    grid = (sum(grid_dim(n, m.cols) for n in c.ns), grid_dim(c.rows, m.rows), splits)
    if splits == 1:
        return [KernelLaunch(kern, grid, args)]
    ws = scratch("gemm_splitk", "f32", [splits, c.rows, sum(c.ns)])
    fix_args: list[Ref] = [ws, scalar(splits), scalar(c.rows)]
    for n, o in zip(c.ns, c.outs):
        fix_args += [o, scalar(n)]
    fix_args += [c.residual] if residual else []
    fix = fixup_kernel(len(c.ns), residual)
    return [KernelLaunch(kern, grid, [*args, ws, scalar(splits)]),
            KernelLaunch(fix, (grid_dim(sum(c.ns), FIXUP_THREADS), grid_dim(c.rows)), fix_args)]
