"""Shared by fuse-qkv and fuse-gate-up: projections of one layer that read the same packed row become
one segmented projection. The projections are the layer's tensors named by `roles`, or, where the file
stores them fused in one tensor (Phi-3's attn_qkv, its gate|up ffn_up), the views of that tensor's rows
(core/weight_views.py) in row order."""

from __future__ import annotations

import re

from llmplan.core.weight_views import parse_view
from llmplan.ir.graph import Graph, Value

from .rewrite import Rewriter


def fuse_segments(g: Graph, name: str, roles: tuple[str, ...], fused: str) -> tuple[Graph, list[str]]:
    rw = Rewriter(g, name)
    groups: dict[str, dict[object, object]] = {}
    for n in g.order:
        if n.op != "matmul":
            continue
        w = rw.weight_name(n.operands[1]) or ""
        view = parse_view(w)
        m = re.fullmatch(r"(blk\.\d+)\.(\w+)\.weight", view[0] if view else w)
        if m and view and m.group(2) == fused:
            groups.setdefault(m.group(1), {})[view[1:]] = n
        elif m and not view and m.group(2) in roles:
            groups.setdefault(m.group(1), {})[m.group(2)] = n
    for layer, found in groups.items():
        views = sorted(r for r in found if isinstance(r, tuple))
        contiguous = all(a[1] == b[0] for a, b in zip(views, views[1:]))
        nodes = [found[r] for r in views] if views and contiguous else [found[r] for r in roles if r in found]
        if len(nodes) != len(roles):
            continue
        inputs = {n.operands[0] for n in nodes}
        if len(inputs) != 1:
            formats = "/".join(rw.type_of(n.operands[0]).dtype for n in nodes)
            rw.decline(layer, f"the projections read activations packed differently ({formats}): their weight "
                              "formats take different dot products")
            continue
        fused = rw.emit("matmul_segmented", [nodes[0].operands[0]] + [n.operands[1] for n in nodes], nodes[0])
        for i, n in enumerate(nodes):
            rw.replace(n.out, Value(fused.id, i))
        rw.drop(*nodes)
    return rw.finish(), rw.declines
