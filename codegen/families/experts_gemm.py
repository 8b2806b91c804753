"""Prefill's routed-expert projections as grouped GEMM tiles (codegen/kernels/experts.cu lp_gemm_experts on
gemm.cu's tiles): ops matmul_experts and matmul_experts_residual when a phase has more rows than the
mat-vec serves (plans/select.py family_module). The slots are grouped by expert and their activations
gathered on the device as for the grouped mat-vec (codegen/families/experts.py); then one GEMM per expert
over its rows, TR rows a tile.

Launches (member a GEMM tile of codegen/families/gemm.py, `<kind>_<TR>x<TW>`, no split over k):
  1. lp_moe_group and 2. lp_moe_gather_<activation>: experts.py's.
  3. lp_moe_tiles_<TR>: grid (1,), experts.GROUP_THREADS threads; args groups, the tile table, rows, top,
     MOST: each group cut into tiles of up to TR rows (expert, first gathered row, rows).
  4. lp_gemm_experts_<member>_<format>: grid (ceil(n / TW), MOST), 2 TW threads; args the gathered
     activations, the weight (planar, experts * n rows), groups, the tile table, y, rows, k, n, experts, top.
     Block (x, b) computes columns x TW .. of tile b; blocks past the tile count return.
  last, for matmul_experts_residual: lp_moe_sum_residual, experts.py's.
MOST = ceil(S / TR) + min(experts, S) for the phase's bound of S = rows * top slots: a group of c rows
takes ceil(c / TR) <= c / TR + 1 tiles, so the grid is fixed for a phase whatever the routing (the ids
change per step, the launches do not) and no host round trip sizes it.

Member "matvec": the grouped mat-vec (experts.py grouped_launches) instead, for the tune store to choose
where the groups are short. Without an entry the order is the heuristic: matrix-core tiles first (as the
dense GEMM), the tiles whose rows an expected group fills (rows * top / experts) before the larger ones,
the dot-product tile, the mat-vec last.

Numerics: a row's result is the dense GEMM tile's for that row (gemm.cu lp_gemm_acc, the k order fixed, no
split), whichever rows share its expert or its tile and whatever the chunk.

Scratch (codegen/kernel.py), beside experts.py's: "matmul_experts.tiles" i32 [1 + 3 MOST].
"""

from __future__ import annotations

from llmplan.core.plan_records import Launch, Weight, grid_dim

from ..build import BuildError
from ..format_header import weight_code
from ..kernel import Context, Kernel, KernelLaunch, scalar, scratch
from . import experts, gemm

MATVEC = "matvec"


def most_tiles(slots: int, tr: int, n_experts: int) -> int:
    """The most tiles `slots` slots make in groups of up to `tr` rows over `n_experts` experts."""
    return -(-slots // tr) + min(n_experts, slots)


def candidates(launch: Launch, ctx: Context) -> list[str]:
    c = experts.contract(launch, ctx)
    expected = ctx.bound(c.rows) * c.top / c.experts  # rows per expert, routing uniform
    tiles = [gemm.MEMBERS[m] for m in gemm.members(ctx.target)]
    filled = max(expected, min(m.rows for m in tiles))  # the tile rows a group is expected to fill
    return [m.name for m in sorted(tiles, key=lambda m: (m.kind != "mma", m.rows > filled))] + [MATVEC]


def kernel(member: gemm.Member, fmt: str) -> Kernel:
    name = f"lp_gemm_experts_{member.name}_{fmt.lower()}"
    kind = 0 if member.kind == "mma" else 1
    entry = (f"LP_KERNEL void __launch_bounds__({member.threads}) {name}(const void* xg, const void* w, "
             "const int* groups, const int* tiles, float* y, int rows, int k, int n, int experts, int top) "
             f"{{ lp_gemm_experts<{member.rows}, {member.cols}, {kind}, {weight_code(fmt)}>(xg, w, groups, tiles, y, "
             "rows, k, n, experts, top); }")
    f16 = fmt.upper() == "F16"
    expects = (("hmma",) if f16 else ("imma",)) if member.kind == "mma" else (() if f16 else ("dot4",))
    return Kernel(name, member.family, "experts.cu", entry, member.threads, expects)


def tiles_kernel(tr: int) -> Kernel:
    name = f"lp_moe_tiles_{tr}"
    threads = experts.GROUP_THREADS
    entry = (f"LP_KERNEL void __launch_bounds__({threads}) {name}(const int* groups, int* tiles, int rows, int top, "
             f"int most) {{ lp_moe_tiles<{tr}, {threads}>(groups, tiles, rows, top, most); }}")
    return Kernel(name, "matmul_experts", "experts.cu", entry, threads)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    c = experts.contract(launch, ctx)
    member = launch.member or candidates(launch, ctx)[0]
    if member == MATVEC:
        return experts.grouped_launches(c, ctx)
    m, splits = gemm.parse_member(member)
    if splits > 1 or m.family in ctx.target.unsupported:
        why = "a row's sums would depend on the split" if splits > 1 else ctx.target.unsupported[m.family]
        raise BuildError(f"expert GEMM member {member} has no kernel for {ctx.target.name}: {why}")
    v, y = c.values, experts.projected(c)
    most = most_tiles(ctx.bound(c.rows) * c.top, m.rows, c.experts)
    group, groups, xg = experts.grouping(c)
    tiles = scratch("matmul_experts.tiles", "i32", [1 + 3 * most])
    cut = KernelLaunch(tiles_kernel(m.rows), (1,), [groups, tiles, v["rows"], v["top"], scalar(most)])
    project = KernelLaunch(kernel(m, c.fmt), (grid_dim(c.n, m.cols), most),
                           [xg, Weight(c.w.name, "planar"), groups, tiles, y,
                            *(v[p] for p in ("rows", "k", "n", "experts", "top"))])
    return [*group, cut, project, *experts.summed(c, y)]
