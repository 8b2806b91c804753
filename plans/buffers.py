"""Buffer planning: every intermediate value of every phase gets an offset in one arena.

Values whose lifetimes (first write .. last read, in launch order) overlap must not share bytes: they
are the edges of an interference graph (networkx). Buffers are placed largest first at the lowest
offset that no already-placed neighbour covers, so the arena holds about one layer's activations
however deep the model is. Phases never run at once, so each phase is laid out from offset 0 and the
arena is as large as the largest phase needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from llmplan.core.formats import value_bytes
from llmplan.ir.types import Type

ALIGN = 256  # bytes: every buffer starts on a 256-byte boundary (16-byte vector loads, cache lines)


def type_bytes(t: Type, dims: dict[str, int]) -> int:
    """Bytes of a value of type t with its symbolic dimensions bound to their upper limits (packed
    activations as field planes, core/formats.py, for the GPU kernels' loads)."""
    return value_bytes(t.dtype, [d if isinstance(d, int) else dims[d] for d in t.shape])


@dataclass(frozen=True)
class Interval:
    """A value's bytes and lifetime in launch order."""

    id: int
    bytes: int
    first: int  # index of the launch that writes it
    last: int  # index of the last launch that reads it (or the end, for outputs)


def place(intervals: list[Interval]) -> tuple[dict[int, int], int]:
    """Offsets for intervals so that no two live at once overlap; returns (offsets, arena bytes)."""
    g = nx.Graph()
    g.add_nodes_from(b.id for b in intervals)
    by_start = sorted(intervals, key=lambda b: b.first)
    for i, a in enumerate(by_start):
        for b in by_start[i + 1:]:
            if b.first > a.last:
                break
            g.add_edge(a.id, b.id)
    size = {b.id: -(-b.bytes // ALIGN) * ALIGN for b in intervals}
    offsets: dict[int, int] = {}
    for b in sorted(intervals, key=lambda b: (-size[b.id], b.first, b.id)):
        taken = sorted((offsets[n], offsets[n] + size[n]) for n in g.neighbors(b.id) if n in offsets)
        at = 0
        for lo, hi in taken:
            if at + size[b.id] <= lo:
                break
            at = max(at, hi)
        offsets[b.id] = at
    return offsets, max((offsets[i] + size[i] for i in offsets), default=0)
