"""RMSNorm, RMSNorm + pack, and pack (codegen/kernels/norm.cu): one block per row; operands and arguments
as codegen/operands.py's norm contract says. Packing writes the 8-bit block formats only here."""

from __future__ import annotations

from llmplan.core.formats import ACTIVATION_FORMATS
from llmplan.core.plan_records import Launch, grid_dim

from .. import operands
from ..build import BuildError
from ..format_header import act_code
from ..kernel import Context, Kernel, KernelLaunch
from ..operands import declare, refs

PACK_FORMATS = tuple(f.lower() for f in ACTIVATION_FORMATS)  # the 8-bit block formats (common.cuh lp_pack_row)
THREADS = 256


def kernel(op: str, fmt: str) -> Kernel:
    """rmsnorm (fmt f32), rmsnorm_pack or pack to `fmt`."""
    params = declare(operands.norm_params(op))
    if op == "rmsnorm":
        name, call = "lp_rmsnorm_f32", "lp_rmsnorm(x, w, y, k, group, eps)"
    elif fmt not in PACK_FORMATS:
        raise BuildError(f"{op}: pack format {fmt} is not one of {', '.join(PACK_FORMATS)}")
    elif op == "rmsnorm_pack":
        name, call = f"lp_rmsnorm_pack_{fmt}", f"lp_rmsnorm_pack<{act_code(fmt)}>(x, w, out, rows, k, eps)"
    else:
        name, call = f"lp_pack_{fmt}", f"lp_pack<{act_code(fmt)}>(x, out, rows, k)"
    entry = f"LP_KERNEL void __launch_bounds__({THREADS}) {name}({params}) {{ {call}; }}"
    return Kernel(name, op, "norm.cu", entry, THREADS)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    c = operands.norm(launch, ctx)
    return [KernelLaunch(kernel(c.op, c.fmt), (grid_dim(c.rows),), refs(c.args))]
