"""Lowering a fused graph to a launch list: one launch per node, each argument a reference the runtime
can resolve without the IR.

References: {"state": name} for step state (tokens, pos, seq, pages, last), {"cache": 1} for the K/V planes,
{"weight": name} for a model tensor, {"buf": id} for an arena buffer; on GPU targets a kernel may also
name a {"scratch": ...} buffer (codegen/kernel.py), placed in the arena here too. Each buffer has a
dtype and a shape whose symbolic dimensions (rows, seqs, splits, ...) the runtime binds per step. A launch also
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

def lower(g: Graph, device: DeviceFacts, dims: dict[str, int]) -> dict[str, Any]:
    """The launch list, buffers and layout of one phase; `dims` bounds every symbolic dimension."""
    ref: dict[Value, dict[str, Any]] = {}
    for n in g.order:
        if n.op == "input":
            ref[n.out] = {"cache": 1} if n.name == "cache" else {"state": n.name}
        elif n.op == "weight":
            ref[n.out] = {"weight": n.name}
    buffers: list[dict[str, Any]] = []
    launches: list[dict[str, Any]] = []
    nodes = [n for n in g.order if n.op not in ("input", "weight")]
    for n in nodes:
        outs = []
        for k, t in enumerate(n.types):
            v = Value(n.id, k)
            if n.op in ("kv_store", "rope_kv", "norm_rope_kv") and t.rank == 5:
                ref[v] = {"cache": 1}  # the K/V planes are updated in place
            else:
                ref[v] = {"buf": len(buffers)}
                buffers.append({"dtype": t.dtype, "shape": list(t.shape)})
            outs.append(ref[v])
        choice = choose(n, device)
        launches.append({"op": n.op, "family": choice.family, "member": choice.member,
                         "attrs": dict(n.attrs), "args": [ref[o] for o in n.operands], "outs": outs,
                         "provenance": choice.provenance})
    outputs = {name: ref[v] for name, v in g.outputs}
    # which outputs each launch serves: the outputs downstream of it
    node_index = {n.id: i for i, n in enumerate(nodes)}
    for name, v in g.outputs:
        if v.node not in node_index:
            continue
        for a in nx.ancestors(g.nx, v.node) | {v.node}:
            if a in node_index:
                launches[node_index[a]].setdefault("serves", []).append(name)
    phase = {"launches": launches, "buffers": buffers, "outputs": outputs}
    return phase | layout(phase, dims)


def layout(phase: dict[str, Any], dims: dict[str, int]) -> dict[str, int]:
    """Place the phase's arena values, and the scratch buffers its GPU kernels ask for, by liveness:
    a value lives from the launch that writes it to the last that reads it (graph outputs to the end),
    a scratch buffer (codegen/kernel.py scratch) during its launch's kernels only. Sets every buffer's
    and scratch reference's offset and bytes; returns the arena's size and the unshared total."""
    launches = phase["launches"]
    live: dict[tuple, list[int]] = {}
    scratch_bytes: dict[tuple, int] = {}
    for i, launch in enumerate(launches):
        for r in launch["args"] + launch["outs"]:
            if "buf" in r:
                live.setdefault(("buf", r["buf"]), [i, i])[1] = i
        for k in launch.get("kernels", ()):
            for r in k["args"]:
                if "scratch" in r:
                    key = ("scratch", i, r["scratch"])
                    live[key] = [i, i]
                    size = type_bytes(Type(r["dtype"], tuple(r["shape"])), dims)
                    scratch_bytes[key] = max(scratch_bytes.get(key, 0), size)
    for r in phase["outputs"].values():
        if "buf" in r:
            live[("buf", r["buf"])][1] = len(launches)
    sizes = {("buf", b): type_bytes(Type(d["dtype"], tuple(d["shape"])), dims) for b, d in enumerate(phase["buffers"])}
    sizes |= scratch_bytes
    keys = list(sizes)
    offsets, arena = place([Buffer(j, sizes[key], *live[key]) for j, key in enumerate(keys)])
    at = {key: (offsets[j], sizes[key]) for j, key in enumerate(keys)}
    for b, d in enumerate(phase["buffers"]):
        d["offset"], d["bytes"] = at[("buf", b)]
    for i, launch in enumerate(launches):
        for k in launch.get("kernels", ()):
            k["args"] = [r | dict(zip(("offset", "bytes"), at[("scratch", i, r["scratch"])])) if "scratch" in r else r
                         for r in k["args"]]
    return {"arena_bytes": arena, "activation_bytes": sum(sizes.values())}
