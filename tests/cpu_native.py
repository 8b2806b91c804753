"""What the CPU target's kernel tests (tests/test_cpu_native_*.py) share: each catalog built once per SIMD
path this machine has (the scalar path always) and per C++ compiler (clang++-19 and g++: a test marked
each_compiler runs once with each, through $CXX), launches run through codegen/cpu_build.CpuLibrary,
and random weights as the GGUF stores them (blocks, read in place)."""

from __future__ import annotations

import functools
import os
import zlib
from typing import Any, Callable

import numpy as np
import pytest

from llmplan.codegen import cpu_build
from llmplan.codegen.kernel import Context, Kernel, KernelLaunch
from llmplan.core import layouts
from llmplan.core.formats import FORMATS, dequantize, value_bytes
from llmplan.core.plan_records import Buf, Cache, Ref, RopeTable, Scratch, State, Weight

from kernel_inputs import random_blocks
from launch_records import phase_buffers

# every path this machine runs
ISAS = list(cpu_build.host_isas())
# the compilers the CPU target builds with on the machines users have (CI installs both)
COMPILERS = ("clang++-19", "g++")


def use_compiler(monkeypatch: pytest.MonkeyPatch, name: str):
    """The CPU target built by compiler `name` ($CXX) from now on; the test is skipped where it does not
    serve, failed under CI."""
    monkeypatch.setenv("CXX", name)
    if not cpu_build.available():
        why = f"the CPU target with $CXX={name}: {cpu_build.no_compiler()}"
        if os.environ.get("CI"):
            pytest.fail(f"{why} (CI must test the kernels with every compiler in COMPILERS)")
        pytest.skip(why)
    return cpu_build.compiler()


@pytest.fixture(params=COMPILERS)
def cxx(request, monkeypatch):
    return use_compiler(monkeypatch, request.param)


# a test of the compiled kernels: once with each compiler
each_compiler = pytest.mark.usefixtures("cxx")
# a test that needs the compiled kernels, whichever compiler builds them; under CI a missing one fails
needs_compiler = pytest.mark.skipif(not os.environ.get("CI") and not cpu_build.available(),
                                    reason="the CPU target needs a C++ compiler (clang++ or g++)")


@functools.cache
def _library(kernels: tuple[Kernel, ...], isa: str, compiler) -> cpu_build.CpuLibrary:  # compiler: a cache key
    return cpu_build.CpuLibrary.from_kernels(list(kernels), isa)


def library(catalog: Callable[[], list[Kernel]], isa: str) -> cpu_build.CpuLibrary:
    """The catalog's kernels built for one SIMD path by the compiler in use (once per test session)."""
    return _library(tuple(catalog()), isa, cpu_build.compiler())


def run(lib: cpu_build.CpuLibrary, launches: list[KernelLaunch], arrays: dict[str, np.ndarray], dims: dict[str, int],
        weights: dict[str, tuple[str, tuple[int, ...]]] | None = None) -> None:
    """Run launches binding each reference by a key: "buf:N", "weight:NAME" (the file's bytes, made into
    the reference's layout as the runtime makes it, with the weight's (format, shape) from `weights`),
    "state:NAME", "cache", "table", "scratch:NAME" (where absent, made here at the step's size with every
    byte 0xFF, a NaN in every float format, and kept in `arrays` for the launches after)."""
    def bind(ref: Ref) -> np.ndarray:
        if isinstance(ref, Buf):
            return arrays[f"buf:{ref.index}"]
        if isinstance(ref, Weight):
            raw = arrays[f"weight:{ref.name}"]
            if ref.layout in ("", "blocks"):
                return raw
            return layouts.make(ref.layout, raw, *weights[ref.name])
        if isinstance(ref, State):
            return arrays[f"state:{ref.name}"]
        if isinstance(ref, Cache):
            return arrays["cache"]
        if isinstance(ref, RopeTable):
            return arrays["table"]
        if isinstance(ref, Scratch):
            shape = [d if isinstance(d, int) else dims[d] for d in ref.shape]
            return arrays.setdefault(f"scratch:{ref.name}", np.full(value_bytes(ref.dtype, shape), 0xFF, np.uint8))
        raise KeyError(ref)

    for ln in launches:
        lib.launch(ln, bind, dims)


@pytest.fixture
def rng(request):
    """A random generator seeded by the test's own id."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def weight(rng: np.random.Generator, fmt: str, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(the tensor's bytes as the GGUF stores them, the exactly dequantized float32 matrix [n, k])."""
    raw = random_blocks(rng, fmt, n, k).view(np.uint8).reshape(-1)
    return raw, dequantize(raw, FORMATS[fmt.upper()], (n, k))


def context(specs: list[dict[str, Any]], weights: dict[str, tuple[str, tuple[int, ...]]]) -> Context:
    """A CPU family's context: buffers from {"dtype", "shape"} maps, weights (format, shape) by name."""
    return Context(phase_buffers(specs), weights, None)
