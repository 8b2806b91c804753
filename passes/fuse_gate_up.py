"""fuse-gate-up: the gate and up projections of a layer's FFN become one segmented projection.

    %g = matmul %h, @blk.N.ffn_gate.weight
    %u = matmul %h, @blk.N.ffn_up.weight
 => %g, %u = matmul_segmented %h, @blk.N.ffn_gate.weight, @blk.N.ffn_up.weight

A layer that stores gate|up as one ffn_up tensor (Phi-3) reads them as its two row ranges, fused the
same way. Declined, as fuse-qkv, when the two take differently packed activations.
"""

from __future__ import annotations

from llmplan.ir.graph import Graph

from .segments import fuse_segments

NAME = "fuse-gate-up"


def run(g: Graph) -> tuple[Graph, list[str]]:
    return fuse_segments(g, NAME, ("ffn_gate", "ffn_up"), "ffn_up")
