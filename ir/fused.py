"""The fused ops the passes produce. Each is one kernel launch later, and each means exactly the
composition of primitive ops it replaces (its docstring says which); type inference is that
composition's, so the checks live in one place (ir/ops.py).
"""

from __future__ import annotations

from llmplan.core.numerics import mask_words

from .ops import _dtype, _need, _rank, _same, infer, op
from .types import Type


def _prim(name, types, **attrs):
    return infer(name, list(types), attrs)


@op("x w", eps="float", format="str")
def rmsnorm_pack(ts, a):
    """pack[format](rmsnorm[eps](x, w)): the norm writes 8-bit activation blocks directly."""
    return _prim("pack", _prim("rmsnorm", ts, eps=a["eps"]), format=a["format"])


@op("x w*")
def matmul_segmented(ts, a):
    """matmul(x, w_i) for every weight: one launch over the rows of all weights (q|k|v, gate|up), each
    segment in its own weight format, all reading the same packed x."""
    x, ws = ts[0], ts[1:]
    return tuple(_prim("matmul", [x, w])[0] for w in ws)


def _rope_kv(ts, a, q_norm=None, k_norm=None):
    q, k, v, pos, seq, pages, cache = ts[:7]
    factors, biases = ts[7:len(ts) - 3 * a["bias"]], ts[len(ts) - 3 * a["bias"]:]
    _need(len(factors) <= 1, f"rope_kv takes one factors operand and{'' if a['bias'] else ' no'} biases, got "
                             f"{len(ts)} operands")
    rope = dict(dims=a["dims"], base=a["base"], scale=a["scale"], mode=a["mode"], mscale=a["mscale"])
    if biases:
        q, k, v = (_prim("bias_add", [x, b])[0] for x, b in zip((q, k, v), biases))
    if q_norm is not None:
        q = _prim("rmsnorm", [q, q_norm], eps=a["eps"])[0]
        k = _prim("rmsnorm", [k, k_norm], eps=a["eps"])[0]
    qr = _prim("rope", [q, pos, *factors], heads=a["heads"], **rope)[0]
    kr = _prim("rope", [k, pos, *factors], heads=a["kv_heads"], **rope)[0]
    new_cache = _prim("kv_store", [cache, kr, v, seq, pages, pos], layer=a["layer"])[0]
    return qr, new_cache


_ROPE_ATTRS = dict(heads="int", kv_heads="int", dims="int", base="float", scale="float", mode="str", layer="int",
                   mscale="float=1.0", bias="bool=false")


@op("q k v pos seq pages cache factors? q_bias? k_bias? v_bias?", **_ROPE_ATTRS)
def rope_kv(ts, a):
    """(rope(q), kv_store[layer](cache, rope(k), v, seq, pages, pos)): rotary embedding of queries and
    keys and the K/V cache write in one pass over the rows. With bias, the last three operands are the
    q, k and v projections' biases, added first (bias_add)."""
    return _rope_kv(ts, a)


@op("q k v pos seq pages cache q_norm k_norm q_bias? k_bias? v_bias?", eps="float", **_ROPE_ATTRS)
def norm_rope_kv(ts, a):
    """rope_kv with per-head RMSNorm of queries and keys first (Gemma 3, Qwen3):
    (rope(rmsnorm(q, q_norm)), kv_store(cache, rope(rmsnorm(k, k_norm)), v, seq, pages, pos)); biases
    as rope_kv's, added before the norms."""
    return _rope_kv(ts[:7] + ts[9:], a, q_norm=ts[7], k_norm=ts[8])


_ATTN_ATTRS = dict(layer="int", heads="int", kv_heads="int", scale="float", window="int")


@op("q cache seq pages pos", chunk="int", **_ATTN_ATTRS)
def attention_partial(ts, a):
    """First half of split-context attention: for each row, head and `chunk`-position slice of the
    row's context, the slice's max score m, sum of exp(score - m), and exp-weighted sum of V (the
    values `attention` would compute, per slice). Result [rows, heads, splits, head_dim + 2]."""
    q = ts[0]
    _prim("attention", ts, **{k: a[k] for k in _ATTN_ATTRS})
    _need(a["chunk"] >= 1, f"attention chunk {a['chunk']} must be positive")
    return (Type("f32", (q.shape[0], a["heads"], "splits", q.shape[1] // a["heads"] + 2)),)


def _reduced(p: Type) -> Type:
    _dtype(p, "f32", what="attention partials")
    _rank(p, 4, "attention partials")
    return Type("f32", (p.shape[0], p.shape[1] * (p.shape[3] - 2)))


@op("partials")
def attention_reduce(ts, a):
    """Second half of split-context attention: combine the slices' partial results into
    softmax(q.K^T * scale) V for every row and head."""
    return (_reduced(ts[0]),)


@op("partials", format="str")
def attention_reduce_pack(ts, a):
    """pack[format](attention_reduce(partials)): the reduce writes the output projection's packed input."""
    return _prim("pack", [_reduced(ts[0])], format=a["format"])


@op("gate up", act="str", format="str")
def glu_pack(ts, a):
    """pack[format](mul(act(gate), up)) with act silu or gelu_tanh: the gated product packed for the
    down projection."""
    _need(a["act"] in ("silu", "gelu_tanh"), f"glu_pack act must be silu or gelu_tanh, is {a['act']!r}")
    g = _prim(a["act"], ts[:1])
    return _prim("pack", _prim("mul", [*g, ts[1]]), format=a["format"])


@op("x w r")
def matmul_residual(ts, a):
    """add(r, matmul(x, w)): the projection accumulates into the residual stream in its epilogue."""
    (y,) = _prim("matmul", ts[:2])
    return _prim("add", [ts[2], y])


@op("x w ids weights r")
def matmul_experts_residual(ts, a):
    """add(r, moe_sum(matmul_experts(x, w, ids), weights)): the down projection of the routed experts adds
    their weighted sum to the residual stream in its epilogue."""
    (y,) = _prim("matmul_experts", ts[:3])
    (s,) = _prim("moe_sum", [y, ts[3]])
    return _prim("add", [ts[4], s])


@op("x norm head mask", eps="float", format="str")
def tail_argmax(ts, a):
    """argmax over the vocabulary of matmul(rmsnorm_pack[eps, format](x, norm), head), among the tokens
    each row's mask allows (core/numerics.py masked_argmax: i32 [rows, ceil(vocab / 32)], one bit per
    token): the next token of each row, greedy or constrained, one int32 per sequence instead of a row
    of logits."""
    packed = rmsnorm_pack(ts[:2], a)
    (logits,) = _prim("matmul", [*packed, ts[2]])
    mask = ts[3]
    _dtype(mask, "i32", what="tail_argmax mask")
    _rank(mask, 2, "tail_argmax mask")
    _same(mask.shape[0], logits.shape[0], "tail_argmax mask rows")
    _same(mask.shape[1], mask_words(logits.shape[1]), "tail_argmax mask words")
    return (Type("i32", (logits.shape[0],)),)
