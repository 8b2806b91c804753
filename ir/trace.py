"""The tracer: model definitions call ops on traced values, and the calls record a graph.

A model definition (models/llama.py, models/gemma3.py) is ordinary Python that receives a Tracer as
`nn` and calls `nn.rmsnorm(x, w, eps=...)`, `nn.matmul(x, w)` and every other op of the registry by
name; each call types its result through the op's schema, so a mistake in a definition fails at the
line that made it. The phase decides the graph's inputs (`nn.tokens`, `nn.pos`, `nn.seq`, `nn.pages`,
`nn.cache`) and what `nn.last_rows` does; `nn.ctx` is the context a sequence may reach (LongRoPE picks
its factors by it). Tracing runs once per (architecture, phase, weight table, context).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable

from llmplan.core.formats import ACTIVATION_FORMAT
from llmplan.core.numerics import PAGE
from llmplan.core.weight_views import view_name

from .graph import Graph, Node, Value, make_node
from .ops import REGISTRY, infer, with_defaults
from .types import Dim, Type

PHASES = ("prefill", "decode", "decode-batch")
# rows of activations in each phase: a prefill chunk holds the tokens of all its sequences; a decode
# step one row; a batched decode step one row per running sequence
_ROWS: dict[str, Dim] = {"prefill": "rows", "decode": 1, "decode-batch": "seqs"}


class Traced:
    """A value under construction; only the tracer that made it can use it."""

    __slots__ = ("tracer", "value", "type")

    def __init__(self, tracer: Tracer, value: Value, type: Type):
        self.tracer, self.value, self.type = tracer, value, type

    def __repr__(self) -> str:
        return f"<traced {self.type}>"


class Tracer:
    def __init__(self, name: str, phase: str, weights: dict[str, Type], cache: Type, ctx: int):
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r} (phases: {', '.join(PHASES)})")
        self.name, self.phase, self.ctx = name, phase, ctx
        self._weight_types = weights
        self._nodes: list[Node] = []
        self._weights: dict[str, Traced] = {}
        self._packed: dict[tuple[Value, str], Traced] = {}
        rows = _ROWS[phase]
        self.tokens = self._input("tokens", Type("i32", (rows,)))
        self.pos = self._input("pos", Type("i32", (rows,)))
        self.seq = self._input("seq", Type("i32", (rows,)))
        self.pages = self._input("pages", Type("i32", (1 if rows == 1 else "seqs", "pages")))
        self.last = self._input("last", Type("i32", ("seqs",))) if phase == "prefill" else None
        self.cache = self._input("cache", cache)

    def _add(self, op: str, operands: list[Traced], attrs: dict[str, Any], types: tuple[Type, ...]) -> list[Traced]:
        node = make_node(len(self._nodes), op, [t.value for t in operands], attrs, types)
        self._nodes.append(node)
        return [Traced(self, Value(node.id, i), t) for i, t in enumerate(types)]

    def _input(self, name: str, t: Type) -> Traced:
        return self._add("input", [], {"name": name}, (t,))[0]

    def weight(self, name: str, rows: tuple[int, int] | None = None) -> Traced:
        """A model tensor, or with `rows` = (lo, hi) its rows lo..hi-1 as a weight of their own (a projection
        stored fused with others in the file: core/weight_views.py)."""
        if name not in self._weight_types:
            raise KeyError(f"the model has no tensor {name}")
        t = self._weight_types[name]
        if rows is not None:
            lo, hi = rows
            if not 0 <= lo < hi <= t.shape[0]:
                raise ValueError(f"rows {lo}:{hi} are outside the {t.shape[0]} rows of {name}")
            name, t = view_name(name, lo, hi), t.with_shape(hi - lo, *t.shape[1:])
        if name not in self._weights:
            self._weights[name] = self._add("weight", [], {"name": name}, (t,))[0]
        return self._weights[name]

    def emit(self, op: str, *operands: Traced, **attrs: Any) -> Traced | tuple[Traced, ...]:
        for o in operands:
            if not isinstance(o, Traced) or o.tracer is not self:
                raise TypeError(f"{op}: operand {o!r} is not a value of this trace")
        attrs = with_defaults(op, attrs)
        types = infer(op, [o.type for o in operands], attrs)
        out = self._add(op, list(operands), attrs, types)
        return out[0] if len(out) == 1 else tuple(out)

    def __getattr__(self, op: str) -> Callable[..., Any]:
        if op in REGISTRY and op not in ("input", "weight", "pack"):
            return lambda *operands, **attrs: self.emit(op, *operands, **attrs)
        raise AttributeError(op)

    def _packed_for(self, x: Traced, w: Traced) -> Traced:
        """x packed to the activation format w's dot product takes (one pack per value and format, shared
        by every projection that reads it)."""
        fmt = ACTIVATION_FORMAT.get(w.type.dtype, "f32")
        if fmt == x.type.dtype:
            return x
        key = (x.value, fmt)
        if key not in self._packed:
            self._packed[key] = self.emit("pack", x, format=fmt)
        return self._packed[key]

    def matmul(self, x: Traced, w: Traced) -> Traced:
        """x @ w.T, x packed for w first."""
        return self.emit("matmul", self._packed_for(x, w), w)

    def matmul_experts(self, x: Traced, w: Traced, ids: Traced) -> Traced:
        """The routed experts' projections of x (ir/ops.py matmul_experts), x packed for w first."""
        return self.emit("matmul_experts", self._packed_for(x, w), w, ids)

    def last_rows(self, x: Traced) -> Traced:
        """The rows whose next token is wanted: each sequence's last row in prefill, every row in decode."""
        return self.emit("take_rows", x, self.last) if self.phase == "prefill" else x

    def finish(self, **outputs: Traced) -> Graph:
        return Graph(f"{self.name}.{self.phase}", self._nodes, [(k, v.value) for k, v in outputs.items()])


@lru_cache(maxsize=32)
def _trace_cached(definition: Callable, config, weights: tuple[tuple[str, Type], ...], phase: str, ctx: int) -> Graph:
    c = config
    cache = Type("f16", (c.n_layers, 2, "blocks", PAGE, c.kv_dim))
    nn = Tracer(c.arch, phase, dict(weights), cache, ctx)
    logits, cache_out = definition(nn, c)
    return nn.finish(logits=logits, cache=cache_out)


def trace_model(definition: Callable, config, weights: dict[str, tuple[str, tuple[int, ...]]], phase: str,
                ctx: int | None = None) -> Graph:
    """The graph of one phase of a model: `definition(nn, config)` (models/llama.py, models/gemma3.py)
    called with a Tracer. `weights` maps tensor names to (format, shape in NumPy order); `config` is a
    models.config.ModelConfig; `ctx` the context a sequence may reach (default the model's own)."""
    table = tuple(sorted((n, Type(fmt.lower(), tuple(shape))) for n, (fmt, shape) in weights.items()))
    return _trace_cached(definition, config, table, phase, config.context_length if ctx is None else ctx)


def weight_table(g: Graph) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The weights a graph reads, as trace_model's table names them (views of fused tensors included)."""
    return {n.name: (n.types[0].dtype.upper(), tuple(n.types[0].shape)) for n in g.order if n.op == "weight"}
