"""The driver interface: what every backend implements for the one executor (runtime/executor.py).

A driver owns one device. It allocates device buffers, copies host bytes in and out, loads a plan's
kernels, launches a kernel call (a resolved grid and bound arguments) on its stream, and, where the
backend has graphs, records a sequence of calls once for replay. Everything else (which buffers a
plan needs, how arguments bind, step state, poisoning, buckets) is the executor's and the same for
every backend.

Drivers are found by name (`driver_for`); a backend's module, and the library it wraps (CuPy,
hip-python), is imported only when that backend is used.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llmplan.core import layouts
from llmplan.core.errors import InputError
from llmplan.core.plan_records import PlanBody, PlanHeader


@dataclass(frozen=True)
class Region:
    """Bytes [offset, offset + nbytes) of a device buffer, and what they hold: `dtype` (f32, i32, f16,
    bf16; a packed activation format q8_0/q8_1/q8_k as field planes; a weight format for a weight in a
    file layout; u8) and its shape with every dimension bound. `layout` names a weight's layout."""

    buffer: Any
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    layout: str = ""


@dataclass(frozen=True)
class Scalar:
    kind: str  # "i32" or "f32"
    value: int | float


@dataclass
class Call:
    """One kernel call: the plan's kernel record with its grid resolved and its arguments bound. `op`,
    `attrs` and `outs` (how many leading arguments are outputs) are the launch's, for backends whose
    kernels are the NumPy twins."""

    name: str
    grid: tuple[int, int, int]
    block: int
    smem: int
    args: list[Region | Scalar]
    op: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)
    outs: int = 0


class Graph(ABC):
    """A recorded sequence of calls, replayed as a whole (a CUDA graph; a prepared list on the host)."""

    @abstractmethod
    def replay(self) -> None: ...


class Pending(ABC):
    """A copy to the host queued on the driver's stream; result() waits for it."""

    @abstractmethod
    def result(self) -> np.ndarray: ...


class Ready(Pending):
    """A copy that has already happened (the host backends execute in order, at once)."""

    def __init__(self, data: np.ndarray):
        self.data = data

    def result(self) -> np.ndarray:
        return self.data


class Driver(ABC):
    name: str
    graphs: bool = False  # whether record() captures calls for replay
    overlaps: bool = False  # whether launches run asynchronously to the host (a pipelined decode pays off)
    bursts: bool = False  # whether replay_steps runs a greedy decode burst in one call
    records_free: bool = False  # whether record() costs no more than binding the calls (executor: prefill replays too)
    host_memory: bool = False  # whether put() may use the host array in place (the caller keeps it alive)
    threads: int | None = None  # host threads the kernels run on (cpu, emu), set before load; None: every core

    @abstractmethod
    def load(self, body: PlanBody, header: PlanHeader) -> None:
        """Make the plan's kernels callable (compile or load its code); raise InputError if this
        backend cannot run them."""

    @abstractmethod
    def alloc(self, nbytes: int) -> Any:
        """A zero-filled device buffer of at least nbytes (at least one byte)."""

    @abstractmethod
    def put(self, host: np.ndarray) -> Any:
        """A device buffer holding host's bytes; the host backends may use host's memory in place,
        so `host` must stay alive and unchanged."""

    @abstractmethod
    def write(self, dst: Region, host: np.ndarray) -> None:
        """Copy host's bytes into dst (queued on the stream; `host` may be reused at once)."""

    @abstractmethod
    def read(self, src: Region) -> Pending:
        """Queue a copy of src to the host, ordered after everything queued before it."""

    @abstractmethod
    def fill(self, dst: Region, byte: int) -> None:
        """Set every byte of dst (the poison mode's NaN bytes)."""

    @abstractmethod
    def launch(self, call: Call) -> None: ...

    def make_layout(self, layout: str, raw: np.ndarray, fmt: str, shape: tuple[int, ...],
                    consumed: layouts.Consumed) -> np.ndarray | None:
        """A weight in `layout` made by this backend's own code from its file bytes `raw` (calling
        consumed(lo, hi) as core/layouts.make does), or None where core/layouts.make makes it."""
        return None

    def record(self, calls: list[Call]) -> Graph:
        """The calls recorded for replay; only backends with graphs implement it."""
        raise NotImplementedError(f"the {self.name} driver has no graphs")

    def replay_steps(self, graph: Graph, steps: int, pos: Region, tokens: Region) -> np.ndarray | None:
        """A greedy decode burst in one call: `graph` (a decode step whose tail writes its tokens into the
        `tokens` slot its embedding reads) replayed `steps` times, each after advancing every row's `pos`
        by one; the tokens each replay wrote (steps x rows, int32). None where the backend has no such
        call (the executor then steps through Python)."""
        return None

    def sync(self) -> None:
        """Wait for everything queued (nothing to do on the host backends)."""

    def marker(self) -> Any:
        """A point on the device's timeline, recorded on the stream now, whose seconds_since(earlier
        marker) is device time (a trace's device track); None where the host's clock is the device's."""
        return None


# backend name -> module (runtime/drivers/) and class
DRIVERS = {"cpu": ("cpu", "CpuDriver"), "emu": ("emu", "EmuDriver"), "cuda": ("cuda", "CudaDriver"),
           "hip": ("hip", "HipDriver")}


def driver_for(name: str) -> Driver:
    if name not in DRIVERS:
        raise InputError(f"unknown device {name!r} (the runtime's drivers: {', '.join(DRIVERS)})")
    module, cls = DRIVERS[name]
    try:
        mod = importlib.import_module(f"llmplan.runtime.drivers.{module}")
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("llmplan.runtime.drivers"):
            raise InputError(f"--device {name}: the {name.upper()} driver is not built yet") from None
        raise
    return getattr(mod, cls)()
