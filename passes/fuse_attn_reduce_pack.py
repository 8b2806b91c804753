"""fuse-attn-reduce-pack: split-context attention's reduce writes the output projection's packed row.

    %o = attention_reduce %p
    %x = pack[format] %o
 => %x = attention_reduce_pack[format] %p

Declined when the attention output is also read unpacked.
"""

from __future__ import annotations

from llmplan.ir.graph import Graph

from .rewrite import Rewriter

NAME = "fuse-attn-reduce-pack"


def run(g: Graph) -> tuple[Graph, list[str]]:
    rw = Rewriter(g, NAME)
    for red in g.order:
        if red.op != "attention_reduce":
            continue
        pack = rw.only_user(red.out, "pack")
        if pack is None:
            rw.decline(rw.layer(*rw.users(red.out)), "the attention output is read unpacked")
            continue
        fused = rw.emit("attention_reduce_pack", list(red.operands), red, format=pack.attr["format"])
        rw.replace(pack.out, fused.out)
        rw.drop(red, pack)
    return rw.finish(), rw.declines
