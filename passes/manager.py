"""The pass manager: the ordered list of passes, the verifier after each, a snapshot after each."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from llmplan.ir.errors import IRError
from llmplan.ir.graph import Graph
from llmplan.ir.verify import verify
from llmplan.core.errors import InputError

from . import (dce, fuse_attn_reduce_pack, fuse_gate_up, fuse_glu_pack, fuse_norm_pack, fuse_qkv, fuse_residual,
               fuse_rope_kv, fuse_tail, split_attention)

PASSES: list[ModuleType] = [split_attention, fuse_norm_pack, fuse_qkv, fuse_gate_up, fuse_rope_kv,
                            fuse_attn_reduce_pack, fuse_glu_pack, fuse_residual, fuse_tail, dce]
PASS_NAMES = [p.NAME for p in PASSES]


class PassError(Exception):
    """A pass produced an invalid graph (a bug); names the pass and those before it."""


@dataclass(frozen=True)
class Snapshot:
    name: str  # "traced" for the input, else the pass that produced the graph
    graph: Graph
    declines: tuple[str, ...]

    @property
    def node_count(self) -> int:
        return sum(1 for n in self.graph.order if n.op not in ("input", "weight"))


def check_pass_name(name: str) -> str:
    if name not in PASS_NAMES:
        raise InputError(f"unknown pass {name!r} (passes: {', '.join(PASS_NAMES)})")
    return name


def run_passes(g: Graph) -> list[Snapshot]:
    """The traced graph and the graph after every pass, in order."""
    snapshots = [Snapshot("traced", verify(g), ())]
    for p in PASSES:
        try:
            new, declines = p.run(snapshots[-1].graph)
            verify(new)
        except (IRError, Exception) as e:
            before = ", ".join(s.name for s in snapshots[1:]) or "none"
            raise PassError(f"pass {p.NAME} failed (passes before it: {before}): {e}") from e
        snapshots.append(Snapshot(p.NAME, new, tuple(declines)))
    return snapshots


def compile_graph(g: Graph) -> Graph:
    """The fully fused graph."""
    return run_passes(g)[-1].graph
