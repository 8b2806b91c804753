"""Running the kernel tests. KernelLaunch records on the package's emulated GPU (codegen/emu.py), or on a real
NVIDIA GPU (LLMPLAN_KERNEL_RUNNER=cuda: tests/cuda_runner.py, with the same launch()).

Emulator(kernels, wave, mode) builds the kernels for the host with codegen/kernels/emu.h in place of
vendor.h; wave 64 emulates CDNA; mode "mma" and "wmma" the matrix-core fragments of sm_80+ and of
RDNA3 (wave 32), "plain" none. launch(launch, bind, dims) runs a codegen KernelLaunch as a runtime would:
grid symbols and scalar arguments bound from `dims`, every other argument (buffers, weights, step
state, scratch, tables) through bind(ref) -> a C-contiguous NumPy array. KernelLaunch.smem must be 0:
dynamic shared memory is not emulated (static __shared__ variables are).

What this checks: a kernel's indexing, its barriers and shuffles (one some lanes skip is an error, not
a hang), its fragment layouts, and its float32 arithmetic as written. What it does not: the GPUs' own
exp (host libm here), FMA contraction choices of nvcc and the AMDGPU backend, memory-model subtleties
beyond barriers, and speed.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Callable

import numpy as np

from llmplan.codegen.emu import MODES, SCALARS, EmuLibrary
from llmplan.codegen.kernel import Kernel, KernelLaunch
from llmplan.core.plan_records import Ref, ref_to_wire

COMPILER = "clang++-19"
assert set(MODES) == {"plain", "mma", "wmma"}


def on_gpu() -> bool:
    """LLMPLAN_KERNEL_RUNNER=cuda: the kernel tests run their launches on the local NVIDIA GPU."""
    return os.environ.get("LLMPLAN_KERNEL_RUNNER") == "cuda"


def have_host_compiler() -> bool:
    """Whether the Emulator can be built here."""
    return shutil.which(COMPILER) is not None


def have_compiler() -> bool:
    """Whether runner() can run kernels here: the GPU runner needs no host compiler."""
    return on_gpu() or have_host_compiler()


def runner(kernels: list[Kernel], wave: int = 32, mode: str = "plain"):
    """What the kernel tests launch through: the emulator, or (on_gpu()) tests/cuda_runner.py's
    CudaRunner, which has the same launch() and skips a wave width or fragment mode the GPU lacks."""
    if on_gpu():
        from cuda_runner import CudaRunner

        return CudaRunner(kernels, wave, mode)
    return Emulator(kernels, wave, mode)


def scalar_values(k: Kernel, args: list[Ref], dims: dict[str, int],
                  bind: Callable[[dict[str, Any]], np.ndarray]) -> tuple[list[Any], list[np.ndarray]]:
    """Each argument as the launcher takes it: a number for a scalar parameter (symbols bound from
    dims), a bound array for a pointer parameter (bind takes the reference's wire form); and the arrays."""
    assert len(k.params) == len(args), f"{k.name}: {len(k.params)} parameters, {len(args)} arguments"
    values, arrays = [], []
    for t, arg in zip(k.params, args):
        if t in SCALARS:
            assert arg.KIND == ("f32" if t == "float" else "i32"), (k.name, t, arg)
            values.append(dims[arg.value] if isinstance(arg.value, str) else arg.value)
        else:
            arr = bind(ref_to_wire(arg))
            assert isinstance(arr, np.ndarray) and arr.flags.c_contiguous, (k.name, arg)
            values.append(arr)
            arrays.append(arr)
    return values, arrays


def grid_of(launch: KernelLaunch, dims: dict[str, int]) -> tuple[int, int, int]:
    grid = [g if isinstance(g, int) else -(-dims[g[0]] // g[1]) for g in launch.grid]
    return tuple(grid + [1] * (3 - len(grid)))  # type: ignore[return-value]


class Emulator:
    """The kernels built for the host with one wave width and fragment mode."""

    def __init__(self, kernels: list[Kernel], wave: int = 32, mode: str = "plain"):
        self.lib = EmuLibrary.from_kernels(kernels, wave, mode)
        self.kernels = {k.name: k for k in kernels}

    def launch(self, launch: KernelLaunch, bind: Callable[[dict[str, Any]], np.ndarray], dims: dict[str, int]) -> None:
        k = launch.kernel
        values, _ = scalar_values(k, launch.args, dims, bind)
        addresses = [v.ctypes.data if isinstance(v, np.ndarray) else v for v in values]
        array, keep = self.lib.arguments(k.name, addresses)
        self.lib.call(k.name, grid_of(launch, dims), int(launch.smem or 0), array)
        del keep
