"""Embedding gather (codegen/kernels/embed.cu): op `embed`, rows of the planar table picked by the step's
tokens, dequantized to f32 bit-exactly as core/formats.dequantize.

One block of THREADS threads per token row; grid (rows,). A step gathers a few KB per token, so the
kernel favours being checkable (each value dequantized as formats.py does it) over speed. CPU twin:
runtime/numpy_kernels.py embed. Launch arguments, in order: the table
({"weight": name, "layout": "planar"}), the tokens ({"state": "tokens"}), the output [rows, k] f32,
then the table's row count (tokens outside it give NaN rows) and k.
"""

from __future__ import annotations

from llmplan.core.plan_records import Launch, Weight, grid_dim

from ..kernel import Context, Kernel, KernelLaunch, scalar

FORMATS = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
BLOCK_VALUES = {"F32": 1, "F16": 1, "BF16": 1, "Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32,
                "Q2_K": 256, "Q3_K": 256, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256}
THREADS = 256


class EmbedError(ValueError):
    """A table this family cannot read; the message names it."""


def kernel(fmt: str) -> Kernel:
    name = f"lp_embed_{fmt.lower()}"
    entry = (f"LP_KERNEL void __launch_bounds__({THREADS}) {name}(const void* table, const int* tokens, float* out, "
             f"int vocab, int k) {{ lp_embed<LP_FMT_{fmt}>(table, tokens, out, vocab, k); }}")
    return Kernel(name, "embed_rows", "embed.cu", entry, THREADS)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    if launch.op != "embed":
        raise EmbedError(f"the embedding family does not implement {launch.op}")
    table, tokens = launch.args
    out = launch.outs[0]
    fmt = ctx.weights[table.name][0].upper()
    vocab, k = ctx.shape(table)
    if fmt not in FORMATS:
        raise EmbedError(f"embed: table {table.name} is {fmt}; the kernels read {', '.join(FORMATS)}")
    if k % BLOCK_VALUES[fmt]:
        raise EmbedError(f"embed: table {table.name} ({fmt}) has rows of {k}, not whole blocks")
    rows = ctx.shape(out)[0]
    return [KernelLaunch(kernel(fmt), (grid_dim(rows),),
                   [Weight(table.name, "planar"), tokens, out, scalar(vocab), scalar(k)])]
