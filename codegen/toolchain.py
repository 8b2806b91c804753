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


@functools.lru_cache(maxsize=None)
def cuobjdump() -> str:
    return require("cuobjdump", "pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm",
                   _NVIDIA_DIRS + _pip_nvidia_bins())


def tool_env() -> dict[str, str]:
    """cuobjdump calls nvdisasm: make the pip-installed one findable."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([env.get("PATH", ""), *_pip_nvidia_bins(), *_NVIDIA_DIRS])
    return env


@functools.lru_cache(maxsize=None)
def clang() -> str:
    return require("clang++-19", "apt-get install clang-19 hipcc libamdhip64-dev rocm-device-libs to build for "
                                 "AMD targets")


def available(target) -> bool:
    """Whether this machine has the compiler for a codegen/targets.py Target."""
    return find("nvcc", _NVIDIA_DIRS) is not None if target.nvidia else find("clang++-19") is not None


@functools.lru_cache(maxsize=None)
def version(tool: str) -> str:
    """One line naming the compiler's version."""
    out = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    lines = [ln for ln in out if "release" in ln or "version" in ln]
    return (lines or out or ["unknown"])[-1 if "nvcc" in tool else 0].strip()
