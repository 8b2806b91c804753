"""The CPU backend's kernels: one NumPy function per kernel family, with the interface its GPU twin has.

A kernel is called as kernel(op, attrs, outputs, *inputs), `op` naming the family's variant;
it reads its inputs and writes its outputs in place: arena views (f32 rows, 8-bit activation
blocks as field planes, i32 tokens), the paged f16 K/V planes [layers, 2, blocks, PAGE, kv features],
step state, and weights as the plan's residency says (float32 matrices for projections, mapped
quantized rows for the embedding). Arithmetic is core/numerics.py's, shared with the IR's reference
interpreter, so a plan run on the CPU gives the interpreter's numbers; GPU kernels are tested against
these functions.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from llmplan.core import numerics as num
from llmplan.core.formats import dequantize


class Packed:
    """A packed activation buffer [rows, K] as its field planes (core/formats.planes): `d`, `qs` and
    `s` (q8_1) or `bsums` (q8_k), each [rows, blocks, ...]."""

    def __init__(self, fmt: str, planes: dict[str, np.ndarray]):
        self.fmt, self.planes = fmt, planes

    def __getitem__(self, field: str) -> np.ndarray:
        return self.planes[field]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.planes["qs"].shape[:2]


class MappedRows:
    """A quantized table left in the mapped file; kernels dequantize the rows they need."""

    def __init__(self, raw: np.ndarray, fmt: str, row_bytes: int):
        self.raw, self.fmt, self.row_bytes = raw, fmt, row_bytes

    def rows(self, ids: np.ndarray) -> np.ndarray:
        table = self.raw.reshape(-1, self.row_bytes)
        return dequantize(np.ascontiguousarray(table[ids]), self.fmt, (len(ids), -1))


def values(x: np.ndarray | Packed) -> np.ndarray:
    """The float32 values of an activation: 8-bit blocks unpacked, f16 widened, bf16 (held as uint16
    bit patterns) shifted into place."""
    if isinstance(x, Packed):
        return num.unpack_blocks(x)
    if x.dtype == np.uint16:
        return (x.astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float32, copy=False)


_HELD_AS = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "bf16": np.dtype(np.uint16)}


def _store(dst: np.ndarray | Packed, x: np.ndarray, fmt: str) -> None:
    """Write float32 rows into an output in format `fmt` (the op's), which the buffer must hold."""
    held = dst.fmt if isinstance(dst, Packed) else dst.dtype
    if held != (fmt if fmt.startswith("q8") else _HELD_AS[fmt]):
        raise ValueError(f"a {fmt} result into a {held} buffer: the plan is inconsistent")
    if fmt.startswith("q8"):
        blocks = num.pack_blocks(x, fmt)
        for name in blocks.dtype.names:
            dst[name][...] = blocks[name]
    elif fmt == "bf16":
        dst[...] = (num.packed_values(x, "bf16").view(np.uint32) >> 16).astype(np.uint16)
    else:
        dst[...] = x


def embed(op, a, out, table: MappedRows, tokens):
    out[0][...] = table.rows(tokens)


def norm(op, a, out, x, w=None):
    """rmsnorm, rmsnorm_pack, and pack (no weight)."""
    if op == "rmsnorm":
        out[0][...] = num.rmsnorm(x, w, a["eps"])
    else:
        _store(out[0], x if op == "pack" else num.rmsnorm(x, w, a["eps"]), a["format"])


def _strategy(a) -> dict[str, int]:
    """How a projection runs its products (panel_bytes), as the planner chose it from the tune store
    (plans/cpu_decisions.py); every choice gives the same bits. None recorded: numerics' default."""
    return a.get("strategy", {})


def matmul(op, a, out, x, *rest):
    """matmul / matmul_segmented / matmul_residual: the same dot products (float32 BLAS on the exactly
    dequantized operands, each row alone: numerics.matmul), with several weights or a residual to add."""
    xv = values(x)
    how = _strategy(a)
    if op == "matmul_residual":
        w, r = rest
        out[0][...] = r + num.matmul(xv, w, **how)
    else:  # matmul, matmul_segmented: one output per weight
        for w, o in zip(rest, out):
            o[...] = num.matmul(xv, w, **how)


def rope_kv(op, a, out, q, k, v, pos, seq, pages, cache, *extra):
    """rope_kv (extra = [factors]) and norm_rope_kv (extra = [q_norm, k_norm]), then the q, k and v
    biases where the op has them (added first, in float32): out[0] gets the roped queries; keys and
    values go to the cache, which is out[1] itself."""
    if a.get("bias"):
        *extra, bq, bk, bv = extra
        q, k, v = q + bq, k + bk, v + bv
    factors = None
    if op == "norm_rope_kv":
        q, k = num.rmsnorm(q, extra[0], a["eps"]), num.rmsnorm(k, extra[1], a["eps"])
    elif extra:
        factors = extra[0]
    rope = dict(dims=a["dims"], base=a["base"], scale=a["scale"], mode=a["mode"], factors=factors,
                mscale=a.get("mscale", 1.0))
    out[0][...] = num.rope(q, pos, a["heads"], **rope)
    num.store_kv(out[1], a["layer"], num.rope(k, pos, a["kv_heads"], **rope), v, seq, pages, pos)


_ATTN = ("layer", "heads", "kv_heads", "scale", "window")


def attention(op, a, out, q, cache, seq, pages, pos):
    out[0][...] = num.attention(q, cache, seq, pages, pos, *(a[k] for k in _ATTN))


def attention_decode(op, a, out, *args):
    """Split-context attention. attention_partial(q, cache, seq, pages, pos): out[0] is [rows, heads,
    splits, d + 2] = (exp-weighted V sum, max score, exp sum) per slice of `chunk` positions.
    attention_reduce[_pack](partials): combine the slices (and pack them)."""
    if op == "attention_partial":
        out[0][...] = num.attention_partials(*args, *(a[k] for k in _ATTN), a["chunk"])
    else:
        _store(out[0], num.reduce_partials(args[0]), a.get("format", "f32"))


def glu_pack(op, a, out, gate, up):
    _store(out[0], num.ACTIVATIONS[a["act"]](gate) * up, a["format"])


def elementwise(op, a, out, x, y=None):
    """add, mul, scale, softcap, silu, gelu_tanh; and take_rows (y: the row indices)."""
    if op == "take_rows":
        take_rows(out, x, y)
    elif op == "add":
        out[0][...] = x + y
    elif op == "mul":
        out[0][...] = x * y
    elif op == "scale":
        out[0][...] = x * np.float32(a["factor"])
    elif op == "softcap":
        out[0][...] = (np.tanh(x.astype(np.float64) / a["cap"]) * a["cap"]).astype(np.float32)
    else:
        out[0][...] = num.ACTIVATIONS[op](x)


def take_rows(out, x, rows):
    if isinstance(x, Packed):
        for name, plane in x.planes.items():
            out[0][name][...] = plane[rows]
    else:
        out[0][...] = x[rows]


def tail_argmax(op, a, out, x, norm_w, head, mask):
    """Final norm, packing, output head and the argmax over the tokens each row's mask allows: one
    int32 per row leaves the kernel."""
    xv = num.packed_values(num.rmsnorm(x, norm_w, a["eps"]), a["format"])
    out[0][...] = num.masked_argmax(num.matmul(xv, head, **_strategy(a)), mask)


def moe_router(op, a, out, x, gate):
    """The router: out[0] the routed experts' ids, out[1] their weights (numerics.route of x's gate logits)."""
    out[0][...], out[1][...] = num.route(num.matmul(x, gate), a["k"], a["norm"])


def experts(op, a, out, x, w, ids, *rest):
    """matmul_experts (each row's routed projections) and matmul_experts_residual (rest: the routed
    weights and the residual; out[0] = r + their weighted sum)."""
    y = num.matmul_experts(values(x), w, ids)
    if op == "matmul_experts_residual":
        weights, r = rest
        out[0][...] = r + num.moe_sum(y, weights)
    else:
        out[0][...] = y


# kernel family (core/op_traits.py) -> its NumPy twin
KERNELS: dict[str, Callable[..., Any]] = {
    "embed": embed, "norm": norm, "matmul": matmul, "rope_kv": rope_kv, "attention_prefill": attention,
    "attention_decode": attention_decode, "glu": glu_pack, "elementwise": elementwise, "tail": tail_argmax,
    "router": moe_router, "experts": experts,
}
