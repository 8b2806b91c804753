"""RMSNorm, RMSNorm + pack, and pack (codegen/kernels/norm.cu): one block per row."""

from __future__ import annotations

from llmplan.core.formats import ACTIVATION_FORMATS
from llmplan.core.plan_records import Launch, grid_dim

from ..build import BuildError
from ..format_header import act_code
from ..kernel import Context, Kernel, KernelLaunch, scalar

PACK_FORMATS = tuple(f.lower() for f in ACTIVATION_FORMATS)  # the 8-bit block formats (common.cuh lp_pack_row)
THREADS = 256


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    op, a = launch.op, launch.attrs
    x, out = launch.args[0], launch.outs[0]
    rows, k = ctx.shape(x)
    grid = (grid_dim(rows),)
    if op == "rmsnorm":
        w = launch.args[1]
        name = "lp_rmsnorm_f32"
        entry = (f"LP_KERNEL void __launch_bounds__({THREADS}) {name}(const float* x, const float* w, float* y, "
                 "int k, int group, float eps) { lp_rmsnorm(x, w, y, k, group, eps); }")
        return [KernelLaunch(Kernel(name, "rmsnorm", "norm.cu", entry, THREADS), grid,
                       [x, w, out, scalar(k), scalar(ctx.shape(w)[0]), scalar(a["eps"], "f32")])]
    fmt = a["format"]
    if fmt not in PACK_FORMATS:
        raise BuildError(f"{op}: pack format {fmt} is not one of {', '.join(PACK_FORMATS)}")
    code = act_code(fmt)
    if op == "rmsnorm_pack":
        w = launch.args[1]
        name = f"lp_rmsnorm_pack_{fmt}"
        entry = (f"LP_KERNEL void __launch_bounds__({THREADS}) {name}(const float* x, const float* w, void* out, "
                 f"int rows, int k, float eps) {{ lp_rmsnorm_pack<{code}>(x, w, out, rows, k, eps); }}")
        return [KernelLaunch(Kernel(name, "rmsnorm_pack", "norm.cu", entry, THREADS), grid,
                       [x, w, out, scalar(rows), scalar(k), scalar(a["eps"], "f32")])]
    name = f"lp_pack_{fmt}"
    entry = (f"LP_KERNEL void __launch_bounds__({THREADS}) {name}(const float* x, void* out, int rows, int k) "
             f"{{ lp_pack<{code}>(x, out, rows, k); }}")
    return [KernelLaunch(Kernel(name, "pack", "norm.cu", entry, THREADS), grid, [x, out, scalar(rows), scalar(k)])]
