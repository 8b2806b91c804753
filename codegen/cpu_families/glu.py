"""GLU + pack on the CPU (codegen/cpu/glu.h): op glu_pack, out = pack[format](act(gate) * up), the
activation in float64 as the twin computes it; operands and arguments as codegen/operands.py's glu
contract says, to every activation format."""

from __future__ import annotations

from llmplan.core.plan_records import Launch

from .. import operands
from ..format_header import act_code
from ..kernel import Context, Kernel, KernelLaunch
from ..operands import GLU_ACTS, GLU_PARAMS, declare, refs


def kernel(act: str, fmt: str) -> Kernel:
    name = f"lp_cpu_glu_pack_{act}_{fmt}"
    entry = (f"LP_KERNEL void {name}({declare(GLU_PARAMS)}) "
             f"{{ lp_cpu::glu_pack<{GLU_ACTS[act]}, {act_code(fmt)}>(gate, up, out, rows, k); }}")
    return Kernel(name, "glu_pack", "glu.h", entry, 0)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    c = operands.glu(launch, ctx)
    return [KernelLaunch(kernel(c.act, c.fmt), (1,), refs(c.args))]
