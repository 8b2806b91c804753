"""fuse-glu-pack: the gated product of the FFN is computed and packed for the down projection in one op.

    %a = silu %g          (or gelu_tanh)
    %m = mul %a, %u
    %x = pack[format] %m
 => %x = glu_pack[act, format] %g, %u

Declined when the activation or the product has another reader.
"""

from __future__ import annotations

from llmplan.ir.graph import Graph

from .rewrite import Rewriter

NAME = "fuse-glu-pack"


def run(g: Graph) -> tuple[Graph, list[str]]:
    rw = Rewriter(g, NAME)
    for act in g.order:
        if act.op not in ("silu", "gelu_tanh"):
            continue
        mul = rw.only_user(act.out, "mul")
        pack = mul and rw.only_user(mul.out, "pack")
        if mul is None or pack is None or mul.operands[0] != act.out:
            rw.decline(rw.layer(act, *rw.users(act.out)), f"the {act.op} product is read unpacked or twice")
            continue
        fused = rw.emit("glu_pack", [act.operands[0], mul.operands[1]], act, act=act.op, format=pack.attr["format"])
        rw.replace(pack.out, fused.out)
        rw.drop(act, mul, pack)
    return rw.finish(), rw.declines
