"""Running llmplan's GPU kernels on the CPU (tests/kernel_emu.h), for tests on machines without a GPU.

emulate(kernels, wave) renders the kernels' sources as codegen/build.py does, with tests/kernel_emu.h in
place of codegen/kernels/vendor.h, compiles them with the host clang++-19 into a shared library (one
launcher per kernel) and returns an Emulator whose launch(launch, bind, dims) runs a codegen Launch
record: grid symbols and scalar symbols bound from `dims`, every other argument (buffers, weights,
step state, scratch) through bind(ref) -> NumPy array. Launch.smem must be 0: dynamic shared memory is
not emulated (static __shared__ variables are).

Also random inputs for kernel tests: quantized blocks with random bytes (moderate f16 scales), their
planar relayout (models/formats.planes), random packed activations, and the normalized MSE.

(This module was rewritten from its users' calls after the original was overwritten by mistake; see
the prefill-kernels report.)
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
from llmplan.models.formats import ACTIVATION_FORMATS, FORMATS, Format, dequantize, planes
from llmplan.runtime.cpu_kernels import Packed

HEADER = Path(__file__).parent / "kernel_emu.h"
_SCALARS = {"int": ctypes.c_int, "float": ctypes.c_float, "unsigned": ctypes.c_uint}


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


def _signature(k: Kernel) -> list[tuple[str, str]]:
    """(type, name) of the entry point's parameters."""
    m = re.match(r"LP_KERNEL void (?:__launch_bounds__\([\d, ]+\) )?(\w+)\((.*?)\)\s*\{", k.entry, re.S)
    assert m and m.group(1) == k.name, k.entry
    params = []
    for p in m.group(2).split(","):
        p = p.strip()
        if not p:
            continue
        name = re.search(r"(\w+)$", p).group(1)
        params.append((p[: -len(name)].strip(), name))
    return params


def render(kernels: list[Kernel]) -> str:
    seen: set[str] = set()
    out = ["// llmplan kernels for the CPU emulator (tests/kernel_emu.h)"]
    _inline(HEADER, seen, out)
    seen.add("vendor.h")
    for src in dict.fromkeys(k.source for k in kernels):
        _inline(KERNEL_DIR / src, seen, out)
    for k in sorted({k.name: k for k in kernels}.values(), key=lambda k: k.name):
        out.append(k.entry)
        params = _signature(k)
        call = ", ".join(f"*({t}*)a[{i}]" if t in _SCALARS else f"({t})a[{i}]" for i, (t, _) in enumerate(params))
        out.append(f'extern "C" const char* lp_emu_call_{k.name}(int gx, int gy, int gz, int smem, void** a) '
                   f"{{ return lp_emu_launch(gx, gy, gz, {k.block}, smem, [=] {{ {k.name}({call}); }}); }}")
    return "\n".join(out) + "\n"


def _workdir() -> Path:
    root = os.environ.get("LLMPLAN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "llmplan")
    path = Path(root) / "emu"
    try:
        path.mkdir(parents=True, exist_ok=True)
        return path
    except OSError:
        return Path(tempfile.mkdtemp(prefix="llmplan-emu-"))


class Emulator:
    def __init__(self, kernels: list[Kernel], wave: int = 32):
        self.kernels = {k.name: k for k in kernels}
        self.wave = wave
        source = render(list(self.kernels.values()))
        flags = ["-std=c++20", "-O1", "-shared", "-fPIC", "-w", f"-DWAVE={wave}"]
        key = hashlib.sha256("\0".join([source, *flags, HEADER.read_text()]).encode()).hexdigest()[:24]
        work = _workdir()
        lib = work / f"emu_{key}.so"
        if not lib.exists():
            cpp = work / f"emu_{key}.cpp"
            cpp.write_text(source)
            tmp = work / f"emu_{key}.{os.getpid()}.tmp"
            r = subprocess.run(["clang++-19", *flags, "-o", str(tmp), str(cpp)], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"emulator build failed:\n{r.stderr[:4000]}")
            os.replace(tmp, lib)
        self.lib = ctypes.CDLL(str(lib))
        for name in self.kernels:
            getattr(self.lib, f"lp_emu_call_{name}").restype = ctypes.c_char_p

    def launch(self, launch: Launch, bind: Callable[[dict[str, Any]], np.ndarray], dims: dict[str, int]) -> None:
        k = launch.kernel
        params = _signature(k)
        assert len(params) == len(launch.args), f"{k.name}: {len(params)} parameters, {len(launch.args)} arguments"
        keep, ptrs = [], []
        for (t, _), arg in zip(params, launch.args):
            if t in _SCALARS:
                assert len(arg) == 1, arg
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
        args = (ctypes.c_void_p * max(1, len(ptrs)))(*ptrs)
        err = getattr(self.lib, f"lp_emu_call_{k.name}")(grid[0], grid[1], grid[2], int(launch.smem or 0), args)
        if err:
            raise RuntimeError(f"{k.name}: {err.decode()}")


def emulate(kernels: list[Kernel], wave: int = 32) -> Emulator:
    return Emulator(kernels, wave)


# --- inputs ------------------------------------------------------------------------------------------

def _fmt(fmt: str | Format) -> Format:
    return fmt if isinstance(fmt, Format) else FORMATS[fmt.upper()]


def random_blocks(rng: np.random.Generator, fmt: str | Format, n: int, k: int) -> np.ndarray:
    """n rows of k values in format `fmt` as a flat array of blocks: random bytes in every quantized
    field, moderate random f16 scales (either sign); F16 values standard normal."""
    f = _fmt(fmt)
    nb = n * k // f.block
    if f.name == "F16":
        return rng.standard_normal(nb).astype(np.float16).view(f.layout).reshape(-1)
    if f.name in ("F32", "BF16"):
        vals = rng.standard_normal(nb).astype(np.float32)
        return (vals if f.name == "F32" else (vals.view(np.uint32) >> 16).astype(np.int16)).view(f.layout).reshape(-1)
    raw = rng.integers(0, 256, nb * f.block_bytes, dtype=np.uint8)
    b = raw.view(f.layout).reshape(-1).copy()
    for name in f.layout.names:
        if f.layout[name].base == np.float16:
            b[name] = (rng.uniform(0.002, 0.05, nb) * rng.choice([-1.0, 1.0], nb)).astype(np.float16)
    return b


def planar_bytes(fmt: str | Format, blocks: np.ndarray, rows: int, k: int) -> np.ndarray:
    """The planar relayout (models/formats.planes) of `rows` rows of blocks, as bytes."""
    f = _fmt(fmt)
    blocks = np.ascontiguousarray(blocks).reshape(-1)
    ps, total = planes(f, rows, k)
    out = np.zeros(total, np.uint8)
    for p in ps:
        out[p.offset:p.offset + p.nbytes] = np.ascontiguousarray(blocks[p.name]).view(np.uint8).reshape(-1)
    return out


def random_weight(rng: np.random.Generator, fmt: str | Format, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(planar bytes, the exactly dequantized float32 matrix [n, k]) of a random weight."""
    f = _fmt(fmt)
    blocks = random_blocks(rng, f, n, k)
    dense = dequantize(blocks.view(np.uint8).reshape(-1), f, (n, k))
    return planar_bytes(f, blocks, n, k), dense


def random_activation(rng: np.random.Generator, fmt: str, rows: int, k: int) -> tuple[np.ndarray, Any]:
    """(the buffer a kernel reads, what the CPU twin reads) of random activations [rows, k]: packed
    field planes (a cpu_kernels.Packed view of the same bytes, every field consistent: q8_1 sums,
    q8_k 16-value sums) or f16 rows."""
    if fmt == "f16":
        a = rng.standard_normal((rows, k)).astype(np.float16)
        return a, a
    f = ACTIVATION_FORMATS[fmt.upper()]
    ps, total = planes(f, rows, k)
    buf = np.zeros(total, np.uint8)
    x = Packed(fmt, {p.name: buf[p.offset:p.offset + p.nbytes].view(p.dtype).reshape(p.shape) for p in ps})
    qs = rng.integers(-127, 128, x["qs"].shape).astype(np.int8)
    x["qs"][...] = qs
    if fmt == "q8_k":
        x["d"][...] = (rng.uniform(0.004, 0.03, x["d"].shape) * rng.choice([-1.0, 1.0], x["d"].shape))
        x["bsums"][...] = qs.reshape(rows, -1, 16, 16).astype(np.int32).sum(-1)
    else:
        x["d"][...] = rng.uniform(0.004, 0.03, x["d"].shape).astype(np.float16)
        if fmt == "q8_1":
            x["s"][...] = (x["d"].astype(np.float32) * qs.reshape(rows, -1, 32).astype(np.float32).sum(-1)).astype(
                np.float16)
    return buf, x


def nmse(got: np.ndarray, want: np.ndarray) -> float:
    """Normalized mean squared error sum((got - want)^2) / sum(want^2)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(((got - want) ** 2).sum() / max((want ** 2).sum(), 1e-300))
