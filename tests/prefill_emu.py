"""Running the prefill kernels (gemm.cu, flash_attention.cu) on the CPU with emulated matrix fragments.

The kernel sources are compiled for the host against tests/prefill_emu.h instead of vendor.h: one OS
thread per GPU thread, blocks one after another, and mma.sync / RDNA3 WMMA fragments emulated with the
register layouts codegen/kernels/mma.cuh documents (modes "mma", "wmma"; "plain" has neither and runs
the dot-product and row members). Called through ctypes with NumPy arrays, so the tests check these
kernels' indexing, fragment use, scaling and epilogues against the CPU twins without a GPU. (The
catalog-wide emulator tests/kernel_emu.py has no matrix fragments; this one adds them.)
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from llmplan.codegen.build import KERNEL_DIR
from llmplan.codegen.kernel import Kernel, Launch

HEADER = Path(__file__).parent / "prefill_emu.h"
MODES = {"mma": ["-DLP_EMU_MMA"], "wmma": ["-DLP_EMU_WMMA"], "plain": []}
_SCALARS = {"int": ctypes.c_int, "float": ctypes.c_float}


def _inline(path: Path, seen: set[str], out: list[str]) -> None:
    if path.name in seen:
        return
    seen.add(path.name)
    for line in path.read_text().splitlines():
        m = re.match(r'\s*#include\s+"([^"]+)"', line)
        if m:
            name = m.group(1)
            _inline(HEADER if name == "vendor.h" else KERNEL_DIR / name, seen, out)
        elif line.strip() != "#pragma once":
            out.append(line)


def _params(k: Kernel) -> list[str]:
    """The C types of the entry point's parameters."""
    m = re.match(r"LP_KERNEL void (?:__launch_bounds__\(\d+\) )?(\w+)\((.*?)\)\s*\{", k.entry, re.S)
    assert m and m.group(1) == k.name, k.entry
    return [re.sub(r"\s*\w+$", "", p.strip()) for p in m.group(2).split(",") if p.strip()]


def render(kernels: list[Kernel]) -> str:
    seen: set[str] = set()
    out: list[str] = []
    _inline(HEADER, seen, out)
    seen.add("vendor.h")
    for src in dict.fromkeys(k.source for k in kernels):
        _inline(KERNEL_DIR / src, seen, out)
    for k in sorted({k.name: k for k in kernels}.values(), key=lambda k: k.name):
        out.append(k.entry)
        call = ", ".join(f"*({t}*)a[{i}]" if t in _SCALARS else f"({t})a[{i}]" for i, t in enumerate(_params(k)))
        out.append(f'extern "C" void lp_emu_call_{k.name}(int gx, int gy, int gz, void** a) '
                   f"{{ lp_emu::launch(gx, gy, gz, {k.block}, [=] {{ {k.name}({call}); }}); }}")
    return "\n".join(out) + "\n"


def _workdir() -> Path:
    root = os.environ.get("LLMPLAN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "llmplan")
    path = Path(root) / "prefill_emu"
    try:
        path.mkdir(parents=True, exist_ok=True)
        return path
    except OSError:
        return Path(tempfile.mkdtemp(prefix="llmplan-prefill-emu-"))


class Emulator:
    """The kernels built for the host in one mode; run(launch, bind, dims) runs a codegen Launch."""

    def __init__(self, kernels: list[Kernel], mode: str):
        self.kernels = {k.name: k for k in kernels}
        source = render(list(self.kernels.values()))
        flags = ["-std=c++20", "-O1", "-fPIC", "-shared", "-pthread", "-w", *MODES[mode]]
        key = hashlib.sha256("\0".join([source, *flags]).encode()).hexdigest()[:24]
        work = _workdir()
        lib = work / f"{mode}_{key}.so"
        if not lib.exists():
            cpp = work / f"{mode}_{key}.cpp"
            cpp.write_text(source)
            tmp = work / f"{mode}_{key}.{os.getpid()}.tmp"
            r = subprocess.run(["clang++-19", *flags, "-o", str(tmp), str(cpp)], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"host build ({mode}) failed:\n{r.stderr[:4000]}")
            os.replace(tmp, lib)
        self.lib = ctypes.CDLL(str(lib))

    def run(self, launch: Launch, bind: Callable[[dict[str, Any]], np.ndarray], dims: dict[str, int]) -> None:
        k = launch.kernel
        types = _params(k)
        assert len(types) == len(launch.args), f"{k.name}: {len(types)} parameters, {len(launch.args)} arguments"
        keep, ptrs = [], []
        for t, arg in zip(types, launch.args):
            if t in _SCALARS:
                (v,) = arg.values()
                c = _SCALARS[t](dims[v] if isinstance(v, str) else v)
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
        getattr(self.lib, f"lp_emu_call_{k.name}")(grid[0], grid[1], grid[2], (ctypes.c_void_p * len(ptrs))(*ptrs))


def have_host_compiler() -> bool:
    from shutil import which
    return which("clang++-19") is not None


# --- inputs ---------------------------------------------------------------------------------------

def random_weight(rng: np.random.Generator, fmt: str, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(the planar relayout's bytes, the exactly dequantized float32 [n, k]) of a random weight: random
    bytes in every quantized field (every bit pattern of the formats' packing is exercised), moderate
    f16 scales of either sign; F16 standard normal values."""
    from llmplan.models.formats import FORMATS, dequantize, planes

    f = FORMATS[fmt.upper()]
    nb = n * k // f.block
    if f.name == "F16":
        blocks = rng.standard_normal(nb).astype(np.float16).view(f.layout)
    else:
        blocks = rng.integers(0, 256, nb * f.block_bytes, dtype=np.uint8).view(f.layout).copy()
        for name in f.layout.names:
            if f.layout[name].base == np.float16:
                blocks[name] = (rng.uniform(0.002, 0.05, nb) * rng.choice([-1.0, 1.0], nb)).astype(np.float16)
    ps, total = planes(f, n, k)
    raw = np.zeros(total, np.uint8)
    for p in ps:
        raw[p.offset:p.offset + p.nbytes] = np.ascontiguousarray(blocks[p.name]).view(np.uint8).reshape(-1)
    return raw, dequantize(blocks.view(np.uint8).reshape(-1), f, (n, k))


def random_activation(rng: np.random.Generator, fmt: str, rows: int, k: int) -> tuple[np.ndarray, Any]:
    """(the buffer the kernel reads, what the CPU twin reads) of random activations [rows, k]: f16 rows,
    or real values packed by the CPU twins' own packing (models/numerics.pack_blocks) into the arena's
    field planes (a cpu_kernels.Packed view of the same bytes)."""
    from llmplan.models import numerics as num
    from llmplan.models.formats import ACTIVATION_FORMATS, planes
    from llmplan.runtime.cpu_kernels import Packed

    x = (rng.standard_normal((rows, k)) * rng.uniform(0.1, 3.0, (rows, 1))).astype(np.float32)
    if fmt == "f16":
        a = x.astype(np.float16)
        return a, a
    ps, total = planes(ACTIVATION_FORMATS[fmt.upper()], rows, k)
    raw = np.zeros(total, np.uint8)
    packed = Packed(fmt, {p.name: raw[p.offset:p.offset + p.nbytes].view(p.dtype).reshape(p.shape) for p in ps})
    blocks = num.pack_blocks(x, fmt)
    for name in blocks.dtype.names:
        packed[name][...] = blocks[name]
    return raw, packed


def nmse(got: np.ndarray, want: np.ndarray) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(((got - want) ** 2).sum() / (want ** 2).sum())
