"""The embedding gather on the CPU (codegen/cpu/embed.h): op `embed`, rows of the table picked by the
step's tokens, read in place from the mapped file and dequantized bit-exactly as core/formats.dequantize
(quant.cuh LpWeight<F>::value). A token outside the table gives a NaN row. Operands and arguments as
codegen/operands.py's embed contract says, then the row count.
"""

from __future__ import annotations

from llmplan.core.formats import FORMATS
from llmplan.core.plan_records import Launch

from .. import operands
from ..format_header import weight_code
from ..kernel import Context, Kernel, KernelLaunch
from ..operands import EMBED_PARAMS, declare, i32, refs

PARAMS = (*EMBED_PARAMS, ("int", "rows"))


def kernel(fmt: str) -> Kernel:
    name = f"lp_cpu_embed_{fmt.lower()}"
    entry = (f"LP_KERNEL void {name}({declare(PARAMS)}) "
             f"{{ lp_cpu::embed<{weight_code(fmt)}>(table, tokens, out, rows, vocab, k); }}")
    return Kernel(name, "embed_rows", "embed.h", entry, 0)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    c = operands.embed(launch, ctx, tuple(FORMATS))
    return [KernelLaunch(kernel(c.fmt), (1,), refs((*c.args("blocks"), i32("rows", c.rows))))]
