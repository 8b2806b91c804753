"""GLU + pack on the CPU (codegen/cpu/glu.h): op glu_pack, out = pack[format](act(gate) * up), the
activation in float64 as the twin computes it. Arguments (gate, up, out, rows, k)."""

from __future__ import annotations

from llmplan.core.plan_records import Launch

from ..build import BuildError
from ..kernel import Context, Kernel, KernelLaunch, scalar
from .norm import out_format

ACTS = {"silu": 0, "gelu_tanh": 1}


def kernel(act: str, fmt: str, k: int) -> Kernel:
    if act not in ACTS:
        raise BuildError(f"glu_pack: activation {act!r} is not one of {', '.join(ACTS)}")
    code = out_format(fmt, k, "glu_pack")
    name = f"lp_cpu_glu_pack_{act}_{fmt}"
    entry = (f"LP_KERNEL void {name}(const float* gate, const float* up, void* out, int rows, int k) "
             f"{{ lp_cpu::glu_pack<{ACTS[act]}, {code}>(gate, up, out, rows, k); }}")
    return Kernel(name, "glu_pack", "glu.h", entry, 0)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    if launch.op != "glu_pack":
        raise BuildError(f"glu: no CPU kernel for op {launch.op}")
    gate, up = launch.args
    rows, k = ctx.shape(gate)
    return [KernelLaunch(kernel(launch.attrs["act"], launch.attrs["format"], k), (1,),
                   [gate, up, launch.outs[0], scalar(rows), scalar(k)])]
