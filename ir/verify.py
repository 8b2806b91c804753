"""The verifier: a graph's invariants, checked after tracing and after every pass.

Every operand is defined by a node of the graph; there are no cycles; every node's attributes and
result types are what its op's schema infers from its operands; inputs and weights are named and
unique; outputs exist. Errors name the node by its printed line.
"""

from __future__ import annotations

import functools

import networkx as nx

from .errors import IRError, VerifyError
from .graph import Graph, Node
from .ops import REGISTRY, infer
from .printer import node_line


def _describe(g: Graph, n: Node) -> str:
    try:
        return node_line(g, n.id)
    except Exception:  # the graph may be too broken to print (a cycle, a dangling use)
        return f"node {n.id} ({n.op})"


def _infer(op: str, types: tuple, attrs: dict) -> tuple:
    """infer(), remembered: a model's layers repeat the same ops on the same types, and every pass's
    graph repeats its predecessor's nodes. The key holds each attribute's type too (1 == 1.0)."""
    if not all(isinstance(v, (bool, int, float, str)) for v in attrs.values()):
        return infer(op, list(types), attrs)  # not a valid attribute: infer() says which
    return _infer_known(op, types, tuple((k, type(v), v) for k, v in sorted(attrs.items())))


@functools.lru_cache(maxsize=1 << 14)
def _infer_known(op: str, types: tuple, attrs: tuple) -> tuple:
    return infer(op, list(types), {k: v for k, _, v in attrs})


def verify(g: Graph) -> Graph:
    """Raise VerifyError on the first broken invariant; return the graph otherwise."""
    for node_id, data in () if g.ids_topological else g.nx.nodes(data=True):
        if "node" not in data:
            users = [g.node(s) for s in g.nx.successors(node_id)]
            raise VerifyError(f"{g.name}: node {users[0].id} ({users[0].op}) uses value of node {node_id}, "
                              "which is not in the graph")
    if not g.ids_topological and not nx.is_directed_acyclic_graph(g.nx):
        cycle = nx.find_cycle(g.nx)
        ops = " -> ".join(f"{g.node(a).op}#{a}" for a, _ in cycle)
        raise VerifyError(f"{g.name}: cycle {ops}")
    seen: dict[tuple[str, str], int] = {}
    for n in g.order:
        if n.op not in REGISTRY:
            raise VerifyError(f"{g.name}: {_describe(g, n)}: unknown op {n.op!r}")
        if n.op in ("input", "weight"):
            if n.operands or set(n.attr) != {"name"} or len(n.types) != 1:
                raise VerifyError(f"{g.name}: {n.op} node {n.id} must have a name, one type and no operands")
            key = (n.op, n.name)
            if key in seen:
                raise VerifyError(f"{g.name}: {n.op} {n.name!r} is declared twice")
            seen[key] = n.id
            continue
        for o in n.operands:
            if o.index >= len(g.node(o.node).types):
                raise VerifyError(f"{g.name}: {_describe(g, n)}: uses result {o.index} of a node with "
                                  f"{len(g.node(o.node).types)}")
        try:
            types = _infer(n.op, tuple(g.type_of(o) for o in n.operands), n.attr)
        except IRError as e:
            raise VerifyError(f"{g.name}: {_describe(g, n)}: {e}") from None
        if types != n.types:
            want = ", ".join(str(t) for t in types)
            raise VerifyError(f"{g.name}: {_describe(g, n)}: result type should be {want}")
    for name, v in g.outputs:
        if v.node not in g or v.index >= len(g.node(v.node).types):
            raise VerifyError(f"{g.name}: output {name} is not a value of the graph")
    return g
