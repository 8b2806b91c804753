"""What a plan body must hold beyond its types (core/plan_records.py checks those as it reads): every
reference in range, every size what its dtype, shape, format and layout make, every kernel call's
arguments matching its kernel's parameters. A body that fails gets a SchemaError naming the field,
e.g. `phases.decode.launches[3].kernels[0].args[2]: buffer 9 of 7`, never an IndexError later.

A GPU plan has a `gpu` section (its translation unit, binary, manifests); a CPU plan a `cpu` section
whose `kernels` is "native" (the CPU target's compiled kernels, in the kernel table) or "numpy" (the
NumPy twins, each call named numpy.<family>).
"""

from __future__ import annotations

from .formats import ACTIVATION_FORMATS, FORMATS, SCALAR_BYTES, value_bytes
from .layouts import LAYOUTS, layout_bytes
from .op_traits import FAMILIES, TRAITS
from .plan_records import (
    F32,
    I32,
    MEMORY,
    Buf,
    Cache,
    KernelCall,
    Launch,
    Phase,
    PlanBody,
    Ref,
    RopeTable,
    SchemaError,
    Scratch,
    State,
    Weight,
)

PHASES = ("prefill", "decode", "decode-batch")
NUMPY_PREFIX = "numpy."  # kernel calls of the NumPy CPU backend: numpy.<family>
C_SCALARS = {"int": I32, "unsigned": I32, "float": F32}
CPU_KERNELS = ("native", "numpy")  # a CPU plan's calls: the compiled kernels, or the NumPy twins
DTYPES = set(SCALAR_BYTES) | {f.lower() for f in ACTIVATION_FORMATS}


def _fail(where: str, problem: str) -> None:
    raise SchemaError(f"{where}: {problem}")


def _shape(shape: tuple, dims: dict[str, int], where: str) -> list[int]:
    """The shape bound to the phase's bounds; every symbol must be one of its dims."""
    out = []
    for i, d in enumerate(shape):
        if isinstance(d, str):
            if d not in dims:
                _fail(f"{where}[{i}]", f"unknown dimension {d!r} (the phase binds {', '.join(sorted(dims))})")
            out.append(dims[d])
        elif d >= 0:
            out.append(d)
        else:
            _fail(f"{where}[{i}]", f"a dimension must be a size or a symbol, got {d!r}")
    return out


class _Checker:
    def __init__(self, body: PlanBody):
        self.body = body

    def check(self) -> None:
        b = self.body
        _nonneg(b.arena_bytes, "body.arena_bytes")
        self._cache()
        for name, w in b.weights.items():
            self._weight(name, w)
        for name, k in b.kernels.items():
            if not all(p for p in k.params):
                _fail(f"kernels.{name}.params", "parameter types must be C type names")
            if k.block < 1:
                _fail(f"kernels.{name}.block", f"{k.block} is below 1")
        if (b.gpu is None) == (b.cpu is None):
            _fail("body", "a plan has either a gpu or a cpu section")
        self.numpy = b.cpu is not None and b.cpu.kernels == "numpy"
        if b.cpu is not None:
            if b.cpu.kernels not in CPU_KERNELS:
                _fail("cpu.kernels", f"{b.cpu.kernels!r} is not one of {', '.join(CPU_KERNELS)}")
            if not self.numpy:
                for key in ("isa", "compiler", "source"):
                    if not getattr(b.cpu, key):
                        _fail("cpu", f"missing field {key!r}")
        for phase in PHASES:
            if phase not in b.phases:
                _fail("phases", f"missing field {phase!r}")
            self._phase(phase, b.phases[phase])

    def _cache(self) -> None:
        c = self.body.cache
        if c.dtype != "f16":
            _fail("cache.dtype", f"the K/V cache is f16, not {c.dtype}")
        if c.page < 1:
            _fail("cache.page", f"{c.page} is below 1")
        s = c.shape
        if len(s) != 5 or s[2] != "blocks" or s[3] != c.page or s[1] != 2:
            _fail("cache.shape", f"expected [layers, 2, 'blocks', {c.page}, kv features], got {list(s)}")
        _shape(tuple(d for d in s if d != "blocks"), {}, "cache.shape")

    def _weight(self, name: str, w) -> None:
        where = f"weights.{name}"
        if w.format.upper() not in FORMATS:
            _fail(f"{where}.format", f"unknown format {w.format!r}")
        shape = _shape(w.shape, {}, f"{where}.shape")
        for layout, info in w.layouts.items():
            at = f"{where}.layouts.{layout}"
            if layout not in LAYOUTS:
                _fail(at, f"unknown layout (this runtime knows {', '.join(LAYOUTS)})")
            if info.version != LAYOUTS[layout].version:
                _fail(f"{at}.version", f"layout version {info.version}, this runtime makes version "
                                       f"{LAYOUTS[layout].version}")
            want = layout_bytes(layout, w.format, tuple(shape))
            if info.bytes != want:
                _fail(f"{at}.bytes", f"{info.bytes} bytes, but a {w.format} {shape} weight is {want} in this layout")

    def _phase(self, phase: str, p: Phase) -> None:
        where = f"phases.{phase}"
        for d, v in p.dims.items():
            if v < 1:
                _fail(f"{where}.dims.{d}", f"a bound must be a positive size, got {v!r}")
        self.dims, self.phase = p.dims, p
        for d in p.per_step:
            if d not in p.dims:
                _fail(f"{where}.per_step", f"{d!r} is not one of the phase's dims")
        for name, s in p.state.items():
            at = f"{where}.state.{name}"
            if s.dtype != "i32":
                _fail(f"{at}.dtype", f"step state is i32, not {s.dtype}")
            _shape(s.shape, p.dims, f"{at}.shape")
        for name in ("tokens", "pos", "seq", "pages"):
            if name not in p.state:
                _fail(f"{where}.state", f"missing step-state input {name!r}")
        _nonneg(p.arena_bytes, f"{where}.arena_bytes")
        if p.arena_bytes > self.body.arena_bytes:
            _fail(f"{where}.arena_bytes", f"{p.arena_bytes} is over the plan's arena of {self.body.arena_bytes}")
        for i, b in enumerate(p.buffers):
            at = f"{where}.buffers[{i}]"
            if b.dtype not in DTYPES:
                _fail(f"{at}.dtype", f"unknown dtype {b.dtype!r}")
            shape = _shape(b.shape, p.dims, f"{at}.shape")
            _nonneg(b.offset, f"{at}.offset")
            if b.bytes != value_bytes(b.dtype, shape):
                _fail(f"{at}.bytes", f"{b.bytes} bytes, but {b.dtype}{shape} is {value_bytes(b.dtype, shape)}")
            if b.offset + b.bytes > p.arena_bytes:
                _fail(at, f"bytes {b.offset}..{b.offset + b.bytes} are outside the phase's arena of {p.arena_bytes}")
        for name, ref in p.outputs.items():
            self._ref(ref, f"{where}.outputs.{name}", memory_only=True)
        for i, launch in enumerate(p.launches):
            self._launch(launch, f"{where}.launches[{i}]")

    def _launch(self, launch: Launch, where: str) -> None:
        if launch.op not in TRAITS:
            _fail(f"{where}.op", f"unknown op {launch.op!r}")
        if launch.family not in FAMILIES:
            _fail(f"{where}.family", f"unknown kernel family {launch.family!r}")
        for key in ("args", "outs"):
            for j, ref in enumerate(getattr(launch, key)):
                self._ref(ref, f"{where}.{key}[{j}]", memory_only=True, weight_layout=False)
        if not launch.kernels:
            _fail(f"{where}.kernels", "a launch makes at least one kernel call")
        for j, k in enumerate(launch.kernels):
            self._call(k, f"{where}.kernels[{j}]", launch.family)

    def _call(self, k: KernelCall, where: str, family: str) -> None:
        for i, g in enumerate(k.grid):
            ok = (g >= 0) if isinstance(g, int) else (g[0] in self.dims and g[1] >= 1)
            if not ok:
                _fail(f"{where}.grid[{i}]", f"a grid dimension is a size or [symbol, per], got {g!r}")
        if k.block < 1:
            _fail(f"{where}.block", f"{k.block} is below 1")
        _nonneg(k.smem, f"{where}.smem")
        if k.name.startswith(NUMPY_PREFIX) != self.numpy:
            _fail(f"{where}.name", f"{k.name} in a plan whose cpu.kernels is "
                                   f"{'numpy' if self.numpy else 'not numpy'}")
        if k.name.startswith(NUMPY_PREFIX):
            if k.name != NUMPY_PREFIX + family:
                _fail(f"{where}.name", f"{k.name} is not the launch family's NumPy twin ({NUMPY_PREFIX}{family})")
            for i, ref in enumerate(k.args):
                self._ref(ref, f"{where}.args[{i}]", memory_only=True)
            return
        if k.name not in self.body.kernels:
            _fail(f"{where}.name", f"kernel {k.name} is not in the plan's kernel table")
        params = self.body.kernels[k.name].params
        if len(params) != len(k.args):
            _fail(f"{where}.args", f"{len(k.args)} arguments for the {len(params)} parameters of {k.name}")
        for i, (ctype, ref) in enumerate(zip(params, k.args)):
            at = f"{where}.args[{i}]"
            self._ref(ref, at)
            if ctype in C_SCALARS:
                if not isinstance(ref, C_SCALARS[ctype]):
                    _fail(at, f"parameter {i} of {k.name} is a {ctype}, the argument is {ref.KIND}")
            elif not ctype.endswith("*"):
                _fail(f"kernels.{k.name}.params[{i}]", f"unknown parameter type {ctype!r}")
            elif isinstance(ref, (I32, F32)):
                _fail(at, f"parameter {i} of {k.name} is a pointer ({ctype}), the argument a scalar")

    def _ref(self, ref: Ref, where: str, memory_only: bool = False, weight_layout: bool = True) -> None:
        if memory_only and not isinstance(ref, MEMORY):
            _fail(where, f"a {ref.KIND} argument cannot appear here")
        p = self.phase
        if isinstance(ref, Buf):
            if not 0 <= ref.index < len(p.buffers):
                _fail(where, f"buffer {ref.index} of {len(p.buffers)}")
        elif isinstance(ref, State):
            if ref.name not in p.state:
                _fail(where, f"unknown step-state input {ref.name!r}")
        elif isinstance(ref, Weight):
            if ref.name not in self.body.weights:
                _fail(where, f"unknown weight {ref.name!r}")
            if weight_layout and ref.layout not in self.body.weights[ref.name].layouts:
                _fail(f"{where}.layout", f"weight {ref.name} is not held in layout {ref.layout!r}")
        elif isinstance(ref, Scratch):
            if ref.dtype not in DTYPES:
                _fail(f"{where}.dtype", f"unknown dtype {ref.dtype!r}")
            shape = _shape(ref.shape, self.dims, f"{where}.shape")
            _nonneg(ref.offset, f"{where}.offset")
            if ref.bytes < value_bytes(ref.dtype, shape):
                _fail(f"{where}.bytes", f"{ref.bytes} bytes for {ref.dtype}{shape} ({value_bytes(ref.dtype, shape)})")
            if ref.offset + ref.bytes > p.arena_bytes:
                _fail(where, f"bytes {ref.offset}..{ref.offset + ref.bytes} are outside the phase's arena of "
                             f"{p.arena_bytes}")
        elif isinstance(ref, RopeTable):
            if ref.dims < 2:
                _fail(f"{where}.rope_table.dims", f"{ref.dims} is below 2")
            if ref.factors is not None and ref.factors not in self.body.weights:
                _fail(f"{where}.rope_table.factors", f"unknown weight {ref.factors!r}")
            if not (isinstance(ref.positions, int) or ref.positions in self.dims):
                _fail(f"{where}.rope_table.positions", f"a size or a dimension, got {ref.positions!r}")
        elif isinstance(ref, I32):
            if isinstance(ref.value, str) and ref.value not in self.dims:
                _fail(where, f"an i32 is an integer or a dimension, got {ref.value!r}")
        elif not isinstance(ref, (Cache, F32)):
            _fail(where, f"unknown argument {ref!r}")


def _nonneg(v: int, where: str) -> None:
    if v < 0:
        _fail(where, f"{v} is below 0")


def check_body(body: PlanBody) -> None:
    """Raise SchemaError naming the first field that does not hold."""
    _Checker(body).check()
