"""split-attention (canonicalization): in decode graphs, attention becomes split-context attention.

    %o = attention[...] %q, %cache, %seq, %pages, %pos
 => %p = attention_partial[..., chunk=256] %q, %cache, %seq, %pages, %pos
    %o = attention_reduce %p

A decode step has one query row per sequence but up to the whole context to read: one workgroup per
(row, head) would leave most of the GPU idle, so the context is cut into `chunk`-position slices that
run in parallel (flash-decoding) and a second kernel combines them. 256 positions per slice is 16 K/V
pages; the planner may retune it. Prefill graphs keep one attention op (many query rows already fill
the device).
"""

from __future__ import annotations

from llmplan.ir.graph import Graph

from llmplan.core.numerics import SLICE

from .rewrite import Rewriter

NAME = "split-attention"
CHUNK = SLICE  # the slices the interpreter's attention rounds by: decode and prefill rows agree


def run(g: Graph) -> tuple[Graph, list[str]]:
    rw = Rewriter(g, NAME)
    for n in g.order:
        if n.op != "attention" or n.types[0].shape[0] == "rows":
            continue
        part = rw.emit("attention_partial", list(n.operands), n, chunk=CHUNK, **n.attr)
        red = rw.emit("attention_reduce", [part.out], n)
        rw.replace(n.out, red.out)
        rw.drop(n)
    return rw.finish(), rw.declines
