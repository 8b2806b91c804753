"""What the cuda and hip drivers share: device buffers, one stream, copies staged through pinned host
memory, reads that wait on an event, and kernel arguments packed into the one buffer both launch APIs
take (`extra`, CU_/HIP_LAUNCH_PARAM_BUFFER_POINTER), from the plan's parameter types. Each backend
supplies only the primitives at the bottom of StreamDriver.

Step-state writes go through pinned memory because an asynchronous copy from pageable memory may be
synchronous with the host (CUDA's documented behaviour): a pipelined decode step could stall on the one
before it.
"""

from __future__ import annotations

import ctypes
import struct
from abc import abstractmethod
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from llmplan.core.errors import InputError
from llmplan.core.plan_records import PlanBody, PlanHeader

from ..driver import Call, Driver, Pending, Region
from .host import typed

# C parameter type -> struct format; pointers (`const float*`, `lp_half*` ...) are 8-byte addresses
SCALAR_FORMATS = {"int": "i", "unsigned": "I", "float": "f"}


def pack(params: tuple[str, ...], values: list[int | float]) -> bytes:
    """The kernel's argument buffer: each value at its natural alignment, as the C ABI lays out the
    parameters (pointers: 8-byte addresses)."""
    if len(params) != len(values):
        raise ValueError(f"{len(params)} parameters, {len(values)} arguments")
    out = bytearray()
    for t, v in zip(params, values):
        if not t.endswith("*") and t not in SCALAR_FORMATS:
            raise ValueError(f"no packing for a parameter of type {t!r}")
        fmt = SCALAR_FORMATS.get(t, "Q")
        size = struct.calcsize(fmt)
        out += bytes(-len(out) % size)
        out += struct.pack("<" + fmt, v)
    return bytes(out)


class LaunchArgs:
    """A packed argument buffer and the `extra` array that hands it to cuLaunchKernel /
    hipModuleLaunchKernel: {BUFFER_POINTER, &buffer, BUFFER_SIZE, &size, END}. `address` stays valid
    while this object lives (a graph capture copies the arguments, so only direct launches need it)."""

    def __init__(self, packed: bytes, pointer: int, size: int, end: int):
        self.buffer = ctypes.create_string_buffer(packed, max(len(packed), 1))
        self.size = ctypes.c_size_t(len(packed))
        self.extra = (ctypes.c_void_p * 5)(pointer, ctypes.addressof(self.buffer), size,
                                           ctypes.addressof(self.size), end)
        self.address = ctypes.addressof(self.extra)


@dataclass(frozen=True)
class DeviceBuffer:
    ptr: int
    nbytes: int
    owner: Any  # what keeps the allocation alive (frees it when collected)


def _address(region: Region) -> int:
    return region.buffer.ptr + int(region.offset)  # offsets computed from step state are NumPy integers


class PinnedPool:
    """Pinned host buffers by size (powers of two), reused once the copy that used them is done."""

    def __init__(self, alloc):
        self.alloc = alloc  # nbytes -> a pinned np.uint8 array
        self.free: dict[int, list[np.ndarray]] = {}
        self.busy: list[tuple[Any, np.ndarray]] = []  # (event, buffer) of copies in flight

    def take(self, nbytes: int) -> np.ndarray:
        still = []
        for event, buf in self.busy:
            if event.done():
                self.free.setdefault(buf.nbytes, []).append(buf)
            else:
                still.append((event, buf))
        self.busy = still
        size = 1 << max(nbytes - 1, 0).bit_length()
        spare = self.free.get(size)
        return spare.pop() if spare else self.alloc(size)

    def give(self, buf: np.ndarray, event: Any = None) -> None:
        if event is None:
            self.free.setdefault(buf.nbytes, []).append(buf)
        else:
            self.busy.append((event, buf))


class PinnedRead(Pending):
    """A device-to-host copy into pinned memory; result() waits on the event recorded after it."""

    def __init__(self, event: Any, buf: np.ndarray, src: Region, pool: PinnedPool):
        self.event, self.buf, self.src, self.pool = event, buf, src, pool
        self.data: np.ndarray | None = None

    def result(self) -> np.ndarray:
        if self.data is None:
            self.event.wait()
            self.data = typed(replace(self.src, buffer=self.buf[:self.src.nbytes], offset=0)).copy()
            self.pool.give(self.buf)
        return self.data


class StreamDriver(Driver):
    """A GPU driver over one stream; subclasses implement the primitives (cuda.py, hip.py)."""

    overlaps = True
    PARAM_CONSTANTS: tuple[int, int, int]  # BUFFER_POINTER, BUFFER_SIZE, END of the backend's launch API

    def load(self, body: PlanBody, header: PlanHeader) -> None:
        dev = header.device
        here = self.arch()
        if dev.backend != self.name or dev.arch != here:
            raise InputError(f"this plan is for {dev.backend} {dev.arch}; the device here is {self.name} {here}: "
                             f"recompile with plan compile ... --device {self.name}")
        if body.gpu is None:
            raise InputError(f"this plan's header says {dev.arch}, but it holds no GPU kernels: recompile it")
        self.params = {name: tuple(k.params) for name, k in body.kernels.items()}
        self.module = self.load_module(body.gpu.binary)
        self.functions = {name: self.function(self.module, name) for name in self.params}
        # opt in once, before any capture, to the most dynamic shared memory any launch of a kernel asks,
        # where it and the kernel's static shared memory (its manifest's) pass what a block gets without
        # opting in: CUDA's default dynamic limit is that less the static bytes
        smem: dict[str, int] = {}
        for p in body.phases.values():
            for launch in p.launches:
                for k in launch.kernels:
                    smem[k.name] = max(smem.get(k.name, 0), k.smem)
        manifests = body.gpu.manifests
        for name, n in smem.items():
            if n and manifests.get(name, {}).get("shared_bytes", 0) + n > dev.smem_per_block:
                self.opt_in_smem(self.functions[name], n)
        self.pinned = PinnedPool(self.pinned_alloc)

    def alloc(self, nbytes: int) -> DeviceBuffer:
        buf = self.malloc(max(nbytes, 1))
        self.memset(buf.ptr, 0, buf.nbytes)
        return buf

    def put(self, host: np.ndarray) -> DeviceBuffer:
        data = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
        buf = self.malloc(max(data.nbytes, 1))
        self.copy_to_device(buf.ptr, data)  # `host` (the mapped file, or a relayout) is not kept
        return buf

    def write(self, dst: Region, host: np.ndarray) -> None:
        data = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
        if data.size > dst.nbytes:
            raise ValueError(f"{data.size} bytes into a region of {dst.nbytes}")
        stage = self.pinned.take(data.size)
        stage[:data.size] = data
        self.copy_async(_address(dst), stage.ctypes.data, data.size, to_device=True)
        self.pinned.give(stage, self.event())

    def read(self, src: Region) -> Pending:
        buf = self.pinned.take(src.nbytes)
        self.copy_async(buf.ctypes.data, _address(src), src.nbytes, to_device=False)
        return PinnedRead(self.event(), buf, src, self.pinned)

    def fill(self, dst: Region, byte: int) -> None:
        self.memset(_address(dst), byte, dst.nbytes)

    def launch(self, call: Call) -> None:
        values = [_address(a) if isinstance(a, Region) else a.value for a in call.args]
        args = LaunchArgs(pack(self.params[call.name], values), *self.PARAM_CONSTANTS)
        if min(call.grid) > 0:
            self.launch_kernel(self.functions[call.name], call.grid, call.block, call.smem, args.address)

    def marker(self) -> Any:
        return self.event(timing=True)

    # --- the backend's primitives ---------------------------------------------------------------

    @abstractmethod
    def arch(self) -> str:
        """The local device's architecture as the plan names it (sm_90, gfx1100)."""

    @abstractmethod
    def load_module(self, binary: bytes) -> Any: ...

    @abstractmethod
    def function(self, module: Any, name: str) -> Any: ...

    @abstractmethod
    def opt_in_smem(self, function: Any, nbytes: int) -> None: ...

    @abstractmethod
    def malloc(self, nbytes: int) -> DeviceBuffer: ...

    @abstractmethod
    def memset(self, ptr: int, byte: int, nbytes: int) -> None:
        """Queued on the stream."""

    @abstractmethod
    def copy_to_device(self, ptr: int, host: np.ndarray) -> None:
        """Copy host's bytes, ordered on the stream; `host` may be dropped when it returns."""

    @abstractmethod
    def copy_async(self, dst: int, src: int, nbytes: int, to_device: bool) -> None:
        """Queued on the stream; the host side is pinned."""

    @abstractmethod
    def event(self, timing: bool = False) -> Any:
        """An event recorded on the stream now: done() polls it, wait() blocks on it; with timing,
        seconds_since(earlier) is the device time between two."""

    @abstractmethod
    def pinned_alloc(self, nbytes: int) -> np.ndarray: ...

    @abstractmethod
    def launch_kernel(self, function: Any, grid: tuple[int, int, int], block: int, smem: int, extra: int) -> None: ...
