"""Building host code: one C++ translation unit compiled into a shared library for this machine, cached.

Two things run on the host as compiled code: the emulated GPU (a GPU plan's kernels with the host
vendor header, codegen/kernels/emu.h) and the CPU target's kernels. Both come here as a rendered
source string, a flag list and the compiler (codegen/toolchain.py Compiler); the library is keyed by
source, flags and the compiler's command and identity (its --version), and built once per key
(concurrent builders race harmlessly: each writes its own temporary and renames).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import toolchain
from .build import BuildError, cache_root


@dataclass(frozen=True)
class HostLibrary:
    path: Path
    seconds: float  # build time (0 when it came from the cache)
    cached: bool
    compiler: toolchain.Compiler

    def load(self) -> ctypes.CDLL:
        return ctypes.CDLL(str(self.path))


def _dir(kind: str) -> Path:
    path = cache_root() / kind
    try:
        path.mkdir(parents=True, exist_ok=True)
        return path
    except OSError:  # a read-only cache: build into a private temporary directory
        return Path(tempfile.mkdtemp(prefix=f"llmplan-{kind}-"))


def build_library(source: str, flags: list[str], kind: str, compiler: toolchain.Compiler) -> HostLibrary:
    """The shared library of `source` compiled with `flags` (cached under $LLMPLAN_CACHE/<kind>)."""
    key = hashlib.sha256("\0".join([source, *compiler.command, compiler.identity, *flags]).encode()).hexdigest()[:24]
    work = _dir(kind)
    lib = work / f"{kind}_{key}.so"
    if lib.exists():
        return HostLibrary(lib, 0.0, True, compiler)
    cpp = work / f"{kind}_{key}.{os.getpid()}.cpp"
    tmp = work / f"{kind}_{key}.{os.getpid()}.tmp"
    cpp.write_text(source)
    t0 = time.perf_counter()
    try:
        r = subprocess.run([*compiler.command, *flags, "-shared", "-fPIC", "-o", str(tmp), str(cpp)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            first = next((ln for ln in r.stderr.splitlines() if "error" in ln), r.stderr.strip()[:400] or "no output")
            raise BuildError(f"host build ({kind}) failed: {first.replace(str(cpp), 'source')}")
        os.replace(tmp, lib)
    finally:
        cpp.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return HostLibrary(lib, round(time.perf_counter() - t0, 3), False, compiler)
