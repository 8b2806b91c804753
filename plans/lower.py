"""Lowering a fused graph to a launch list: one launch per node, each argument a reference the runtime
can resolve without the IR.

References: {"state": name} for step state (tokens, pos, seq, last), {"cache": 1} for the K/V planes,
{"weight": name} for a model tensor, {"buf": id} for an arena buffer. Each buffer has a dtype and a
shape whose symbolic dimensions (rows, seqs, splits, ...) the runtime binds per step. A launch also
lists the graph outputs that need it, so a greedy step can skip the logits path and an early prefill
chunk the whole tail.
"""

from __future__ import annotations

from typing import Any

import networkx as nx

from llmplan.ir.graph import Graph, Value
from llmplan.ir.types import Type

from .buffers import Buffer, place, type_bytes
from .catalog import choose
from .devices import DeviceFacts

STATE_INPUTS = ("tokens", "pos", "seq", "last")


def lower(g: Graph, device: DeviceFacts, dims: dict[str, int]) -> dict[str, Any]:
    """The launch list, buffers and layout of one phase; `dims` bounds every symbolic dimension."""
    ref: dict[Value, dict[str, Any]] = {}
    for n in g.order:
        if n.op == "input":
            ref[n.out] = {"cache": 1} if n.name == "cache" else {"state": n.name}
        elif n.op == "weight":
            ref[n.out] = {"weight": n.name}
    buffers: dict[int, dict[str, Any]] = {}
    launches: list[dict[str, Any]] = []
    nodes = [n for n in g.order if n.op not in ("input", "weight")]
    for i, n in enumerate(nodes):
        outs = []
        for k, t in enumerate(n.types):
            v = Value(n.id, k)
            if n.op in ("kv_store", "rope_kv", "norm_rope_kv") and t.rank == 5:
                ref[v] = {"cache": 1}  # the K/V planes are updated in place
            else:
                ref[v] = {"buf": len(buffers)}
                buffers[len(buffers)] = {"dtype": t.dtype, "shape": list(t.shape), "first": i, "last": i}
            outs.append(ref[v])
        for o in n.operands:
            if "buf" in ref[o]:
                buffers[ref[o]["buf"]]["last"] = i
        choice = choose(n, device)
        launches.append({"op": n.op, "family": choice.family, "member": choice.member,
                         "attrs": dict(n.attrs), "args": [ref[o] for o in n.operands], "outs": outs,
                         "provenance": choice.provenance})
    outputs = {name: ref[v] for name, v in g.outputs}
    for r in outputs.values():
        if "buf" in r:
            buffers[r["buf"]]["last"] = len(nodes)
    # which outputs each launch serves: the outputs downstream of it
    node_index = {n.id: i for i, n in enumerate(nodes)}
    for name, v in g.outputs:
        if v.node not in node_index:
            continue
        for a in nx.ancestors(g.nx, v.node) | {v.node}:
            if a in node_index:
                launches[node_index[a]].setdefault("serves", []).append(name)
    sizes = {b: type_bytes(Type(d["dtype"], tuple(d["shape"])), dims) for b, d in buffers.items()}
    offsets, arena = place([Buffer(b, sizes[b], d["first"], d["last"]) for b, d in buffers.items()])
    for b, d in buffers.items():
        d.update(offset=offsets[b], bytes=sizes[b])
        del d["first"], d["last"]
    return {"launches": launches, "buffers": [buffers[b] for b in sorted(buffers)], "outputs": outputs,
            "arena_bytes": arena, "activation_bytes": sum(sizes.values())}

