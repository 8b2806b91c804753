"""Each op's launch contract, shared by the CPU and GPU kernel families: the operands a lowered launch
carries, checked and named once, and the arguments its kernels take, in order, as C parameters bound
to plan references. A family (codegen/families/ for the GPUs, codegen/cpu_families/ for the CPU)
declares its entry point from a contract's `args` and keeps only what differs on its backend: the
kernel's name, template and grid, its members, the formats its kernels read, and the arguments a CPU
kernel takes after the shared ones (the row count a GPU grid carries, a schedule).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmplan.core import formats as core_formats
from llmplan.core.formats import ACTIVATION_FORMAT, SCALAR_BYTES
from llmplan.core.numerics import MAX_EXPERTS, PAGE, SLICE
from llmplan.core.op_traits import ops_of
from llmplan.core.plan_records import F32, I32, Buf, Dim, Launch, Ref, RopeTable, State, Weight

from .build import BuildError
from .kernel import Context, scratch

Param = tuple[str, str]  # an entry point's parameter: (C type, name)


@dataclass(frozen=True)
class Arg:
    """One kernel argument: the entry point's parameter (C type and name) and the reference it binds."""

    ctype: str
    name: str
    ref: Ref


def i32(name: str, value: Dim) -> Arg:
    return Arg("int", name, I32(value))


def f32(name: str, value: float) -> Arg:
    return Arg("float", name, F32(value))


def declare(params) -> str:
    """An entry point's parameter list, from Params or Args."""
    return ", ".join(f"{p[0]} {p[1]}" if isinstance(p, tuple) else f"{p.ctype} {p.name}" for p in params)


def refs(args) -> list[Ref]:
    """What a launch passes for its arguments."""
    return [a.ref for a in args]


def _bind(params: tuple[Param, ...], values: dict[str, Ref]) -> tuple[Arg, ...]:
    """The arguments of `params`, in their order, from the references named in `values`."""
    return tuple(Arg(ctype, name, values[name]) for ctype, name in params)


def _fail(ok: bool, problem: str) -> None:
    if not ok:
        raise BuildError(problem)


def pack_format(fmt: str, k: int, what: str) -> None:
    """An activation format rows of k values can be written in (core/formats.py ACTIVATIONS), else
    BuildError."""
    _fail(fmt in core_formats.ACTIVATIONS,
          f"{what}: output format {fmt} is not one of {', '.join(core_formats.ACTIVATIONS)}")
    _fail(k % core_formats.PACK_BLOCK.get(fmt, 1) == 0, f"{what}: rows of {k} values are not whole {fmt} blocks")


def _op(launch: Launch, family: str) -> str:
    _fail(launch.op in ops_of(family), f"the {family} family does not implement {launch.op}")
    return launch.op


# --- projections -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Projection:
    """matmul, matmul_segmented, matmul_residual: x (packed) times up to three weights (segments, each in
    its own format, all taking x's activation format), a residual added in place for matmul_residual."""

    x: Buf
    weights: tuple[Weight, ...]
    formats: tuple[str, ...]
    residual: Buf | None
    outs: tuple[Buf, ...]
    rows: Dim
    k: int
    ns: tuple[int, ...]

    def args(self, layout) -> tuple[Arg, ...]:
        """projection_params' arguments, each weight in the layout `layout(format)` names."""
        values: dict[str, Ref] = {"x": self.x, "r": self.residual, "rows": I32(self.rows), "k": I32(self.k)}
        for i, (w, f, o, n) in enumerate(zip(self.weights, self.formats, self.outs, self.ns)):
            values |= {f"w{i}": Weight(w.name, layout(f)), f"y{i}": o, f"n{i}": I32(n)}
        return _bind(projection_params(len(self.weights), self.residual is not None), values)


def projection_params(segments: int, residual: bool) -> tuple[Param, ...]:
    """x, each weight, the residual (matmul_residual), each output, rows, k, each weight's out rows."""
    seg = range(segments)
    r = (("const float*", "r"),) if residual else ()
    return (("const void*", "x"), *(("const void*", f"w{i}") for i in seg), *r, *(("float*", f"y{i}") for i in seg),
            ("int", "rows"), ("int", "k"), *(("int", f"n{i}") for i in seg))


def weight(ctx: Context, ref: Weight, formats, what: str, multiple=None) -> tuple[str, int, int]:
    """(format, out rows, in) of a weight in one of `formats` whose rows are whole blocks (or whole
    multiples of `multiple(format)` where a kernel reads wider pieces), else BuildError naming it."""
    fmt = ctx.weights[ref.name][0].upper()
    n, k = ctx.shape(ref)
    _fail(fmt in formats, f"{what}: weight {ref.name} is {fmt}; the kernels read {', '.join(formats)}")
    m = multiple(fmt) if multiple else core_formats.FORMATS[fmt].block
    _fail(k % m == 0, f"{what}: weight {ref.name} ({fmt}) has rows of {k}, not a multiple of {m}")
    return fmt, n, k


def projection(launch: Launch, ctx: Context, formats, multiple=None) -> Projection:
    op = _op(launch, "matmul")
    residual = launch.args[2] if op == "matmul_residual" else None
    ws = tuple(launch.args[1:2] if residual else launch.args[1:])
    _fail(1 <= len(ws) <= 3 and len(launch.outs) == len(ws),
          f"{op}: {len(ws)} weights and {len(launch.outs)} outputs (the kernels take 1 to 3)")
    checked = [weight(ctx, w, formats, op, multiple) for w in ws]
    x = launch.args[0]
    rows, k = ctx.shape(x)
    for (_, _, wk), w in zip(checked, ws):
        _fail(wk == k, f"{op}: weight {w.name} has rows of {wk}, the activation {k}")
    fmts = tuple(f for f, _, _ in checked)
    acts = {ACTIVATION_FORMAT[f.lower()] for f in fmts}
    _fail(len(acts) == 1, f"{op}: segments {'/'.join(fmts)} take different activations ({', '.join(sorted(acts))})")
    _fail(ctx.dtype(x) in acts, f"{op}: a {fmts[0]} weight takes {acts.pop()} activations, not {ctx.dtype(x)}")
    return Projection(x, ws, fmts, residual, tuple(launch.outs), rows, k, tuple(n for _, n, _ in checked))


# --- the tail ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tail:
    """tail_argmax: argmax(pack[act](rmsnorm[eps](x, norm)) . head^T) over the tokens each row's mask
    allows, one int32 per row. The kernel that reads the head takes the mask after it (TAIL_MASK)."""

    x: Buf
    norm: Weight
    head: Weight
    mask: State  # i32 [rows, ceil(vocab / 32)]: bit t % 32 of word t / 32 allows token t (core/numerics.py)
    fmt: str  # the head's
    act: str  # the activation format the head takes
    out: Buf
    rows: Dim
    k: int
    vocab: int
    eps: float


TAIL_MASK: Param = ("const unsigned*", "mask")  # the tail's mask parameter, on every backend


def tail(launch: Launch, ctx: Context, formats, multiple=None) -> Tail:
    """The head in one of `formats` (row multiples as weight() says)."""
    _op(launch, "tail")
    x, norm, head, mask = launch.args
    fmt, vocab, k = weight(ctx, head, formats, "tail_argmax", multiple)
    act = ACTIVATION_FORMAT[fmt.lower()]
    _fail(launch.attrs["format"] == act,
          f"tail_argmax: a {fmt} head takes {act} activations, the op packs {launch.attrs['format']}")
    return Tail(x, norm, head, mask, fmt, act, launch.outs[0], ctx.shape(x)[0], k, vocab, launch.attrs["eps"])


# --- embedding, norms, the gated product -------------------------------------------------------------


@dataclass(frozen=True)
class Embed:
    """embed: row tokens[r] of the table for each row r."""

    table: Weight
    fmt: str
    tokens: State
    out: Buf
    rows: Dim
    vocab: int
    k: int

    def args(self, layout: str) -> tuple[Arg, ...]:
        """EMBED_PARAMS' arguments, the table in `layout`."""
        values = {"table": Weight(self.table.name, layout), "tokens": self.tokens, "out": self.out,
                  "vocab": I32(self.vocab), "k": I32(self.k)}
        return _bind(EMBED_PARAMS, values)


EMBED_PARAMS: tuple[Param, ...] = (("const void*", "table"), ("const int*", "tokens"), ("float*", "out"),
                                   ("int", "vocab"), ("int", "k"))


def embed(launch: Launch, ctx: Context, formats) -> Embed:
    _op(launch, "embed")
    table, tokens = launch.args
    fmt, vocab, k = weight(ctx, table, formats, "embed")
    return Embed(table, fmt, tokens, launch.outs[0], ctx.shape(launch.outs[0])[0], vocab, k)


@dataclass(frozen=True)
class Norm:
    """rmsnorm (f32 out; `group` values per norm: the row, or a head), rmsnorm_pack and pack (to the
    activation format `fmt`)."""

    op: str
    x: Buf
    w: Weight | None
    out: Buf
    fmt: str
    rows: Dim
    k: int
    group: int
    eps: float

    @property
    def args(self) -> tuple[Arg, ...]:
        values = {"x": self.x, "w": self.w, "y": self.out, "out": self.out, "rows": I32(self.rows), "k": I32(self.k),
                  "group": I32(self.group), "eps": F32(self.eps)}
        return _bind(norm_params(self.op), values)


def norm_params(op: str) -> tuple[Param, ...]:
    """rmsnorm (x, w, y, k, group, eps); rmsnorm_pack (x, w, out, rows, k, eps); pack (x, out, rows, k)."""
    if op == "rmsnorm":
        return ("const float*", "x"), ("const float*", "w"), ("float*", "y"), ("int", "k"), ("int", "group"), \
            ("float", "eps")
    if op == "rmsnorm_pack":
        return ("const float*", "x"), ("const float*", "w"), ("void*", "out"), ("int", "rows"), ("int", "k"), \
            ("float", "eps")
    return ("const float*", "x"), ("void*", "out"), ("int", "rows"), ("int", "k")


def norm(launch: Launch, ctx: Context) -> Norm:
    op = _op(launch, "norm")
    x, out = launch.args[0], launch.outs[0]
    w = launch.args[1] if op != "pack" else None
    rows, k = ctx.shape(x)
    fmt = "f32" if op == "rmsnorm" else launch.attrs["format"]
    pack_format(fmt, k, op)
    return Norm(op, x, w, out, fmt, rows, k, ctx.shape(w)[0] if w else k, launch.attrs.get("eps", 0.0))


GLU_ACTS = {"silu": 0, "gelu_tanh": 1}  # the kernels' activation codes


@dataclass(frozen=True)
class Glu:
    """glu_pack: pack[fmt](act(gate) * up)."""

    act: str
    fmt: str
    rows: Dim
    k: int
    args: tuple[Arg, ...]  # GLU_PARAMS


def glu(launch: Launch, ctx: Context) -> Glu:
    _op(launch, "glu")
    gate, up = launch.args
    rows, k = ctx.shape(gate)
    fmt, act = launch.attrs["format"], launch.attrs["act"]
    _fail(act in GLU_ACTS, f"glu_pack: activation {act!r} is not one of {', '.join(GLU_ACTS)}")
    pack_format(fmt, k, "glu_pack")
    values = {"gate": gate, "up": up, "out": launch.outs[0], "rows": I32(rows), "k": I32(k)}
    return Glu(act, fmt, rows, k, _bind(GLU_PARAMS, values))


GLU_PARAMS: tuple[Param, ...] = (("const float*", "gate"), ("const float*", "up"), ("void*", "out"), ("int", "rows"),
                                 ("int", "k"))


# --- elementwise ops and row gathers -------------------------------------------------------------------

EW_OPS = {"add": 0, "mul": 1, "scale": 2, "silu": 3, "gelu_tanh": 4, "softcap": 5}  # elementwise kernels' codes
EW_BINARY = ("add", "mul")
EW_ATTR = {"scale": "factor", "softcap": "cap"}  # the op's float attribute the kernel takes


def _row(shape: tuple, what: str) -> tuple[Dim, int]:
    """(rows, values per row) of a [rows, ...] operand; the row must have a fixed size."""
    rest = shape[1:] if len(shape) > 1 else ()
    _fail(all(isinstance(d, int) for d in rest), f"{what}: rows of {shape} do not have a fixed size")
    return (shape[0] if rest else 1), (math.prod(rest) if rest else shape[0])


def elementwise_params(op: str) -> tuple[Param, ...]:
    """add, mul (x, y, out, k); scale, softcap (x, out, k, attr); silu, gelu_tanh (x, out, k)."""
    _fail(op in EW_OPS, f"elementwise: no kernel for op {op}")
    return (("const float*", "x"), *((("const float*", "y"),) if op in EW_BINARY else ()), ("float*", "out"),
            ("int", "k"), *((("float", "attr"),) if op in EW_ATTR else ()))


@dataclass(frozen=True)
class Elementwise:
    """An elementwise op on f32 [rows, k]."""

    op: str
    code: int
    rows: Dim
    k: int
    args: tuple[Arg, ...]


def elementwise(launch: Launch, ctx: Context) -> Elementwise:
    op = launch.op
    params = elementwise_params(op)
    out = launch.outs[0]
    for ref in (*launch.args, out):
        _fail(ctx.dtype(ref) == "f32", f"{op}: operands must be f32, got {ctx.dtype(ref)}")
    rows, k = _row(ctx.shape(launch.args[0]), op)
    values = {"x": launch.args[0], "y": launch.args[-1], "out": out, "k": I32(k),
              "attr": F32(launch.attrs.get(EW_ATTR.get(op, ""), 0.0))}
    return Elementwise(op, EW_OPS[op], rows, k, _bind(params, values))


TAKE_ROWS_PARAMS: tuple[Param, ...] = (("const void*", "x"), ("const int*", "rows"), ("void*", "out"),
                                       ("int", "row_bytes"))


@dataclass(frozen=True)
class TakeRows:
    """take_rows: out[i] = x[rows[i]] for rows of f32 / i32 / f16 / bf16 values (TAKE_ROWS_PARAMS)."""

    n: Dim
    row_bytes: int
    args: tuple[Arg, ...]


def take_rows(launch: Launch, ctx: Context) -> TakeRows:
    x, rows = launch.args
    out = launch.outs[0]
    dtype = ctx.dtype(x)
    _fail(dtype in SCALAR_BYTES, f"take_rows: {dtype} rows are not gathered by a kernel (f32, i32, f16, bf16 only)")
    _, k = _row(ctx.shape(x), "take_rows")
    row_bytes = k * SCALAR_BYTES[dtype]
    values = {"x": x, "rows": rows, "out": out, "row_bytes": I32(row_bytes)}
    return TakeRows(ctx.shape(out)[0], row_bytes, _bind(TAKE_ROWS_PARAMS, values))


# --- rotary embedding and the K/V write ------------------------------------------------------------------

ROPE_MODES = {"norm": 0, "neox": 1}


@dataclass(frozen=True)
class RopeKv:
    """rope_kv and norm_rope_kv: q and k rotated (after their biases or their per-head norms), k and v
    (v after its bias) written to the paged cache at each row's position."""

    norm: bool
    bias: bool
    mode: str
    rows: Dim
    heads: int
    kv_heads: int
    d: int
    args: tuple[Arg, ...]


def rope_kv_params(norm: bool, bias: bool = False) -> tuple[Param, ...]:
    """q, k, v, pos, seq, pages, cache, the rope table, [q_norm, k_norm,] [q_bias, k_bias, v_bias,] q_out,
    heads, kv_heads, d, dims, layer, npages, blocks[, eps]; `npages` (the page table's row length) and
    `blocks` (the cache's) are symbols the runtime binds."""
    return (("const float*", "q"), ("const float*", "k"), ("const float*", "v"), ("const int*", "pos"),
            ("const int*", "seq"), ("const int*", "pages"), ("lp_half*", "cache"), ("const float*", "table"),
            *((("const float*", "q_norm"), ("const float*", "k_norm")) if norm else ()),
            *((("const float*", "q_bias"), ("const float*", "k_bias"), ("const float*", "v_bias")) if bias else ()),
            ("float*", "q_out"), ("int", "heads"), ("int", "kv_heads"), ("int", "d"), ("int", "dims"), ("int", "layer"),
            ("int", "npages"), ("int", "blocks"), *((("float", "eps"),) if norm else ()))


def rope_kv_call(norm: bool, bias: bool) -> tuple[str, str, str]:
    """What a rope_kv entry hands its template on either backend: the <NORM, BIAS> flags, the norm and
    bias pointers (nullptr where the variant has none) and the eps argument."""
    flags = f"{'true' if norm else 'false'}, {'true' if bias else 'false'}"
    pointers = ", ".join(["q_norm, k_norm" if norm else "nullptr, nullptr",
                          "q_bias, k_bias, v_bias" if bias else "nullptr, nullptr, nullptr"])
    return flags, pointers, "eps" if norm else "0.0f"

def rope_kv(launch: Launch, ctx: Context) -> RopeKv:
    op, a = _op(launch, "rope_kv"), launch.attrs
    q, k, v, pos, seq, pages, cache = launch.args[:7]
    norm, bias = op == "norm_rope_kv", bool(a.get("bias"))
    extra = launch.args[7:len(launch.args) - 3 * bias]
    biases = launch.args[len(launch.args) - 3 * bias:]
    rows, width = ctx.shape(q)
    heads, kv_heads, dims = a["heads"], a["kv_heads"], a["dims"]
    d = width // heads
    _fail(width % heads == 0 and dims % 2 == 0 and 0 < dims <= d,
          f"rope_kv: {heads} heads of {width} features cannot rotate {dims} dims")
    _fail(a["mode"] in ROPE_MODES, f"rope_kv: rotation mode {a['mode']!r} is not one of {', '.join(ROPE_MODES)}")
    _fail(not (norm and bias), "norm_rope_kv: no kernel adds biases before the per-head norms (no model has both)")
    factors = None if norm or not extra else extra[0].name
    if norm:
        _fail(ctx.shape(extra[0])[0] == d and ctx.shape(extra[1])[0] == d,
              f"norm_rope_kv: q/k norm weights must have head_dim {d} values")
    for b, n in zip(biases, (heads * d, kv_heads * d, kv_heads * d)):
        _fail(tuple(ctx.shape(b)) == (n,), f"rope_kv: bias {b.name} has shape {ctx.shape(b)}, not ({n},)")
    table = RopeTable(a["base"], a["scale"], dims, factors, "ctx", a.get("mscale", 1.0))
    values = {"q": q, "k": k, "v": v, "pos": pos, "seq": seq, "pages": pages, "cache": cache, "table": table,
              "q_norm": extra[0] if norm else None, "k_norm": extra[1] if norm else None,
              **dict(zip(("q_bias", "k_bias", "v_bias"), biases)), "q_out": launch.outs[0], "heads": I32(heads),
              "kv_heads": I32(kv_heads), "d": I32(d), "dims": I32(dims), "layer": I32(a["layer"]),
              "npages": I32("pages"), "blocks": I32("blocks"), "eps": F32(a.get("eps", 0.0))}
    args = _bind(rope_kv_params(norm, bias), values)
    return RopeKv(norm, bias, a["mode"], rows, heads, kv_heads, d, args)


# --- attention ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attention:
    """attention and attention_partial (over `chunk`-position slices of the context, `splits` of them):
    query rows against the paged cache of one layer; attention_reduce(_pack) combines the partials."""

    op: str
    rows: Dim
    heads: int
    kv_heads: int
    d: int
    splits: Dim
    chunk: int  # positions per slice: the op's for attention_partial, core/numerics.py SLICE otherwise
    fmt: str  # attention_reduce(_pack)'s output format
    args: tuple[Arg, ...]


def attention_params(op: str) -> tuple[Param, ...]:
    """attention: (q, cache, seq, pages, pos, out, rows, heads, kv_heads, npages, blocks, layer, scale,
    window); attention_partial: (q, cache, seq, pages, pos, part, layer, npages, blocks, kv_heads, splits,
    window, scale); attention_reduce(_pack): (part, out, rows, heads, d, splits)."""
    if op in ("attention_reduce", "attention_reduce_pack"):
        return (("const float*", "part"), ("void*", "out"), ("int", "rows"), ("int", "heads"), ("int", "d"),
                ("int", "splits"))
    common = (("const float*", "q"), ("const lp_half*", "cache"), ("const int*", "seq"), ("const int*", "pages"),
              ("const int*", "pos"))
    if op == "attention":
        return (*common, ("float*", "out"), ("int", "rows"), ("int", "heads"), ("int", "kv_heads"), ("int", "npages"),
                ("int", "blocks"), ("int", "layer"), ("float", "scale"), ("int", "window"))
    return (*common, ("float*", "part"), ("int", "layer"), ("int", "npages"), ("int", "blocks"), ("int", "kv_heads"),
            ("int", "splits"), ("int", "window"), ("float", "scale"))


def attention(launch: Launch, ctx: Context) -> Attention:
    op, a = launch.op, launch.attrs
    _fail(op in ops_of("attention_prefill") + ops_of("attention_decode"), f"attention: no kernel for op {op}")
    out = launch.outs[0]
    if op in ("attention_reduce", "attention_reduce_pack"):
        part = launch.args[0]
        rows, heads, splits, width = ctx.shape(part)
        fmt = a["format"] if op == "attention_reduce_pack" else "f32"
        pack_format(fmt, heads * (width - 2), op)
        values = {"part": part, "out": out, "rows": I32(rows), "heads": I32(heads), "d": I32(width - 2),
                  "splits": I32(splits)}
        return Attention(op, rows, heads, 0, width - 2, splits, SLICE, fmt, _bind(attention_params(op), values))
    q, cache, seq, pages, pos = launch.args
    rows, width = ctx.shape(q)
    heads, kv_heads = a["heads"], a["kv_heads"]
    splits: Dim = 1
    chunk = SLICE
    if op == "attention_partial":
        rows, part_heads, splits, dp2 = ctx.shape(out)  # one partial per row of the output
        _fail(part_heads == heads, f"attention_partial: partials for {part_heads} heads, the op has {heads}")
        d, chunk = dp2 - 2, a["chunk"]
        _fail(chunk > 0 and chunk % PAGE == 0, f"attention_partial: chunk {chunk} is not whole {PAGE}-position pages")
    else:
        d = width // heads
    _fail(kv_heads >= 1 and heads % kv_heads == 0 and width == heads * d,
          f"attention: {heads} heads / {kv_heads} K/V heads of {d} do not fit {width} query features")
    values = {"q": q, "cache": cache, "seq": seq, "pages": pages, "pos": pos, "out": out, "part": out,
              "rows": I32(rows), "heads": I32(heads), "kv_heads": I32(kv_heads), "npages": I32("pages"),
              "blocks": I32("blocks"), "layer": I32(a["layer"]), "scale": F32(a["scale"]), "window": I32(a["window"]),
              "splits": I32(splits)}
    args = _bind(attention_params(op), values)
    return Attention(op, rows, heads, kv_heads, d, splits, chunk, "f32", args)


# --- mixture of experts ----------------------------------------------------------------------------


ROUTER_PARAMS: tuple[Param, ...] = (("const float*", "x"), ("const float*", "gate"), ("int*", "ids"),
                                    ("float*", "weights"), ("int", "rows"), ("int", "k"), ("int", "experts"),
                                    ("int", "top"), ("int", "norm"))


@dataclass(frozen=True)
class Router:
    """moe_router: each row's gate logits x . gate^T (x f32 [rows, k], gate f32 [experts, k]), their
    softmax, the `top` experts of largest probability (ids [rows, top]) and their weights [rows, top],
    divided by their sum when `norm` (ROUTER_PARAMS)."""

    rows: Dim
    k: int
    experts: int
    top: int
    args: tuple[Arg, ...]


def router(launch: Launch, ctx: Context) -> Router:
    _op(launch, "router")
    x, gate = launch.args
    ids, weights = launch.outs
    _fail(ctx.dtype(x) == "f32" and ctx.dtype(gate) == "f32",
          f"moe_router: the input and the gate must be f32, are {ctx.dtype(x)} and {ctx.dtype(gate)}")
    rows, k = ctx.shape(x)
    experts, gk = ctx.shape(gate)
    top = launch.attrs["k"]
    _fail(gk == k and 1 <= top <= experts, f"moe_router: {top} of {experts} experts of rows of {gk} for inputs of {k}")
    values = {"x": x, "gate": gate, "ids": ids, "weights": weights, "rows": I32(rows), "k": I32(k),
              "experts": I32(experts), "top": I32(top), "norm": I32(int(launch.attrs["norm"]))}
    return Router(rows, k, experts, top, _bind(ROUTER_PARAMS, values))


def group_ints(top: int) -> int:
    """Ints per row of the groups scratch for `top` slots a row: the group count, each group's expert and
    first position, the slots in group order, each slot's position (4 top + 2; experts.cu lp_moe_group,
    experts.h group_slots)."""
    return 4 * top + 2


def experts_params(residual: bool) -> tuple[Param, ...]:
    """x, w, ids, [weights, r,] y, rows, k, n, experts, top, sliced (x holds one k-wide slice per slot)."""
    fused = (("const float*", "weights"), ("const float*", "r")) if residual else ()
    return (("const void*", "x"), ("const void*", "w"), ("const int*", "ids"), *fused, ("float*", "y"), ("int", "rows"),
            ("int", "k"), ("int", "n"), ("int", "experts"), ("int", "top"), ("int", "sliced"))


@dataclass(frozen=True)
class Experts:
    """matmul_experts: y[r, j*n:(j+1)*n] = x_j . W[ids[r, j]]^T for every slot j < top, W [experts, n, k]
    in format `fmt`, x_j the row x[r] or (sliced) its slot's k-wide slice; matmul_experts_residual: y[r] =
    r[r] + sum_j weights[r, j] * (x_j . W[ids[r, j]]^T), slot after slot. x is packed in the weight's
    activation format."""

    op: str
    x: Buf
    w: Weight
    fmt: str
    rows: Dim
    k: int
    n: int
    experts: int
    top: int
    sliced: bool
    values: dict  # the references of experts_params, by name

    def args(self, layout) -> tuple[Arg, ...]:
        """experts_params' arguments, the weight in the layout `layout(format)` names."""
        return _bind(experts_params(self.op == "matmul_experts_residual"),
                     self.values | {"w": Weight(self.w.name, layout(self.fmt))})

    def grouping(self) -> tuple[Ref, Ref, Ref]:
        """The grouping buffers of both targets' kernels, the plan's scratch sized for the phase's bound of
        rows: "matmul_experts.groups" i32 [rows, group_ints(top)], "matmul_experts.x" the slots' activation
        rows in group order [rows, top * k], "matmul_experts.y" f32 [rows, top * n] the slots' results
        (matmul_experts_residual's, before their weighted sum)."""
        return (scratch("matmul_experts.groups", "i32", [self.rows, group_ints(self.top)]),
                scratch("matmul_experts.x", ACTIVATION_FORMAT[self.fmt.lower()], [self.rows, self.top * self.k]),
                scratch("matmul_experts.y", "f32", [self.rows, self.top * self.n]))


def experts(launch: Launch, ctx: Context, formats, multiple=None) -> Experts:
    """The weight in one of `formats`, its rows whole blocks (or whole multiples of `multiple(format)`, as
    weight() says)."""
    op = _op(launch, "experts")
    x, w, ids = launch.args[:3]
    fmt = ctx.weights[w.name][0].upper()
    e, n, k = ctx.shape(w)
    _fail(fmt in formats, f"{op}: weight {w.name} is {fmt}; the kernels read {', '.join(formats)}")
    m = multiple(fmt) if multiple else core_formats.FORMATS[fmt].block
    _fail(k % m == 0, f"{op}: weight {w.name} ({fmt}) has rows of {k}, not a multiple of {m}")
    rows, width = ctx.shape(x)
    top = ctx.shape(ids)[1]
    _fail(width in (k, top * k), f"{op}: inputs of {width} are neither the weight's rows of {k} nor {top} slots of them")
    act = ACTIVATION_FORMAT[fmt.lower()]
    _fail(ctx.dtype(x) == act, f"{op}: a {fmt} weight takes {act} activations, not {ctx.dtype(x)}")
    values = {"x": x, "ids": ids, "y": launch.outs[0], "rows": I32(rows), "k": I32(k), "n": I32(n),
              "experts": I32(e), "top": I32(top), "sliced": I32(int(width != k))}
    if op == "matmul_experts_residual":
        values |= {"weights": launch.args[3], "r": launch.args[4]}
    return Experts(op, x, w, fmt, rows, k, n, e, top, width != k, values)
