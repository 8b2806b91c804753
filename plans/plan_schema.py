"""The plan body's schema, checked when a plan is read: every field a runtime uses, present, of its type,
and consistent with the others (references in range, sizes matching what their dtype, shape, format
and layout make). A body that fails gets a PlanError naming the field, e.g.
`phases.decode.launches[3].kernels[0].args[2]: unknown argument kind 'foo'`, never a KeyError later.

Argument references (plans/lower.py, codegen/kernel.py): {"buf": i} an arena buffer of the phase,
{"state": name} a step-state input, {"cache": 1} the K/V cache, {"weight": name, "layout": L} a model
tensor in a device layout (core/layouts.py), {"scratch": name, "dtype", "shape", "offset", "bytes"} a
kernel's private arena range, {"rope_table": {base, scale, dims, factors, positions}} a table the
runtime builds, {"i32": int or symbol} / {"f32": number} scalars.

A GPU plan has a `gpu` section (its translation unit, binary, manifests); a CPU plan a `cpu` section:
{"kernels": "native", "isa", "compiler", "source", "why"} when its calls are the CPU target's compiled
kernels (in the kernel table), {"kernels": "numpy", "why"} when they are the NumPy twins.
"""

from __future__ import annotations

from typing import Any

from llmplan.core.errors import InputError
from llmplan.core.formats import ACTIVATION_FORMATS, FORMATS, SCALAR_BYTES, value_bytes
from llmplan.core.layouts import LAYOUTS, layout_bytes
from llmplan.core.op_traits import FAMILIES, TRAITS

PHASES = ("prefill", "decode", "decode-batch")
NUMPY_PREFIX = "numpy."  # kernel calls of the NumPy CPU backend: numpy.<family>
C_SCALARS = {"int": "i32", "unsigned": "i32", "float": "f32"}
CPU_KERNELS = ("native", "numpy")  # a CPU plan's calls: the compiled kernels, or the NumPy twins
DTYPES = set(SCALAR_BYTES) | {f.lower() for f in ACTIVATION_FORMATS}


class SchemaError(InputError):
    """A plan body that does not hold together; planfile.py turns it into a PlanError with the path."""


def _fail(where: str, problem: str) -> None:
    raise SchemaError(f"{where}: {problem}")


def _get(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict):
        _fail(where, f"expected a map, got {type(obj).__name__}")
    if key not in obj:
        _fail(where, f"missing field {key!r}")
    value = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        _fail(f"{where}.{key}", f"expected {' or '.join(k.__name__ for k in kinds)}, got {type(value).__name__}")
    return value


def _int(obj: Any, key: str, where: str, low: int = 0) -> int:
    v = _get(obj, key, int, where)
    if v < low:
        _fail(f"{where}.{key}", f"{v} is below {low}")
    return v


def _shape(shape: Any, dims: dict[str, int], where: str) -> list[int]:
    """The shape bound to the phase's bounds; every symbol must be one of its dims."""
    if not isinstance(shape, list):
        _fail(where, "a shape must be a list")
    out = []
    for i, d in enumerate(shape):
        if isinstance(d, str):
            if d not in dims:
                _fail(f"{where}[{i}]", f"unknown dimension {d!r} (the phase binds {', '.join(sorted(dims))})")
            out.append(dims[d])
        elif isinstance(d, int) and not isinstance(d, bool) and d >= 0:
            out.append(d)
        else:
            _fail(f"{where}[{i}]", f"a dimension must be a size or a symbol, got {d!r}")
    return out


class _Checker:
    def __init__(self, body: dict[str, Any]):
        self.body = body
        self.weights = _get(body, "weights", dict, "body")
        self.kernels = _get(body, "kernels", dict, "body")

    def check(self) -> None:
        b = self.body
        for key, kind in (("config", dict), ("ir", dict), ("declines", dict), ("tune", dict)):
            _get(b, key, kind, "body")
        self.arena = _int(b, "arena_bytes", "body")
        self._cache(_get(b, "cache", dict, "body"))
        for name, w in self.weights.items():
            self._weight(name, w)
        for name, k in self.kernels.items():
            self._kernel_entry(name, k)
        self.numpy = False
        if "gpu" in b:
            gpu = _get(b, "gpu", dict, "body")
            for key, kind in (("target", str), ("source", str), ("binary", bytes), ("manifests", dict)):
                _get(gpu, key, kind, "gpu")
        else:
            cpu = _get(b, "cpu", dict, "body")
            _get(cpu, "why", str, "cpu")
            kind = _get(cpu, "kernels", str, "cpu")
            if kind not in CPU_KERNELS:
                _fail("cpu.kernels", f"{kind!r} is not one of {', '.join(CPU_KERNELS)}")
            self.numpy = kind == "numpy"
            if not self.numpy:
                for key in ("isa", "compiler", "source"):
                    _get(cpu, key, str, "cpu")
        phases = _get(b, "phases", dict, "body")
        for phase in PHASES:
            self._phase(phase, _get(phases, phase, dict, "phases"))

    def _cache(self, c: dict[str, Any]) -> None:
        if _get(c, "dtype", str, "cache") != "f16":
            _fail("cache.dtype", f"the K/V cache is f16, not {c['dtype']}")
        shape = _get(c, "shape", list, "cache")
        page = _int(c, "page", "cache", 1)
        if len(shape) != 5 or shape[2] != "blocks" or shape[3] != page or shape[1] != 2:
            _fail("cache.shape", f"expected [layers, 2, 'blocks', {page}, kv features], got {shape}")
        _shape([d for d in shape if d != "blocks"], {}, "cache.shape")

    def _weight(self, name: str, w: dict[str, Any]) -> None:
        where = f"weights.{name}"
        fmt = _get(w, "format", str, where)
        if fmt.upper() not in FORMATS:
            _fail(f"{where}.format", f"unknown format {fmt!r}")
        shape = _shape(_get(w, "shape", list, where), {}, f"{where}.shape")
        for layout, info in _get(w, "layouts", dict, where).items():
            at = f"{where}.layouts.{layout}"
            if layout not in LAYOUTS:
                _fail(at, f"unknown layout (this runtime knows {', '.join(LAYOUTS)})")
            if _int(info, "version", at) != LAYOUTS[layout].version:
                _fail(f"{at}.version", f"layout version {info['version']}, this runtime makes version "
                                       f"{LAYOUTS[layout].version}")
            want = layout_bytes(layout, fmt, tuple(shape))
            if _int(info, "bytes", at) != want:
                _fail(f"{at}.bytes", f"{info['bytes']} bytes, but a {fmt} {shape} weight is {want} in this layout")

    def _kernel_entry(self, name: str, k: dict[str, Any]) -> None:
        where = f"kernels.{name}"
        params = _get(k, "params", list, where)
        if not all(isinstance(p, str) and p for p in params):
            _fail(f"{where}.params", "parameter types must be C type names")
        _int(k, "block", where, 1)

    def _phase(self, phase: str, p: dict[str, Any]) -> None:
        where = f"phases.{phase}"
        dims = _get(p, "dims", dict, where)
        for d, v in dims.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                _fail(f"{where}.dims.{d}", f"a bound must be a positive size, got {v!r}")
        self.dims = dict(dims)
        for d in _get(p, "per_step", list, where):
            if d not in dims:
                _fail(f"{where}.per_step", f"{d!r} is not one of the phase's dims")
        self.state = _get(p, "state", dict, where)
        for name, s in self.state.items():
            at = f"{where}.state.{name}"
            if _get(s, "dtype", str, at) != "i32":
                _fail(f"{at}.dtype", f"step state is i32, not {s['dtype']}")
            _shape(_get(s, "shape", list, at), dims, f"{at}.shape")
            if "default" in s and not (isinstance(s["default"], int) and not isinstance(s["default"], bool)
                                       and -2**31 <= s["default"] < 2**31):
                _fail(f"{at}.default", f"must be an i32 value, got {s['default']!r}")
        for name in ("tokens", "pos", "seq", "pages"):
            if name not in self.state:
                _fail(f"{where}.state", f"missing step-state input {name!r}")
        arena = _int(p, "arena_bytes", where)
        if arena > self.arena:
            _fail(f"{where}.arena_bytes", f"{arena} is over the plan's arena of {self.arena}")
        self.buffers = _get(p, "buffers", list, where)
        for i, b in enumerate(self.buffers):
            at = f"{where}.buffers[{i}]"
            dtype = _get(b, "dtype", str, at)
            if dtype not in DTYPES:
                _fail(f"{at}.dtype", f"unknown dtype {dtype!r}")
            shape = _shape(_get(b, "shape", list, at), dims, f"{at}.shape")
            offset, size = _int(b, "offset", at), _int(b, "bytes", at)
            if size != value_bytes(dtype, shape):
                _fail(f"{at}.bytes", f"{size} bytes, but {dtype}{shape} is {value_bytes(dtype, shape)}")
            if offset + size > arena:
                _fail(at, f"bytes {offset}..{offset + size} are outside the phase's arena of {arena}")
        for name, ref in _get(p, "outputs", dict, where).items():
            self._ref(ref, f"{where}.outputs.{name}", memory_only=True)
        for i, launch in enumerate(_get(p, "launches", list, where)):
            self._launch(launch, f"{where}.launches[{i}]", arena)

    def _launch(self, launch: dict[str, Any], where: str, arena: int) -> None:
        op = _get(launch, "op", str, where)
        if op not in TRAITS:
            _fail(f"{where}.op", f"unknown op {op!r}")
        family = _get(launch, "family", str, where)
        if family not in FAMILIES:
            _fail(f"{where}.family", f"unknown kernel family {family!r}")
        _get(launch, "attrs", dict, where)
        for key in ("args", "outs"):
            for j, ref in enumerate(_get(launch, key, list, where)):
                self._ref(ref, f"{where}.{key}[{j}]", memory_only=True, weight_layout=False)
        serves = launch.get("serves", [])
        if not isinstance(serves, list) or not all(isinstance(s, str) for s in serves):
            _fail(f"{where}.serves", "expected a list of output names")
        for j, k in enumerate(_get(launch, "kernels", list, where)):
            self._call(k, f"{where}.kernels[{j}]", family, arena)

    def _call(self, k: dict[str, Any], where: str, family: str, arena: int) -> None:
        name = _get(k, "name", str, where)
        args = _get(k, "args", list, where)
        for i, g in enumerate(_get(k, "grid", list, where)):
            ok = (isinstance(g, int) and g >= 0) or (isinstance(g, list) and len(g) == 2 and g[0] in self.dims
                                                      and isinstance(g[1], int) and g[1] >= 1)
            if not ok:
                _fail(f"{where}.grid[{i}]", f"a grid dimension is a size or [symbol, per], got {g!r}")
        _int(k, "block", where, 1)
        _int(k, "smem", where)
        if name.startswith(NUMPY_PREFIX) != self.numpy:
            _fail(f"{where}.name", f"{name} in a plan whose cpu.kernels is "
                                   f"{'numpy' if self.numpy else 'not numpy'}")
        if name.startswith(NUMPY_PREFIX):
            if name != NUMPY_PREFIX + family:
                _fail(f"{where}.name", f"{name} is not the launch family's NumPy twin ({NUMPY_PREFIX}{family})")
            for i, ref in enumerate(args):
                self._ref(ref, f"{where}.args[{i}]", memory_only=True)
            return
        if name not in self.kernels:
            _fail(f"{where}.name", f"kernel {name} is not in the plan's kernel table")
        params = self.kernels[name]["params"]
        if len(params) != len(args):
            _fail(f"{where}.args", f"{len(args)} arguments for the {len(params)} parameters of {name}")
        for i, (ctype, ref) in enumerate(zip(params, args)):
            at = f"{where}.args[{i}]"
            kind = self._ref(ref, at, scratch_in=arena)
            if ctype in C_SCALARS:
                if kind != C_SCALARS[ctype]:
                    _fail(at, f"parameter {i} of {name} is a {ctype}, the argument is {kind}")
            elif not ctype.endswith("*"):
                _fail(f"kernels.{name}.params[{i}]", f"unknown parameter type {ctype!r}")
            elif kind in ("i32", "f32"):
                _fail(at, f"parameter {i} of {name} is a pointer ({ctype}), the argument a scalar")

    def _ref(self, ref: Any, where: str, memory_only: bool = False, weight_layout: bool = True,
             scratch_in: int | None = None) -> str:
        """Check one argument reference; returns its kind."""
        if not isinstance(ref, dict) or not ref:
            _fail(where, f"an argument must be a map, got {ref!r}")
        kinds = [k for k in ("buf", "state", "cache", "weight", "scratch", "rope_table", "i32", "f32") if k in ref]
        if len(kinds) != 1:
            _fail(where, f"unknown argument kind {next(iter(ref))!r}" if not kinds else
                  f"an argument has one kind, this has {', '.join(kinds)}")
        kind = kinds[0]
        if memory_only and kind not in ("buf", "state", "cache", "weight"):
            _fail(where, f"a {kind} argument cannot appear here")
        if kind == "buf":
            i = _get(ref, "buf", int, where)
            if not 0 <= i < len(self.buffers):
                _fail(where, f"buffer {i} of {len(self.buffers)}")
        elif kind == "state":
            if _get(ref, "state", str, where) not in self.state:
                _fail(where, f"unknown step-state input {ref['state']!r}")
        elif kind == "weight":
            name = _get(ref, "weight", str, where)
            if name not in self.weights:
                _fail(where, f"unknown weight {name!r}")
            if weight_layout:
                layout = _get(ref, "layout", str, where)
                if layout not in self.weights[name]["layouts"]:
                    _fail(f"{where}.layout", f"weight {name} is not held in layout {layout!r}")
        elif kind == "scratch":
            _get(ref, "scratch", str, where)
            dtype = _get(ref, "dtype", str, where)
            if dtype not in DTYPES:
                _fail(f"{where}.dtype", f"unknown dtype {dtype!r}")
            shape = _shape(_get(ref, "shape", list, where), self.dims, f"{where}.shape")
            offset, size = _int(ref, "offset", where), _int(ref, "bytes", where)
            if size < value_bytes(dtype, shape):
                _fail(f"{where}.bytes", f"{size} bytes for {dtype}{shape} ({value_bytes(dtype, shape)})")
            if scratch_in is not None and offset + size > scratch_in:
                _fail(where, f"bytes {offset}..{offset + size} are outside the phase's arena of {scratch_in}")
        elif kind == "rope_table":
            t = _get(ref, "rope_table", dict, where)
            _int(t, "dims", f"{where}.rope_table", 2)
            for key in ("base", "scale"):
                _get(t, key, (int, float), f"{where}.rope_table")
            if t.get("factors") is not None and t["factors"] not in self.weights:
                _fail(f"{where}.rope_table.factors", f"unknown weight {t['factors']!r}")
            positions = t.get("positions")
            if not (isinstance(positions, int) or positions in self.dims):
                _fail(f"{where}.rope_table.positions", f"a size or a dimension, got {positions!r}")
        elif kind == "i32":
            v = ref["i32"]
            if not (isinstance(v, int) and not isinstance(v, bool)) and v not in self.dims:
                _fail(where, f"an i32 is an integer or a dimension, got {v!r}")
        elif kind == "f32":
            if not isinstance(ref["f32"], (int, float)) or isinstance(ref["f32"], bool):
                _fail(where, f"an f32 is a number, got {ref['f32']!r}")
        return kind


def check_body(body: Any) -> None:
    """Raise SchemaError naming the first field that does not hold."""
    if not isinstance(body, dict):
        _fail("body", f"expected a map, got {type(body).__name__}")
    _Checker(body).check()
