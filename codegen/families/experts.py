"""The routed experts' projections (codegen/kernels/experts.cu): ops matmul_experts and
matmul_experts_residual. Expert ids come from the device buffer the router writes, so a decode bucket is a
fixed launch sequence (graph replay and pipelined decode keep working: the ids change, the launches do not).

One row a step (decode): each slot reads its expert's rows once, which are then the routed experts' rows
and no others.
  1. lp_matmul_experts_<format>: grid (top * ceil(n / WAVES), rows), WAVES waves: one wave per output row
     of one slot's expert (as the mat-vec), the weight's planar planes over experts * n rows; args as
     codegen/operands.py's experts contract says, y the slots' outputs [rows * top, n].
More rows (decode-batch; a prefill chunk takes experts_gemm.py's grouped GEMM, which reuses the grouping
and the sum below, unless the tune store chose this mat-vec there): the slots are grouped by expert on the
device, so one pass over an expert's rows serves up to COLUMNS of the rows routed to it.
  1. lp_moe_group: grid (1,), GROUP_THREADS threads; args ids, the groups scratch, rows, experts, top.
  2. lp_moe_gather_<activation>: grid (top, rows), GROUP_THREADS threads; args x, groups, the gathered
     activations' scratch [rows, top * k] (each slot's row, in group order), rows, k, top, sliced.
  3. lp_matmul_experts_grouped_<format>: grid (top * ceil(n / WAVES), rows), WAVES waves; args the gathered
     activations, the weight, groups, y, rows, k, n, experts, top.
Then for matmul_experts_residual, whose y is the scratch "matmul_experts.y":
  last. lp_moe_sum_residual: grid (ceil(n / SUM_THREADS), rows); args y, weights, r, out, n, top: the slots'
     weighted sum added to the residual.

Scratch (codegen/kernel.py): "matmul_experts.groups" i32 [rows, 4 top + 2] (group_ints: the group count,
each group's expert and first position, the slots in group order, each slot's position),
"matmul_experts.x" in x's activation format [rows, top * k], "matmul_experts.y" f32 [rows, top * n].
CPU twin: runtime/numpy_kernels.py experts.
"""

from __future__ import annotations

from llmplan.core.formats import ACTIVATION_FORMAT
from llmplan.core.plan_records import Launch, Ref, Scratch, Weight, grid_dim

from .. import operands
from ..format_header import act_code, weight_code
from ..kernel import Context, Kernel, KernelLaunch, scalar
from ..operands import MAX_EXPERTS, declare, experts_params
from .matvec import FORMATS, MAX_COLUMNS, launch_bounds, piece

WAVES = 4  # waves per block of the projections, as the mat-vec
COLUMNS = MAX_COLUMNS  # a group's activation rows one pass over an expert's row serves
GROUP_THREADS = 256  # of the grouping and the gather
SUM_THREADS = 256
SUM = "lp_moe_sum_residual"
GROUP = "lp_moe_group"
EXPECTS = {True: ("dot4", "load128"), False: ("load128",)}  # quantized or F16 weights


def kernel(fmt: str, target) -> Kernel:
    name = f"lp_matmul_experts_{fmt.lower()}"
    threads = WAVES * target.wave
    entry = (f"LP_KERNEL void {launch_bounds(threads, target)} {name}({declare(experts_params(False))}) "
             f"{{ lp_matmul_experts<{weight_code(fmt)}>(x, w, ids, y, rows, k, n, experts, top, sliced); }}")
    return Kernel(name, "matmul_experts", "experts.cu", entry, threads, EXPECTS[fmt != "F16"])


def grouped_kernel(fmt: str, target) -> Kernel:
    name = f"lp_matmul_experts_grouped_{fmt.lower()}"
    threads = WAVES * target.wave
    entry = (f"LP_KERNEL void {launch_bounds(threads, target)} {name}(const void* xg, const void* w, const int* groups, "
             f"float* y, int rows, int k, int n, int experts, int top) {{ lp_matmul_experts_grouped<{weight_code(fmt)}, "
             f"{COLUMNS}>(xg, w, groups, y, rows, k, n, experts, top); }}")
    return Kernel(name, "matmul_experts", "experts.cu", entry, threads, EXPECTS[fmt != "F16"])


def group_kernel() -> Kernel:
    entry = (f"LP_KERNEL void __launch_bounds__({GROUP_THREADS}) {GROUP}(const int* ids, int* groups, int rows, "
             f"int experts, int top) {{ lp_moe_group<{GROUP_THREADS}, {MAX_EXPERTS}>(ids, groups, rows, experts, top); }}")
    return Kernel(GROUP, "matmul_experts", "experts.cu", entry, GROUP_THREADS)


def gather_kernel(act: str) -> Kernel:
    name = f"lp_moe_gather_{act}"
    entry = (f"LP_KERNEL void __launch_bounds__({GROUP_THREADS}) {name}(const void* x, const int* groups, void* xg, "
             f"int rows, int k, int top, int sliced) {{ lp_moe_gather<{act_code(act)}, {GROUP_THREADS}>(x, groups, xg, "
             "rows, k, top, sliced); }")
    return Kernel(name, "matmul_experts", "experts.cu", entry, GROUP_THREADS)


def sum_kernel() -> Kernel:
    entry = (f"LP_KERNEL void __launch_bounds__({SUM_THREADS}) {SUM}(const float* y, const float* weights, "
             f"const float* r, float* out, int n, int top) {{ lp_moe_weighted_sum(y, weights, r, out, n, top); }}")
    return Kernel(SUM, "matmul_experts_residual", "experts.cu", entry, SUM_THREADS)


def contract(launch: Launch, ctx: Context) -> operands.Experts:
    """The launch's operands, checked against what the expert kernels read (mat-vec and GEMM alike)."""
    return operands.experts(launch, ctx, FORMATS, piece)


def projected(c: operands.Experts) -> Ref:
    """Where the projections write: y, or for matmul_experts_residual the slots' scratch its sum reads."""
    return c.grouping()[2] if c.op == "matmul_experts_residual" else c.values["y"]


def grouping(c: operands.Experts) -> tuple[list[KernelLaunch], Scratch, Scratch]:
    """The launches that group the slots by expert and gather their activation rows in group order, and
    the groups and gathered rows' scratch they write."""
    v = c.values
    act = ACTIVATION_FORMAT[c.fmt.lower()]
    groups, xg, _ = c.grouping()
    return ([KernelLaunch(group_kernel(), (1,), [v["ids"], groups, v["rows"], v["experts"], v["top"]]),
             KernelLaunch(gather_kernel(act), (c.top, grid_dim(c.rows)),
                          [v["x"], groups, xg, v["rows"], v["k"], v["top"], v["sliced"]])], groups, xg)


def summed(c: operands.Experts, y: Ref) -> list[KernelLaunch]:
    """matmul_experts_residual's weighted sum of the slots' projections y into its output; none for
    matmul_experts."""
    if c.op != "matmul_experts_residual":
        return []
    v = c.values
    return [KernelLaunch(sum_kernel(), (grid_dim(c.n, SUM_THREADS), grid_dim(c.rows)),
                         [y, v["weights"], v["r"], v["y"], scalar(c.n), scalar(c.top)])]


def grouped_launches(c: operands.Experts, ctx: Context) -> list[KernelLaunch]:
    """More rows than one: the slots grouped, their rows gathered, the grouped mat-vec, the sum."""
    v, y = c.values, projected(c)
    group, groups, xg = grouping(c)
    project = KernelLaunch(grouped_kernel(c.fmt, ctx.target), (c.top * grid_dim(c.n, WAVES), grid_dim(c.rows)),
                           [xg, Weight(c.w.name, "planar"), groups, y, *(v[p] for p in ("rows", "k", "n", "experts", "top"))])
    return [*group, project, *summed(c, y)]


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    c = contract(launch, ctx)
    if ctx.bound(c.rows) > 1:
        return grouped_launches(c, ctx)
    v, y = c.values, projected(c)
    grid = (c.top * grid_dim(c.n, WAVES), grid_dim(c.rows))
    return [KernelLaunch(kernel(c.fmt, ctx.target), grid,
                         [v["x"], Weight(c.w.name, "planar"), v["ids"], y,
                          *(v[p] for p in ("rows", "k", "n", "experts", "top", "sliced"))]),
            *summed(c, y)]
