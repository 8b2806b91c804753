"""The line `plan run`, `plan serve`, `plan eval` and `plan compile --device cpu` print on stderr when a
CPU plan runs the NumPy kernels (it was compiled where no C++ compiler was): why, what it costs, and the
command that fixes it."""

from __future__ import annotations

import shlex
import sys

from llmplan.codegen import cpu_build, toolchain
from llmplan.core.console import human_bytes
from llmplan.core.layouts import weight_bytes_beyond_file
from llmplan.core.plan_records import PlanBody, PlanHeader

# the NumPy kernels against the compiled ones on Gemma 3 270M at 2 threads, each as a ratio to llama.cpp in
# its own run: decode 0.216x against 1.30x, prefill 0.166x against 1.82x (docs/benchmarks.md)
SLOWER = "about 6x slower to decode and 11x to prefill than the compiled kernels (Gemma 3 270M)"


def notice(verb: str, header: PlanHeader, body: PlanBody, plan: str, from_gguf: bool) -> str | None:
    """The line for a plan `plan VERB` runs (or wrote), None unless it runs the NumPy kernels. `from_gguf`:
    the plan is the one a GGUF compiles to on the fly, which the next run recompiles once a compiler is
    here."""
    cpu = body.cpu
    if cpu is None or cpu.kernels != "numpy":
        return None
    copies = sum(weight_bytes_beyond_file(w) for w in body.weights.values())
    recompile = f"plan compile {shlex.quote(header.model.path)} --device cpu -o {shlex.quote(plan)}"
    if cpu_build.available():  # a compiler is here now: the plan was compiled before, or elsewhere
        fix = recompile
    else:
        fix = toolchain.cxx_install() + ("" if from_gguf else f", then {recompile}")
    return (f"plan {verb}: the NumPy kernels run this plan, not the compiled ones ({cpu.why}): {SLOWER}, and "
            f"{human_bytes(copies)} of float32 weight copies; to fix it: {fix}")


def announce(verb: str, header: PlanHeader, body: PlanBody, plan: str, from_gguf: bool) -> None:
    line = notice(verb, header, body, plan, from_gguf)
    if line:
        print(line, file=sys.stderr)
