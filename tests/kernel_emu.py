"""Running llmplan's GPU kernels on the CPU (tests/kernel_emu.h), for tests on machines without a GPU.

Emulator(kernels, wave, mode) renders the kernels as codegen/build.py does, with tests/kernel_emu.h in
place of codegen/kernels/vendor.h, adds one launcher per kernel, and compiles that with the host
clang++-19 into a shared library (cached under $LLMPLAN_CACHE/emu by source and flags). wave 64
emulates CDNA; mode "mma" and "wmma" emulate the matrix-core fragments of sm_80+ and of RDNA3 (wave
32), "plain" has none. launch(launch, bind, dims) runs a codegen Launch record as a runtime would:
grid symbols and scalar arguments bound from `dims`, every other argument (buffers, weights, step
state, scratch, tables) through bind(ref) -> NumPy array. Launch.smem must be 0: dynamic shared memory
is not emulated (static __shared__ variables are).

What this checks: a kernel's indexing, its barriers and shuffles (one some lanes skip is an error, not
a hang), its fragment layouts, and its float32 arithmetic as written. What it does not: the GPUs' own
exp (host libm here), FMA contraction choices of nvcc and the AMDGPU backend, memory-model subtleties
beyond barriers, and speed.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from llmplan.codegen.build import cache_root, render
from llmplan.codegen.kernel import Kernel, Launch

HEADER = Path(__file__).parent / "kernel_emu.h"
COMPILER = "clang++-19"
MODES = {"plain": [], "mma": ["-DLP_EMU_MMA"], "wmma": ["-DLP_EMU_WMMA"]}
_SCALARS = {"int": (ctypes.c_int, "i32"), "unsigned": (ctypes.c_uint, "i32"), "float": (ctypes.c_float, "f32")}


def on_gpu() -> bool:
    """LLMPLAN_KERNEL_RUNNER=cuda: the kernel tests run their launches on the local NVIDIA GPU."""
    return os.environ.get("LLMPLAN_KERNEL_RUNNER") == "cuda"


def have_compiler() -> bool:
    """Whether runner() can run kernels here: the GPU runner needs no host compiler."""
    return on_gpu() or shutil.which(COMPILER) is not None


def runner(kernels: list[Kernel], wave: int = 32, mode: str = "plain"):
    """What the kernel tests launch through: the host emulator, or (on_gpu()) tests/cuda_runner.py's
    CudaRunner, which has the same launch() and skips a wave width or fragment mode the GPU lacks."""
    if on_gpu():
        from cuda_runner import CudaRunner

        return CudaRunner(kernels, wave, mode)
    return Emulator(kernels, wave, mode)


def _params(k: Kernel) -> list[str]:
    """The C types of the entry point's parameters."""
    m = re.match(r"LP_KERNEL void (?:__launch_bounds__\([\d, ]+\) )?(\w+)\((.*?)\)\s*\{", k.entry, re.S)
    assert m and m.group(1) == k.name, k.entry
    return [re.sub(r"\s*\w+$", "", p.strip()) for p in m.group(2).split(",") if p.strip()]


def _source(kernels: list[Kernel]) -> str:
    """The kernels' translation unit and a launcher lp_emu_call_<kernel>(grid, smem, argument pointers)."""
    out = [render(kernels, HEADER)]
    for k in sorted({k.name: k for k in kernels}.values(), key=lambda k: k.name):
        call = ", ".join(f"*({t}*)a[{i}]" if t in _SCALARS else f"({t})a[{i}]" for i, t in enumerate(_params(k)))
        out.append(f'extern "C" const char* lp_emu_call_{k.name}(int gx, int gy, int gz, int smem, void** a) '
                   f"{{ return lp_emu::launch(gx, gy, gz, {k.block}, smem, [=] {{ {k.name}({call}); }}); }}")
    return "\n".join(out) + "\n"


def _workdir() -> Path:
    path = cache_root() / "emu"
    try:
        path.mkdir(parents=True, exist_ok=True)
        return path
    except OSError:
        return Path(tempfile.mkdtemp(prefix="llmplan-emu-"))


class Emulator:
    """The kernels built for the host with one wave width and fragment mode."""

    def __init__(self, kernels: list[Kernel], wave: int = 32, mode: str = "plain"):
        self.kernels = {k.name: k for k in kernels}
        source = _source(list(self.kernels.values()))
        flags = ["-std=c++20", "-O1", "-shared", "-fPIC", "-w", f"-DWAVE={wave}", *MODES[mode]]
        key = hashlib.sha256("\0".join([source, *flags]).encode()).hexdigest()[:24]
        work = _workdir()
        lib = work / f"emu_{key}.so"
        if not lib.exists():
            cpp = work / f"emu_{key}.cpp"
            cpp.write_text(source)
            tmp = work / f"emu_{key}.{os.getpid()}.tmp"
            r = subprocess.run([COMPILER, *flags, "-o", str(tmp), str(cpp)], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"emulator build (wave {wave}, {mode}) failed:\n{r.stderr[:4000]}")
            os.replace(tmp, lib)
        self.lib = ctypes.CDLL(str(lib))
        for name in self.kernels:
            getattr(self.lib, f"lp_emu_call_{name}").restype = ctypes.c_char_p

    def launch(self, launch: Launch, bind: Callable[[dict[str, Any]], np.ndarray], dims: dict[str, int]) -> None:
        k = launch.kernel
        types = _params(k)
        assert len(types) == len(launch.args), f"{k.name}: {len(types)} parameters, {len(launch.args)} arguments"
        keep, ptrs = [], []
        for t, arg in zip(types, launch.args):
            if t in _SCALARS:
                ctype, kind = _SCALARS[t]
                assert list(arg) == [kind], (k.name, t, arg)
                v = arg[kind]
                c = ctype(dims[v] if isinstance(v, str) else v)
                keep.append(c)
                ptrs.append(ctypes.cast(ctypes.pointer(c), ctypes.c_void_p))
            else:
                arr = bind(arg)
                assert isinstance(arr, np.ndarray) and arr.flags.c_contiguous, (k.name, arg)
                keep.append(arr)
                ptrs.append(ctypes.c_void_p(arr.ctypes.data))
        grid = [g if isinstance(g, int) else -(-dims[g[0]] // g[1]) for g in launch.grid]
        grid += [1] * (3 - len(grid))
        if min(grid) == 0:
            return
        args = (ctypes.c_void_p * max(1, len(ptrs)))(*ptrs)
        err = getattr(self.lib, f"lp_emu_call_{k.name}")(grid[0], grid[1], grid[2], int(launch.smem or 0), args)
        if err:
            raise RuntimeError(f"{k.name}: {err.decode()}")
