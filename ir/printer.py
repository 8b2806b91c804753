"""The IR as text: deterministic, one node per line, values numbered per printout.

    graph llama.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %cache: f16[2, 2, slots, ctx, 128]) {
      @token_embd.weight : q4_k[3000, 512]
      %0 = embed @token_embd.weight, %tokens : f32[1, 512]
      %1 = rmsnorm[eps=1e-05] %0, @blk.0.attn_norm.weight : f32[1, 512]
      ...
      return logits=%57, cache=%55
    }

Inputs are named in the signature, weights declared by their GGUF tensor name before first use,
attributes sorted by name. The printed text reads back with ir/parser.py into an equal graph.
"""

from __future__ import annotations

from typing import Any

from .graph import Graph, Value
from .ops import is_default


def format_attr(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)  # shortest text that reads back to the same double
    return str(v)


def print_graph(g: Graph) -> str:
    names: dict[Value, str] = {}
    for n in g.order:
        if n.op == "input":
            names[n.out] = f"%{n.name}"
        elif n.op == "weight":
            names[n.out] = f"@{n.name}"
    sig = ", ".join(f"{names[n.out]}: {n.types[0]}" for n in g.inputs)
    lines = [f"graph {g.name}({sig}) {{"]
    counter = 0
    for n in g.order:
        if n.op == "input":
            continue
        if n.op == "weight":
            lines.append(f"  {names[n.out]} : {n.types[0]}")
            continue
        results = []
        for i in range(len(n.types)):
            names[(v := n.out if i == 0 else Value(n.id, i))] = f"%{counter}"
            results.append(names[v])
            counter += 1
        said = [(k, v) for k, v in n.attrs if not is_default(n.op, k, v)]
        attrs = "[" + ", ".join(f"{k}={format_attr(v)}" for k, v in said) + "]" if said else ""
        operands = ", ".join(names[o] for o in n.operands)
        types = ", ".join(str(t) for t in n.types)
        lines.append(f"  {', '.join(results)} = {n.op}{attrs}{' ' + operands if operands else ''} : {types}")
    lines.append("  return " + ", ".join(f"{k}={names[v]}" for k, v in g.outputs))
    lines.append("}")
    return "\n".join(lines) + "\n"


def node_line(g: Graph, node_id: int) -> str:
    """The printed line of one node (for error messages), as it appears in print_graph(g)."""
    text = print_graph(g).splitlines()
    order = [n.id for n in g.order if n.op != "input"]
    return text[1 + order.index(node_id)].strip()
