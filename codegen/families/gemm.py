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

Launch geometry: block 2 * TW threads; grid (sum_i ceil(n_i / TW), ceil(rows / TR), S). The fix-up runs
on grid (ceil(sum n_i / 256), rows) with 256 threads. Shared memory is static (no dynamic bytes, no
opt-in): shared_bytes(member, formats), at most 45.5 KiB (Q2_K at 128x128), under every target's
default per-block limit (48 KiB CUDA, 64 KiB LDS gfx11/gfx942).

Weights are read in the "planar" relayout ({"weight": name, "layout": "planar"}: core/formats.planes of
the weight's format with rows = n, k = in features), activations in the arena's field planes.

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
from llmplan.core.op_traits import ops_of
from llmplan.core.plan_records import Buf, Launch, Ref, Weight, grid_dim

from ..format_header import weight_code
from ..kernel import Context, Kernel, KernelLaunch, scalar, scratch

SOURCE = "gemm.cu"
LAYOUT = "planar"
OPS = ops_of("matmul")


class WeightFormat(NamedTuple):
    """What the tiles take from core/formats.py for a weight format."""

    code: str  # formats.h
    block: int  # values per block
    sub: int  # values per integer sub-sum (per scale)
    has_min: bool
    act: str  # the activation format


# the weight formats the tiles read: every one but F32 and BF16 (no f32 / bf16 tiles are written)
WEIGHT_FORMATS: dict[str, WeightFormat] = {
    name.lower(): WeightFormat(weight_code(name), f.block, f.sub, f.has_min, ACTIVATION_FORMAT[name.lower()])
    for name, f in FORMATS.items() if name not in ("F32", "BF16")
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


class GemmError(ValueError):
    """A launch this family cannot serve (format, shape or member); the message says which."""


def parse_member(member: str) -> tuple[Member, int]:
    """'mma_128x128_k4' -> (MEMBERS['mma_128x128'], 4); no suffix means no split."""
    m = re.fullmatch(r"((?:mma|dot4)_\d+x\d+)(?:_k(\d+))?", member)
    if not m or m.group(1) not in MEMBERS:
        raise GemmError(f"gemm member {member!r} is not one of {', '.join(MEMBERS)} (optionally _k<splits>)")
    splits = int(m.group(2) or 1)
    if splits < 1:
        raise GemmError(f"gemm member {member!r}: splits must be at least 1")
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
    """The GEMM kernel for segment weight formats `formats` (1 to 3, one activation format)."""
    m = member if isinstance(member, Member) else parse_member(member)[0]
    if not 1 <= len(formats) <= 3:
        raise GemmError(f"gemm: {len(formats)} segments (1 to 3 supported)")
    for f in formats:
        if f not in WEIGHT_FORMATS:
            raise GemmError(f"gemm: weight format {f} is not supported (supported: {', '.join(WEIGHT_FORMATS)})")
    acts = {WEIGHT_FORMATS[f].act for f in formats}
    if len(acts) != 1:
        raise GemmError(f"gemm: segments {'/'.join(formats)} take different activation formats")
    if residual and len(formats) != 1:
        raise GemmError("gemm: a residual epilogue takes one segment")
    codes = [WEIGHT_FORMATS[f].code for f in formats]
    codes += [codes[0]] * (3 - len(codes))
    name = f"lp_gemm_{m.name}_{'_'.join(formats)}_res{int(residual)}{'_sk' if split else ''}"
    params, call = ["const void* x", "int rows", "int k"], ["x", "rows", "k"]
    for i in range(3):
        if i < len(formats):
            params += [f"const void* w{i}", f"int n{i}", f"float* o{i}"]
            call += [f"w{i}", f"n{i}", f"o{i}"]
        else:
            call += ["nullptr", "0", "nullptr"]
    if residual:
        params.append("const float* r")
    call.append("r" if residual else "nullptr")
    if split:
        params += ["float* ws", "int splits"]
    call += ["ws", "splits"] if split else ["nullptr", "1"]
    targs = [m.rows, m.cols, 0 if m.kind == "mma" else 1, *codes, len(formats), int(residual), int(split)]
    entry = (f"LP_KERNEL void __launch_bounds__({m.threads}) {name}({', '.join(params)}) "
             f"{{ lp_gemm<{', '.join(map(str, targs))}>({', '.join(call)}); }}")
    f16 = acts == {"f16"}
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


def _check_shapes(ctx: Context, x: Buf, weights: list[Weight]) -> tuple[tuple[str, ...], int]:
    formats = tuple(ctx.dtype(w) for w in weights)
    k = ctx.shape(x)[1]
    for w, f in zip(weights, formats):
        if f not in WEIGHT_FORMATS:
            raise GemmError(f"gemm: weight {w.name} format {f} is not supported "
                            f"(supported: {', '.join(WEIGHT_FORMATS)})")
        if ctx.shape(w)[1] != k:
            raise GemmError(f"gemm: weight {w.name} has {ctx.shape(w)[1]} inputs, the activation {k}")
        block, act = WEIGHT_FORMATS[f].block, WEIGHT_FORMATS[f].act
        if ctx.dtype(x) != act:
            raise GemmError(f"gemm: a {f} weight takes {act} activations, got {ctx.dtype(x)}")
        if k % (8 if f == "f16" else block):
            raise GemmError(f"gemm: k = {k} is not a multiple of {f}'s {8 if f == 'f16' else block}-value blocks")
    return formats, k


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    op = launch.op
    if op not in OPS:
        raise GemmError(f"gemm: op {op!r} is not a projection")
    member = launch.member
    if member in ("", "numpy"):
        member = default_member(ctx.target)
    m, splits = parse_member(member)
    if m.family in ctx.target.unsupported:
        raise GemmError(f"gemm member {m.name} has no kernel for {ctx.target.name}: "
                        f"{ctx.target.unsupported[m.family]}")
    args_in = launch.args
    x = args_in[0]
    residual = op == "matmul_residual"
    weights = _weights(launch)
    outs = list(launch.outs)
    formats, k = _check_shapes(ctx, x, weights)
    rows = ctx.shape(x)[0]
    ns = [ctx.shape(w)[0] for w in weights]
    split = splits > 1
    kern = kernel(m, formats, residual, split)
    args: list[Ref] = [x, scalar(rows), scalar(k)]
    for w, n, o in zip(weights, ns, outs):
        args += [Weight(w.name, LAYOUT), scalar(n), o]
    if residual:
        args.append(args_in[2])
    grid = (sum(grid_dim(n, m.cols) for n in ns), grid_dim(rows, m.rows), splits)
    if not split:
        return [KernelLaunch(kern, grid, args)]
    ws = scratch("gemm_splitk", "f32", [splits, rows, sum(ns)])
    args += [ws, scalar(splits)]
    fix_args: list[Ref] = [ws, scalar(splits), scalar(rows)]
    for n, o in zip(ns, outs):
        fix_args += [o, scalar(n)]
    if residual:
        fix_args.append(args_in[2])
    fix = fixup_kernel(len(weights), residual)
    return [KernelLaunch(kern, grid, args),
            KernelLaunch(fix, (grid_dim(sum(ns), FIXUP_THREADS), grid_dim(rows)), fix_args)]
