"""Graph rewriting for the passes: match on the old graph, emit new nodes, build a new graph.

A pass reads the input graph (never changes it), emits fused nodes where a pattern matched, redirects
the matched values to the new ones and drops the matched nodes. `finish` checks that every dropped
node really became dead, orders the new graph so that each new node sits where its pattern started
(so printed diffs stay local), and numbers nodes afresh.
"""

from __future__ import annotations

import heapq
import re
from typing import Any

from llmplan.ir.graph import Graph, Node, Value, make_node
from llmplan.ir.ops import infer, with_defaults
from llmplan.ir.types import Type


class RewriteError(Exception):
    """A pass broke its own bookkeeping (a bug in the pass)."""


class Rewriter:
    def __init__(self, g: Graph, pass_name: str):
        self.g, self.pass_name = g, pass_name
        self._key = {n.id: float(i) for i, n in enumerate(g.order)}
        self._new: dict[int, Node] = {}
        self._next = max(self._key, default=-1) + 1
        self._subst: dict[Value, Value] = {}
        self._dropped: set[int] = set()
        self._outputs = list(g.outputs)
        self.declines: list[str] = []
        self._users: dict[Value, list[Node]] = {}
        for n in g.order:
            for o in n.operands:
                self._users.setdefault(o, []).append(n)

    # reading the input graph ------------------------------------------------------------------

    def users(self, v: Value) -> list[Node]:
        return self._users.get(v, [])

    def producer(self, v: Value) -> Node:
        return self.g.node(v.node)

    def weight_name(self, v: Value) -> str | None:
        n = self.g.node(v.node)
        return n.name if n.op == "weight" else None

    def only_user(self, v: Value, op: str | tuple[str, ...]) -> Node | None:
        """The single user of `v` if there is exactly one and it is `op`."""
        users = self.users(v)
        ops = (op,) if isinstance(op, str) else op
        return users[0] if len(users) == 1 and users[0].op in ops and v not in (o for _, o in self._outputs) else None

    def layer(self, *nodes: Node) -> str:
        """'blk.N' for the layer the nodes belong to (by a `layer` attribute or the layer weights they,
        or the few nodes before them, read), else 'the tail'."""
        frontier = list(nodes)
        for _ in range(3):
            for n in frontier:
                if "layer" in n.attr:
                    return f"blk.{n.attr['layer']}"
                for o in n.operands:
                    name = self.weight_name(o)
                    if name and (m := re.match(r"(blk\.\d+)\.", name)):
                        return m.group(1)
            frontier = [self.producer(o) for n in frontier for o in n.operands]
        return "the tail"

    # writing the output graph -----------------------------------------------------------------

    def type_of(self, v: Value):
        node = self._new.get(v.node) or self.g.node(v.node)
        return node.types[v.index]

    def emit(self, op: str, operands: list[Value], at: Node, **attrs: Any) -> Node:
        """A new node, typed by its op's schema, placed where `at` was."""
        attrs = with_defaults(op, attrs)
        types = infer(op, [self.type_of(o) for o in operands], attrs)
        node = make_node(self._next, op, operands, attrs, types)
        self._key[node.id] = self._key[at.id] + 1e-6 * (len(self._new) + 1) / (1 + len(self._key))
        self._next += 1
        self._new[node.id] = node
        return node

    def input(self, name: str, t: Type, at: Node) -> Node:
        """A new graph input (a value the caller binds each run), placed where `at` was."""
        node = make_node(self._next, "input", [], {"name": name}, (t,))
        self._key[node.id] = self._key[at.id] + 1e-6 * (len(self._new) + 1) / (1 + len(self._key))
        self._next += 1
        self._new[node.id] = node
        return node

    def replace(self, old: Value, new: Value) -> None:
        self._subst[old] = new

    def drop(self, *nodes: Node) -> None:
        self._dropped.update(n.id for n in nodes)

    def add_output(self, name: str, v: Value) -> None:
        self._outputs.append((name, v))

    def decline(self, where: str, reason: str) -> None:
        self.declines.append(f"{self.pass_name} declined at {where}: {reason}")

    def finish(self) -> Graph:
        def resolve(v: Value) -> Value:
            while v in self._subst:
                v = self._subst[v]
            return v

        kept = [n for n in self.g.order if n.id not in self._dropped] + list(self._new.values())
        nodes = {n.id: make_node(n.id, n.op, [resolve(o) for o in n.operands], n.attr, n.types) for n in kept}
        outputs = [(k, resolve(v)) for k, v in self._outputs]
        used = {o.node for n in nodes.values() for o in n.operands} | {v.node for _, v in outputs}
        missing = used - set(nodes)
        if missing:
            raise RewriteError(f"{self.pass_name}: dropped nodes {sorted(missing)} are still used")
        order = _ordered(nodes, self._key)
        renumber = {old: new for new, old in enumerate(order)}

        def moved(v: Value) -> Value:
            return Value(renumber[v.node], v.index)

        out_nodes = [make_node(renumber[i], nodes[i].op, [moved(o) for o in nodes[i].operands], nodes[i].attr,
                               nodes[i].types) for i in order]
        return Graph(self.g.name, out_nodes, [(k, moved(v)) for k, v in outputs])


def _ordered(nodes: dict[int, Node], key: dict[int, float]) -> list[int]:
    """Node ids in topological order, the smallest key first among those ready (Kahn's algorithm with a
    heap: networkx's lexicographical_topological_sort, without building a DiGraph for it)."""
    waiting = {i: len({o.node for o in n.operands}) for i, n in nodes.items()}
    users: dict[int, list[int]] = {}
    for i, n in nodes.items():
        for producer in {o.node for o in n.operands}:
            users.setdefault(producer, []).append(i)
    ready = [(key[i], i) for i, w in waiting.items() if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, ()):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, (key[u], u))
    if len(order) != len(nodes):
        raise RewriteError("the rewritten graph has a cycle")
    return order
