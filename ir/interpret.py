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


def _attention(a, q, cache, seq, pos):
    heads, kv_heads, window, layer = a["heads"], a["kv_heads"], a["window"], a["layer"]
    rows, width = q.shape
    d = width // heads
    group = heads // kv_heads
    out = np.empty_like(q)
    # Q and the softmax weights meet the f16 cache as f16, as in llama.cpp and in f16 matrix-unit
    # kernels; products accumulate in f32 and the scale applies to the f32 scores
    q = q.astype(np.float16).astype(np.float32)
    for r in range(rows):
        p = int(pos[r])
        first = max(0, p - window + 1) if window > 0 else 0
        k = cache[layer, 0, seq[r], first : p + 1].astype(np.float32).reshape(-1, kv_heads, d)
        v = cache[layer, 1, seq[r], first : p + 1].astype(np.float32).reshape(-1, kv_heads, d)
        qh = q[r].reshape(kv_heads, group, d)
        s = np.einsum("hgd,nhd->hgn", qh, k) * np.float32(a["scale"])
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        pr = (e / e.sum(axis=-1, keepdims=True)).astype(np.float16).astype(np.float32)
        out[r] = np.einsum("hgn,nhd->hgd", pr, v).reshape(width)
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
}
_IN_PLACE = {"kv_store": 0}  # op -> operand it may update in place


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
