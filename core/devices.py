"""What the planner knows about a device: DeviceFacts from the local machine (the CPU, or GPU 0 through
CuPy or hip-python), or from a built-in table for offline targets (compile for a GPU that is not here).

The device key names the backend and the geometry that changes a planning answer (architecture,
multiprocessors, wave width, shared memory); plans are valid only for their key, tune entries only for
their tune key (the same on GPUs; on the CPU it adds cores and SIMD level).
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass

from llmplan.core import gpu_runtime

from .errors import InputError


@dataclass(frozen=True)
class DeviceFacts:
    name: str
    backend: str  # "cpu", "cuda" or "hip"
    arch: str  # sm_89, gfx1151, or the CPU's machine type
    multiprocessors: int  # SMs, CUs, or CPU cores
    wave: int  # threads per warp / wavefront (1 on the CPU)
    smem_per_block: int  # bytes a block may use without opting in
    smem_per_block_optin: int  # bytes with cudaFuncAttributeMaxDynamicSharedMemorySize (same on AMD)
    regs_per_multiprocessor: int  # 32-bit registers
    max_threads_per_block: int
    bandwidth_gbs: float  # peak memory bandwidth, GB/s
    memory_gib: float
    int8_matrix: str  # mma.sync.s8, wmma_iu8, mfma_i8, or none
    simd: str = ""  # the CPU's widest SIMD level NumPy dispatches to (avx512_icl, avx2, asimd, ...)

    @property
    def key(self) -> str:
        """Backend + the geometry that changes the planner's answers: the key a plan is valid for."""
        if self.backend == "cpu":
            return f"cpu:{self.arch}"
        return (f"{self.backend}:{self.arch}:sm{self.multiprocessors}:w{self.wave}"
                f":smem{self.smem_per_block_optin // 1024}k")

    @property
    def tune_key(self) -> str:
        """The key of tune-store entries: what changes a measured answer. On the CPU that adds the core
        count and SIMD level to `key`, which stays coarse so a CPU plan runs on any CPU of its machine
        type (its tuned strategies are all correct anywhere, only perhaps slower)."""
        if self.backend == "cpu":
            return f"{self.key}:c{self.multiprocessors}:{self.simd or 'baseline'}"
        return self.key

    def to_dict(self) -> dict:
        return asdict(self) | {"key": self.key, "tune_key": self.tune_key}


_K = 1024
# Published figures for each target (vendor specifications); bandwidth is the peak the roofline uses.
OFFLINE_TARGETS: dict[str, DeviceFacts] = {
    "sm_89": DeviceFacts("NVIDIA GeForce RTX 4090", "cuda", "sm_89", 128, 32, 48 * _K, 99 * _K, 65536, 1024,
                         1008.0, 24.0, "mma.sync.s8"),
    "sm_90": DeviceFacts("NVIDIA H100 SXM5", "cuda", "sm_90", 132, 32, 48 * _K, 227 * _K, 65536, 1024,
                         3350.0, 80.0, "mma.sync.s8"),
    "sm_90-h200": DeviceFacts("NVIDIA H200 SXM", "cuda", "sm_90", 132, 32, 48 * _K, 227 * _K, 65536, 1024,
                              4800.0, 141.0, "mma.sync.s8"),
    "gfx1100": DeviceFacts("AMD Radeon RX 7900 XTX", "hip", "gfx1100", 96, 32, 64 * _K, 64 * _K, 131072, 1024,
                           960.0, 24.0, "wmma_iu8"),
    "gfx1151": DeviceFacts("AMD Radeon 8060S (Strix Halo)", "hip", "gfx1151", 40, 32, 64 * _K, 64 * _K, 131072, 1024,
                           256.0, 96.0, "wmma_iu8"),
    "gfx942": DeviceFacts("AMD Instinct MI300X", "hip", "gfx942", 304, 64, 64 * _K, 64 * _K, 131072, 1024,
                          5300.0, 192.0, "mfma_i8"),
}


# NumPy's CPU dispatch features, widest first within each architecture: the first one present names
# the SIMD level (x86-64, Arm, POWER, IBM Z).
SIMD_LEVELS = ("AVX512_SPR", "AVX512_ICL", "AVX512_CNL", "AVX512_CLX", "AVX512_SKX", "AVX512F", "AVX2", "AVX",
               "SSE42", "SSE3", "SSE2", "SVE", "ASIMDHP", "ASIMD", "NEON", "VSX4", "VSX3", "VSX2", "VSX", "VXE2",
               "VXE", "VX")


def simd_level() -> str:
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:  # NumPy < 2
        from numpy.core._multiarray_umath import __cpu_features__ as features
    return next((f.lower() for f in SIMD_LEVELS if features.get(f)), "baseline")


def local_cpu() -> DeviceFacts:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 if hasattr(os, "sysconf") else 0.0
    # A CPU plan's key holds only the machine type: the cpu driver checks the plan's SIMD path against the
    # CPU it loads on (a NumPy-fallback plan runs on any); tune entries add cores and SIMD level (tune_key).
    return DeviceFacts("CPU " + (platform.processor() or platform.machine()), "cpu", platform.machine(), cores,
                       1, 0, 0, 0, 1, 0.0, round(mem, 1), "none", simd_level())


def _matrix(backend: str, arch: str) -> str:
    """The int8 matrix instruction family of an architecture (the offline table's)."""
    for t in OFFLINE_TARGETS.values():
        if (t.backend, t.arch) == (backend, arch):
            return t.int8_matrix
    known = sorted({t.arch for t in OFFLINE_TARGETS.values() if t.backend == backend})
    raise InputError(f"the local {backend} device is {arch}, which llmplan has no kernels for ({', '.join(known)})")


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _peak_gbs(props: dict) -> float:
    """Peak bandwidth from the memory clock (kHz; HBM moves data on both edges) and bus width (bits)."""
    return round(2 * props.get("memoryClockRate", 0) * 1e3 * props.get("memoryBusWidth", 0) / 8 / 1e9, 1)


def cuda_facts(props: dict) -> DeviceFacts:
    """DeviceFacts from a CUDA device's properties, keyed as cupy.cuda.runtime.getDeviceProperties
    gives them (built for CUDA 13, CuPy 13.6 and 14 read clockRate and memoryClockRate, which that
    struct dropped, from the device attributes: cupy_backends/cuda/api/runtime.pyx)."""
    arch = f"sm_{props['major']}{props['minor']}"
    matrix = _matrix("cuda", arch)
    return DeviceFacts(_text(props["name"]), "cuda", arch, props["multiProcessorCount"], props["warpSize"],
                       props["sharedMemPerBlock"], props["sharedMemPerBlockOptin"], props["regsPerMultiprocessor"],
                       props["maxThreadsPerBlock"], _peak_gbs(props), round(props["totalGlobalMem"] / 2**30, 1),
                       matrix)


def hip_facts(props: dict) -> DeviceFacts:
    """DeviceFacts from a HIP device's properties (hipDeviceProp_t's fields by name). AMD has no
    shared-memory opt-in: a block may use all of sharedMemPerBlock. The peak bandwidth is left unknown
    (0): the memory clock HIP reports gives no data rate that holds across GDDR6 and HBM3 parts (the
    benchmark measures it)."""
    arch = _text(props["gcnArchName"]).split(":")[0]  # gfx1100:sramecc+:xnack-
    matrix = _matrix("hip", arch)
    return DeviceFacts(_text(props["name"]), "hip", arch, props["multiProcessorCount"], props["warpSize"],
                       props["sharedMemPerBlock"], props["sharedMemPerBlock"], props["regsPerMultiprocessor"],
                       props["maxThreadsPerBlock"], 0.0, round(props["totalGlobalMem"] / 2**30, 1), matrix)


HIP_PROPERTIES = ("name", "gcnArchName", "multiProcessorCount", "warpSize", "sharedMemPerBlock",
                  "regsPerMultiprocessor", "maxThreadsPerBlock", "totalGlobalMem")


def local_gpu(backend: str) -> DeviceFacts:
    """The facts of GPU 0, read through its runtime library."""
    if backend == "cuda":
        return cuda_facts(gpu_runtime.cupy().cuda.runtime.getDeviceProperties(0))
    hip = gpu_runtime.hip()
    err, p = gpu_runtime.hip_properties(hip)
    if err != hip.hipError_t.hipSuccess:
        raise InputError(f"--device hip: cannot read the device's properties ({err})")
    return hip_facts({k: getattr(p, k) for k in HIP_PROPERTIES})


def resolve_device(name: str) -> DeviceFacts:
    """'cpu', an offline target such as 'sm_90', or the local GPU ('cuda', 'hip')."""
    if name == "cpu":
        return local_cpu()
    if name in OFFLINE_TARGETS:
        return OFFLINE_TARGETS[name]
    if name in ("cuda", "hip"):
        return local_gpu(name)
    raise InputError(f"unknown device {name!r} (cpu, cuda, hip, or an offline target: {', '.join(OFFLINE_TARGETS)})")
