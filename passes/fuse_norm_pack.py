"""fuse-norm-pack: an RMSNorm whose only reader packs it becomes one op that writes packed blocks.

    %h = rmsnorm[eps] %x, @w
    %p = pack[format] %h
 => %p = rmsnorm_pack[eps, format] %x, @w

The packing format is the consumer's: 32-value blocks with an f16 scale (q8_0, or q8_1 with the
block sum) for projections with 32-value weight formats, 256-value blocks with an f32 scale (q8_k)
for K-quant weights, exactly as the unfused graph's pack says. Declined when the normed row is also
read unpacked or packed twice (the norm would have to be computed twice).
"""

from __future__ import annotations

from llmplan.ir.graph import Graph

from .rewrite import Rewriter

NAME = "fuse-norm-pack"


def run(g: Graph) -> tuple[Graph, list[str]]:
    rw = Rewriter(g, NAME)
    for norm in g.order:
        if norm.op != "rmsnorm":
            continue
        users = rw.users(norm.out)
        packs = [u for u in users if u.op == "pack"]
        if not packs:
            continue
        if len(users) != 1:
            readers = ", ".join(sorted(u.op for u in users))
            rw.decline(rw.layer(norm), f"the normed row is also read by {readers}")
            continue
        (pack,) = packs
        fused = rw.emit("rmsnorm_pack", list(norm.operands), norm, eps=norm.attr["eps"], format=pack.attr["format"])
        rw.replace(pack.out, fused.out)
        rw.drop(norm, pack)
    return rw.finish(), rw.declines
