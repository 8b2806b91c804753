"""The embedding gather on the CPU (codegen/cpu/embed.h): op `embed`, rows of the table picked by the
step's tokens, read in place from the mapped file and dequantized bit-exactly as core/formats.dequantize
(quant.cuh LpWeight<F>::value). A token outside the table gives a NaN row.

Arguments: the table ({"weight": name, "layout": "blocks"}), the tokens ({"state": "tokens"}), the output
[rows, k] f32, rows, the table's row count, k.
"""

from __future__ import annotations

from llmplan.core.formats import FORMATS
from llmplan.core.plan_records import Launch

from ..build import BuildError
from ..format_header import weight_code
from ..kernel import Context, Kernel, KernelLaunch, scalar
from .matmul import in_place


def kernel(fmt: str) -> Kernel:
    name = f"lp_cpu_embed_{fmt.lower()}"
    entry = (f"LP_KERNEL void {name}(const void* table, const int* tokens, float* out, int rows, int vocab, int k) "
             f"{{ lp_cpu::embed<{weight_code(fmt)}>(table, tokens, out, rows, vocab, k); }}")
    return Kernel(name, "embed_rows", "embed.h", entry, 0)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    if launch.op != "embed":
        raise BuildError(f"the CPU embedding family does not implement {launch.op}")
    table, tokens = launch.args
    out = launch.outs[0]
    fmt = ctx.weights[table.name][0].upper()
    vocab, k = ctx.shape(table)
    if fmt not in FORMATS:
        raise BuildError(f"embed: table {table.name} is {fmt}; the kernels read {', '.join(FORMATS)}")
    if k % FORMATS[fmt].block:
        raise BuildError(f"embed: table {table.name} ({fmt}) has rows of {k}, not whole blocks")
    return [KernelLaunch(kernel(fmt), (1,),
                   [in_place(table), tokens, out, scalar(ctx.shape(out)[0]), scalar(vocab), scalar(k)])]
