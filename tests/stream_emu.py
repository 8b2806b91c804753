"""Test helper: the real cuda and hip drivers (runtime/drivers/cuda.py, hip.py, over gpu.py's
StreamDriver) running on stand-ins for CuPy and hip-python whose calls have the libraries' own names,
signatures, argument types and return shapes, over host memory and the emulated GPU's kernels. So every
line of the two drivers runs in CI, and only what the libraries do inside a call is left to the GPU.

The stand-ins: `fake_cupy()` and `fake_hip()` build module trees (cupy.cuda.runtime.memcpyAsync,
hip.hipModuleLaunchKernel, ...) whose functions carry the signature line the real library's docstring
gives (Cython embeds it), checked at every call as Cython checks it (argument count, C integer types and
ranges, `bytes`, handle objects, enum kinds); test_gpu_drivers.py holds each line against the installed
CuPy / hip-python where they are importable. Behind them one EmuDevice:

- device memory is host memory addressed by pointer; a copy checks its direction against its kind (the
  destination of a host-to-device copy is device memory, its source is not) and that device addresses
  lie inside live allocations, as a launch checks every pointer argument, replayed graphs too (nothing
  captured may point at a freed buffer);
- a launch reads its argument buffer through the `extra` array (BUFFER_POINTER, &buffer, BUFFER_SIZE,
  &size, END; END is 0 on CUDA, 3 on HIP), whose size must be where the last parameter ends (no tail
  padding, as cuLaunchKernel wants), unpacks it with a ctypes Structure built from the parameter types
  (the C ABI's own layout, independent of gpu.pack) and runs the kernel on the emulator; dynamic
  shared memory past the default limit (the device's per-block bytes less the kernel's static bytes)
  fails unless the kernel opted in;
- stream capture keeps launches, memsets and copies, with their argument bytes, as graph nodes instead of
  running them, and refuses an allocation or a synchronization while capturing; events are done at
  once and carry the host's clock.
"""

from __future__ import annotations

import bisect
import ctypes
import enum
import operator
import re
import sys
import time
import types
from typing import Any
from unittest import mock

import numpy as np

from llmplan.codegen.emu import EmuLibrary, mode_for
from llmplan.core.plan_records import PlanBody, PlanHeader
from llmplan.runtime.drivers.cuda import CudaDriver
from llmplan.runtime.drivers.hip import HipDriver

CTYPES = {"int": ctypes.c_int, "unsigned": ctypes.c_uint, "float": ctypes.c_float}
CUDA_END, HIP_END = 0, 3  # CU_LAUNCH_PARAM_END, HIP_LAUNCH_PARAM_END
BUFFER_POINTER, BUFFER_SIZE = 1, 2  # the same on CUDA and HIP


def _struct(params: tuple[str, ...]) -> type[ctypes.Structure]:
    fields = [(f"a{i}", CTYPES.get(t, ctypes.c_void_p)) for i, t in enumerate(params)]
    return type("Args", (ctypes.Structure,), {"_fields_": fields})


def params_size(params: tuple[str, ...]) -> int:
    """The argument buffer's size cuLaunchKernel takes: where the last parameter ends, without the tail
    padding a struct of them would have (a size with it is refused: llvm/llvm-project#172249)."""
    if not params:
        return 0
    struct = _struct(params)
    return getattr(struct, f"a{len(params) - 1}").offset + ctypes.sizeof(struct._fields_[-1][1])


def unpack(params: tuple[str, ...], data: bytes) -> list[Any]:
    """The argument values a kernel with these parameter types reads from `data`."""
    struct = _struct(params)
    assert len(data) == params_size(params), (params, len(data))
    args = struct.from_buffer_copy(data.ljust(ctypes.sizeof(struct), b"\0"))
    return [getattr(args, f"a{i}") or 0 for i in range(len(params))]


# --- signatures ------------------------------------------------------------------------------------

_RANGES = {"int": (-2**31, 2**31), "unsigned int": (0, 2**32), "intptr_t": (-2**63, 2**63), "size_t": (0, 2**64),
           "unsigned long": (0, 2**64)}


def parse_signature(line: str) -> tuple[str, list[tuple[str, str, str | None]]]:
    """'Module.load(self, bytes cubin)' -> ('Module.load', [('cubin', 'bytes', None)]): the name and
    (name, C type or '' for an object, default text) of each parameter, `self` left out."""
    m = re.fullmatch(r"([\w.]+)\((.*)\)(?: -> .*)?", line.strip())
    assert m, line
    params = []
    for p in filter(None, (p.strip() for p in m.group(2).split(","))):
        decl, _, default = p.partition("=")
        words = decl.split()
        ctype = " ".join(words[:-1])
        params.append((words[-1], "" if ctype == "object" else ctype, default or None))
    return m.group(1), [p for p in params if p[0] != "self"]


def _check(where: str, name: str, ctype: str, value: Any) -> None:
    if ctype in _RANGES:
        v = operator.index(value)  # TypeError for a float or an object, as Cython raises
        lo, hi = _RANGES[ctype]
        if not lo <= v < hi:
            raise OverflowError(f"{where}: {name}={v} does not fit {ctype}")
    elif ctype in ("bytes", "str", "tuple") and value is not None and type(value) is not \
            {"bytes": bytes, "str": str, "tuple": tuple}[ctype]:
        raise TypeError(f"{where}: argument {name!r} has incorrect type (expected {ctype}, got {type(value).__name__})")


def api(line: str):
    """Give a stand-in the real function's signature line, and check each call against it."""
    qual, params = parse_signature(line)

    def wrap(fn):
        code = fn.__code__
        names = list(code.co_varnames[:code.co_argcount])
        method = bool(names) and names[0] == "self"
        names = names[1:] if method else names
        assert names == [p[0] for p in params], (line, names)

        def call(*args, **kwargs):
            values = list(args[1:] if method else args)
            if len(values) + len(kwargs) > len(params) or any(k not in names for k in kwargs):
                raise TypeError(f"{qual}() takes {len(params)} arguments ({len(values) + len(kwargs)} given)")
            bound = dict(zip(names, values)) | kwargs
            for name, ctype, default in params:
                if name not in bound and default is None:
                    raise TypeError(f"{qual}() missing argument {name!r}")
                if name in bound:
                    _check(qual, name, ctype, bound[name])
            return fn(*args, **kwargs)

        call.signature = line
        call.__name__ = fn.__name__
        return call

    return wrap


class Stub:
    """A stand-in class (its methods' first argument is `self`)."""


class FakeError(RuntimeError):
    pass


# --- the device ------------------------------------------------------------------------------------

class EmuDevice:
    """Device memory, kernels and one in-order queue on the host, under both stand-ins."""

    def __init__(self, arch: str, smem_per_block: int, smem_optin: int, end: int):
        self.arch, self.smem_per_block, self.smem_optin, self.end = arch, smem_per_block, smem_optin, end
        self.memory: dict[int, np.ndarray] = {}  # device allocations by address
        self.starts: list[int] | None = None  # their addresses, sorted
        self.functions: dict[int, str] = {}  # handle -> kernel name
        self.max_dynamic: dict[str, int] = {}  # kernels that opted in: their dynamic shared memory limit
        self.capture: list | None = None
        self.launches = self.pinned_allocs = 0

    def program(self, body: PlanBody, header: PlanHeader) -> None:
        """What the binary the driver loads holds: the plan's kernels, built for the emulator."""
        dev = header.device
        kernels = {name: (tuple(k.params), k.block) for name, k in body.kernels.items()}
        self.lib = EmuLibrary.from_plan(body.gpu.source, kernels, dev.wave, mode_for(dev.int8_matrix))
        self.binary = body.gpu.binary
        self.static = {n: m["shared_bytes"] for n, m in body.gpu.manifests.items()}

    def program_kernels(self, kernels: list, wave: int = 32, mode: str = "plain") -> None:
        """The same for codegen Kernels, whatever binary is loaded (tests/cuda_runner.py builds its own)."""
        self.lib, self.binary, self.static = EmuLibrary.from_kernels(kernels, wave, mode), None, {}

    # memory
    def malloc(self, nbytes: int) -> int:
        if self.capture is not None:
            raise FakeError("an allocation during stream capture")
        mem = np.full(max(nbytes, 1), 0xAB, np.uint8)  # not zeroed: the driver's alloc() must clear it
        self.memory[mem.ctypes.data], self.starts = mem, None
        return mem.ctypes.data

    def free(self, ptr: int) -> None:
        del self.memory[ptr]
        self.starts = None

    def on_device(self, ptr: int, nbytes: int) -> bool:
        if self.starts is None:
            self.starts = sorted(self.memory)
        i = bisect.bisect_right(self.starts, ptr) - 1
        return i >= 0 and ptr + nbytes <= self.starts[i] + self.memory[self.starts[i]].nbytes

    def need_device(self, what: str, ptr: int, nbytes: int) -> None:
        if not self.on_device(ptr, nbytes):
            raise FakeError(f"{what}: {nbytes} bytes at {ptr:#x} are not in a live device allocation")

    def pinned(self, nbytes: int) -> np.ndarray:
        if self.capture is not None:
            raise FakeError("a pinned allocation during stream capture")
        self.pinned_allocs += 1
        return np.zeros(nbytes, np.uint8)

    def sync(self, what: str) -> None:
        if self.capture is not None:
            raise FakeError(f"{what} during stream capture")

    # work on the stream
    def queue(self, op: str, *args) -> None:
        if self.capture is not None:
            self.capture.append((op, args))
        else:
            getattr(self, op)(*args)

    def memset(self, ptr: int, byte: int, nbytes: int) -> None:
        self.need_device("memset", ptr, nbytes)
        ctypes.memset(ptr, byte, nbytes)

    def memcpy(self, dst: int, src: int, nbytes: int, to_device: bool) -> None:
        dev, host = (dst, src) if to_device else (src, dst)
        self.need_device(f"the device side of a {'host-to-device' if to_device else 'device-to-host'} copy", dev,
                         nbytes)
        if self.on_device(host, 1):
            raise FakeError(f"the host side of a copy, {host:#x}, is device memory: source and destination swapped?")
        ctypes.memmove(dst, src, nbytes)

    def launch_extra(self, handle: int, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int,
                     kernel_params: int, extra: int) -> None:
        """cuLaunchKernel / hipModuleLaunchKernel with the arguments in `extra`."""
        assert kernel_params == 0, "the drivers pass the arguments through `extra`"
        words = (ctypes.c_void_p * 5).from_address(extra)
        if (words[0], words[2], words[4] or 0) != (BUFFER_POINTER, BUFFER_SIZE, self.end):
            raise FakeError(f"invalid `extra` array {list(words)}")
        data = ctypes.string_at(words[1], ctypes.c_size_t.from_address(words[3]).value)
        name = self.functions[handle]
        if block[1:] != (1, 1) or min(grid) < 1:
            raise FakeError(f"{name}: launch dimensions {grid} x {block}")
        if smem > self.max_dynamic.get(name, self.smem_per_block - self.static.get(name, 0)):
            raise FakeError(f"{name}: {smem} bytes of dynamic shared memory past its limit")
        self.queue("run", name, grid, block[0], smem, data)  # the bytes are copied: the capture keeps its own

    def run(self, name: str, grid: tuple[int, int, int], block: int, smem: int, data: bytes) -> None:
        self.run_values(name, grid, block, smem, unpack(self.lib.kernels[name][0], data))

    def run_values(self, name: str, grid: tuple[int, int, int], block: int, smem: int, values: list) -> None:
        params, built = self.lib.kernels[name]
        assert block == built, (name, block, built)
        for t, v in zip(params, values):
            if t.endswith("*"):
                self.need_device(f"{name}: a {t} argument", v, 1)
        array, keep = self.lib.arguments(name, values)
        self.lib.call(name, grid, smem, array)
        self.launches += 1

    def replay(self, nodes: list) -> None:
        for op, args in nodes:
            getattr(self, op)(*args)


def _address(obj: Any) -> int:
    """What hip-python's Pointer.fromPyobj makes of an argument: None, an int, a stand-in handle or
    pointer, or an object with the buffer protocol."""
    if obj is None:
        return 0
    if isinstance(obj, int):
        return obj
    if isinstance(obj, HipPointer):
        return int(obj)
    try:
        return np.frombuffer(obj, np.uint8).ctypes.data
    except TypeError:
        raise TypeError(f"unsupported input type: '{type(obj)}'") from None


class _Clock:
    def __init__(self, timing: bool):
        self.timing, self.t = timing, None

    def elapsed_ms(self, later: _Clock) -> float:
        if not (self.timing and later.timing) or self.t is None or later.t is None:
            raise FakeError("elapsed time between events that do not both time, or were not recorded")
        return (later.t - self.t) * 1e3


# --- CuPy ------------------------------------------------------------------------------------------

H200_PROPS = {"name": b"NVIDIA H200", "totalGlobalMem": 150754820096, "sharedMemPerBlock": 49152,
              "regsPerBlock": 65536, "warpSize": 32, "maxThreadsPerBlock": 1024, "major": 9, "minor": 0,
              "multiProcessorCount": 132, "l2CacheSize": 62914560, "sharedMemPerBlockOptin": 232448,
              "regsPerMultiprocessor": 65536, "memoryBusWidth": 6144, "memoryClockRate": 3201000, "clockRate": 1980000}


def fake_cupy(device: EmuDevice, props: dict[str, Any] | None = None) -> types.ModuleType:
    """The parts of CuPy (13.6, 14.x) the cuda driver, core/gpu_runtime.py and core/devices.py use,
    signature lines as CuPy 14.2's docstrings give them."""
    props = dict(H200_PROPS if props is None else props)

    class CUDARuntimeError(RuntimeError):
        @api("CUDARuntimeError.__init__(self, status)")
        def __init__(self, status):
            super().__init__(f"cuda error {status}")

    runtime = types.ModuleType("cupy.cuda.runtime")
    runtime.CUDARuntimeError = CUDARuntimeError
    runtime.memcpyHostToDevice, runtime.memcpyDeviceToHost = 1, 2

    @api("getDeviceCount() -> int")
    def getDeviceCount():
        return 1

    @api("getDeviceProperties(int device)")
    def getDeviceProperties(device):
        return dict(props)

    @api("memsetAsync(intptr_t ptr, int value, size_t size, intptr_t stream)")
    def memsetAsync(ptr, value, size, stream):
        device.queue("memset", ptr, value, size)

    @api("memcpyAsync(intptr_t dst, intptr_t src, size_t size, int kind, intptr_t stream)")
    def memcpyAsync(dst, src, size, kind, stream):
        if kind not in (1, 2):
            raise CUDARuntimeError(1)
        device.queue("memcpy", dst, src, size, kind == 1)

    for fn in (getDeviceCount, getDeviceProperties, memsetAsync, memcpyAsync):
        setattr(runtime, fn.__name__, fn)

    driver = types.ModuleType("cupy.cuda.driver")
    driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8

    @api("launchKernel(intptr_t f, unsigned int grid_dim_x, unsigned int grid_dim_y, unsigned int grid_dim_z, "
         "unsigned int block_dim_x, unsigned int block_dim_y, unsigned int block_dim_z, unsigned int shared_mem_bytes, "
         "intptr_t stream, intptr_t kernel_params, intptr_t extra)")
    def launchKernel(f, grid_dim_x, grid_dim_y, grid_dim_z, block_dim_x, block_dim_y, block_dim_z,
                     shared_mem_bytes, stream, kernel_params, extra):
        device.launch_extra(f, (grid_dim_x, grid_dim_y, grid_dim_z), (block_dim_x, block_dim_y, block_dim_z),
                            shared_mem_bytes, kernel_params, extra)

    @api("funcSetAttribute(intptr_t f, int attribute, int value)")
    def funcSetAttribute(f, attribute, value):
        name = device.functions[f]
        if attribute != 8 or device.static.get(name, 0) + value > device.smem_optin:
            raise CUDARuntimeError(1)  # CUDA_ERROR_INVALID_VALUE
        device.max_dynamic[name] = value

    driver.launchKernel, driver.funcSetAttribute = launchKernel, funcSetAttribute

    class Stream(Stub):
        @api("Stream.__init__(self, null=False, non_blocking=False, ptds=False)")  # 14 adds priority=None
        def __init__(self, null=False, non_blocking=False, ptds=False):
            assert non_blocking, "the drivers queue on a non-blocking stream"
            self.ptr = id(self)

        @api("_BaseStream.begin_capture(self, mode=None)")
        def begin_capture(self, mode=None):
            assert device.capture is None
            device.capture = []

        @api("_BaseStream.end_capture(self)")
        def end_capture(self):
            nodes, device.capture = device.capture, None
            return Graph(nodes)

        @api("_BaseStream.synchronize(self)")
        def synchronize(self):
            device.sync("a stream synchronization")

    class Graph(Stub):
        def __init__(self, nodes):
            self.nodes = nodes

        @api("Graph.launch(self, stream=None)")
        def launch(self, stream=None):
            device.replay(self.nodes)

    class Event(Stub):
        @api("Event.__init__(self, block=False, disable_timing=False, interprocess=False)")
        def __init__(self, block=False, disable_timing=False, interprocess=False):
            self.clock = _Clock(not disable_timing)
            self.ptr = id(self)

        @api("Event.record(self, stream=None)")
        def record(self, stream=None):
            assert stream is not None, "recorded on the driver's stream, not the current one"
            device.sync("an event record")
            self.clock.t = time.perf_counter()

        @api("Event.synchronize(self)")
        def synchronize(self):
            device.sync("an event synchronization")

        @property
        def done(self):
            return True

    @api("get_elapsed_time(start_event, end_event)")
    def get_elapsed_time(start_event, end_event):
        return start_event.clock.elapsed_ms(end_event.clock)

    class Device(Stub):
        @api("Device(device=None)")
        def __init__(self, device=None):
            pass

        @property
        def compute_capability(self):
            return device.arch.removeprefix("sm_")

        @api("Device.synchronize(self)")
        def synchronize(self):
            device.sync("a device synchronization")

    function = types.ModuleType("cupy.cuda.function")

    class Module(Stub):
        @api("Module()")
        def __init__(self):
            self.ptr = 0

        @api("Module.load(self, bytes cubin)")
        def load(self, cubin):
            assert device.binary is None or cubin == device.binary
            self.ptr = id(self)

        @api("Module.get_function(self, name)")
        def get_function(self, name):
            return Function(self, name.decode() if isinstance(name, bytes) else name)

    class Function(Stub):
        @api("Function(Module module, str funcname)")
        def __init__(self, module, funcname):
            if funcname not in device.lib.kernels:
                raise FakeError(f"CUDA_ERROR_NOT_FOUND: {funcname}")
            self.module, self.ptr = module, id(self)
            device.functions[self.ptr] = funcname

        # cupy/cuda/function.pyx (its docstring has no signature): CuPy packs each argument by its own
        # type, a cupy.ndarray as its pointer and a NumPy scalar at its dtype's size
        @api("Function.__call__(self, tuple grid, tuple block, args, size_t shared_mem=0, stream=None, "
             "enable_cooperative_groups=False)")
        def __call__(self, grid, block, args, shared_mem=0, stream=None, enable_cooperative_groups=False):
            name = device.functions[self.ptr]
            params = device.lib.kernels[name][0]
            if len(args) != len(params):
                raise FakeError(f"{name}: {len(params)} parameters, {len(args)} arguments")
            scalars = {"int": np.int32, "unsigned": np.uint32, "float": np.float32}
            values = []
            for t, a in zip(params, args):
                if t in scalars:
                    if type(a) is not scalars[t]:  # a Python int would go as 8 bytes, not an int's 4
                        raise FakeError(f"{name}: a {t} parameter given a {type(a).__name__}")
                    values.append(a.item())
                else:
                    values.append(a.ptr if isinstance(a, ndarray) else a)
            device.run_values(name, (grid + (1, 1))[:3], block[0], shared_mem, values)

    function.Module, function.Function = Module, Function

    class ndarray(Stub):
        def __init__(self, host):
            self.host = np.ascontiguousarray(host)
            self.ptr = device.malloc(self.host.nbytes)
            device.memcpy(self.ptr, self.host.ctypes.data, self.host.nbytes, True)

        @api("_ndarray_base.get(self, stream=None, order='C', out=None, blocking=True)")
        def get(self, stream=None, order="C", out=None, blocking=True):
            got = np.empty_like(self.host)
            device.memcpy(got.ctypes.data, self.ptr, got.nbytes, False)
            return got

        def __del__(self):
            device.free(self.ptr)

    @api("asarray(a, dtype=None, order=None)")
    def asarray(a, dtype=None, order=None):
        assert dtype is None and isinstance(a, np.ndarray)
        return ndarray(a)

    memory = types.ModuleType("cupy.cuda.memory")

    class Memory(Stub):
        @api("Memory(size_t size)")
        def __init__(self, size):
            self.size, self.ptr = size, device.malloc(size) if size else 0

        def __del__(self):
            if self.ptr:
                device.free(self.ptr)

    memory.Memory = Memory

    @api("alloc_pinned_memory(size_t size) -> PinnedMemoryPointer")
    def alloc_pinned_memory(size):
        unit = 512  # CuPy's pinned memory pool rounds up to a power of two of 512-byte units
        return device.pinned(1 << max(-(-size // unit) * unit - 1, 0).bit_length())  # buffer protocol, as CuPy's

    graph = types.ModuleType("cupy.cuda.graph")
    graph.Graph = Graph
    cuda = types.ModuleType("cupy.cuda")
    for name, value in dict(runtime=runtime, driver=driver, function=function, memory=memory, graph=graph,
                            Stream=Stream, Event=Event, Device=Device, get_elapsed_time=get_elapsed_time,
                            alloc_pinned_memory=alloc_pinned_memory).items():
        setattr(cuda, name, value)
    cupy = types.ModuleType("cupy")
    cupy.cuda, cupy.asarray, cupy.ndarray = cuda, asarray, ndarray
    return cupy


class EmuCudaDriver(CudaDriver):
    """The cuda driver, unchanged, on fake_cupy()."""

    def __init__(self, arch: str = "sm_90", smem_per_block: int = 48 << 10, smem_optin: int = 227 << 10):
        self.device = EmuDevice(arch, smem_per_block, smem_optin, CUDA_END)
        with mock.patch.dict(sys.modules, {"cupy": fake_cupy(self.device)}):  # core/gpu_runtime imports it
            super().__init__()

    def load(self, body: dict[str, Any], header: dict[str, Any]) -> None:
        self.device.program(body, header)
        super().load(body, header)


# --- hip-python ------------------------------------------------------------------------------------

class HipPointer:
    """What hipMalloc / hipHostMalloc return (rocm.bindings.util.types.Pointer): int() is the address."""

    def __init__(self, address: int):
        self.address = address

    def __int__(self) -> int:
        return self.address


GFX1100_PROPS = {"name": b"Radeon RX 7900 XTX", "gcnArchName": b"gfx1100:sramecc-:xnack-", "multiProcessorCount": 48,
                 "warpSize": 32, "sharedMemPerBlock": 65536, "regsPerMultiprocessor": 131072,
                 "maxThreadsPerBlock": 1024, "totalGlobalMem": 25753026560}


def fake_hip(device: EmuDevice, props: dict[str, Any] | None = None, returned_props: bool = False) -> types.ModuleType:
    """The parts of hip-python's `hip` module the hip driver, core/gpu_runtime.py and core/devices.py
    use, signature lines as its docstrings give them: every call returns a tuple, its hipError_t first.
    returned_props: hipGetDeviceProperties(deviceId) -> (err, prop), as rocm.bindings (hip-python 10)
    has it; else hipGetDeviceProperties(prop, deviceId) -> (err,), filling `prop`, as hip-python 6.x/7.x."""
    props = dict(GFX1100_PROPS if props is None else props)
    hip = types.ModuleType("hip.hip")

    class hipError_t(enum.IntEnum):
        hipSuccess = 0
        hipErrorInvalidValue = 1
        hipErrorNotReady = 600

    class hipMemcpyKind(enum.IntEnum):
        hipMemcpyHostToHost = 0
        hipMemcpyHostToDevice = 1
        hipMemcpyDeviceToHost = 2

    class hipDeviceProp_t(Stub):
        def __init__(self):
            for k, v in props.items():
                setattr(self, k, type(v)())  # zeroed until hipGetDeviceProperties fills it

    class Handle(Stub):  # ihipStream_t, ihipEvent_t, ihipModule_t, ihipModuleSymbol_t
        def __init__(self, **kw):
            self.__dict__.update(kw)

    ok = hipError_t.hipSuccess

    def handle(obj: Any, kind: str) -> Any:
        if not (obj is None or isinstance(obj, Handle) and obj.kind == kind):
            raise TypeError(f"expected a {kind} handle, got {type(obj).__name__}")
        return obj

    def kind_of(kind: Any) -> bool:
        if not isinstance(kind, hipMemcpyKind):
            raise TypeError("argument 'kind' must be of type '_hipMemcpyKind__Base'")
        if kind == hipMemcpyKind.hipMemcpyHostToHost:
            raise FakeError("a host-to-host copy")
        return kind == hipMemcpyKind.hipMemcpyHostToDevice

    @api("hipGetDeviceCount()")
    def hipGetDeviceCount():
        return ok, 1

    if returned_props:
        @api("hipGetDeviceProperties(int deviceId)")
        def hipGetDeviceProperties(deviceId):
            prop = hipDeviceProp_t()
            for k, v in props.items():  # rocm.bindings decodes the char arrays (hip-python 6.x/7.x: bytes)
                setattr(prop, k, v.decode() if isinstance(v, bytes) else v)
            return ok, prop
    else:
        @api("hipGetDeviceProperties(prop, int deviceId)")
        def hipGetDeviceProperties(prop, deviceId):
            for k, v in props.items():
                setattr(prop, k, v)
            return (ok,)

    @api("hipGetErrorString(hipError)")
    def hipGetErrorString(hipError):
        if not isinstance(hipError, hipError_t):
            raise TypeError("argument 'hipError' must be of type '_hipError_t__Base'")
        return ok, hipError.name.encode()

    @api("hipStreamCreateWithFlags(unsigned int flags)")
    def hipStreamCreateWithFlags(flags):
        assert flags == hip.hipStreamNonBlocking
        return ok, Handle(kind="stream")

    @api("hipStreamSynchronize(stream)")
    def hipStreamSynchronize(stream):
        handle(stream, "stream")
        return (ok,)

    @api("hipMalloc(size_t size)")
    def hipMalloc(size):
        return ok, HipPointer(device.malloc(size))

    @api("hipFree(ptr)")
    def hipFree(ptr):
        device.free(_address(ptr))
        return (ok,)

    @api("hipHostMalloc(size_t size, unsigned int flags)")
    def hipHostMalloc(size, flags):
        mem = device.pinned(size)
        keep.append(mem)  # never freed: the driver keeps its pinned buffers for the process's life
        return ok, HipPointer(mem.ctypes.data)

    keep: list[np.ndarray] = []

    @api("hipMemsetAsync(dst, int value, size_t sizeBytes, stream)")
    def hipMemsetAsync(dst, value, sizeBytes, stream):
        handle(stream, "stream")
        device.queue("memset", _address(dst), value, sizeBytes)
        return (ok,)

    @api("hipMemcpy(dst, src, size_t sizeBytes, kind)")
    def hipMemcpy(dst, src, sizeBytes, kind):
        device.sync("a synchronous copy")
        device.memcpy(_address(dst), _address(src), sizeBytes, kind_of(kind))
        return (ok,)

    @api("hipMemcpyAsync(dst, src, size_t sizeBytes, kind, stream)")
    def hipMemcpyAsync(dst, src, sizeBytes, kind, stream):
        handle(stream, "stream")
        device.queue("memcpy", _address(dst), _address(src), sizeBytes, kind_of(kind))
        return (ok,)

    @api("hipEventCreateWithFlags(unsigned int flags)")
    def hipEventCreateWithFlags(flags):
        return ok, Handle(kind="event", clock=_Clock(not flags & hip.hipEventDisableTiming))

    @api("hipEventRecord(event, stream)")
    def hipEventRecord(event, stream):
        handle(event, "event").clock.t = time.perf_counter()
        handle(stream, "stream")
        return (ok,)

    @api("hipEventQuery(event)")
    def hipEventQuery(event):
        handle(event, "event")
        return (ok,)

    @api("hipEventSynchronize(event)")
    def hipEventSynchronize(event):
        handle(event, "event")
        return (ok,)

    @api("hipEventElapsedTime(start, stop)")
    def hipEventElapsedTime(start, stop):
        return ok, handle(start, "event").clock.elapsed_ms(handle(stop, "event").clock)

    @api("hipEventDestroy(event)")
    def hipEventDestroy(event):
        handle(event, "event")
        return (ok,)

    @api("hipModuleLoadData(image)")
    def hipModuleLoadData(image):
        assert bytes(np.frombuffer(image, np.uint8)) == device.binary
        return ok, Handle(kind="module")

    @api("hipModuleGetFunction(module, kname)")
    def hipModuleGetFunction(module, kname):
        handle(module, "module")
        name = kname.decode() if isinstance(kname, bytes) else kname
        if name not in device.lib.kernels:
            return hipError_t.hipErrorInvalidValue, None
        f = Handle(kind="function")
        device.functions[id(f)] = name
        return ok, f

    @api("hipModuleLaunchKernel(f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, "
         "unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, "
         "stream, kernelParams, extra)")
    def hipModuleLaunchKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                              stream, kernelParams, extra):
        handle(stream, "stream")
        device.launch_extra(id(handle(f, "function")), (gridDimX, gridDimY, gridDimZ), (blockDimX, blockDimY, blockDimZ),
                            sharedMemBytes, _address(kernelParams), _address(extra))
        return (ok,)

    for name, value in dict(locals()).items():
        if name.startswith("hip") and (callable(value) or isinstance(value, type)):
            setattr(hip, name, value)
    hip.hipStreamNonBlocking, hip.hipEventDisableTiming, hip.hipHostMallocDefault = 1, 2, 0
    hip.HIP_LAUNCH_PARAM_BUFFER_POINTER, hip.HIP_LAUNCH_PARAM_BUFFER_SIZE, hip.HIP_LAUNCH_PARAM_END = 1, 2, 3
    package = types.ModuleType("hip")
    package.hip = hip
    return package


class EmuHipDriver(HipDriver):
    """The hip driver, unchanged, on fake_hip()."""

    def __init__(self, arch: str = "gfx1100", returned_props: bool = False):
        self.device = EmuDevice(arch, 65536, 65536, HIP_END)
        props = GFX1100_PROPS | {"gcnArchName": f"{arch}:sramecc-:xnack-".encode()}
        with mock.patch.dict(sys.modules, {"hip": fake_hip(self.device, props, returned_props)}):
            super().__init__()

    def load(self, body: dict[str, Any], header: dict[str, Any]) -> None:
        self.device.program(body, header)
        super().load(body, header)
