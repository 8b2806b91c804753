"""GLU + pack (codegen/kernels/glu.cu): op glu_pack, out = pack[format](act(gate) * up); operands and
arguments as codegen/operands.py's glu contract says (rows is the step's row count: the packed planes'
layout depends on it, as in norm.py).

Grid (ceil(k / TILE), rows), THREADS threads: each block computes TILE consecutive values of one row
(act silu or gelu_tanh through lp_exp, float32) and stores them packed (q8_0, q8_1, q8_k with
common.cuh's rounding, on the tile's slice of the field planes) or as f16 / bf16. Tiling the row
spreads a single decode row (k = 14336 for Llama-3-8B: 28 blocks) over the GPU; the kernel reads gate
and up once and writes the packed row once, which is all its memory traffic.
"""

from __future__ import annotations

from llmplan.core.formats import PACK_BLOCK
from llmplan.core.plan_records import Launch, grid_dim

from .. import operands
from ..build import BuildError
from ..format_header import act_code
from ..kernel import Context, Kernel, KernelLaunch
from ..operands import GLU_ACTS, GLU_PARAMS, declare, refs

THREADS = 64
TILE = 512  # values per block: whole q8_0 / q8_1 / q8_k blocks; q8_k: one 256-block per 32-thread group
FORMATS = tuple(PACK_BLOCK)  # the pack formats


def kernel(act: str, fmt: str) -> Kernel:
    if fmt not in FORMATS:
        raise BuildError(f"glu_pack: output format {fmt} is not one of {', '.join(FORMATS)}")
    name = f"lp_glu_pack_{act}_{fmt}"
    entry = (f"LP_KERNEL void __launch_bounds__({THREADS}) {name}({declare(GLU_PARAMS)}) "
             f"{{ lp_glu_pack<{GLU_ACTS[act]}, {act_code(fmt)}, {TILE}>(gate, up, out, rows, k); }}")
    return Kernel(name, "glu_pack", "glu.cu", entry, THREADS)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    c = operands.glu(launch, ctx)
    return [KernelLaunch(kernel(c.act, c.fmt), (grid_dim(c.k, TILE), grid_dim(c.rows)), refs(c.args))]
