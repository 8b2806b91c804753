"""Finding the device compilers and disassemblers, and their versions (part of every cache key)."""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import sys

from llmplan.core.errors import InputError

_NVIDIA_DIRS = ["/usr/local/cuda/bin", *sorted(glob.glob("/usr/local/cuda-*/bin"))]


def _pip_nvidia_bins() -> list[str]:
    """Where PyPI's nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm put their binaries."""
    out = []
    for base in sys.path:
        out += sorted(glob.glob(os.path.join(base, "nvidia", "cu*", "bin")))
    return out


def find(tool: str, extra_dirs: list[str] = ()) -> str | None:
    found = shutil.which(tool)
    if found:
        return found
    for d in extra_dirs:
        path = os.path.join(d, tool)
        if os.access(path, os.X_OK):
            return path
    return None


def require(tool: str, hint: str, extra_dirs: list[str] = ()) -> str:
    path = find(tool, extra_dirs)
    if path is None:
        raise InputError(f"{tool} is not installed: {hint}")
    return path


@functools.lru_cache(maxsize=None)
def nvcc() -> str:
    return require("nvcc", "install the CUDA toolkit (CUDA 13) to build for NVIDIA targets", _NVIDIA_DIRS)


_PIP_NVIDIA_TOOLS = "pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm (or pip install -e '.[gpu]')"


@functools.lru_cache(maxsize=None)
def cuobjdump() -> str:
    return require("cuobjdump", _PIP_NVIDIA_TOOLS, _NVIDIA_DIRS + _pip_nvidia_bins())


@functools.lru_cache(maxsize=None)
def nvdisasm() -> str:
    """cuobjdump --dump-sass runs it."""
    return require("nvdisasm", _PIP_NVIDIA_TOOLS, _NVIDIA_DIRS + _pip_nvidia_bins())


def tool_env() -> dict[str, str]:
    """cuobjdump calls nvdisasm: make the pip-installed one findable."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([env.get("PATH", ""), *_pip_nvidia_bins(), *_NVIDIA_DIRS])
    return env


@functools.lru_cache(maxsize=None)
def clang() -> str:
    return require("clang++-19", "apt-get install clang-19 (it builds the host kernels and the AMD targets' "
                                 "kernels)")


@functools.lru_cache(maxsize=None)
def lld() -> str:
    """clang links every AMD code object with it."""
    return require("ld.lld-19", "apt-get install lld-19 to build for AMD targets")


def check(target) -> None:
    """Every tool a build for the codegen/targets.py Target runs, found before any compile starts: a
    missing one is an InputError naming what to install, not a failure after minutes of compiling."""
    for tool in (nvcc, cuobjdump, nvdisasm) if target.nvidia else (clang, lld):
        tool()


def available(target) -> bool:
    """Whether this machine has the compiler for a codegen/targets.py Target."""
    return find("nvcc", _NVIDIA_DIRS) is not None if target.nvidia else find("clang++-19") is not None


@functools.lru_cache(maxsize=None)
def version(tool: str) -> str:
    """One line naming the compiler's version."""
    out = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    lines = [ln for ln in out if "release" in ln or "version" in ln]
    return (lines or out or ["unknown"])[-1 if "nvcc" in tool else 0].strip()
