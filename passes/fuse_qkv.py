"""fuse-qkv: the query, key and value projections of a layer become one segmented projection.

    %q = matmul %h, @blk.N.attn_q.weight
    %k = matmul %h, @blk.N.attn_k.weight
    %v = matmul %h, @blk.N.attn_v.weight
 => %q, %k, %v = matmul_segmented %h, @blk.N.attn_q.weight, @blk.N.attn_k.weight, @blk.N.attn_v.weight

One launch reads the packed row once for all three. A layer that stores them as one attn_qkv tensor
(Phi-3) reads them as its row ranges, @blk.N.attn_qkv.weight[0:q], [q:q+k], [q+k:q+2k], fused the same way. Segments may differ in weight format (Q4_K_M
gives some layers a Q6_K attn_v) as long as they take the same packed activations; declined when they
do not (e.g. Q4_K queries with Q8_0 values: q8_k and q8_0 rows).
"""

from __future__ import annotations

from llmplan.ir.graph import Graph

from .segments import fuse_segments

NAME = "fuse-qkv"


def run(g: Graph) -> tuple[Graph, list[str]]:
    return fuse_segments(g, NAME, ("attn_q", "attn_k", "attn_v"), "attn_qkv")
