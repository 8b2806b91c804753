"""The cuda driver: a GPU plan on an NVIDIA device through CuPy (imported here, only when this backend
is used). The plan's cubin/fatbin is loaded as a module, kernels launch through cuLaunchKernel with
their packed arguments on one non-blocking stream, and a decode bucket is recorded by stream capture
into a CUDA graph, replayed with one launch per step. runtime/drivers/gpu.py holds what it shares
with the hip driver."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmplan.core import gpu_runtime

from ..driver import Call, Graph
from .gpu import DeviceBuffer, StreamDriver


class _Event:
    def __init__(self, cupy, stream, timing: bool):
        self.cupy = cupy
        self.event = cupy.cuda.Event(disable_timing=not timing)
        self.event.record(stream)

    def done(self) -> bool:
        return self.event.done

    def wait(self) -> None:
        self.event.synchronize()

    def seconds_since(self, earlier: _Event) -> float:
        self.wait()
        return self.cupy.cuda.get_elapsed_time(earlier.event, self.event) / 1000


class CudaGraph(Graph):
    def __init__(self, graph, stream):
        self.graph, self.stream = graph, stream

    def replay(self) -> None:
        self.graph.launch(self.stream)


class CudaDriver(StreamDriver):
    name = "cuda"
    graphs = True
    PARAM_CONSTANTS = (1, 2, 0)  # CU_LAUNCH_PARAM_BUFFER_POINTER, _BUFFER_SIZE, _END

    def __init__(self) -> None:
        self.cupy = gpu_runtime.cupy()
        self.runtime, self.cudriver = self.cupy.cuda.runtime, self.cupy.cuda.driver
        self.stream = self.cupy.cuda.Stream(non_blocking=True)

    def record(self, calls: list[Call]) -> Graph:
        """Capture the calls into a CUDA graph; everything they touch is allocated already (the
        executor allocates at load), and nothing is allocated here."""
        self.stream.begin_capture()
        try:
            for call in calls:
                self.launch(call)
        finally:
            graph = self.stream.end_capture()
        return CudaGraph(graph, self.stream)

    def sync(self) -> None:
        self.stream.synchronize()

    def arch(self) -> str:
        return f"sm_{self.cupy.cuda.Device().compute_capability}"

    def load_module(self, binary: bytes) -> Any:
        module = self.cupy.cuda.function.Module()
        module.load(binary)
        return module

    def function(self, module: Any, name: str) -> Any:
        return module.get_function(name)

    def opt_in_smem(self, function: Any, nbytes: int) -> None:
        self.cudriver.funcSetAttribute(function.ptr, self.cudriver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                       nbytes)

    def malloc(self, nbytes: int) -> DeviceBuffer:
        mem = self.cupy.cuda.memory.Memory(nbytes)  # a plain cudaMalloc, freed when collected
        return DeviceBuffer(mem.ptr, nbytes, mem)

    def memset(self, ptr: int, byte: int, nbytes: int) -> None:
        self.runtime.memsetAsync(ptr, byte, nbytes, self.stream.ptr)

    def copy_to_device(self, ptr: int, host: np.ndarray) -> None:
        # from pageable memory the copy is staged before the call returns: `host` may go at once
        self.runtime.memcpyAsync(ptr, host.ctypes.data, host.nbytes, self.runtime.memcpyHostToDevice, self.stream.ptr)

    def copy_async(self, dst: int, src: int, nbytes: int, to_device: bool) -> None:
        kind = self.runtime.memcpyHostToDevice if to_device else self.runtime.memcpyDeviceToHost
        self.runtime.memcpyAsync(dst, src, nbytes, kind, self.stream.ptr)

    def event(self, timing: bool = False) -> _Event:
        return _Event(self.cupy, self.stream, timing)

    def pinned_alloc(self, nbytes: int) -> np.ndarray:
        mem = self.cupy.cuda.alloc_pinned_memory(nbytes)
        return np.frombuffer(mem, np.uint8, nbytes)

    def launch_kernel(self, function: Any, grid: tuple[int, int, int], block: int, smem: int, extra: int) -> None:
        self.cudriver.launchKernel(function.ptr, *grid, block, 1, 1, smem, self.stream.ptr, 0, extra)
