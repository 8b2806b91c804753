"""An op's traits that every stage after the IR needs: which kernel family implements it and which
operand it updates in place. The op's schema and meaning live in the IR's registry (ir/ops.py,
ir/fused.py); a test holds the two tables to the same ops.

A kernel family is one catalog entry with an implementation per backend: the CPU backend's NumPy twin
(runtime/numpy_kernels.py KERNELS[family]), the GPU template modules and the CPU target's module, which
MODULES names: the one place an op's family leads to its code.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OpTraits:
    family: str | None  # None: no kernel (graph leaves, and primitives the fusion passes always replace)
    updates: int | None = None  # the operand the op updates in place (the K/V cache), else None


TRAITS: dict[str, OpTraits] = {
    "input": OpTraits(None),
    "weight": OpTraits(None),
    "embed": OpTraits("embed"),
    "rmsnorm": OpTraits("norm"),
    "pack": OpTraits("norm"),
    "rmsnorm_pack": OpTraits("norm"),
    "matmul": OpTraits("matmul"),
    "matmul_segmented": OpTraits("matmul"),
    "matmul_residual": OpTraits("matmul"),
    "rope": OpTraits(None),
    "bias_add": OpTraits(None),
    "kv_store": OpTraits(None, updates=0),
    "rope_kv": OpTraits("rope_kv", updates=6),
    "norm_rope_kv": OpTraits("rope_kv", updates=6),
    "attention": OpTraits("attention_prefill"),
    "attention_partial": OpTraits("attention_decode"),
    "attention_reduce": OpTraits("attention_decode"),
    "attention_reduce_pack": OpTraits("attention_decode"),
    "glu_pack": OpTraits("glu"),
    "add": OpTraits("elementwise"),
    "mul": OpTraits("elementwise"),
    "scale": OpTraits("elementwise"),
    "silu": OpTraits("elementwise"),
    "gelu_tanh": OpTraits("elementwise"),
    "softcap": OpTraits("elementwise"),
    "take_rows": OpTraits("elementwise"),
    "tail_argmax": OpTraits("tail"),
    "moe_router": OpTraits("router"),
    "matmul_experts": OpTraits("experts"),
    "matmul_experts_residual": OpTraits("experts"),
    "moe_sum": OpTraits(None),
}
FAMILIES = sorted({t.family for t in TRAITS.values() if t.family})


@dataclass(frozen=True)
class Modules:
    """Where a family's code is: its GPU template modules in codegen/families/ (matmul and experts have
    two, the mat-vec for a few activation rows, then the GEMM tiles for more: plans/select.py picks) and its CPU
    target module in codegen/cpu_families/ (one `attention` module holds both attention families)."""

    gpu: tuple[str, ...]
    cpu: str


MODULES: dict[str, Modules] = {
    "embed": Modules(("embed",), "embed"),
    "norm": Modules(("norm",), "norm"),
    "matmul": Modules(("matvec", "gemm"), "matmul"),
    "rope_kv": Modules(("rope_kv",), "rope_kv"),
    "attention_prefill": Modules(("attention_prefill",), "attention"),
    "attention_decode": Modules(("attention_decode",), "attention"),
    "glu": Modules(("glu",), "glu"),
    "elementwise": Modules(("elementwise",), "elementwise"),
    "tail": Modules(("tail",), "tail"),
    "router": Modules(("router",), "router"),
    "experts": Modules(("experts", "experts_gemm"), "experts"),
}


def ops_of(family: str) -> tuple[str, ...]:
    """The ops a family implements."""
    return tuple(op for op, t in TRAITS.items() if t.family == family)
