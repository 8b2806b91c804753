"""Lowering a fused graph to a launch list: one launch per node, each argument a reference the runtime
can resolve without the IR.

References (core/plan_records.py): State for step state (tokens, pos, seq, pages), Cache for the K/V
planes, Weight for a model tensor, Buf for an arena buffer; a kernel may also name a Scratch range
(codegen/kernel.py), placed in the arena here too. Each buffer has a
dtype and a shape whose symbolic dimensions (rows, seqs, splits, ...) the runtime binds per step. A launch also
lists the graph outputs that need it, so a greedy step can skip the logits path and an early prefill
chunk the whole tail.

The phase describes its step state (each input's dtype and shape), and in the decode phases the fused
tail writes its greedy tokens into the `tokens` input itself ("fed_by"): the next step's embedding
reads them where they are, so the host can queue step n+1 before it has read token n. Every launch
carries the kernel calls a backend makes for it ("kernels"): here one call of the family's NumPy twin on
the CPU backend, which plans/cpu_native.py replaces with the compiled CPU kernels where the compiler is;
on GPU targets the codegen stage fills them in (plans/select.py).
"""

from __future__ import annotations

import dataclasses

import networkx as nx

from llmplan.core.devices import DeviceFacts
from llmplan.core.op_traits import TRAITS
from llmplan.core.plan_records import (
    Buf,
    Buffer,
    Cache,
    KernelCall,
    Launch,
    Phase,
    Ref,
    Scratch,
    State,
    StateInput,
    Weight,
)
from llmplan.ir.graph import Graph, Node, Value
from llmplan.ir.types import Type

from .buffers import Interval, place, type_bytes

PER_STEP_DIMS = ("rows", "seqs")  # bound each step by the step state; every other symbol is fixed at its bound


class CatalogError(Exception):
    """An op no kernel family implements (a planner bug: the passes produced something new)."""


def family(node: Node) -> str:
    fam = TRAITS[node.op].family if node.op in TRAITS else None
    if fam is None:
        raise CatalogError(f"no kernel family implements op {node.op!r}")
    return fam


def cpu_weight_layout(op: str) -> str:
    """How the NumPy CPU backend reads a weight operand (core/layouts.py): the embedding table's rows
    in the mapped file; everything else (projections, the tail's head, norm vectors) as float32."""
    return "rows" if op == "embed" else "f32"


def lower(g: Graph, device: DeviceFacts, dims: dict[str, int]) -> Phase:
    """The launch list, buffers and layout of one phase; `dims` bounds every symbolic dimension."""
    ref: dict[Value, Ref] = {}
    state: dict[str, StateInput] = {}
    for n in g.order:
        if n.op == "input":
            ref[n.out] = Cache() if n.name == "cache" else State(n.name)
            if n.name != "cache":
                state[n.name] = StateInput(n.types[0].dtype, tuple(n.types[0].shape))
        elif n.op == "weight":
            ref[n.out] = Weight(n.name)
    fed = _fed_token(g)
    buffers: list[Buffer] = []
    launches: list[Launch] = []
    nodes = [n for n in g.order if n.op not in ("input", "weight")]
    for n in nodes:
        outs = []
        for k, t in enumerate(n.types):
            v = Value(n.id, k)
            if TRAITS[n.op].updates is not None and t.rank == 5:
                ref[v] = Cache()  # the K/V planes are updated in place
            elif v == fed:
                ref[v] = State("tokens")
                state["tokens"].fed_by = "next_token"
            else:
                ref[v] = Buf(len(buffers))
                buffers.append(Buffer(t.dtype, tuple(t.shape)))
            outs.append(ref[v])
        fam = family(n)
        args = [ref[o] for o in n.operands]
        launch = Launch(n.op, fam, dict(n.attrs), args, outs)
        if device.backend == "cpu":
            calls = [Weight(a.name, cpu_weight_layout(n.op)) if isinstance(a, Weight) else a for a in args]
            launch.member, launch.provenance = "numpy", "cpu backend: the family's NumPy twin is its only member"
            launch.kernels = [KernelCall(f"numpy.{fam}", (), 1, 0, outs + calls)]
        launches.append(launch)
    outputs = {name: ref[v] for name, v in g.outputs}
    # which outputs each launch serves: the outputs downstream of it
    node_index = {n.id: i for i, n in enumerate(nodes)}
    for name, v in g.outputs:
        if v.node not in node_index:
            continue
        for a in nx.ancestors(g.nx, v.node) | {v.node}:
            if a in node_index:
                launches[node_index[a]].serves.append(name)
    phase = Phase(launches, buffers, outputs, state, [d for d in PER_STEP_DIMS if d in dims], dict(dims))
    layout(phase)
    return phase


def _fed_token(g: Graph) -> Value | None:
    """The graph's next_token output when it has a row per tokens input row (the decode phases: one
    row per sequence), else None (prefill: one token per sequence from a chunk of rows)."""
    out = dict(g.outputs).get("next_token")
    tokens = next(n for n in g.order if n.op == "input" and n.name == "tokens")
    return out if out is not None and g.type_of(out).shape == tokens.types[0].shape else None


def layout(phase: Phase) -> None:
    """Place the phase's arena values, and the scratch ranges its kernels ask for, by liveness: a value
    lives from the launch that writes it to the last that reads it (graph outputs to the end), a scratch
    range during its launch's kernels only. Sets every buffer's and scratch reference's offset and bytes,
    the phase's arena size and its unshared total."""
    launches, dims = phase.launches, phase.dims
    live: dict[tuple, list[int]] = {}
    scratch_bytes: dict[tuple, int] = {}
    for i, launch in enumerate(launches):
        for r in launch.args + launch.outs:
            if isinstance(r, Buf):
                live.setdefault(("buf", r.index), [i, i])[1] = i
        for k in launch.kernels:
            for r in k.args:
                if isinstance(r, Scratch):
                    key = ("scratch", i, r.name)
                    live[key] = [i, i]
                    size = type_bytes(Type(r.dtype, tuple(r.shape)), dims)
                    scratch_bytes[key] = max(scratch_bytes.get(key, 0), size)
    for r in phase.outputs.values():
        if isinstance(r, Buf):
            live[("buf", r.index)][1] = len(launches)
    sizes = {("buf", b): type_bytes(Type(d.dtype, tuple(d.shape)), dims) for b, d in enumerate(phase.buffers)}
    sizes |= scratch_bytes
    keys = list(sizes)
    offsets, arena = place([Interval(j, sizes[key], *live[key]) for j, key in enumerate(keys)])
    at = {key: (offsets[j], sizes[key]) for j, key in enumerate(keys)}
    for b, d in enumerate(phase.buffers):
        d.offset, d.bytes = at[("buf", b)]
    for i, launch in enumerate(launches):
        for k in launch.kernels:
            k.args = [dataclasses.replace(r, offset=at[("scratch", i, r.name)][0], bytes=at[("scratch", i, r.name)][1])
                      if isinstance(r, Scratch) else r for r in k.args]
    phase.arena_bytes, phase.activation_bytes = arena, sum(sizes.values())
