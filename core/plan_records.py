"""The plan contract's records: everything a plan file holds, typed. The compiler builds them, the plan
file stores them (core/planfile.py: msgpack of their wire form), and the runtime, `plan inspect` and the
drivers read their attributes. One table per fact: a record's fields are its schema; core/plan_schema.py
adds only the checks a type cannot say (references in range, sizes that agree).

Wire form. `to_wire` turns a record into plain msgpack values (maps, lists, scalars), leaving out an
optional field that holds nothing; `from_wire` turns them back, checking every type on the way and naming
the field that is wrong (`phases.decode.launches[3].kernels[0].grid[1]: expected int or [symbol, per]`).
An argument reference is a one-key map naming its kind ({"buf": 3}, {"state": "tokens"}, {"weight":
name, "layout": L}, ...), as plans/lower.py has always written it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

from .devices import DeviceFacts
from .errors import InputError


class SchemaError(InputError):
    """A plan body or header that does not hold together; core/planfile.py adds the path and what to run."""


Dim = Union[int, str]  # a size, or a symbol (rows, seqs, ctx, ...) bound per phase or per step


def bound_shape(shape: tuple[Dim, ...], dims: dict[str, int]) -> tuple[int, ...]:
    """A shape with its symbols bound by `dims`."""
    return tuple(d if isinstance(d, int) else dims[d] for d in shape)

# --- argument references ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Buf:
    """An arena buffer of the phase: Phase.buffers[index]."""

    index: int
    KIND: ClassVar[str] = "buf"


@dataclass(frozen=True, slots=True)
class State:
    """A step-state input of the phase (tokens, pos, seq, pages, ...): Phase.state[name]."""

    name: str
    KIND: ClassVar[str] = "state"


@dataclass(frozen=True, slots=True)
class Cache:
    """The paged K/V cache (PlanBody.cache)."""

    KIND: ClassVar[str] = "cache"


@dataclass(frozen=True, slots=True)
class Weight:
    """A model tensor; in a kernel call, in the device layout its kernel reads (core/layouts.py)."""

    name: str
    layout: str = ""  # "" in a lowered launch's operands: the layout is the kernel's to choose
    KIND: ClassVar[str] = "weight"


@dataclass(frozen=True, slots=True)
class Scratch:
    """A kernel's private arena range (a split-K workspace, partial results), placed by liveness."""

    name: str
    dtype: str
    shape: tuple[Dim, ...]
    offset: int = 0
    bytes: int = 0
    KIND: ClassVar[str] = "scratch"


@dataclass(frozen=True, slots=True)
class RopeTable:
    """The (cos, sin) table the runtime builds for a rotary embedding (core/numerics.py rope_table):
    float32 [positions, dims / 2, 2]."""

    base: float
    scale: float
    dims: int
    factors: str | None  # a weight holding per-frequency divisors, or none
    positions: Dim
    mscale: float = 1.0  # cos and sin times this (LongRoPE's attention factor)
    KIND: ClassVar[str] = "rope_table"


@dataclass(frozen=True, slots=True)
class I32:
    """An int scalar: a constant, or a symbol bound per step."""

    value: Dim
    KIND: ClassVar[str] = "i32"


@dataclass(frozen=True, slots=True)
class F32:
    value: float
    KIND: ClassVar[str] = "f32"


Ref = Union[Buf, State, Cache, Weight, Scratch, RopeTable, I32, F32]
REF_KINDS: dict[str, type] = {c.KIND: c for c in (Buf, State, Cache, Weight, Scratch, RopeTable, I32, F32)}
MEMORY = (Buf, State, Cache, Weight)  # what a lowered launch's operands and outputs may be
GridDim = Union[int, tuple[str, int]]  # a size, or (symbol, per): ceil(symbol / per), bound per step


def grid_dim(value: int | str, per: int = 1) -> GridDim:
    return -(-value // per) if isinstance(value, int) else (value, per)


# --- the plan's records --------------------------------------------------------------------------


@dataclass(slots=True)
class Buffer:
    dtype: str
    shape: tuple[Dim, ...]
    offset: int = 0  # in the arena
    bytes: int = 0


@dataclass(slots=True)
class StateInput:
    dtype: str
    shape: tuple[Dim, ...]
    fed_by: str = ""  # the output a decode step writes into it for the next (next_token)
    default: int | None = None  # what its slot holds when a step gives none (the tail's mask: -1, all allowed)


@dataclass(slots=True)
class KernelCall:
    """One kernel launch: a compiled kernel by name, its grid, block, dynamic shared memory, arguments."""

    name: str
    grid: tuple[GridDim, ...]
    block: int
    smem: int
    args: list[Ref]


@dataclass(slots=True)
class Launch:
    """A fused graph node: its op and operands, the outputs it writes, and the kernel calls a backend
    makes for it, with the member chosen and why."""

    op: str
    family: str
    attrs: dict[str, Any]
    args: list[Ref]
    outs: list[Ref]
    kernels: list[KernelCall] = field(default_factory=list)
    member: str = ""
    provenance: str = ""
    serves: list[str] = field(default_factory=list)  # the graph outputs downstream of it
    decision: str = ""  # the tune-store decision key, where one was consulted
    pruned: dict[str, str] = field(default_factory=dict)  # GPU members that do not fit, and why


@dataclass(slots=True)
class Phase:
    launches: list[Launch]
    buffers: list[Buffer]
    outputs: dict[str, Ref]
    state: dict[str, StateInput]
    per_step: list[str]  # the dims each step binds (rows, seqs)
    dims: dict[str, int] = field(default_factory=dict)  # each symbol's bound
    arena_bytes: int = 0
    activation_bytes: int = 0  # every value's bytes, unshared


@dataclass(slots=True)
class LayoutInfo:
    version: int
    bytes: int


@dataclass(slots=True)
class WeightInfo:
    format: str
    shape: tuple[int, ...]
    layouts: dict[str, LayoutInfo]  # the device layouts its kernels read


@dataclass(slots=True)
class KernelInfo:
    params: list[str]  # C parameter types, in order
    block: int


@dataclass(slots=True)
class CacheInfo:
    dtype: str
    shape: tuple[Dim, ...]  # [layers, 2, "blocks", page, kv features]
    page: int
    layout: str  # in words, for a reader


@dataclass(slots=True)
class CpuSection:
    kernels: str  # "native": the CPU target's compiled kernels; "numpy": the NumPy twins
    why: str
    isa: str = ""
    compiler: str = ""
    source: str = ""  # the translation unit


@dataclass(slots=True)
class GpuSection:
    target: str
    source: str
    binary: bytes
    manifests: dict[str, dict[str, Any]]
    compiler: str = ""
    ptx: str = ""
    seconds: float = 0.0
    cached: bool = False


@dataclass(slots=True)
class TunedDecision:
    member: str
    provenance: str
    launches: dict[str, int]  # per phase


@dataclass(slots=True)
class TuneRecord:
    store: str
    device_key: str
    decisions: dict[str, TunedDecision]


@dataclass(slots=True)
class PlanBody:
    config: dict[str, Any]  # models/config.py ModelConfig.to_dict
    ir: dict[str, str]  # each phase's final IR text
    phases: dict[str, Phase]
    arena_bytes: int
    cache: CacheInfo
    weights: dict[str, WeightInfo]
    declines: dict[str, list[str]]
    kernels: dict[str, KernelInfo]
    tune: TuneRecord
    device_memory: dict[str, int] = field(default_factory=dict)
    decode_bytes_per_token: int = 0
    cpu: CpuSection | None = None
    gpu: GpuSection | None = None


@dataclass(slots=True)
class Limits:
    ctx: int
    chunk: int
    max_seqs: int
    kv_blocks: int


@dataclass(slots=True)
class ModelRef:
    path: str
    name: str
    arch: str
    fingerprint: dict[str, Any]  # core/planfile.py model_fingerprint


@dataclass(slots=True)
class PlanHeader:
    format: int
    llmplan: str
    device: DeviceFacts
    toolchain: dict[str, str]
    model: ModelRef
    limits: Limits


# --- wire form -----------------------------------------------------------------------------------


def ref_to_wire(r: Ref) -> dict[str, Any]:
    if isinstance(r, Buf):
        return {"buf": r.index}
    if isinstance(r, State):
        return {"state": r.name}
    if isinstance(r, Cache):
        return {"cache": 1}
    if isinstance(r, Weight):
        return {"weight": r.name, "layout": r.layout} if r.layout else {"weight": r.name}
    if isinstance(r, Scratch):
        return {"scratch": r.name, "dtype": r.dtype, "shape": list(r.shape), "offset": r.offset, "bytes": r.bytes}
    if isinstance(r, RopeTable):
        mscale = {"mscale": r.mscale} if r.mscale != 1.0 else {}
        return {"rope_table": {"base": r.base, "scale": r.scale, "dims": r.dims, "factors": r.factors,
                               "positions": r.positions, **mscale}}
    return {r.KIND: r.value}


def to_wire(obj: Any) -> Any:
    """Plain msgpack values of a record (an optional field left out where it holds nothing)."""
    if isinstance(obj, REF_TYPES):
        return ref_to_wire(obj)
    if isinstance(obj, DeviceFacts):
        return obj.to_dict()
    if dataclasses.is_dataclass(obj):
        out = {}
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if _optional(f) and (v is None or v == "" or v == [] or v == {}):
                continue
            out[f.name] = to_wire(v)
        return out
    if isinstance(obj, dict):
        return {k: to_wire(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_wire(v) for v in obj]
    return obj


REF_TYPES = tuple(REF_KINDS.values())


def _optional(f: dataclasses.Field) -> bool:
    """A field a record may leave empty: its default is nothing, "", or an empty list or map."""
    return f.default_factory is not dataclasses.MISSING or f.default is None or f.default == ""


def _fail(where: str, problem: str) -> typing.NoReturn:
    raise SchemaError(f"{where or 'body'}: {problem}")


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _name(tp: Any) -> str:
    if tp is type(None):
        return "nothing"
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_name(a) for a in typing.get_args(tp))
    if origin in (list, tuple):
        return "a list"
    if origin is dict:
        return "a map"
    return getattr(tp, "__name__", str(tp))


def ref_from_wire(obj: Any, where: str) -> Ref:
    if not isinstance(obj, dict) or not obj:
        _fail(where, f"an argument must be a map, got {obj!r}")
    kinds = [k for k in REF_KINDS if k in obj]
    if len(kinds) != 1:
        _fail(where, f"unknown argument kind {next(iter(obj))!r}" if not kinds else
              f"an argument has one kind, this has {', '.join(kinds)}")
    kind = kinds[0]
    if kind == "buf":
        return Buf(_value(int, obj["buf"], f"{where}.buf"))
    if kind == "state":
        return State(_value(str, obj["state"], f"{where}.state"))
    if kind == "cache":
        return Cache()
    if kind == "weight":
        return Weight(_value(str, obj["weight"], f"{where}.weight"), _value(str, obj.get("layout", ""), f"{where}.layout"))
    if kind == "scratch":
        return Scratch(_value(str, obj["scratch"], f"{where}.scratch"),
                       *(_value(tp, obj.get(k, d), f"{where}.{k}") for k, tp, d in (
                           ("dtype", str, None), ("shape", tuple[Dim, ...], None), ("offset", int, 0),
                           ("bytes", int, 0))))
    if kind == "rope_table":
        t = _value(dict[str, Any], obj["rope_table"], f"{where}.rope_table")
        at = f"{where}.rope_table"
        return RopeTable(*(_value(tp, t.get(k, d), f"{at}.{k}") for k, tp, d in (
            ("base", float, None), ("scale", float, None), ("dims", int, None), ("factors", str | None, None),
            ("positions", Dim, None), ("mscale", float, 1.0))))
    if kind == "i32":
        return I32(_value(Dim, obj["i32"], f"{where}.i32"))
    return F32(_value(float, obj["f32"], f"{where}.f32"))


def _value(tp: Any, obj: Any, where: str) -> Any:
    """`obj` (plain values) as type `tp`, checked; raises SchemaError naming `where`."""
    if tp is Any:
        return obj
    if tp is Ref:
        return ref_from_wire(obj, where)
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        for option in options:
            try:
                return _value(option, obj, where)
            except SchemaError:
                continue
        _fail(where, f"expected {_name(tp)}, got {obj!r:.80}")
    if tp is type(None):
        if obj is not None:
            _fail(where, f"expected nothing, got {obj!r:.80}")
        return None
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(obj, (list, tuple)):
            _fail(where, f"expected a list, got {type(obj).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_value(args[0], v, f"{where}[{i}]") for i, v in enumerate(obj))
        if len(obj) != len(args):
            _fail(where, f"expected {len(args)} values, got {len(obj)}")
        return tuple(_value(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, obj)))
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(obj, (list, tuple)):
            _fail(where, f"expected a list, got {type(obj).__name__}")
        return [_value(item, v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if origin is dict:
        key, item = typing.get_args(tp)
        if not isinstance(obj, dict):
            _fail(where, f"expected a map, got {type(obj).__name__}")
        return {_value(key, k, f"{where} key"): _value(item, v, _join(where, str(k))) for k, v in obj.items()}
    if tp is DeviceFacts:
        d = _value(dict[str, Any], obj, where)
        known = {f.name for f in dataclasses.fields(DeviceFacts)}
        return record_from_wire(DeviceFacts, {k: v for k, v in d.items() if k in known}, where)
    if dataclasses.is_dataclass(tp):
        return record_from_wire(tp, obj, where)
    if tp is float:
        if isinstance(obj, bool) or not isinstance(obj, (int, float)):
            _fail(where, f"expected a number, got {obj!r:.80}")
        return float(obj)
    if isinstance(obj, bool) and tp is not bool or not isinstance(obj, tp):
        _fail(where, f"expected {_name(tp)}, got {type(obj).__name__}")
    return obj


_HINTS: dict[type, dict[str, Any]] = {}


def record_from_wire(cls: type, obj: Any, where: str) -> Any:
    """A record of type `cls` from its wire form; a missing field takes its default, or is an error."""
    if not isinstance(obj, dict):
        _fail(where, f"expected a map, got {type(obj).__name__}")
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in obj:
            values[f.name] = _value(hints[f.name], obj[f.name], _join(where, f.name))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            _fail(where, f"missing field {f.name!r}")
    return cls(**values)
