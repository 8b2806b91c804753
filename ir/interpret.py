"""The reference interpreter: runs any graph with NumPy, the semantic ground truth for passes and kernels.

Activations are float32 with the rounding of core/numerics.py (shared with the CPU backend), weights
are dequantized float32 supplied by the caller, and the K/V cache is the paged f16 array [layers, 2,
blocks, PAGE, kv features] (numerics.store_kv) updated in place when no later node still reads the old
version. Correct and simple rather than fast.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from llmplan.core import numerics as num
from llmplan.core.op_traits import TRAITS

from .errors import IRError
from .graph import Graph, Node, Value

WeightFn = Callable[[str], np.ndarray]


def _rmsnorm(a, x, w):
    return num.rmsnorm(x, w, a["eps"])


def _rope(a, x, pos, factors=None):
    return num.rope(x, pos, a["heads"], a["dims"], a["base"], a["scale"], a["mode"], factors, a["mscale"])


def _pack(a, x):
    return num.packed_values(x, a["format"])


def _kv_store(a, cache, k, v, seq, pages, pos):
    num.store_kv(cache, a["layer"], k, v, seq, pages, pos)
    return cache


def _attention(a, q, cache, seq, pages, pos):
    return num.attention(q, cache, seq, pages, pos, a["layer"], a["heads"], a["kv_heads"], a["scale"], a["window"])


# --- fused ops: the compositions they stand for (see ir/fused.py) --------------------------------

def _biased(a, q, k, v, rest):
    """(q, k, v) with their biases added where the op has them, and the operands before the biases."""
    if not a["bias"]:
        return q, k, v, rest
    *rest, bq, bk, bv = rest
    return q + bq, k + bk, v + bv, rest


def _rope_kv(a, q, k, v, pos, seq, pages, cache, *rest):
    q, k, v, rest = _biased(a, q, k, v, rest)
    factors = rest[0] if rest else None
    qr = _rope({**a, "heads": a["heads"]}, q, pos, factors)
    kr = _rope({**a, "heads": a["kv_heads"]}, k, pos, factors)
    return qr, _kv_store(a, cache, kr, v, seq, pages, pos)


def _norm_rope_kv(a, q, k, v, pos, seq, pages, cache, q_norm, k_norm, *biases):
    q, k, v, _ = _biased(a, q, k, v, biases)
    a = {**a, "bias": False}
    return _rope_kv(a, _rmsnorm(a, q, q_norm), _rmsnorm(a, k, k_norm), v, pos, seq, pages, cache)


def _attention_partial(a, q, cache, seq, pages, pos):
    return num.attention_partials(q, cache, seq, pages, pos, a["layer"], a["heads"], a["kv_heads"], a["scale"],
                                  a["window"], a["chunk"])


IMPLS: dict[str, Callable[..., Any]] = {
    "embed": lambda a, table, tokens: table[tokens],
    "rmsnorm": _rmsnorm,
    "pack": _pack,
    "matmul": lambda a, x, w: num.matmul(x, w),
    "rope": _rope,
    "kv_store": _kv_store,
    "attention": _attention,
    "add": lambda a, x, y: x + y,
    "bias_add": lambda a, x, b: x + b,
    "mul": lambda a, x, y: x * y,
    "scale": lambda a, x: x * np.float32(a["factor"]),
    "silu": lambda a, x: num.silu(x),
    "gelu_tanh": lambda a, x: num.gelu_tanh(x),
    "softcap": lambda a, x: (np.tanh(x.astype(np.float64) / a["cap"]) * a["cap"]).astype(np.float32),
    "take_rows": lambda a, x, rows: x[rows],
    "rmsnorm_pack": lambda a, x, w: _pack(a, _rmsnorm(a, x, w)),
    "matmul_segmented": lambda a, x, *ws: tuple(num.matmul(x, w) for w in ws),
    "rope_kv": _rope_kv,
    "norm_rope_kv": _norm_rope_kv,
    "attention_partial": _attention_partial,
    "attention_reduce": lambda a, p: num.reduce_partials(p),
    "attention_reduce_pack": lambda a, p: _pack(a, num.reduce_partials(p)),
    "glu_pack": lambda a, g, u: _pack(a, num.ACTIVATIONS[a["act"]](g) * u),
    "matmul_residual": lambda a, x, w, r: r + num.matmul(x, w),
    "tail_argmax": lambda a, x, n, w, m: num.masked_argmax(num.matmul(_pack(a, _rmsnorm(a, x, n)), w), m),
    "moe_router": lambda a, x, gate: num.route(num.matmul(x, gate), a["k"], a["norm"]),
    "matmul_experts": lambda a, x, w, ids: num.matmul_experts(x, w, ids),
    "moe_sum": lambda a, y, w: num.moe_sum(y, w),
    "matmul_experts_residual": lambda a, x, w, ids, wt, r: r + num.moe_sum(num.matmul_experts(x, w, ids), wt),
}


def _bind(n: Node, arr: np.ndarray, sizes: dict[str, int]) -> None:
    t = n.types[0]
    if arr.ndim != t.rank:
        raise IRError(f"input {n.name}: expected {t}, got an array of shape {arr.shape}")
    for d, size in zip(t.shape, arr.shape):
        if isinstance(d, int):
            ok = d == size
        else:
            ok = sizes.setdefault(d, size) == size
        if not ok:
            raise IRError(f"input {n.name}: expected {t}, got shape {arr.shape} ({d} is {sizes.get(d, d)})")


class Interpreter:
    def __init__(self, graph: Graph, weight: WeightFn):
        self.graph, self.weight = graph, weight
        missing = {n.op for n in graph.order if n.op not in IMPLS and n.op not in ("input", "weight")}
        if missing:
            raise IRError(f"the reference interpreter cannot run ops {sorted(missing)}")

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        g = self.graph
        env: dict[Value, np.ndarray] = {}
        sizes: dict[str, int] = {}
        pending_reads: dict[Value, int] = {}
        for n in g.order:
            for o in n.operands:
                pending_reads[o] = pending_reads.get(o, 0) + 1
        for n in g.order:
            if n.op == "input":
                if n.name not in inputs:
                    raise IRError(f"missing input {n.name}")
                _bind(n, inputs[n.name], sizes)
                env[n.out] = inputs[n.name]
                continue
            if n.op == "weight":
                env[n.out] = self.weight(n.name)
                continue
            args = [env[o] for o in n.operands]
            for o in n.operands:
                pending_reads[o] -= 1
            updated = TRAITS[n.op].updates  # the operand the op may update in place
            if updated is not None and pending_reads[n.operands[updated]] > 0:  # someone still reads the old one
                args[updated] = args[updated].copy()
            result = IMPLS[n.op](n.attr, *args)
            results = result if isinstance(result, tuple) else (result,)
            for i, r in enumerate(results):
                env[Value(n.id, i)] = r
        return {name: env[v] for name, v in g.outputs}
