"""The CPU plan's kernels: every launch lowered to its compiled family (codegen/cpu_families/) where this
machine has the C++ compiler, else the NumPy twins plans/lower.py gave it, and the plan's record of which
and why (its `cpu` section).

A native launch's kernel call is one C call (grid [1], block 1: the kernel fans its work out over the
library's thread pool); projections, the tail's head and the embedding read their weights in place
({"layout": "blocks"}), norm vectors as float32 ({"layout": "f32"}: a few KiB a layer). The section
holds the host translation unit and its SIMD path, so the driver builds (once, cached by source, flags
and compiler) exactly what the plan names.
"""

from __future__ import annotations

import importlib
from typing import Any

from llmplan.codegen import cpu_build, toolchain
from llmplan.codegen.cpu_families import FAMILY_MODULE
from llmplan.codegen.kernel import Context, Kernel
from llmplan.core.errors import InputError

NO_COMPILER = ("no C++ compiler (clang++-19 is not on PATH): the NumPy twins run (runtime/cpu_kernels.py), "
               "dequantizing projections to float32 at load; install clang-19 and recompile for the native kernels")


def _vector(ref: dict[str, Any]) -> dict[str, Any]:
    """A weight argument the family leaves unnamed is a float vector (norms): held as float32."""
    return ref | {"layout": "f32"} if "weight" in ref and "layout" not in ref else ref


def lower_native(phases: dict[str, dict[str, Any]], table: dict[str, tuple[str, tuple[int, ...]]],
                 isa: str) -> dict[str, Any]:
    """Replace every launch's NumPy call with its compiled kernel calls; returns the plan's kernel table
    (name -> parameter types) and its `cpu` section."""
    kernels: dict[str, Kernel] = {}
    for p in phases.values():
        ctx = Context(p["buffers"], table, None, p["dims"])
        for launch in p["launches"]:
            family = importlib.import_module(f"llmplan.codegen.cpu_families.{FAMILY_MODULE[launch['op']]}")
            calls = family.launches(launch, ctx)
            launch["kernels"] = [{"name": ln.kernel.name, "grid": list(ln.grid), "block": 1, "smem": 0,
                                  "args": [_vector(a) for a in ln.args]} for ln in calls]
            if "decision" not in launch:
                launch["member"] = "native"
                launch["provenance"] = f"cpu target: the {launch['family']} family's compiled kernel ({isa})"
            kernels.update({ln.kernel.name: ln.kernel for ln in calls})
    source = cpu_build.render(list(kernels.values()))
    return {"kernels": {name: {"params": list(k.params), "block": 1} for name, k in sorted(kernels.items())},
            "cpu": {"kernels": "native", "isa": isa, "compiler": toolchain.version(toolchain.clang()),
                    "source": source,
                    "why": f"the CPU target's compiled kernels, SIMD path {isa} (this machine runs "
                           f"{', '.join(cpu_build.host_isas())})"}}


def choose_isa(isa: str | None) -> str:
    """The SIMD path a plan is built for: `isa` if this machine runs it, else its best."""
    if isa is None:
        return cpu_build.best_isa()
    if isa not in cpu_build.host_isas():
        raise InputError(f"--isa {isa}: this machine runs {', '.join(cpu_build.host_isas())}")
    return isa


def fallback() -> dict[str, Any]:
    """The plan's record when the NumPy twins stay."""
    return {"kernels": {}, "cpu": {"kernels": "numpy", "why": NO_COMPILER}}
