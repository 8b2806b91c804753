"""The routed experts' projections (codegen/kernels/experts.cu): ops matmul_experts and
matmul_experts_residual. Expert ids come from the device buffer the router writes, so a decode bucket is a
fixed launch sequence (graph replay and pipelined decode keep working: the ids change, the launches do not).

  1. lp_matmul_experts_<format>: grid (top * ceil(n / WAVES), rows), WAVES waves: one wave per output row of
     one slot's expert (as the mat-vec), the weight's planar planes over experts * n rows; args as
     codegen/operands.py's experts contract says, with y the slots' outputs [rows * top, n]: the op's
     output for matmul_experts, the scratch "matmul_experts.y" for matmul_experts_residual, whose
  2. lp_moe_sum_residual: grid (ceil(n / THREADS), rows), THREADS threads, adds the slots' weighted sum to
     the residual (args: the scratch, weights, r, out, n, top).

Each slot reads its expert's rows once: a step reads the routed experts' rows and no others (batched rows
that share an expert each read it; the grouping of rows by expert, on the device, is not done yet).
CPU twin: runtime/numpy_kernels.py experts."""

from __future__ import annotations

from llmplan.core.plan_records import Launch, Weight, grid_dim

from .. import operands
from ..format_header import weight_code
from ..kernel import Context, Kernel, KernelLaunch, scalar, scratch
from ..operands import declare, experts_params, refs
from .matvec import FORMATS, launch_bounds

WAVES = 4  # waves per block of launch 1, as the mat-vec
THREADS = 256  # of launch 2
SUM = "lp_moe_sum_residual"


def kernel(fmt: str, target) -> Kernel:
    name = f"lp_matmul_experts_{fmt.lower()}"
    threads = WAVES * target.wave
    entry = (f"LP_KERNEL void {launch_bounds(threads, target)} {name}({declare(experts_params(False))}) "
             f"{{ lp_matmul_experts<{weight_code(fmt)}>(x, w, ids, y, rows, k, n, experts, top, sliced); }}")
    return Kernel(name, "matmul_experts", "experts.cu", entry, threads,
                  ("dot4", "load128") if fmt != "F16" else ("load128",))


def sum_kernel() -> Kernel:
    entry = (f"LP_KERNEL void __launch_bounds__({THREADS}) {SUM}(const float* y, const float* weights, const float* r, "
             f"float* out, int n, int top) {{ lp_moe_weighted_sum(y, weights, r, out, n, top); }}")
    return Kernel(SUM, "matmul_experts_residual", "experts.cu", entry, THREADS)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    c = operands.experts(launch, ctx, FORMATS)
    grid = (c.top * grid_dim(c.n, WAVES), grid_dim(c.rows))
    if c.op == "matmul_experts":
        return [KernelLaunch(kernel(c.fmt, ctx.target), grid, refs(c.args(lambda fmt: "planar")))]
    ys = scratch("matmul_experts.y", "f32", [c.rows, c.top * c.n])
    v = c.values
    project = [v["x"], Weight(c.w.name, "planar"), v["ids"], ys, *(v[p] for p in ("rows", "k", "n", "experts", "top",
                                                                                  "sliced"))]
    return [KernelLaunch(kernel(c.fmt, ctx.target), grid, project),
            KernelLaunch(sum_kernel(), (grid_dim(c.n, THREADS), grid_dim(c.rows)),
                         [ys, v["weights"], v["r"], v["y"], scalar(c.n), scalar(c.top)])]
