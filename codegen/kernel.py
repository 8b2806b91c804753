"""What a kernel family hands the planner: kernels to compile, and launches of them.

A family module (codegen/families/<family>.py) turns one lowered launch (plans/lower.py) into one or
more Launch records for a target. Each names a Kernel: an `extern "C"` entry point with a stable name,
generated as a few lines that instantiate the family's templated device code (codegen/kernels/*.cu)
with the constants of this use (formats, tile shapes, widths). Everything that varies per layer
(sizes, pointers) is a kernel argument, so one kernel serves every layer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from llmplan.core.plan_records import F32, I32, Buf, Buffer, GridDim, Ref, Scratch, Weight


@dataclass(frozen=True)
class Kernel:
    name: str
    family: str
    source: str  # file under codegen/kernels/ holding the templated device code
    entry: str  # the generated `LP_KERNEL void <name>(...) { ... }` text
    block: int  # threads per block
    expects: tuple[str, ...] = ()  # instruction classes the compiled code must contain (see build.py)

    @cached_property
    def params(self) -> tuple[str, ...]:
        """The C types of the entry point's parameters, in order (what a plan records for its drivers)."""
        m = re.match(r"LP_KERNEL void (?:__launch_bounds__\([\d, ]+\) )?(\w+)\((.*?)\)\s*\{", self.entry, re.S)
        if not m or m.group(1) != self.name:
            raise ValueError(f"kernel {self.name}: its entry does not start as `LP_KERNEL void {self.name}(...)`")
        return tuple(re.sub(r"\s*\w+$", "", p.strip()) for p in m.group(2).split(",") if p.strip())


@dataclass
class KernelLaunch:
    """A family's launch of one of its kernels (a plan KernelCall once the kernel is built and named)."""

    kernel: Kernel
    grid: tuple[GridDim, ...]
    args: list[Ref] = field(default_factory=list)  # plan references and scalars, in order
    smem: int = 0  # dynamic shared memory bytes


def scalar(value: int | float | str, kind: str = "i32") -> I32 | F32:
    """A scalar kernel argument: a constant, or a symbol (rows, seqs) bound per step."""
    return F32(value) if kind == "f32" else I32(value)


def scratch(name: str, dtype: str, shape: list[int | str]) -> Scratch:
    """A buffer the graph does not name (a split-K workspace, a packed copy, partial results): the
    planner places it apart from every arena value, live across the launches of one node, with no
    initial contents. The same reference appears in the launch that writes it and the ones that read it."""
    return Scratch(name, dtype, tuple(shape))


@dataclass(frozen=True)
class Context:
    """What a family may ask about a launch's operands: buffer and weight types, and the target."""

    buffers: list[Buffer]  # the phase's buffers: dtype, shape (symbols allowed)
    weights: dict[str, tuple[str, tuple[int, ...]]]  # name -> (format, shape in NumPy order)
    target: Any  # codegen/targets.py Target
    dims: dict[str, int] = field(default_factory=dict)  # the phase's bound of each symbol (rows, seqs, ...)
    multiprocessors: int = 1  # of the device the plan is for: how many blocks fill it

    def bound(self, dim: int | str) -> int:
        """A dimension's largest value in this phase (a symbol's bound; unbound symbols raise)."""
        return dim if isinstance(dim, int) else self.dims[dim]

    def dtype(self, ref: Buf | Weight) -> str:
        if isinstance(ref, Buf):
            return self.buffers[ref.index].dtype
        return self.weights[ref.name][0].lower()

    def shape(self, ref: Buf | Weight) -> tuple:
        if isinstance(ref, Buf):
            return tuple(self.buffers[ref.index].shape)
        return tuple(self.weights[ref.name][1])
