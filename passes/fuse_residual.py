"""fuse-residual: a projection whose result is added to the residual stream adds it in its epilogue.

    %y = matmul %x, @w
    %r1 = add %r0, %y
 => %r1 = matmul_residual %x, @w, %r0

and the routed experts' down projection adds their weighted sum to it in its epilogue:

    %y = matmul_experts %x, @w, %ids
    %s = moe_sum %y, %weights
    %r1 = add %r0, %s
 => %r1 = matmul_experts_residual %x, @w, %ids, %weights, %r0

Declined where something stands between the projection and the add (Gemma's post-projection norms
need the whole output row, which a row-per-wave projection does not have in its epilogue), or where
the projection's result (or the experts' sum) has another reader.
"""

from __future__ import annotations

from llmplan.ir.graph import Graph, Node

from .rewrite import Rewriter

NAME = "fuse-residual"


def _experts(rw: Rewriter, add: Node, side: int) -> None:
    """add(r, moe_sum(matmul_experts(...), weights)) with the sum on operand `side`."""
    total = rw.producer(add.operands[side])
    mm = rw.producer(total.operands[0])
    if mm.op != "matmul_experts" or rw.only_user(mm.out, "moe_sum") is None or rw.only_user(total.out, "add") is None:
        rw.decline(rw.layer(total), "the experts' outputs or their sum have another reader")
        return
    fused = rw.emit("matmul_experts_residual", [*mm.operands, total.operands[1], add.operands[1 - side]], mm)
    rw.replace(add.out, fused.out)
    rw.drop(mm, total, add)


def run(g: Graph) -> tuple[Graph, list[str]]:
    rw = Rewriter(g, NAME)
    for add in g.order:
        if add.op != "add":
            continue
        producers = [rw.producer(o) for o in add.operands]
        experts = next((i for i, p in enumerate(producers) if p.op == "moe_sum"), None)
        if experts is not None:
            _experts(rw, add, experts)
            continue
        proj = next((i for i, p in enumerate(producers) if p.op == "matmul"), None)
        if proj is None:
            normed = next((p for p in producers if p.op == "rmsnorm" and rw.producer(p.operands[0]).op == "matmul"), None)
            if normed is not None:
                norm_w = rw.weight_name(normed.operands[1])
                rw.decline(rw.layer(normed), f"a norm ({norm_w}) stands between the projection and the residual add")
            continue
        mm = producers[proj]
        if rw.only_user(mm.out, "add") is None:
            rw.decline(rw.layer(mm), "the projection's result has another reader")
            continue
        fused = rw.emit("matmul_residual", [*mm.operands, add.operands[1 - proj]], mm)
        rw.replace(add.out, fused.out)
        rw.drop(mm, add)
    return rw.finish(), rw.declines
