"""What `plan env` reports: this llmplan (version, build id), Python and the packages llmplan uses, its
extras, the compilers found for each target and the one each build uses, the CPU's SIMD paths and
features, the GPUs CuPy and hip-python see with their facts, and the cache and tune-store paths: what a
bug report needs about the machine."""

from __future__ import annotations

import importlib.metadata as metadata
import os
import platform
import re
import sys
from pathlib import Path
from typing import Any

from llmplan.codegen import cpu_build, toolchain
from llmplan.codegen.build import cache_root
from llmplan.codegen.targets import TARGETS
from llmplan.core import gpu_runtime, tune_store
from llmplan.core.build_id import PACKAGE_ROOT, build_id
from llmplan.core.devices import HIP_PROPERTIES, cuda_facts, hip_facts, local_cpu, simd_level
from llmplan.core.errors import InputError

# the x86 features LLM kernels use: the SIMD paths' (codegen/cpu_build.py), and the wider dot products and
# matrix units beyond them
FEATURES = ("avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
            "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16", "amx_fp16")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _requires() -> list[tuple[str, list[str], str | None]] | None:
    """The installed llmplan's requirements: (distribution, llmplan's extras it names, the extra that
    brings it or None); None where llmplan is not installed as a distribution."""
    try:
        requires = metadata.requires("llmplan") or []
    except metadata.PackageNotFoundError:
        return None
    out = []
    for req in requires:
        m = re.match(r"\s*([A-Za-z0-9_.\-]+)(?:\[([^\]]+)\])?[^;]*(?:;\s*extra\s*==\s*['\"]([^'\"]+)['\"])?", req)
        name, inner, extra = m.groups()
        out.append((name, [e.strip() for e in inner.split(",")] if inner else [], extra))
    return out


def packages() -> dict[str, str | None] | None:
    """The version of every package llmplan requires, its extras' too (None: not installed)."""
    reqs = _requires()
    return None if reqs is None else {name: _version(name) for name, _, _ in reqs if name != "llmplan"}


def extras() -> dict[str, dict[str, Any]] | None:
    """Each extra of the installed llmplan: whether every package it brings is installed, and which are
    not."""
    reqs = _requires()
    if reqs is None:
        return None
    wants: dict[str, list[str]] = {}
    for name, inner, extra in reqs:
        if extra:
            wants.setdefault(extra, []).extend([f"llmplan[{e}]" for e in inner] if name == "llmplan" else [name])
    return {extra: {"installed": not (missing := _missing(extra, wants)), "missing": missing} for extra in wants}


def _missing(extra: str, wants: dict[str, list[str]]) -> list[str]:
    missing = []
    for name in wants[extra]:
        if name.startswith("llmplan["):
            missing += _missing(name[len("llmplan["):-1], wants)
        elif _version(name) is None:
            missing.append(name)
    return missing


def _tool(path: str | None) -> dict[str, Any] | None:
    return None if path is None else {"path": path, "from": toolchain.origin(path), "version": toolchain.version(path)}


def compilers() -> dict[str, dict[str, Any]]:
    """Per kind of target: the tools found, the compiler its builds use (None: it cannot build here),
    and the command that installs what is missing."""
    cands = toolchain.cxx_candidates()
    cxx = cpu_build.compiler()
    cpu = {"targets": ["--device cpu"], "uses": cxx and " ".join(cxx.command), "install": toolchain.cxx_install(),
           "found": [{"command": " ".join(c.command), "family": c.family, "version": c.version, "identity": c.identity,
                      "builds": (why := cpu_build.probe(c)) is None, "why_not": why} for c in cands]}
    if cxx is None:
        cpu["why_none"] = cpu_build.no_compiler()
    nvidia_tools = {t: _tool(toolchain.find_nvidia(t)) for t in ("nvcc", "cuobjdump", "nvdisasm")}
    nvidia_tools["gcc"] = _tool(toolchain.find("gcc"))  # nvcc's host compiler
    clang_tools = {t: _tool(toolchain.find(t)) for t in ("clang++-19", "ld.lld-19")}
    names = {vendor: [t.name for t in TARGETS.values() if t.vendor == vendor] for vendor in ("cuda", "hip")}
    return {
        "cpu": cpu,
        "nvidia": {"targets": names["cuda"], "found": nvidia_tools, "install": toolchain.NVIDIA_INSTALL,
                   "uses": nvidia_tools["nvcc"]["path"] if all(nvidia_tools.values()) else None},
        "amd": {"targets": names["hip"], "found": clang_tools, "install": toolchain.AMD_INSTALL,
                "uses": clang_tools["clang++-19"]["path"] if all(clang_tools.values()) else None},
        "emu": {"targets": ["--device emu"], "found": {"clang++-19": clang_tools["clang++-19"]},
                "install": toolchain.AMD_INSTALL,
                "uses": clang_tools["clang++-19"] and clang_tools["clang++-19"]["path"]},
    }


def _cpu_model() -> str | None:
    """The CPU's model name as Linux reports it (None elsewhere)."""
    try:
        m = re.search(r"^model name\s*:(.*)$", Path("/proc/cpuinfo").read_text(), re.M)
    except OSError:
        return None
    return m.group(1).strip() if m else None


def cpu() -> dict[str, Any]:
    facts = local_cpu()
    flags = cpu_build.cpu_flags()
    return {"name": _cpu_model() or facts.name, "machine": facts.arch, "cores": facts.multiprocessors,
            "memory_gib": facts.memory_gib,
            "simd_paths": list(cpu_build.host_isas()), "best": cpu_build.best_isa(),
            "features": [f for f in FEATURES if f in flags], "amx": any(f.startswith("amx") for f in flags),
            "numpy_simd": simd_level()}


def gpus() -> dict[str, Any]:
    """Per runtime library: the facts of each device it sees, or why it sees none."""
    return {"cuda": _listed(_cuda_devices), "hip": _listed(_hip_devices)}


def _listed(devices) -> dict[str, Any]:
    try:
        return {"devices": devices()}
    except InputError as e:
        return {"devices": [], "why_none": str(e)}


def _cuda_devices() -> list[dict[str, Any]]:
    cp = gpu_runtime.cupy()
    out = []
    for i in range(cp.cuda.runtime.getDeviceCount()):
        props = cp.cuda.runtime.getDeviceProperties(i)
        out.append(_facts(lambda: cuda_facts(props), props["name"]))
    return out


def _hip_devices() -> list[dict[str, Any]]:
    h = gpu_runtime.hip()
    out = []
    for i in range(h.hipGetDeviceCount()[1]):
        err, p = gpu_runtime.hip_properties(h, i)
        if err != h.hipError_t.hipSuccess:
            out.append({"name": f"device {i}", "unsupported": f"its properties cannot be read ({err})"})
            continue
        props = {k: getattr(p, k) for k in HIP_PROPERTIES}
        out.append(_facts(lambda: hip_facts(props), props["name"]))
    return out


def _facts(read, name) -> dict[str, Any]:
    """A device's facts, or its name and why llmplan has no kernels for it."""
    try:
        return read().to_dict()
    except InputError as e:
        return {"name": name.decode() if isinstance(name, bytes) else str(name), "unsupported": str(e)}


def collect() -> dict[str, Any]:
    store = tune_store.resolve(None)
    return {
        "llmplan": {"version": _version("llmplan"), "build_id": build_id(), "path": str(PACKAGE_ROOT)},
        "python": {"version": platform.python_version(), "executable": sys.executable,
                   "platform": platform.platform()},
        "packages": packages(),
        "extras": extras(),
        "cpu": cpu(),
        "compilers": compilers(),
        "gpus": gpus(),
        "paths": {"cache": str(cache_root()), "tune_store": str(store) if store else "off",
                  "cxx_env": os.environ.get("CXX")},
    }
