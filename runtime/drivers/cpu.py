"""The cpu driver: a CPU plan's kernel calls, either the CPU target's compiled kernels (the plan's `cpu`
section carries their translation unit and SIMD path; codegen/cpu_build.py builds it once per source,
flags and compiler, cached, and loads it) or, in a plan compiled where no C++ compiler was, the
families' NumPy twins (runtime/numpy_kernels.py), called with views of host memory in the dtypes and
shapes the plan gives each argument."""

from __future__ import annotations

import math
import os
import threading
import time
from typing import Any, Callable

import numpy as np

from llmplan.codegen.cpu_build import CpuLibrary
from llmplan.codegen.cpu_families import matmul
from llmplan.core import layouts
from llmplan.core.errors import InputError
from llmplan.core.formats import ACTIVATION_FORMATS, FORMATS, planes
from llmplan.core.plan_records import PlanBody, PlanHeader

from ..driver import Call, Graph, Region, Scalar
from ..numpy_kernels import KERNELS, MappedRows, Packed
from .host import HostDriver, HostGraph, raw, typed

PREFIX = "numpy."
# One thread pool per loaded library, shared by every engine of the process that loads it (a library is
# loaded once per path): a launch must not meet another launch or a pool resize, so each holds this.
_POOL = threading.Lock()


def view(region: Region) -> Any:
    """What a NumPy twin takes for an argument: an array of the region's dtype and shape, a packed
    activation's field planes, or a quantized table left in the mapped file."""
    if region.layout == "rows":
        fmt = FORMATS[region.dtype.upper()]
        return MappedRows(raw(region), fmt.name, fmt.row_bytes(region.shape[-1]))
    if not region.layout and region.dtype.upper() in ACTIVATION_FORMATS:
        fmt = ACTIVATION_FORMATS[region.dtype.upper()]
        ps, _ = planes(fmt, math.prod(region.shape[:-1]), region.shape[-1])
        data = raw(region)
        return Packed(region.dtype, {p.name: data[p.offset:p.offset + p.nbytes].view(p.dtype).reshape(p.shape)
                                     for p in ps})
    return typed(region)


class CpuDriver(HostDriver):
    name = "cpu"
    bursts = records_free = True
    lib: CpuLibrary | None = None  # the compiled kernels (None: the plan's calls are the NumPy twins)

    def load(self, body: PlanBody, header: PlanHeader) -> None:
        backend = header.device.backend
        if backend != "cpu":
            raise InputError(f"a {backend} plan ({header.device.arch}) does not run on the cpu driver: run it "
                             "with --device emu, or compile for the CPU (plan compile ... --device cpu)")
        cpu = body.cpu
        if cpu.kernels != "native":
            return
        params = {name: k.params for name, k in body.kernels.items()}
        t0 = time.perf_counter()
        self.lib = CpuLibrary(cpu.source, params, cpu.isa)
        self.build_s = time.perf_counter() - t0
        with _POOL:
            self.lib.set_threads(self.threads or len(os.sched_getaffinity(0)))

    def prepare(self, call: Call) -> Callable[[], None]:
        if self.lib is not None and not call.name.startswith(PREFIX):
            return self._native(call)
        if not call.name.startswith(PREFIX) or call.name[len(PREFIX):] not in KERNELS:
            raise InputError(f"the cpu driver has no kernel {call.name!r}")
        fn = KERNELS[call.name[len(PREFIX):]]
        views = [view(a) for a in call.args if not isinstance(a, Scalar)]
        outs, ins, op, attrs = views[:call.outs], views[call.outs:], call.op, call.attrs
        return lambda: fn(op, attrs, outs, *ins)

    def _values(self, call: Call) -> tuple:
        """The call's arguments as the entry point takes them: region addresses and scalar values."""
        _, types = self.lib.entry(call.name)
        if len(types) != len(call.args):
            raise InputError(f"kernel {call.name}: {len(call.args)} arguments for {len(types)} parameters")
        return tuple(a.value if isinstance(a, Scalar) else _address(a) for a in call.args)

    def _native(self, call: Call) -> Callable[[], None]:
        """The entry point with its arguments bound, fixed from here on."""
        fn, values = self.lib.entry(call.name)[0], self._values(call)

        def run() -> None:
            with _POOL:
                fn(*values)

        run.keep = _buffers([call])  # the memory the addresses point into lives as long as the call
        return run

    def make_layout(self, layout: str, blocks: np.ndarray, fmt: str, shape: tuple[int, ...],
                    consumed: layouts.Consumed) -> np.ndarray | None:
        """rows16 records made by the plan's library (matmul.relayout) over the pool's threads."""
        if self.lib is None:
            return None
        with _POOL:
            return matmul.make_held(self.lib, layout, blocks, fmt, shape, consumed)

    def _replay(self, calls: list[Call]) -> Callable[..., None] | None:
        """The compiled calls as one native call holding the pool (graph.h; given a uint64 array, it
        writes the clock after each call); None where the calls are the NumPy twins."""
        if self.lib is None or any(c.name.startswith(PREFIX) for c in calls):
            return None
        replay = self.lib.replayer([(c.name, self._values(c)) for c in calls])

        def run(ns: np.ndarray | None = None) -> None:
            with _POOL:
                replay(ns)

        run.replayer, run.keep = replay, _buffers(calls)
        return run

    def record(self, calls: list[Call]) -> Graph:
        """A step of compiled kernels as one native call (graph.h); the NumPy twins as a list of calls."""
        run = self._replay(calls)
        return HostGraph([run]) if run else super().record(calls)

    def replay_steps(self, graph: Graph, steps: int, pos: Region, tokens: Region) -> np.ndarray | None:
        """graph.h's burst, where the graph is one native replay of a library that has it."""
        replayer = getattr(graph.steps[0], "replayer", None) if len(graph.steps) == 1 else None
        if replayer is None or not replayer.bursts:
            return None
        out = np.empty((steps, pos.shape[0]), np.int32)
        with _POOL:
            replayer.replay_steps(steps, _address(pos), _address(tokens), out)
        return out

    def timed_replay(self, calls: list[Call]) -> Callable[[], np.ndarray] | None:
        """The compiled calls replayed as record() replays them, returning each call's seconds (the
        profile of a step without a trip through Python per launch); None for the NumPy twins."""
        run = self._replay(calls)
        if run is None:
            return None
        ns = np.zeros(len(calls) + 1, np.uint64)

        def timed() -> np.ndarray:
            run(ns)
            return np.diff(ns.astype(np.int64)) / 1e9

        timed.keep = run
        return timed


def _address(region: Region) -> int:
    return region.buffer.ctypes.data + region.offset


def _buffers(calls: list[Call]) -> list:
    return [a.buffer for c in calls for a in c.args if isinstance(a, Region)]
