"""What the host backends (cpu, emu) share: device memory is host memory (NumPy byte arrays), copies
are immediate, and a recorded graph is the list of prepared calls."""

from __future__ import annotations

from abc import abstractmethod
from typing import Callable

import numpy as np

from llmplan.core.formats import SCALAR_BYTES

from ..driver import Call, Driver, Graph, Pending, Ready, Region

_NUMPY = {"f32": np.float32, "i32": np.int32, "f16": np.float16, "bf16": np.uint16}  # bf16 held as its bits
assert set(_NUMPY) == set(SCALAR_BYTES)


def raw(region: Region) -> np.ndarray:
    """The region's bytes (a view of the buffer)."""
    return region.buffer[region.offset:region.offset + region.nbytes]


def typed(region: Region) -> np.ndarray:
    """The region as an array of its dtype and shape (plain dtypes), else its bytes."""
    data = raw(region)
    if region.dtype in _NUMPY:
        return data.view(_NUMPY[region.dtype]).reshape(region.shape)
    return data


class HostGraph(Graph):
    def __init__(self, steps: list[Callable[[], None]]):
        self.steps = steps

    def replay(self) -> None:
        for step in self.steps:
            step()


class HostDriver(Driver):
    graphs = True
    host_memory = True

    def alloc(self, nbytes: int) -> np.ndarray:
        return np.zeros(max(nbytes, 1), np.uint8)

    def put(self, host: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(host).reshape(-1).view(np.uint8)

    def write(self, dst: Region, host: np.ndarray) -> None:
        data = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
        if data.size > dst.nbytes:
            raise ValueError(f"{data.size} bytes into a region of {dst.nbytes}")
        dst.buffer[dst.offset:dst.offset + data.size] = data

    def read(self, src: Region) -> Pending:
        return Ready(typed(src).copy())

    def fill(self, dst: Region, byte: int) -> None:
        raw(dst)[...] = byte

    @abstractmethod
    def prepare(self, call: Call) -> Callable[[], None]:
        """The call with its arguments bound once (what launch runs and record keeps)."""

    def launch(self, call: Call) -> None:
        self.prepare(call)()

    def record(self, calls: list[Call]) -> Graph:
        return HostGraph([self.prepare(c) for c in calls])
