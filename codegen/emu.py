"""The emulated GPU's code: GPU kernels compiled for the host with codegen/kernels/emu.h in place of
vendor.h, one launcher per kernel, in one cached shared library (codegen/host.py).

From a plan, the source is the plan's own translation unit with its vendor section swapped
(`from_plan`), so what runs is exactly what the plan carries for the GPU; the kernel tests render
their Kernel records the same way (`from_kernels`). The wave width and the matrix-fragment emulation
follow the target: NVIDIA sm_80+ mma.sync fragments, RDNA3 WMMA, CDNA at wave 64 with neither.

A launcher lp_emu_call_<kernel>(gx, gy, gz, smem, args) takes the argument pointers as the plan's
parameter types order them (a pointer parameter: the address itself; a scalar: the address of its
value) and returns an error message or null: a barrier some lanes never reach, shuffles out of step,
a block that is not whole waves.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Iterable

from . import toolchain
from .build import KERNEL_DIR, render, with_vendor
from .host import HostLibrary, build_library
from .kernel import Kernel

HEADER = KERNEL_DIR / "emu.h"
MODES = {"plain": [], "mma": ["-DLP_EMU_MMA"], "wmma": ["-DLP_EMU_WMMA"]}
FLAGS = ["-std=c++20", "-O1", "-w", "-pthread"]
SCALARS = {"int": ctypes.c_int, "unsigned": ctypes.c_uint, "float": ctypes.c_float}


def mode_for(int8_matrix: str) -> str:
    """The fragment emulation of a device's matrix instructions (core/devices.py int8_matrix)."""
    return {"mma.sync.s8": "mma", "wmma_iu8": "wmma"}.get(int8_matrix, "plain")


def _launchers(kernels: dict[str, tuple[tuple[str, ...], int]]) -> str:
    out = []
    for name in sorted(kernels):
        params, block = kernels[name]
        call = ", ".join(f"*({t}*)a[{i}]" if t in SCALARS else f"({t})a[{i}]" for i, t in enumerate(params))
        out.append(f'extern "C" const char* lp_emu_call_{name}(int gx, int gy, int gz, int smem, void** a) '
                   f"{{ return lp_emu::launch(gx, gy, gz, {block}, smem, [=] {{ {name}({call}); }}); }}")
    return "\n".join(out) + "\n"


class EmuLibrary:
    """The kernels built for the host at one wave width and fragment mode; call() runs one launch."""

    def __init__(self, source: str, kernels: dict[str, tuple[tuple[str, ...], int]], wave: int, mode: str):
        self.kernels = kernels
        flags = [*FLAGS, f"-DWAVE={wave}", *MODES[mode]]
        self.build: HostLibrary = build_library(source + _launchers(kernels), flags, "emu", toolchain.clang_host())
        self.lib = self.build.load()
        self.fns = {}
        for name in kernels:
            fn = getattr(self.lib, f"lp_emu_call_{name}")
            fn.restype = ctypes.c_char_p
            fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
            self.fns[name] = fn
        self.set_threads(int(os.environ.get("LLMPLAN_EMU_THREADS", 0)) or len(os.sched_getaffinity(0)))

    @classmethod
    def from_plan(cls, source: str, kernels: dict[str, tuple[tuple[str, ...], int]], wave: int,
                  mode: str) -> EmuLibrary:
        """A plan's translation unit (its gpu.source) and kernel table (name -> parameter types, block)."""
        return cls(with_vendor(source, HEADER), kernels, wave, mode)

    @classmethod
    def from_kernels(cls, kernels: Iterable[Kernel], wave: int, mode: str) -> EmuLibrary:
        ks = list({k.name: k for k in kernels}.values())
        return cls(render(ks, HEADER), {k.name: (k.params, k.block) for k in ks}, wave, mode)

    def set_threads(self, n: int) -> None:
        """How many threads run a launch's blocks."""
        self.lib.lp_emu_set_threads(ctypes.c_int(n))

    def arguments(self, name: str, values: list[Any]) -> tuple[Any, list[Any]]:
        """The launcher's argument array for `values` (addresses for pointer parameters, numbers for
        scalars), and the objects that must stay alive while it is used."""
        params, _ = self.kernels[name]
        if len(params) != len(values):
            raise ValueError(f"{name}: {len(params)} parameters, {len(values)} arguments")
        keep, ptrs = [], []
        for t, v in zip(params, values):
            if t in SCALARS:
                c = SCALARS[t](v)
                keep.append(c)
                ptrs.append(ctypes.cast(ctypes.pointer(c), ctypes.c_void_p))
            else:
                ptrs.append(ctypes.c_void_p(v))
        array = (ctypes.c_void_p * max(1, len(ptrs)))(*ptrs)
        keep.append(array)
        return array, keep

    def call(self, name: str, grid: tuple[int, int, int], smem: int, args: Any) -> None:
        """Run one launch; `args` from arguments()."""
        if min(grid) == 0:
            return
        err = self.fns[name](grid[0], grid[1], grid[2], smem, args)
        if err:
            raise RuntimeError(f"{name}: {err.decode()}")
