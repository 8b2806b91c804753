"""dce: remove every node no output depends on (inputs stay: they are the graph's signature)."""

from __future__ import annotations

import networkx as nx

from llmplan.ir.graph import Graph

from .rewrite import Rewriter

NAME = "dce"


def run(g: Graph) -> tuple[Graph, list[str]]:
    rw = Rewriter(g, NAME)
    live = set()
    for _, v in g.outputs:
        live |= nx.ancestors(g.nx, v.node) | {v.node}
    rw.drop(*(n for n in g.order if n.id not in live and n.op != "input"))
    return rw.finish(), rw.declines
