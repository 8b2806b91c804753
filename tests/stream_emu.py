"""Test helper: the GPU drivers' shared code (runtime/drivers/gpu.py StreamDriver) over host memory
and the emulated GPU's kernels, so everything but the CUDA/HIP calls themselves runs in CI.

Its primitives are the ones cuda.py and hip.py implement: device memory is host memory addressed by
pointer, copies are memmoves, events are done at once, and launch_kernel reads the argument buffer
through the `extra` array (BUFFER_POINTER, &buffer, BUFFER_SIZE, &size, END) exactly as
cuLaunchKernel does, unpacks it with a ctypes Structure built from the parameter types (the C ABI's
own layout, independent of gpu.pack), and runs the kernel on the emulator. Recording works as stream
capture does: launches are kept, with a copy of their argument bytes, instead of run.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

import numpy as np

from llmplan.codegen.emu import EmuLibrary, mode_for
from llmplan.runtime.driver import Call, Graph
from llmplan.runtime.drivers.gpu import DeviceBuffer, StreamDriver

CTYPES = {"int": ctypes.c_int, "unsigned": ctypes.c_uint, "float": ctypes.c_float}
END = 0


def unpack(params: tuple[str, ...], data: bytes) -> list[Any]:
    """The argument values a kernel with these parameter types reads from `data`."""
    fields = [(f"a{i}", CTYPES.get(t, ctypes.c_void_p)) for i, t in enumerate(params)]
    struct = type("Args", (ctypes.Structure,), {"_fields_": fields})
    assert ctypes.sizeof(struct) >= len(data) > ctypes.sizeof(struct) - 8, (params, len(data))
    args = struct.from_buffer_copy(data.ljust(ctypes.sizeof(struct), b"\0"))
    return [getattr(args, f) or 0 for f, _ in fields]


class _Event:
    """Done at once (the launches ran when queued); its time is the host's clock."""

    def __init__(self) -> None:
        self.t = time.perf_counter()

    def done(self) -> bool:
        return True

    def wait(self) -> None:
        pass

    def seconds_since(self, earlier: _Event) -> float:
        return self.t - earlier.t


class _Graph(Graph):
    def __init__(self, driver: EmuStreamDriver, launches: list):
        self.driver, self.launches = driver, launches

    def replay(self) -> None:
        for launch in self.launches:
            self.driver.run(*launch)


class EmuStreamDriver(StreamDriver):
    name = "cuda"
    graphs = True
    PARAM_CONSTANTS = (1, 2, END)

    def __init__(self, arch: str = "sm_90"):
        self.device_arch = arch
        self.capture: list | None = None
        self.launches = 0
        self.pinned_allocs = 0

    def load(self, body: dict[str, Any], header: dict[str, Any]) -> None:
        dev = header["device"]
        kernels = {name: (tuple(k["params"]), k["block"]) for name, k in body["kernels"].items()}
        self.lib = EmuLibrary.from_plan(body["gpu"]["source"], kernels, dev["wave"], mode_for(dev["int8_matrix"]))
        self.opted: dict[str, int] = {}
        super().load(body, header)

    def record(self, calls: list[Call]) -> Graph:
        self.capture = []
        try:
            for call in calls:
                self.launch(call)
        finally:
            launches, self.capture = self.capture, None
        return _Graph(self, launches)

    def run(self, name: str, grid: tuple[int, int, int], block: int, smem: int, data: bytes) -> None:
        params, built = self.lib.kernels[name]
        assert block == built, (name, block, built)
        array, keep = self.lib.arguments(name, unpack(params, data))
        self.lib.call(name, grid, smem, array)
        self.launches += 1

    # --- the primitives ---------------------------------------------------------------------------

    def arch(self) -> str:
        return self.device_arch

    def load_module(self, binary: bytes) -> Any:
        assert binary, "the plan carries the GPU binary"
        return self.lib

    def function(self, module: Any, name: str) -> Any:
        return name

    def opt_in_smem(self, function: Any, nbytes: int) -> None:
        self.opted[function] = nbytes

    def malloc(self, nbytes: int) -> DeviceBuffer:
        mem = np.full(nbytes, 0xAB, np.uint8)  # not zeroed: alloc() must clear it
        return DeviceBuffer(mem.ctypes.data, nbytes, mem)

    def memset(self, ptr: int, byte: int, nbytes: int) -> None:
        ctypes.memset(ptr, byte, nbytes)

    def copy_to_device(self, ptr: int, host: np.ndarray) -> None:
        ctypes.memmove(ptr, host.ctypes.data, host.nbytes)

    def copy_async(self, dst: int, src: int, nbytes: int, to_device: bool) -> None:
        ctypes.memmove(dst, src, nbytes)

    def event(self, timing: bool = False) -> _Event:
        return _Event()

    def pinned_alloc(self, nbytes: int) -> np.ndarray:
        self.pinned_allocs += 1
        return np.zeros(nbytes, np.uint8)

    def launch_kernel(self, function: Any, grid: tuple[int, int, int], block: int, smem: int, extra: int) -> None:
        words = (ctypes.c_void_p * 5).from_address(extra)
        assert (words[0], words[2], words[4] or 0) == (1, 2, END), list(words)
        size = ctypes.c_size_t.from_address(words[3]).value
        data = ctypes.string_at(words[1], size)
        launch = (function, grid, block, smem, data)
        if self.capture is not None:
            self.capture.append(launch)
        else:
            self.run(*launch)
