"""Building the CPU target's kernels: one host translation unit per kernel set and SIMD path, compiled
by codegen/host.py into a cached shared library, and called through ctypes.

The translation unit inlines codegen/cpu/<source> and what it includes: codegen/cpu/ headers, and the
GPU kernels' shared headers (codegen/kernels/common.cuh, quant.cuh, fused.cuh) with codegen/cpu/host.h
standing for vendor.h, so block layouts and scale unpacking have one source for every target. The SIMD
path is fixed at compile time (codegen/cpu/simd.h): `scalar` everywhere, `avx2`, `avx512` and `amx` where
the host has them (host_isas: the CPU's flags, and for amx the kernel's permission to use the tiles);
best_isa() is what a plan for this machine uses. The compiler is the first of toolchain.cxx_candidates
($CXX, else each clang++ on PATH, then each g++) that builds codegen/cpu/probe.h for the best path
(compiler()); where none does, a CPU plan keeps the NumPy kernels (no_compiler says why).

CpuLibrary(source, params, isa) loads a translation unit: a plan's own (the runtime's cpu driver), or
one rendered from Kernel records (from_kernels: the kernel tests). CpuLibrary.launch(launch, bind, dims)
runs a KernelLaunch of a CPU family (codegen/cpu_families/) as a driver would: scalars from the record (symbols bound from `dims`), every
other argument through bind(ref) -> a C-contiguous NumPy array; CpuLibrary.bind does the binding once,
for a driver whose buffers stay at fixed addresses. Each launch is one call; the kernel splits its work
over the library's thread pool (set_threads).
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import re
import struct
from pathlib import Path
from typing import Callable

import numpy as np

from llmplan.core.errors import InputError
from llmplan.core.plan_records import Ref

from . import toolchain
from .build import BuildError, _inline
from .host import HostLibrary, build_library
from .kernel import Kernel, KernelLaunch

CPU_DIR = Path(__file__).parent / "cpu"
HOST_VENDOR = CPU_DIR / "host.h"
# -ffp-contract=off: no FMA the code does not ask for, so every path's float order is the code's own;
# -fvisibility=hidden: only the entry points are exported (host.h LP_KERNEL)
FLAGS = ["-std=c++20", "-O3", "-ffp-contract=off", "-fno-math-errno", "-fvisibility=hidden", "-pthread"]
ISAS = {
    "scalar": ["-DLP_CPU_ISA=0"],
    "avx2": ["-DLP_CPU_ISA=1", "-mavx2", "-mfma", "-mf16c"],
    "avx512": ["-DLP_CPU_ISA=2", "-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl",
               "-mavx512vnni"],
    "amx": ["-DLP_CPU_ISA=3", "-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni",
            "-mamx-tile", "-mamx-int8"],
}
# /proc/cpuinfo flags each path needs (the kernel lists only what the OS has enabled)
_NEEDS = {"scalar": (), "avx2": ("avx2", "fma", "f16c"),
          "avx512": ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"),
          "amx": ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "amx_tile", "amx_int8")}
# Linux lets a process use the AMX tile registers only once it has asked (arch_prctl ARCH_REQ_XCOMP_PERM
# for XFEATURE_XTILEDATA): the grant is the process's, for every thread, present and future
_ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA, _SYS_ARCH_PRCTL = 0x1023, 18, 158
_SCALARS = {"int": (ctypes.c_int, "i32"), "float": (ctypes.c_float, "f32")}
_WORD = (1 << 64) - 1  # an argument as graph.h's 64-bit word (negative ints in two's complement)


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The x86 feature flags of this machine's CPU that the OS has enabled (none elsewhere)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return frozenset()
    try:
        m = re.search(r"^flags\s*:(.*)$", Path("/proc/cpuinfo").read_text(), re.M)
    except OSError:
        return frozenset()
    return frozenset(m.group(1).split()) if m else frozenset()


@functools.cache
def host_isas() -> tuple[str, ...]:
    """The SIMD paths this machine runs, scalar first, best last."""
    return tuple(isa for isa, need in _NEEDS.items()
                 if all(f in cpu_flags() for f in need) and (isa != "amx" or _amx_permitted()))


def _amx_permitted() -> bool:
    """Whether the kernel grants this process the AMX tile data (asking it once: the grant then holds)."""
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0


def best_isa() -> str:
    return host_isas()[-1]


@functools.cache
def probe(compiler: toolchain.Compiler) -> str | None:
    """Why `compiler` cannot build the CPU kernels (its first error on probe.h), or None where it can."""
    out: list[str] = []
    _inline(CPU_DIR / "probe.h", set(), out, HOST_VENDOR)
    try:
        build_library("\n".join(out) + "\n", FLAGS + ISAS[best_isa()], "cpu-probe", compiler)
    except BuildError as e:
        return str(e)
    return None


def compiler() -> toolchain.Compiler | None:
    """The C++ compiler the CPU target builds with: the first candidate that passes the probe."""
    return _first_probed(os.environ.get("CXX"), os.environ.get("PATH"))


@functools.cache
def _first_probed(cxx: str | None, path: str | None) -> toolchain.Compiler | None:
    """compiler(), once per $CXX and $PATH (the candidates come from them)."""
    return next((c for c in toolchain.cxx_candidates() if probe(c) is None), None)


def available() -> bool:
    """Whether this machine has a C++ compiler the CPU target builds with."""
    return compiler() is not None


def no_compiler() -> str:
    """Why no compiler serves the CPU target, in a few words."""
    tried = toolchain.cxx_candidates()
    if os.environ.get("CXX") and not tried:
        return f"$CXX ({os.environ['CXX']}) does not run"
    if not tried:
        return "no C++ compiler (clang++ or g++) on PATH"
    return "; ".join(f"{c.describe()} cannot build the CPU kernels ({probe(c)})" for c in tried)


def render(kernels: list[Kernel]) -> str:
    """One translation unit with every source the kernels need, then their entry points."""
    seen: set[str] = set()
    out = ["// generated by llmplan codegen: the CPU target's kernels", ""]
    for src in dict.fromkeys(["pool.h", "graph.h", *(k.source for k in kernels)]):
        _inline(CPU_DIR / src, seen, out, HOST_VENDOR)
    out.append("// ---- entry-points ----")
    for k in sorted({k.name: k for k in kernels}.values(), key=lambda k: k.name):
        out.append(k.entry)
        out.append(_packed(k))
    return "\n".join(out) + "\n"


def _packed(k: Kernel) -> str:
    """The entry point's twin for graph.h's replay: its arguments as 64-bit words."""
    word = {"int": "(int)a[{}]", "float": "lp_word_f32(a[{}])"}
    args = ", ".join(word[t].format(i) if t in word else f"({t})a[{i}]" for i, t in enumerate(k.params))
    return f"LP_KERNEL void {k.name}_packed(const uint64_t* a) {{ {k.name}({args}); }}"


def build(source: str, isa: str) -> HostLibrary:
    """The shared library of a rendered translation unit for one SIMD path (cached by source, flags and
    compiler: built once per key)."""
    cxx = compiler()
    if cxx is None:
        raise InputError(f"the plan's CPU kernels need a C++ compiler ({no_compiler()}): {toolchain.cxx_install()}; "
                         "or recompile the plan here (plan compile ... --device cpu), where it keeps the NumPy kernels")
    return build_library(source, FLAGS + ISAS[isa], f"cpu-{isa}", cxx)


class CpuLibrary:
    """A translation unit built for one SIMD path, loaded: `params` gives each entry point's parameter
    types (a plan's kernel table)."""

    def __init__(self, source: str, params: dict[str, list[str]], isa: str | None = None):
        self.isa = isa or best_isa()
        if self.isa not in host_isas():
            raise InputError(f"the CPU kernels were built for SIMD path {self.isa}; this machine runs "
                             f"{', '.join(host_isas())}: recompile the plan here (plan compile ... --device cpu)")
        self.library = build(source, self.isa)
        self.lib = self.library.load()
        self._types = {name: list(types) for name, types in params.items()}
        for name, types in self._types.items():
            fn = getattr(self.lib, name)
            fn.restype = None
            fn.argtypes = [_SCALARS[t][0] if t in _SCALARS else ctypes.c_void_p for t in types]

    @classmethod
    def from_kernels(cls, kernels: list[Kernel], isa: str | None = None) -> CpuLibrary:
        ks = {k.name: k for k in kernels}
        return cls(render(list(ks.values())), {name: list(k.params) for name, k in ks.items()}, isa)

    def has(self, name: str) -> bool:
        return name in self._types

    def entry(self, name: str) -> tuple[Callable[..., None], list[str]]:
        """An entry point and its parameter types."""
        return getattr(self.lib, name), self._types[name]

    def replayer(self, calls: list[tuple[str, tuple]]) -> Replayer:
        """One call that runs these (entry point, argument values) in order (graph.h lp_cpu_replay)."""
        words, at = [], []
        for name, values in calls:
            types = self._types[name]
            at.append(len(words))
            words += [struct.unpack("<I", struct.pack("<f", v))[0] if t == "float" else v & _WORD
                      for t, v in zip(types, values)]
        fns = np.array([ctypes.cast(getattr(self.lib, f"{name}_packed"), ctypes.c_void_p).value for name, _ in calls],
                       np.uint64)
        return Replayer(self.lib, fns, np.array(words, np.uint64), np.array(at, np.int32))

    def set_threads(self, n: int) -> None:
        self.lib.lp_cpu_set_threads(int(n))

    def threads(self) -> int:
        return int(self.lib.lp_cpu_threads())

    def bind(self, launch: KernelLaunch, bind: Callable[[Ref], np.ndarray],
             dims: dict[str, int]) -> tuple[Callable[..., None], tuple, list[np.ndarray]]:
        """(the entry point, its argument values, the arrays they point into) for a launch: a driver that
        keeps buffers at fixed addresses binds a launch once and calls fn(*values) every step."""
        k = launch.kernel
        types = self._types[k.name]
        assert len(types) == len(launch.args), f"{k.name}: {len(types)} parameters, {len(launch.args)} arguments"
        values, keep = [], []
        for t, arg in zip(types, launch.args):
            if t in _SCALARS:
                assert arg.KIND == _SCALARS[t][1], (k.name, t, arg)
                values.append(dims[arg.value] if isinstance(arg.value, str) else arg.value)
            else:
                arr = bind(arg)
                assert isinstance(arr, np.ndarray) and arr.flags.c_contiguous, (k.name, arg)
                keep.append(arr)
                values.append(arr.ctypes.data)
        return getattr(self.lib, k.name), tuple(values), keep

    def launch(self, launch: KernelLaunch, bind: Callable[[Ref], np.ndarray], dims: dict[str, int]) -> None:
        fn, values, _ = self.bind(launch, bind, dims)
        fn(*values)


class Replayer:
    """A recorded step's calls as graph.h replays them: the entry points, their argument words, and where
    each call's words start."""

    def __init__(self, lib: ctypes.CDLL, fns: np.ndarray, args: np.ndarray, at: np.ndarray):
        self.n, self._held = len(fns), (fns, args, at)
        self._pointers = (fns.ctypes.data, args.ctypes.data, at.ctypes.data)
        self._replay = lib.lp_cpu_replay
        self._replay.restype, self._replay.argtypes = None, [ctypes.c_int] + [ctypes.c_void_p] * 4
        # a library built from a plan's source before graph.h had it replays a step at a time
        self._steps = getattr(lib, "lp_cpu_replay_steps", None)
        if self._steps is not None:
            self._steps.restype = None
            self._steps.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 3 + [ctypes.c_int] * 2 + [ctypes.c_void_p] * 3

    def __call__(self, ns: np.ndarray | None = None) -> None:
        """Run the calls once; given a uint64 array of n + 1, write the clock (ns) before the first call
        and after each."""
        if ns is not None and not (ns.dtype == np.uint64 and ns.shape == (self.n + 1,) and ns.flags.c_contiguous):
            raise ValueError(f"the replay's clock readings take a contiguous uint64 array of {self.n + 1}")
        self._replay(self.n, *self._pointers, None if ns is None else ns.ctypes.data)

    @property
    def bursts(self) -> bool:
        return self._steps is not None

    def replay_steps(self, steps: int, pos: int, tokens: int, out: np.ndarray) -> None:
        """A greedy decode burst (graph.h lp_cpu_replay_steps): `steps` replays, each after advancing the
        int32 positions at address `pos` by one, copying the int32 tokens at `tokens` into out's rows
        (out: int32, C-contiguous, steps x rows)."""
        if not (out.dtype == np.int32 and out.ndim == 2 and out.shape[0] == steps and out.flags.c_contiguous):
            raise ValueError(f"a burst's tokens take a contiguous int32 array of {steps} rows")
        self._steps(self.n, *self._pointers, steps, out.shape[1], pos, tokens, out.ctypes.data)
