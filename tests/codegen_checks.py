"""What the kernel family tests (tests/test_codegen_*.py) share: a catalog built once for every target,
the skip for a missing CPU emulator compiler, and a random generator seeded by the test's own id."""

from __future__ import annotations

import concurrent.futures
import functools
import os
import zlib
from typing import Callable

import numpy as np
import pytest

from llmplan.codegen import toolchain
from llmplan.codegen.build import Build, build
from llmplan.codegen.kernel import Kernel
from llmplan.codegen.targets import TARGETS, Target

import kernel_emu
from conftest import require_compiler

Catalog = Callable[[Target], list[Kernel]]

# under CI the tests run regardless, and fail without the compiler (.ci/run installs it)
needs_emulator = pytest.mark.skipif(not os.environ.get("CI") and not kernel_emu.have_compiler(),
                                    reason="the CPU emulator needs clang++-19")
# the emulator's own tests run on it even where the kernel tests run on a GPU (scripts/device-check,
# whose machine has no clang++-19)
needs_host_emulator = pytest.mark.skipif(not os.environ.get("CI") and not kernel_emu.have_host_compiler(),
                                         reason="the CPU emulator needs clang++-19")


@pytest.fixture
def rng(request):
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@functools.cache
def _builds(catalog: Catalog) -> dict[str, Build]:
    """catalog(target) for every target with a compiler here, targets in parallel (one translation
    unit each), with build()'s gates: no spills, device code, the expected instructions."""
    targets = [t for t in TARGETS.values() if toolchain.available(t)]
    with concurrent.futures.ThreadPoolExecutor(len(targets) or 1) as pool:
        futures = {t.name: pool.submit(build, catalog(t), t, False) for t in targets}
        return {name: f.result() for name, f in futures.items()}


def built(catalog: Catalog, target: str) -> Build:
    """The build of catalog(TARGETS[target]) (conftest.require_compiler: skipped where this machine has
    no compiler for the target, failed under CI), after what every kernel must pass: it is in the
    build, it spills nothing and has no stack frame."""
    t = TARGETS[target]
    require_compiler(t)
    b = _builds(catalog)[target]
    kernels = catalog(t)
    assert set(b.manifests) == {k.name for k in kernels}
    for k in kernels:
        m = b.manifests[k.name]
        assert m.spill_bytes == 0 and m.stack_bytes == 0, (k.name, m)
    return b
