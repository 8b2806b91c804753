"""The emu driver: a GPU plan run on the host, its own kernels compiled with the host vendor header
(codegen/emu.py) and launched block by block, lane by lane, as the GPU would: slow, and exact to the
kernels as written. Device memory is host memory; a launch gets the addresses of its regions."""

from __future__ import annotations

import time
from typing import Callable

from llmplan.codegen.emu import EmuLibrary, mode_for
from llmplan.core.errors import InputError
from llmplan.core.plan_records import PlanBody, PlanHeader

from ..driver import Call, Region
from .host import HostDriver


class EmuDriver(HostDriver):
    name = "emu"

    def load(self, body: PlanBody, header: PlanHeader) -> None:
        dev = header.device
        if dev.backend not in ("cuda", "hip") or body.gpu is None:
            raise InputError("the emulated GPU runs GPU plans; this plan is for the CPU (run it without --device emu)")
        kernels = {name: (tuple(k.params), k.block) for name, k in body.kernels.items()}
        t0 = time.perf_counter()
        self.lib = EmuLibrary.from_plan(body.gpu.source, kernels, dev.wave, mode_for(dev.int8_matrix))
        self.build_s = time.perf_counter() - t0
        if self.threads:
            self.lib.set_threads(self.threads)
        self.blocks = {name: block for name, (_, block) in kernels.items()}

    def prepare(self, call: Call) -> Callable[[], None]:
        if self.blocks.get(call.name) != call.block:
            raise InputError(f"kernel {call.name}: launched with {call.block} threads, built for "
                             f"{self.blocks.get(call.name)}")
        values = [a.buffer.ctypes.data + a.offset if isinstance(a, Region) else a.value for a in call.args]
        array, keep = self.lib.arguments(call.name, values)
        lib, name, grid, smem = self.lib, call.name, call.grid, call.smem

        def run() -> None:
            lib.call(name, grid, smem, array)

        run.keep = keep  # the argument array and scalars live as long as the call
        return run
