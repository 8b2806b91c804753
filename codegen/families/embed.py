"""Embedding gather (codegen/kernels/embed.cu): op `embed`, rows of the planar table picked by the step's
tokens, dequantized to f32 bit-exactly as core/formats.dequantize; operands and arguments as
codegen/operands.py's embed contract says (tokens outside the table give NaN rows).

One block of THREADS threads per token row; grid (rows,). A step gathers a few KB per token, so the
kernel favours being checkable (each value dequantized as formats.py does it) over speed. CPU twin:
runtime/numpy_kernels.py embed.
"""

from __future__ import annotations

from llmplan.core import formats as core_formats
from llmplan.core.plan_records import Launch, grid_dim

from .. import operands
from ..format_header import weight_code
from ..kernel import Context, Kernel, KernelLaunch
from ..operands import EMBED_PARAMS, declare, refs

FORMATS = tuple(core_formats.FORMATS)  # every weight format (quant.cuh LpWeight<F>::value)
THREADS = 256


def kernel(fmt: str) -> Kernel:
    name = f"lp_embed_{fmt.lower()}"
    entry = (f"LP_KERNEL void __launch_bounds__({THREADS}) {name}({declare(EMBED_PARAMS)}) "
             f"{{ lp_embed<{weight_code(fmt)}>(table, tokens, out, vocab, k); }}")
    return Kernel(name, "embed_rows", "embed.cu", entry, THREADS)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    c = operands.embed(launch, ctx, FORMATS)
    return [KernelLaunch(kernel(c.fmt), (grid_dim(c.rows),), refs(c.args("planar")))]
