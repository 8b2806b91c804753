"""RMSNorm, RMSNorm + pack, and pack on the CPU (codegen/cpu/norm.h): ops rmsnorm, rmsnorm_pack, pack.

One call per launch, rows split over the pool. Arguments: rmsnorm (x, w, y, rows, k, group, eps);
rmsnorm_pack (x, w, out, rows, k, eps); pack (x, out, rows, k). Output formats: q8_0, q8_1, q8_k (field
planes), f16, bf16, f32 values.
"""

from __future__ import annotations

from llmplan.core.formats import ACTIVATIONS, PACK_BLOCK
from llmplan.core.plan_records import Launch

from ..build import BuildError
from ..format_header import act_code
from ..kernel import Context, Kernel, KernelLaunch, scalar

FORMATS = ACTIVATIONS  # the output formats (rows.h pack_row)


def out_format(fmt: str, k: int, what: str) -> str:
    """The code of output format `fmt` for rows of k values."""
    if fmt not in FORMATS:
        raise BuildError(f"{what}: output format {fmt} is not one of {', '.join(FORMATS)}")
    if k % PACK_BLOCK.get(fmt, 1):
        raise BuildError(f"{what}: rows of {k} values are not whole {fmt} blocks")
    return act_code(fmt)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    op, a = launch.op, launch.attrs
    x, out = launch.args[0], launch.outs[0]
    rows, k = ctx.shape(x)
    if op == "rmsnorm":
        w = launch.args[1]
        entry = ("LP_KERNEL void lp_cpu_rmsnorm_f32(const float* x, const float* w, float* y, int rows, int k, "
                 "int group, float eps) { lp_cpu::rmsnorm(x, w, y, rows, k, group, eps); }")
        return [KernelLaunch(Kernel("lp_cpu_rmsnorm_f32", "rmsnorm", "norm.h", entry, 0), (1,),
                       [x, w, out, scalar(rows), scalar(k), scalar(ctx.shape(w)[0]), scalar(a["eps"], "f32")])]
    fmt = a["format"]
    code = out_format(fmt, k, op)
    if op == "rmsnorm_pack":
        name = f"lp_cpu_rmsnorm_pack_{fmt}"
        entry = (f"LP_KERNEL void {name}(const float* x, const float* w, void* out, int rows, int k, float eps) "
                 f"{{ lp_cpu::rmsnorm_pack<{code}>(x, w, out, rows, k, eps); }}")
        return [KernelLaunch(Kernel(name, "rmsnorm_pack", "norm.h", entry, 0), (1,),
                       [x, launch.args[1], out, scalar(rows), scalar(k), scalar(a["eps"], "f32")])]
    if op != "pack":
        raise BuildError(f"norm: no CPU kernel for op {op}")
    name = f"lp_cpu_pack_{fmt}"
    entry = (f"LP_KERNEL void {name}(const float* x, void* out, int rows, int k) "
             f"{{ lp_cpu::pack<{code}>(x, out, rows, k); }}")
    return [KernelLaunch(Kernel(name, "pack", "norm.h", entry, 0), (1,), [x, out, scalar(rows), scalar(k)])]
