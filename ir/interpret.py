"""The reference interpreter: runs any graph with NumPy, the semantic ground truth for passes and kernels.

Activations are float32 (reductions in float64), weights are dequantized float32 supplied by the
caller, and the K/V cache is a contiguous f16 array [layers, 2, slots, ctx, kv features] updated in
place when no later node still reads the old version. Correct and simple rather than fast.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .errors import IRError
from .graph import Graph, Node, Value

WeightFn = Callable[[str], np.ndarray]


def _rmsnorm(a, x, w):
    # llama.cpp's order: squares in f32 summed in f64, then mean, scale and products in f32
    g = w.shape[0]
    xs = x.reshape(*x.shape[:-1], -1, g)
    mean = ((xs * xs).astype(np.float64).sum(axis=-1, keepdims=True) / g).astype(np.float32)
    scale = np.float32(1.0) / np.sqrt(mean + np.float32(a["eps"]))
    return ((xs * scale) * w).reshape(x.shape)


def _rope(a, x, pos, factors=None):
    heads, dims, mode = a["heads"], a["dims"], a["mode"]
    rows = x.shape[0]
    hx = x.reshape(rows, heads, -1).astype(np.float64)
    freqs = a["base"] ** (-np.arange(0, dims, 2, dtype=np.float64) / dims)
    if factors is not None:
        freqs = freqs / factors.astype(np.float64)
    theta = (pos.astype(np.float64) * a["scale"])[:, None] * freqs[None, :]  # [rows, dims/2]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    out = hx.copy()
    if mode == "norm":
        x0, x1 = hx[..., 0:dims:2], hx[..., 1:dims:2]
        out[..., 0:dims:2] = x0 * cos - x1 * sin
        out[..., 1:dims:2] = x0 * sin + x1 * cos
    else:
        half = dims // 2
        x0, x1 = hx[..., :half], hx[..., half:dims]
        out[..., :half] = x0 * cos - x1 * sin
        out[..., half:dims] = x0 * sin + x1 * cos
    return out.reshape(x.shape).astype(np.float32)


def _kv_store(a, cache, k, v, seq, pos):
    layer = a["layer"]
    cache[layer, 0, seq, pos] = k.astype(np.float16)
    cache[layer, 1, seq, pos] = v.astype(np.float16)
    return cache


def _attend(qh, cache, layer, slot, lo, hi, scale):
    """One slice of positions [lo, hi) of a row's context, for all heads: (exp-weighted V sum, max
    score, exp sum). Q (already f16-rounded) and the exp weights meet the f16 cache as f16, as in f16
    matrix-unit kernels; products accumulate in f32. Shared by attention and attention_partial so a
    context that fits one slice gives bit-identical results either way."""
    kv_heads, group, d = qh.shape
    k = cache[layer, 0, slot, lo:hi].astype(np.float32).reshape(-1, kv_heads, d)
    v = cache[layer, 1, slot, lo:hi].astype(np.float32).reshape(-1, kv_heads, d)
    s = np.einsum("hgd,nhd->hgn", qh, k) * np.float32(scale)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - m)
    acc = np.einsum("hgn,nhd->hgd", e.astype(np.float16).astype(np.float32), v)
    return acc.reshape(kv_heads * group, d), m.reshape(-1), e.sum(axis=-1).reshape(-1)


def _first(a, p: int) -> int:
    return max(0, p - a["window"] + 1) if a["window"] > 0 else 0


def _heads(a, q):
    heads, kv_heads = a["heads"], a["kv_heads"]
    d = q.shape[1] // heads
    return q.astype(np.float16).astype(np.float32).reshape(q.shape[0], kv_heads, heads // kv_heads, d)


def _attention(a, q, cache, seq, pos):
    qh = _heads(a, q)
    out = np.empty_like(q)
    for r in range(q.shape[0]):
        p = int(pos[r])
        acc, _, total = _attend(qh[r], cache, a["layer"], seq[r], _first(a, p), p + 1, a["scale"])
        out[r] = (acc / total[:, None]).reshape(-1)
    return out


def _pack(a, x):
    """The values x takes after packing, as llama.cpp's CPU backend rounds them (x86 kernels)."""
    fmt = a["format"]
    if fmt == "f16":
        return x.astype(np.float16).astype(np.float32)
    if fmt == "bf16":
        bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
        return (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
    rows = x.shape[0]
    if fmt == "q8_k":  # quantize_row_q8_K_ref: signed max, f32 scale
        b = x.reshape(rows, -1, 256)
        imax = np.argmax(np.abs(b), axis=-1)[..., None]
        mx = np.take_along_axis(b, imax, axis=-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            iscale = np.where(mx != 0, np.float32(-127.0) / mx, np.float32(0)).astype(np.float32)
            d = np.where(mx != 0, np.float32(1.0) / iscale, np.float32(0)).astype(np.float32)
        q = np.minimum(np.rint(iscale * b), 127)
        return (q * d).astype(np.float32).reshape(x.shape)
    # q8_0 / q8_1 (x86 quantize_row_q8_0/1): scale amax/127 stored as f16, values rounded half-even
    b = x.reshape(rows, -1, 32)
    amax = np.abs(b).max(axis=-1, keepdims=True)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(b * inv)
    return (q * d.astype(np.float16).astype(np.float32)).astype(np.float32).reshape(x.shape)


def _gelu_tanh(x):
    x64 = x.astype(np.float64)
    return (0.5 * x64 * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x64 + 0.044715 * x64**3)))).astype(np.float32)


def _silu(x):
    return (x.astype(np.float64) / (1.0 + np.exp(-x.astype(np.float64)))).astype(np.float32)


# --- fused ops: the compositions they stand for (see ir/fused.py) --------------------------------

def _rope_kv(a, q, k, v, pos, seq, cache, factors=None):
    qr = _rope({**a, "heads": a["heads"]}, q, pos, factors)
    kr = _rope({**a, "heads": a["kv_heads"]}, k, pos, factors)
    return qr, _kv_store(a, cache, kr, v, seq, pos)


def _norm_rope_kv(a, q, k, v, pos, seq, cache, q_norm, k_norm):
    return _rope_kv(a, _rmsnorm(a, q, q_norm), _rmsnorm(a, k, k_norm), v, pos, seq, cache)


def _attention_partial(a, q, cache, seq, pos):
    """Flash-decoding partials: per `chunk` slice of positions, (exp-weighted V sum, max, exp sum)."""
    chunk, heads = a["chunk"], a["heads"]
    qh = _heads(a, q)
    d = qh.shape[3]
    out = np.zeros((q.shape[0], heads, -(-cache.shape[3] // chunk), d + 2), np.float32)
    out[..., d] = -np.inf
    for r in range(q.shape[0]):
        p, first = int(pos[r]), _first(a, int(pos[r]))
        for j in range(first // chunk, p // chunk + 1):
            lo, hi = max(first, j * chunk), min(p + 1, (j + 1) * chunk)
            out[r, :, j, :d], out[r, :, j, d], out[r, :, j, d + 1] = _attend(qh[r], cache, a["layer"], seq[r], lo, hi,
                                                                            a["scale"])
    return out


def _attention_reduce(a, partials):
    d = partials.shape[3] - 2
    m = partials[..., d]
    top = m.max(axis=-1, keepdims=True)
    w = np.where(np.isfinite(m), np.exp(m - top), 0).astype(np.float32)  # empty slices weigh nothing
    acc = (partials[..., :d] * w[..., None]).sum(axis=2)
    total = (partials[..., d + 1] * w).sum(axis=2)
    return (acc / total[..., None]).reshape(partials.shape[0], -1).astype(np.float32)


_ACTS = {"silu": _silu, "gelu_tanh": _gelu_tanh}

IMPLS: dict[str, Callable[..., Any]] = {
    "embed": lambda a, table, tokens: table[tokens],
    "rmsnorm": _rmsnorm,
    "pack": _pack,
    "matmul": lambda a, x, w: x @ w.T,
    "rope": _rope,
    "kv_store": _kv_store,
    "attention": _attention,
    "add": lambda a, x, y: x + y,
    "mul": lambda a, x, y: x * y,
    "scale": lambda a, x: x * np.float32(a["factor"]),
    "silu": lambda a, x: _silu(x),
    "gelu_tanh": lambda a, x: _gelu_tanh(x),
    "softcap": lambda a, x: (np.tanh(x.astype(np.float64) / a["cap"]) * a["cap"]).astype(np.float32),
    "take_rows": lambda a, x, rows: x[rows],
    "rmsnorm_pack": lambda a, x, w: _pack(a, _rmsnorm(a, x, w)),
    "matmul_segmented": lambda a, x, *ws: tuple(x @ w.T for w in ws),
    "rope_kv": _rope_kv,
    "norm_rope_kv": _norm_rope_kv,
    "attention_partial": _attention_partial,
    "attention_reduce": _attention_reduce,
    "attention_reduce_pack": lambda a, p: _pack(a, _attention_reduce(a, p)),
    "glu_pack": lambda a, g, u: _pack(a, _ACTS[a["act"]](g) * u),
    "matmul_residual": lambda a, x, w, r: r + x @ w.T,
    "tail_argmax": lambda a, x, n, w: np.argmax(_pack(a, _rmsnorm(a, x, n)) @ w.T, axis=-1).astype(np.int32),
}
_IN_PLACE = {"kv_store": 0, "rope_kv": 5, "norm_rope_kv": 5}  # op -> operand it may update in place


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
            if n.op in _IN_PLACE:
                i = _IN_PLACE[n.op]
                if pending_reads[n.operands[i]] > 0:  # someone still reads the old version
                    args[i] = args[i].copy()
            result = IMPLS[n.op](n.attr, *args)
            results = result if isinstance(result, tuple) else (result,)
            for i, r in enumerate(results):
                env[Value(n.id, i)] = r
        return {name: env[v] for name, v in g.outputs}
