"""The kernel catalog interface: every op of a fused graph maps to a kernel family, and the planner
picks one member of that family for each node, recording why.

A family is one kernel template (codegen/) with members that differ in tile shape or variant; the CPU
backend has one member per family, its NumPy twin (runtime/cpu_kernels.py), which every GPU member is
tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmplan.ir.graph import Node

from .devices import DeviceFacts

FAMILY_OF_OP = {
    "embed": "embed_rows",
    "rmsnorm": "rmsnorm",
    "rmsnorm_pack": "rmsnorm_pack",
    "pack": "pack",
    "matmul": "matmul",
    "matmul_segmented": "matmul",
    "matmul_residual": "matmul",
    "rope_kv": "rope_kv",
    "norm_rope_kv": "rope_kv",
    "attention": "attention",
    "attention_partial": "attention_partial",
    "attention_reduce": "attention_reduce",
    "attention_reduce_pack": "attention_reduce",
    "glu_pack": "glu_pack",
    "add": "elementwise",
    "mul": "elementwise",
    "scale": "elementwise",
    "silu": "elementwise",
    "gelu_tanh": "elementwise",
    "softcap": "elementwise",
    "take_rows": "take_rows",
    "tail_argmax": "tail_argmax",
}
FAMILIES = sorted(set(FAMILY_OF_OP.values()))


@dataclass(frozen=True)
class Choice:
    family: str
    member: str
    provenance: str


class CatalogError(Exception):
    """An op no kernel family implements (a planner bug: the passes produced something new)."""


def choose(node: Node, device: DeviceFacts) -> Choice:
    family = FAMILY_OF_OP.get(node.op)
    if family is None:
        raise CatalogError(f"no kernel family implements op {node.op!r}")
    if device.backend == "cpu":
        return Choice(family, "numpy", "cpu backend: the family's NumPy twin is its only member")
    return Choice(family, "", "chosen by the kernel stage (codegen/select.py) from the built members")
