"""The SSA graph: small immutable node records held in a networkx DiGraph.

A node has an op, operand values (each a result of another node), sorted attributes and result
types. Inputs and weights are nodes too (ops `input` and `weight`, named). A Graph is never changed
after construction: a pass builds a new one (`Graph.rebuild` helps), so every intermediate graph can
still be printed and diffed.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Iterable, Sequence

import networkx as nx

from .types import Type


@dataclass(frozen=True, order=True)
class Value:
    node: int
    index: int = 0


@dataclass(frozen=True)
class Node:
    id: int
    op: str
    operands: tuple[Value, ...]
    attrs: tuple[tuple[str, Any], ...]  # sorted by name
    types: tuple[Type, ...]

    @property
    def attr(self) -> dict[str, Any]:
        return dict(self.attrs)

    @property
    def name(self) -> str | None:
        """The name of an input or weight node."""
        return self.attr.get("name")

    @property
    def out(self) -> Value:
        return Value(self.id, 0)


def make_node(id: int, op: str, operands: Sequence[Value], attrs: dict[str, Any], types: Sequence[Type]) -> Node:
    return Node(id, op, tuple(operands), tuple(sorted(attrs.items())), tuple(types))


class Graph:
    """An immutable graph with named outputs; `nx` is the underlying networkx DiGraph (producer ->
    consumer edges), for ordering and analyses, built when one first asks for it: a pass's graphs
    are mostly only verified and rewritten, which need no more than the nodes by id."""

    def __init__(self, name: str, nodes: Iterable[Node], outputs: Sequence[tuple[str, Value]]):
        self.name = name
        self._nodes = {n.id: n for n in nodes}
        self.outputs: tuple[tuple[str, Value], ...] = tuple(outputs)

    @cached_property
    def nx(self) -> nx.DiGraph:
        g = nx.DiGraph()
        g.add_nodes_from((i, {"node": n}) for i, n in self._nodes.items())
        g.add_edges_from((v.node, n.id) for n in self._nodes.values() for v in n.operands)
        return nx.freeze(g)

    def __contains__(self, id: int) -> bool:
        return id in self._nodes

    def nodes_unordered(self) -> Iterable[Node]:
        return self._nodes.values()

    def node(self, id: int) -> Node:
        return self._nodes[id]

    @cached_property
    def ids_topological(self) -> bool:
        """Whether every operand's producer is in the graph with a smaller id (the tracer and every pass
        number nodes so): then the graph is acyclic and id order is its order."""
        return all(o.node < n.id and o.node in self._nodes for n in self._nodes.values() for o in n.operands)

    def type_of(self, v: Value) -> Type:
        return self.node(v.node).types[v.index]

    @cached_property
    def order(self) -> tuple[Node, ...]:
        """Nodes in a deterministic topological order (ties broken by node id)."""
        if self.ids_topological:  # what the sort below gives then, without it
            return tuple(self._nodes[i] for i in sorted(self._nodes))
        return tuple(self.node(i) for i in nx.lexicographical_topological_sort(self.nx))

    @property
    def inputs(self) -> list[Node]:
        return [n for n in self.order if n.op == "input"]

    @property
    def weights(self) -> list[Node]:
        return [n for n in self.order if n.op == "weight"]

    def output(self, name: str) -> Value:
        return dict(self.outputs)[name]

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.order:
            if n.op not in ("input", "weight"):
                counts[n.op] = counts.get(n.op, 0) + 1
        return dict(sorted(counts.items()))
