"""Finding the compilers and disassemblers each target builds with, and their versions (part of every
cache key). Where each is looked for, first found wins:
- NVIDIA targets (sm_*): nvcc (it runs its own ptxas and fatbinary, and the host's gcc), cuobjdump and
  nvdisasm in the [gpu] extra's wheels (site-packages/nvidia/cu13/bin, the headers beside them), then
  on PATH, then in the CUDA toolkit's folders;
- AMD targets (gfx*) and the emulated GPU's host builds: clang++-19 and ld.lld-19 on PATH, the OS's
  packages (no PyPI package tried ships a clang that builds HIP for AMDGPU: the README says which);
- the CPU target: the C++ compilers on PATH (cxx_candidates: $CXX, else each clang++, then each g++);
  codegen/cpu_build.py takes the first that builds its probe.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Sequence

from llmplan.core.errors import InputError

_NVIDIA_DIRS = ["/usr/local/cuda/bin", *sorted(glob.glob("/usr/local/cuda-*/bin"))]
NVIDIA_INSTALL = "pip install -e '.[gpu]' (NVIDIA's compiler and SASS readers from PyPI)"
AMD_INSTALL = "apt-get install clang-19 lld-19"
# the command that installs a C++ compiler, by the package manager this machine has (first found)
_CXX_INSTALL = {"apt-get": "apt-get install g++", "dnf": "dnf install gcc-c++", "apk": "apk add g++",
                "pacman": "pacman -S gcc", "zypper": "zypper install gcc-c++"}
_CXX_NAME = re.compile(r"(clang\+\+|g\+\+)(-[\d.]+)?")


def registry_bins() -> list[str]:
    """Where the [gpu] extra's wheels (nvidia-cuda-nvcc, -cuobjdump, -nvdisasm) put their binaries."""
    out = []
    for base in sys.path:
        out += sorted(glob.glob(os.path.join(base, "nvidia", "cu*", "bin")))
    return out


def find(tool: str, first: Sequence[str] = (), last: Sequence[str] = ()) -> str | None:
    """`tool` in the `first` folders, else on PATH, else in the `last` folders."""
    def within(folders: Sequence[str]) -> str | None:
        return next((p for d in folders if os.access(p := os.path.join(d, tool), os.X_OK)), None)

    return within(first) or shutil.which(tool) or within(last)


def require(tool: str, hint: str, first: Sequence[str] = (), last: Sequence[str] = ()) -> str:
    path = find(tool, first, last)
    if path is None:
        raise InputError(f"{tool} is not installed: {hint}")
    return path


def origin(path: str) -> str:
    """Where a tool find() found comes from, in words."""
    folder = os.path.dirname(path)
    return ("the [gpu] extra" if folder in registry_bins() else "the CUDA toolkit" if folder in _NVIDIA_DIRS
            else "PATH")


def find_nvidia(tool: str) -> str | None:
    return find(tool, registry_bins(), _NVIDIA_DIRS)


def _nvidia(tool: str) -> str:
    return require(tool, NVIDIA_INSTALL, registry_bins(), _NVIDIA_DIRS)


@functools.lru_cache(maxsize=None)
def nvcc() -> str:
    return _nvidia("nvcc")


@functools.lru_cache(maxsize=None)
def cuobjdump() -> str:
    return _nvidia("cuobjdump")


@functools.lru_cache(maxsize=None)
def nvdisasm() -> str:
    """cuobjdump --dump-sass runs it."""
    return _nvidia("nvdisasm")


@functools.lru_cache(maxsize=None)
def nvcc_host() -> str:
    """nvcc preprocesses and compiles the host side through gcc."""
    return require("gcc", f"nvcc compiles through the host's gcc: {cxx_install()}")


def tool_env() -> dict[str, str]:
    """The NVIDIA tools' environment: cuobjdump calls nvdisasm, found where nvdisasm() finds it."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([*registry_bins(), *filter(None, [env.get("PATH")]), *_NVIDIA_DIRS])
    return env


@functools.lru_cache(maxsize=None)
def clang() -> str:
    return require("clang++-19", "apt-get install clang-19 (it builds the AMD targets' kernels and the emulated "
                                 "GPU's)")


@functools.lru_cache(maxsize=None)
def lld() -> str:
    """clang links every AMD code object with it."""
    return require("ld.lld-19", "apt-get install lld-19 to build for AMD targets")


def check(target) -> None:
    """Every tool a build for the codegen/targets.py Target runs, found before any compile starts: a
    missing one is an InputError naming what to install, not a failure after minutes of compiling."""
    for tool in (nvcc, nvcc_host, cuobjdump, nvdisasm) if target.nvidia else (clang, lld):
        tool()


def available(target) -> bool:
    """Whether this machine has the compiler for a codegen/targets.py Target."""
    return find_nvidia("nvcc") is not None if target.nvidia else find("clang++-19") is not None


@functools.lru_cache(maxsize=None)
def version(tool: str) -> str:
    """One line naming the compiler's version."""
    out = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    lines = [ln for ln in out if "release" in ln or "version" in ln]
    return (lines or out or ["unknown"])[-1 if "nvcc" in tool else 0].strip()


# --- C++ compilers for host code -----------------------------------------------------------------

@dataclass(frozen=True)
class Compiler:
    """A C++ compiler for host code: the command that runs it and what it is. Builds are cached by
    `identity`, the first line of its --version, which names the compiler and its exact build."""

    command: tuple[str, ...]  # the compiler, after a launcher such as ccache where $CXX names one
    family: str  # clang, gcc or other
    version: str  # 19.1.7 ("" where --version shows no version number)
    identity: str

    @property
    def name(self) -> str:
        return os.path.basename(self.command[-1])

    def describe(self) -> str:
        return f"{self.name} {self.version}".strip()


@functools.lru_cache(maxsize=None)
def identify(command: tuple[str, ...]) -> Compiler | None:
    """The compiler `command` runs, or None where it does not run."""
    try:
        r = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or not lines:
        return None
    family = "clang" if "clang version" in lines[0] else "gcc" if "Free Software Foundation" in r.stdout else "other"
    number = re.search(r"\b\d+\.\d+(?:\.\d+)?\b", lines[0])
    return Compiler(command, family, number.group(0) if number else "", lines[0].strip())


@functools.lru_cache(maxsize=None)
def clang_host() -> Compiler:
    """clang++-19 as a host compiler: the emulated GPU's builds."""
    found = identify((clang(),))
    if found is None:
        raise InputError(f"{clang()} does not run ({clang()} --version failed): apt-get install --reinstall clang-19")
    return found


def cxx_candidates() -> list[Compiler]:
    """The C++ compilers the CPU target may build with, in the order codegen/cpu_build.py tries them:
    $CXX alone where it is set (a command: `ccache g++` too); else each clang++ on PATH, newest first,
    then each g++, newest first (one per binary, under the first name PATH gives it)."""
    if os.environ.get("CXX"):
        found = identify(tuple(shlex.split(os.environ["CXX"])))
        return [found] if found else []
    seen: dict[str, str] = {}
    for d in os.environ.get("PATH", "").split(os.pathsep):
        try:
            names = sorted(os.listdir(d or "."))
        except OSError:
            continue
        for name in names:
            path = os.path.join(d, name)
            if _CXX_NAME.fullmatch(name) and os.access(path, os.X_OK):
                seen.setdefault(os.path.realpath(path), path)
    found = [c for c in (identify((path,)) for path in seen.values()) if c is not None]
    order = {"clang": 0, "gcc": 1, "other": 2}
    return sorted(found, key=lambda c: (order[c.family], [-int(x) for x in c.version.split(".") if x]))


def cxx_install() -> str:
    """The one command that installs a C++ compiler here."""
    return next((cmd for tool, cmd in _CXX_INSTALL.items() if shutil.which(tool)), "install g++ or clang++")
