"""Running the kernel tests. KernelLaunch records on a real NVIDIA GPU through CuPy, with the emulator's
interface (tests/kernel_emu.py), so every emulator test is also a GPU test.

`LLMPLAN_KERNEL_RUNNER=cuda pytest tests/test_codegen_*.py` (scripts/device-check does this) builds each
test's kernels with codegen/build.py for the local GPU's architecture, loads the binary from its bytes
(cupy.cuda.function.Module.load; RawModule(path=) would read the file only when a kernel is first
taken) and runs launch(launch, bind, dims) as the emulator does: grid and scalar symbols from
`dims`, every other argument bound to a NumPy array, copied to the device before the launch and back
after it (arguments bound to the same array share one device buffer, so in-place outputs work). A test
configuration the GPU cannot run (wave 64, RDNA3 WMMA fragments) is skipped.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from llmplan.codegen.build import build
from llmplan.codegen.kernel import Kernel, KernelLaunch
from llmplan.codegen.targets import TARGETS
from llmplan.core.plan_records import ref_to_wire

_SCALARS = {"int": (np.int32, "i32"), "unsigned": (np.uint32, "i32"), "float": (np.float32, "f32")}


def device_target():
    """The codegen Target of GPU 0, or None when it has no target (or there is no CUDA GPU)."""
    import cupy

    try:
        cc = cupy.cuda.Device(0).compute_capability
    except cupy.cuda.runtime.CUDARuntimeError:
        return None
    return TARGETS.get(f"sm_{cc}")


class CudaRunner:
    """The kernels built for GPU 0; the emulator's wave and fragment mode name what the test expects."""

    def __init__(self, kernels: list[Kernel], wave: int = 32, mode: str = "plain"):
        import cupy

        self.cupy = cupy
        target = device_target()
        if target is None:
            pytest.skip("no CUDA GPU with a codegen target here")
        if wave != target.wave or mode == "wmma":
            pytest.skip(f"wave {wave} / {mode} fragments do not run on {target.name}")
        self.kernels = {k.name: k for k in kernels}
        built = build(list(self.kernels.values()), target, gates=False)
        self.module = cupy.cuda.function.Module()
        self.module.load(built.binary)
        self.functions = {name: self.module.get_function(name) for name in self.kernels}

    def launch(self, launch: KernelLaunch, bind: Callable[[dict[str, Any]], np.ndarray], dims: dict[str, int]) -> None:
        cp = self.cupy
        k = launch.kernel
        types = k.params
        assert len(types) == len(launch.args), f"{k.name}: {len(types)} parameters, {len(launch.args)} arguments"
        device: dict[tuple[int, int], tuple[np.ndarray, Any]] = {}
        args = []
        for t, arg in zip(types, launch.args):
            if t in _SCALARS:
                ctype, kind = _SCALARS[t]
                assert arg.KIND == kind, (k.name, t, arg)
                args.append(ctype(dims[arg.value] if isinstance(arg.value, str) else arg.value))
                continue
            arr = bind(ref_to_wire(arg))
            assert isinstance(arr, np.ndarray) and arr.flags.c_contiguous, (k.name, arg)
            key = (arr.ctypes.data, arr.nbytes)
            if key not in device:
                device[key] = arr, cp.asarray(arr)
            args.append(device[key][1])
        grid = [g if isinstance(g, int) else -(-dims[g[0]] // g[1]) for g in launch.grid]
        grid += [1] * (3 - len(grid))
        if min(grid) == 0:
            return
        self.functions[k.name](tuple(grid), (k.block,), tuple(args), shared_mem=int(launch.smem or 0))
        cp.cuda.Device().synchronize()
        for arr, dev in device.values():
            arr[...] = dev.get()
