"""The hip driver: a GPU plan on an AMD device through hip-python (imported here, only when this
backend is used). The plan's code object is loaded with hipModuleLoadData and kernels launch through
hipModuleLaunchKernel with their packed arguments on one non-blocking stream. No graphs: a decode step
is launched call by call, and the engine keeps the stream a step ahead (pipelined decode).
runtime/drivers/gpu.py holds what it shares with the cuda driver."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from llmplan.core import gpu_runtime
from llmplan.core.errors import InputError

from .gpu import DeviceBuffer, StreamDriver


class _Checked:
    """hip-python's functions return (hipError_t, results...): raise on an error, return the results."""

    def __init__(self, hip):
        self.hip = hip

    def __getattr__(self, name: str):
        fn = getattr(self.hip, name)

        def call(*args):
            out = fn(*args)
            out = out if isinstance(out, tuple) else (out,)
            self.check(name, out[0])
            return out[1] if len(out) == 2 else out[1:] or None

        return call

    def check(self, name: str, err: Any) -> None:
        if err != self.hip.hipError_t.hipSuccess:
            _, text = self.hip.hipGetErrorString(err)  # a CStr (bytes in older hip-python)
            raise RuntimeError(f"{name}: {text.decode() if isinstance(text, bytes) else text}")


class _Memory:
    def __init__(self, hip, ptr):
        self.hip, self.ptr = hip, ptr

    def __del__(self):
        self.hip.hipFree(self.ptr)


class _Event:
    def __init__(self, hip, stream, timing: bool):
        self.hip = hip
        flags = 0 if timing else hip.hipEventDisableTiming
        self.event = _Checked(hip).hipEventCreateWithFlags(flags)
        _Checked(hip).hipEventRecord(self.event, stream)

    def done(self) -> bool:
        return self.hip.hipEventQuery(self.event)[0] == self.hip.hipError_t.hipSuccess

    def wait(self) -> None:
        _Checked(self.hip).hipEventSynchronize(self.event)

    def seconds_since(self, earlier: _Event) -> float:
        self.wait()
        return _Checked(self.hip).hipEventElapsedTime(earlier.event, self.event) / 1000

    def __del__(self):
        self.hip.hipEventDestroy(self.event)


class HipDriver(StreamDriver):
    name = "hip"
    graphs = False
    PARAM_CONSTANTS = (1, 2, 3)  # HIP_LAUNCH_PARAM_BUFFER_POINTER, _BUFFER_SIZE, _END

    def __init__(self) -> None:
        self.hip = gpu_runtime.hip()
        self.api = _Checked(self.hip)
        self.stream = self.api.hipStreamCreateWithFlags(self.hip.hipStreamNonBlocking)
        err, self.props = gpu_runtime.hip_properties(self.hip)
        self.api.check("hipGetDeviceProperties", err)

    def sync(self) -> None:
        self.api.hipStreamSynchronize(self.stream)

    def arch(self) -> str:
        name = self.props.gcnArchName
        return (name.decode() if isinstance(name, bytes) else name).split(":")[0]  # gfx1100:sramecc+:xnack-

    def load_module(self, binary: bytes) -> Any:
        self.binary = binary  # alive as long as the module: hipModuleLoadData takes a pointer and promises no copy
        return self.api.hipModuleLoadData(binary)

    def function(self, module: Any, name: str) -> Any:
        return self.api.hipModuleGetFunction(module, name.encode())

    def opt_in_smem(self, function: Any, nbytes: int) -> None:
        # AMD has no opt-in: a block may use all of a workgroup's LDS (the plan's smem_per_block, which
        # StreamDriver.load found too small), and a plan asking more cannot run here
        raise InputError(f"a kernel asks {nbytes} bytes of dynamic shared memory beyond what a block gets here "
                         f"({self.props.sharedMemPerBlock} bytes in all); AMD GPUs have no opt-in")

    def malloc(self, nbytes: int) -> DeviceBuffer:
        ptr = self.api.hipMalloc(nbytes)
        return DeviceBuffer(int(ptr), nbytes, _Memory(self.hip, ptr))

    def memset(self, ptr: int, byte: int, nbytes: int) -> None:
        self.api.hipMemsetAsync(ptr, byte, nbytes, self.stream)

    def copy_to_device(self, ptr: int, host: np.ndarray) -> None:
        self.sync()  # hipMemcpy runs on the null stream, which a non-blocking stream does not wait for
        self.api.hipMemcpy(ptr, host.ctypes.data, host.nbytes, self.hip.hipMemcpyKind.hipMemcpyHostToDevice)

    def copy_async(self, dst: int, src: int, nbytes: int, to_device: bool) -> None:
        kinds = self.hip.hipMemcpyKind
        kind = kinds.hipMemcpyHostToDevice if to_device else kinds.hipMemcpyDeviceToHost
        self.api.hipMemcpyAsync(dst, src, nbytes, kind, self.stream)

    def event(self, timing: bool = False) -> _Event:
        return _Event(self.hip, self.stream, timing)

    def pinned_alloc(self, nbytes: int) -> np.ndarray:
        ptr = self.api.hipHostMalloc(nbytes, self.hip.hipHostMallocDefault)  # kept for the process's life
        return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(int(ptr)))

    def launch_kernel(self, function: Any, grid: tuple[int, int, int], block: int, smem: int, extra: int) -> None:
        self.api.hipModuleLaunchKernel(function, *grid, block, 1, 1, smem, self.stream, None, extra)
