"""The op registry: every op's operands, attributes, and type inference, in one place.

An op's `infer` checks its operand types and attributes and returns its result types; the tracer
uses it to type new nodes and the verifier to re-check every node. Semantics (what each op computes)
are given in each op's docstring and implemented by the reference interpreter (ir/interpret.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from llmplan.core.formats import ACTIVATION_FORMAT, PACK_BLOCK
from llmplan.core.numerics import PAGE

from .errors import IRTypeError
from .types import Dim, Type

ATTR_KINDS = {"int": int, "float": float, "str": str, "bool": bool}


@dataclass(frozen=True)
class OpDef:
    name: str
    operands: tuple[str, ...]  # "?" marks an optional operand, "*" one or more (last ones only)
    attrs: dict[str, str]  # name -> kind in ATTR_KINDS
    infer: Callable[[list[Type], dict[str, Any]], tuple[Type, ...]]
    doc: str
    defaults: dict[str, Any]  # the attributes a node may leave unsaid, and what they then are

    @property
    def min_operands(self) -> int:
        return sum(1 for o in self.operands if not o.endswith("?"))

    @property
    def max_operands(self) -> float:
        return float("inf") if self.operands and self.operands[-1].endswith("*") else len(self.operands)


REGISTRY: dict[str, OpDef] = {}


def op(operands: str, **attrs: str) -> Callable:
    """Register the decorated inference function as op `<function name>`; its docstring is the op's.
    An attribute is `kind` or `kind=default` (`mscale="float=1.0"`): one with a default may be left
    out, and the printer leaves it out where it holds its default, so adding one changes no old text."""
    kinds, defaults = {}, {}
    for name, spec in attrs.items():
        kind, _, default = spec.partition("=")
        kinds[name] = kind
        if default:
            defaults[name] = {"bool": lambda s: s == "true"}.get(kind, ATTR_KINDS[kind])(default)

    def register(infer: Callable) -> Callable:
        name = infer.__name__.rstrip("_")
        REGISTRY[name] = OpDef(name, tuple(operands.split()), kinds, infer, (infer.__doc__ or "").strip(), defaults)
        return infer

    return register


def with_defaults(name: str, attrs: dict[str, Any]) -> dict[str, Any]:
    """A node's attributes with every one it left unsaid at its default."""
    opdef = REGISTRY.get(name)
    return attrs if opdef is None else opdef.defaults | attrs


def is_default(name: str, attr: str, value: Any) -> bool:
    """Whether an attribute holds its op's default (the printer leaves it out)."""
    d = REGISTRY[name].defaults
    return attr in d and type(d[attr]) is type(value) and d[attr] == value


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise IRTypeError(message)


def _dtype(t: Type, *dtypes: str, what: str) -> None:
    _need(t.dtype in dtypes, f"{what} must be {' or '.join(dtypes)}, is {t}")


def _rank(t: Type, rank: int, what: str) -> None:
    _need(t.rank == rank, f"{what} must have rank {rank}, is {t}")


def _same(a: Dim, b: Dim, what: str) -> None:
    _need(a == b, f"{what}: {a} != {b}")


# --- graph leaves ------------------------------------------------------------------------------

@op("", name="str")
def input_(ts, a):
    """A value the caller binds when the graph runs (token ids, positions, the K/V cache)."""
    raise AssertionError("inputs are typed by their declaration")


@op("", name="str")
def weight(ts, a):
    """A model tensor, named by its GGUF tensor name; its type is the tensor's format and shape."""
    raise AssertionError("weights are typed by their declaration")


# --- the decoder's ops -------------------------------------------------------------------------

@op("table tokens")
def embed(ts, a):
    """Row `tokens[r]` of the (dequantized) table for every row r."""
    table, tokens = ts
    _rank(table, 2, "embed table")
    _dtype(tokens, "i32", what="embed tokens")
    _rank(tokens, 1, "embed tokens")
    return (Type("f32", (tokens.shape[0], table.shape[1])),)


@op("x w", eps="float")
def rmsnorm(ts, a):
    """x / sqrt(mean(x^2) + eps) * w over groups of len(w) consecutive features (the whole row, or
    each attention head for query/key norms)."""
    x, w = ts
    _dtype(x, "f32", what="rmsnorm input")
    _dtype(w, "f32", what="rmsnorm weight")
    _rank(w, 1, "rmsnorm weight")
    _need(isinstance(x.shape[-1], int) and x.shape[-1] % w.shape[0] == 0,
          f"rmsnorm weight of {w.shape[0]} does not divide the row of {x}")
    return (x,)




@op("x", format="str")
def pack(ts, a):
    """x rounded to the activation format `format`: 8-bit blocks (q8_0, q8_1: 32 values and an f16
    scale amax/127; q8_k: 256 values and an f32 scale) or f16/bf16 values."""
    (x,) = ts
    _dtype(x, "f32", what="pack input")
    fmt = a["format"]
    _need(fmt in PACK_BLOCK, f"pack format must be one of {', '.join(PACK_BLOCK)}, is {fmt!r}")
    _need(isinstance(x.shape[-1], int) and x.shape[-1] % PACK_BLOCK[fmt] == 0,
          f"{fmt} blocks of {PACK_BLOCK[fmt]} do not divide the rows of {x}")
    return (x.with_dtype(fmt),)


@op("x w")
def matmul(ts, a):
    """x @ dequantize(w).T: w has shape [out, in]; x comes in the weight's activation format
    (ACTIVATION_FORMAT)."""
    x, w = ts
    _need(w.dtype in ACTIVATION_FORMAT, f"matmul weight format {w.dtype} is not supported")
    _dtype(x, ACTIVATION_FORMAT[w.dtype], what=f"matmul input for a {w.dtype} weight")
    _rank(x, 2, "matmul input")
    _rank(w, 2, "matmul weight")
    _same(x.shape[1], w.shape[1], "matmul inner dimension")
    return (Type("f32", (x.shape[0], w.shape[0])),)


@op("x pos factors?", heads="int", dims="int", base="float", scale="float", mode="str", mscale="float=1.0")
def rope(ts, a):
    """Rotary position embedding of each head's first `dims` features at position pos[r] * scale;
    frequency i is base^(-2i/dims), divided by factors[i] when given; the rotated features are
    multiplied by mscale (LongRoPE's attention factor), the others kept. mode "norm" rotates adjacent
    pairs (2i, 2i+1) (llama), "neox" pairs (i, i + dims/2) (gemma, qwen, phi)."""
    x, pos = ts[0], ts[1]
    _dtype(x, "f32", what="rope input")
    _dtype(pos, "i32", what="rope positions")
    _same(pos.shape[0], x.shape[0], "rope positions vs rows")
    _need(a["mode"] in ("norm", "neox"), f"rope mode must be norm or neox, is {a['mode']!r}")
    _need(x.shape[1] % a["heads"] == 0 and a["dims"] <= x.shape[1] // a["heads"],
          f"rope over {a['heads']} heads x {a['dims']} dims does not fit {x}")
    if len(ts) == 3:
        _same(ts[2].shape, (a["dims"] // 2,), "rope factors")
    return (x,)


def _cache(t: Type, what: str) -> None:
    _dtype(t, "f16", what=what)
    _rank(t, 5, what)  # [layers, 2 (K, V), blocks, PAGE positions, kv features]
    _same(t.shape[3], PAGE, f"{what} positions per page")


def _pages(seq: Type, pages: Type, rows: Dim, what: str) -> None:
    """seq[r]: row r's sequence, a row of the page table pages [seqs, pages per sequence]."""
    _dtype(seq, "i32", what=f"{what} seq")
    _same(seq.shape[0], rows, f"{what} seq vs rows")
    _dtype(pages, "i32", what=f"{what} pages")
    _rank(pages, 2, f"{what} pages")


@op("cache k v seq pages pos", layer="int")
def kv_store(ts, a):
    """The cache with K row r and V row r written, rounded to f16, at position pos[r] of sequence
    seq[r]: [layer, page pages[seq[r], pos[r] // PAGE], offset pos[r] % PAGE]."""
    cache, k, v, seq, pages, pos = ts
    _cache(cache, "kv_store cache")
    _need(0 <= a["layer"] < cache.shape[0] if isinstance(cache.shape[0], int) else True,
          f"layer {a['layer']} outside the cache's {cache.shape[0]} layers")
    for t, what in ((k, "K"), (v, "V")):
        _dtype(t, "f32", what=f"kv_store {what}")
        _same(t.shape[1], cache.shape[4], f"kv_store {what} width vs cache")
        _same(t.shape[0], seq.shape[0], f"kv_store {what} rows vs seq")
    _pages(seq, pages, k.shape[0], "kv_store")
    _dtype(pos, "i32", what="kv_store pos")
    return (cache,)


@op("q cache seq pages pos", layer="int", heads="int", kv_heads="int", scale="float", window="int")
def attention(ts, a):
    """Causal attention of query row r (heads of q) over sequence seq[r]'s positions p <= pos[r] (and
    pos[r] - p < window when window > 0) in the cache's layer, read through its page table row:
    softmax(q.K^T * scale) V, query heads h reading K/V head h // (heads / kv_heads)."""
    q, cache, seq, pages, pos = ts
    _dtype(q, "f32", what="attention query")
    _cache(cache, "attention cache")
    h, kvh = a["heads"], a["kv_heads"]
    _need(kvh >= 1 and h % kvh == 0 and q.shape[1] % h == 0, f"attention heads {h}/{kvh} do not fit {q}")
    _same(q.shape[1] // h * kvh, cache.shape[4], "attention K/V width vs cache")
    _pages(seq, pages, q.shape[0], "attention")
    _same(pos.shape[0], q.shape[0], "attention pos vs rows")
    return (q,)


def _elementwise(ts):
    a, b = ts
    _need(a == b, f"operand types differ: {a} vs {b}")
    _dtype(a, "f32", what="operand")
    return (a,)


@op("a b")
def add(ts, a):
    """a + b"""
    return _elementwise(ts)


@op("x b")
def bias_add(ts, a):
    """x + b for every row of x: a projection's bias (Qwen2's q, k and v)."""
    x, b = ts
    _dtype(x, "f32", what="bias_add input")
    _dtype(b, "f32", what="bias")
    _rank(b, 1, "bias")
    _same(x.shape[-1], b.shape[0], "bias width vs rows")
    return (x,)


@op("a b")
def mul(ts, a):
    """a * b"""
    return _elementwise(ts)


@op("x", factor="float")
def scale(ts, a):
    """x * factor"""
    _dtype(ts[0], "f32", what="scale input")
    return (ts[0],)


@op("x")
def silu(ts, a):
    """x * sigmoid(x)"""
    _dtype(ts[0], "f32", what="silu input")
    return (ts[0],)


@op("x")
def gelu_tanh(ts, a):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))"""
    _dtype(ts[0], "f32", what="gelu_tanh input")
    return (ts[0],)


@op("x", cap="float")
def softcap(ts, a):
    """tanh(x / cap) * cap"""
    _dtype(ts[0], "f32", what="softcap input")
    return (ts[0],)


@op("x rows")
def take_rows(ts, a):
    """Rows rows[i] of x, in order: the last row of each sequence in a prefill chunk."""
    x, rows = ts
    _dtype(rows, "i32", what="take_rows indices")
    _rank(rows, 1, "take_rows indices")
    return (x.with_shape(rows.shape[0], *x.shape[1:]),)


# --- mixture of experts ------------------------------------------------------------------------


@op("x gate", k="int", norm="bool")
def moe_router(ts, a):
    """Mixture-of-experts routing of every row: the gate logits x @ gate.T (gate f32 [experts, K], x f32
    [rows, K], each row its own matrix-vector product), their softmax p, the k experts of largest p in
    descending order (equal p as llama.cpp's CPU argsort orders them), and those experts' p as weights,
    divided by their sum when norm (core/numerics.py route). Results: expert ids i32[rows, k] and weights
    f32[rows, k]."""
    x, gate = ts
    _dtype(x, "f32", what="moe_router input")
    _dtype(gate, "f32", what="moe_router gate")
    _rank(x, 2, "moe_router input")
    _rank(gate, 2, "moe_router gate")
    _same(x.shape[1], gate.shape[1], "moe_router gate row vs input row")
    _need(1 <= a["k"] <= gate.shape[0], f"moe_router routes {a['k']} of {gate.shape[0]} experts")
    return Type("i32", (x.shape[0], a["k"])), Type("f32", (x.shape[0], a["k"]))


def _experts(x: Type, w: Type, ids: Type, what: str) -> tuple[Type, int]:
    """The checks of an expert-indexed projection; (x's activation type, the routed slots k)."""
    _need(w.dtype in ACTIVATION_FORMAT, f"{what} weight format {w.dtype} is not supported")
    _dtype(x, ACTIVATION_FORMAT[w.dtype], what=f"{what} input for a {w.dtype} weight")
    _rank(w, 3, f"{what} weight")
    _rank(x, 2, f"{what} input")
    _dtype(ids, "i32", what=f"{what} expert ids")
    _rank(ids, 2, f"{what} expert ids")
    _same(ids.shape[0], x.shape[0], f"{what} expert ids vs rows")
    k = ids.shape[1]
    _need(isinstance(k, int), f"{what}: the routed slots must be a fixed number, are {k}")
    _need(x.shape[1] in (w.shape[2], k * w.shape[2]),
          f"{what} input rows of {x.shape[1]} are neither the weight's {w.shape[2]} nor {k} slots of it")
    return x, k


@op("x w ids")
def matmul_experts(ts, a):
    """Each row's routed projections: y[r, j*N:(j+1)*N] = x_j @ dequantize(w[ids[r, j]]).T for every slot
    j < k, w [experts, N, K]; x_j is the row itself (x [rows, K]: every slot reads it) or the slot's own
    slice x[r, j*K:(j+1)*K] (x [rows, k*K]). x comes in the weight's activation format. A (row, slot)'s
    result does not depend on which rows routed to the same expert."""
    x, w, ids = ts
    _, k = _experts(x, w, ids, "matmul_experts")
    return (Type("f32", (x.shape[0], k * w.shape[1])),)


@op("y weights")
def moe_sum(ts, a):
    """The routed experts' weighted sum: sum over slots j of weights[r, j] * y[r, j*N:(j+1)*N], slot after
    slot from j = 0, each product and sum rounded to float32 (llama.cpp's order)."""
    y, w = ts
    _dtype(y, "f32", what="moe_sum input")
    _dtype(w, "f32", what="moe_sum weights")
    _rank(w, 2, "moe_sum weights")
    _same(y.shape[0], w.shape[0], "moe_sum weights vs rows")
    k = w.shape[1]
    _need(isinstance(k, int) and isinstance(y.shape[1], int) and y.shape[1] % k == 0,
          f"moe_sum: rows of {y.shape[1]} are not {k} slots")
    return (y.with_shape(y.shape[0], y.shape[1] // k),)


def check_attrs(opdef: OpDef, attrs: dict[str, Any]) -> None:
    missing = set(opdef.attrs) - set(attrs)
    extra = set(attrs) - set(opdef.attrs)
    _need(not missing and not extra, f"{opdef.name} attributes: missing {sorted(missing)}, unexpected {sorted(extra)}")
    for k, kind in opdef.attrs.items():
        v = attrs[k]
        ok = isinstance(v, ATTR_KINDS[kind]) and not (kind != "bool" and isinstance(v, bool))
        if kind == "float" and isinstance(v, int) and not isinstance(v, bool):
            ok = False  # floats stay floats so printing is unambiguous
        _need(ok, f"{opdef.name} attribute {k}={v!r} must be {kind}")


def infer(name: str, operand_types: list[Type], attrs: dict[str, Any]) -> tuple[Type, ...]:
    opdef = REGISTRY.get(name)
    _need(opdef is not None, f"unknown op {name!r}")
    n = len(operand_types)
    _need(opdef.min_operands <= n <= opdef.max_operands,
          f"{name} takes {opdef.min_operands}..{opdef.max_operands} operands, got {n}")
    check_attrs(opdef, attrs)
    return opdef.infer(operand_types, attrs)


from . import fused  # noqa: E402,F401  (registers the fused ops the passes produce)
