"""The prefill GEMM kernels' numbers, on the CPU (tests/kernel_emu.py: the kernel source compiled for
the host, every GPU thread a fiber, mma.sync and RDNA3 WMMA fragments emulated with their register
layouts) against the CPU twin runtime/numpy_kernels.py matmul, ggml's way: random inputs (random bytes in
every quantized weight field; activations packed by the twins' own packing), outputs poisoned with NaN
and a guard row that must stay untouched, NMSE against the twin.

Every weight format runs on each member kind: "mma" layouts (sm_80+), "wmma" layouts (gfx11) and the
dot-product tile; segmented, residual (also in place) and split-K launches with their fix-up; partial
tiles everywhere (rows, columns, and k for the 32-value formats).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from llmplan.codegen.families import gemm
from llmplan.codegen.kernel import Context
from llmplan.codegen.targets import TARGETS
from llmplan.runtime.numpy_kernels import matmul as cpu_matmul

from codegen_checks import needs_emulator, rng  # noqa: F401 (rng: a fixture)
from kernel_emu import runner
from kernel_inputs import nmse, pack_activation, random_weight
from launch_records import lowered, phase_buffers

pytestmark = needs_emulator

FORMATS = list(gemm.WEIGHT_FORMATS)
# the kernel's sums are exact integers scaled once per sub-block: far inside the 5e-4 bar of the
# accumulation-order class (what is left is float rounding of the scales and the accumulation)
TIGHT = 1e-9
TARGET = {"mma": "sm_90", "wmma": "gfx1151", "plain": "gfx942"}
MEMBER = {"mma": "mma_128x128", "wmma": "mma_64x128", "plain": "dot4_64x64"}
SEGMENTS = [("q4_k", "q4_k", "q6_k"), ("q8_0", "q5_0", "q4_0"), ("f16", "f16")]


def _kernels(mode: str) -> list:
    members = [MEMBER[mode]] + (["mma_64x64"] if mode == "mma" else ["mma_128x128"] if mode == "wmma" else [])
    ks = [gemm.kernel(m, (f,)) for m in members for f in FORMATS]
    m = MEMBER[mode]
    ks += [gemm.kernel(m, s) for s in SEGMENTS]
    ks += [gemm.kernel(m, ("q6_k",), residual=True), gemm.kernel(m, ("q5_1",), residual=True)]
    ks += [gemm.kernel(m, ("q4_k",), split=True), gemm.kernel(m, SEGMENTS[0], split=True),
           gemm.kernel(m, ("q8_0",), residual=True, split=True)]
    ks += [gemm.fixup_kernel(n, r) for n, r in ((1, False), (1, True), (3, False))]
    return ks


@functools.cache
def emulator(mode: str):
    return runner(_kernels(mode), mode=mode)


def k_for(fmt: str) -> int:
    """k: two 256-value super-blocks for the K-quants (4 k-tiles), 1.25 k-tiles for the 32-value formats,
    3 k-tiles of 64 and a partial fourth for F16."""
    return {256: 512, 32: 160, 1: 200}[gemm.WEIGHT_FORMATS[fmt][1]]


def run(mode, op, formats, rows, ns, rng, member=None, k=None, inplace=False):
    """Run the family's launches on the emulator and the CPU twin: (outputs, twin outputs)."""
    e = emulator(mode)
    member = member or MEMBER[mode]
    k = k or k_for(formats[0])
    act = gemm.WEIGHT_FORMATS[formats[0]][4]
    # real values packed by the twins' own packing, rows of different magnitudes
    xbuf, x = pack_activation((rng.standard_normal((rows, k)) * rng.uniform(0.1, 3.0, (rows, 1))).astype(np.float32),
                              act)
    weights = [random_weight(rng, f, n, k) for f, n in zip(formats, ns)]
    names = [f"w{i}" for i in range(len(formats))]
    bufs = [{"dtype": act, "shape": ["rows", k]}] + [{"dtype": "f32", "shape": ["rows", n]} for n in ns]
    args = [{"buf": 0}, *({"weight": w} for w in names)]
    outs = [{"buf": 1 + i} for i in range(len(ns))]
    ys = [np.full((rows + 1, n), np.nan, np.float32) for n in ns]  # poisoned, with a guard row
    arrays = {0: xbuf, **{1 + i: y for i, y in enumerate(ys)}}
    r = None
    if op == "matmul_residual":
        r = rng.standard_normal((rows, ns[0])).astype(np.float32)
        bufs.append({"dtype": "f32", "shape": ["rows", ns[0]]})
        args.append({"buf": len(bufs) - 1})
        if inplace:
            ys[0][:rows] = r
            arrays[len(bufs) - 1] = ys[0]
        else:
            arrays[len(bufs) - 1] = r
    ctx = Context(phase_buffers(bufs), {w: (f.upper(), (n, k)) for w, f, n in zip(names, formats, ns)}, TARGETS[TARGET[mode]])
    launches = gemm.launches(lowered({"op": op, "attrs": {}, "args": args, "outs": outs, "member": member}), ctx)
    scratch = {}

    def bind(ref):
        if "weight" in ref:
            return weights[names.index(ref["weight"])][0]
        if "scratch" in ref:  # poisoned too: every split must write its whole tile
            return scratch.setdefault("ws", np.full([rows if d == "rows" else d for d in ref["shape"]], np.nan, np.float32))
        return arrays[ref["buf"]]

    for ln in launches:
        e.launch(ln, bind, {"rows": rows})
    want = [np.empty((rows, n), np.float32) for n in ns]
    cpu_matmul(op, {}, want, x, *(w[1] for w in weights), *([r] if r is not None else []))
    for y in ys:
        assert np.isnan(y[rows]).all(), "wrote past the output rows"
        assert not np.isnan(y[:rows]).any(), f"{np.isnan(y[:rows]).sum()} outputs left unwritten"
    return [y[:rows] for y in ys], want


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", ["mma", "wmma", "plain"])
def test_matmul_matches_the_cpu_twin(mode, fmt, rng):
    # 70 rows: a partial row tile; 150 columns: a partial column tile
    got, want = run(mode, "matmul", [fmt], 70, [150], rng)
    assert nmse(got[0], want[0]) < TIGHT


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k", "q8_0", "q5_1", "f16"])
@pytest.mark.parametrize("mode,member", [("mma", "mma_64x64"), ("wmma", "mma_128x128")])
def test_other_tiles(mode, member, fmt, rng):
    got, want = run(mode, "matmul", [fmt], 130, [70], rng, member=member)
    assert nmse(got[0], want[0]) < TIGHT


@pytest.mark.parametrize("formats", SEGMENTS, ids="/".join)
@pytest.mark.parametrize("mode", ["mma", "wmma", "plain"])
def test_segmented(mode, formats, rng):
    ns = [150, 64, 40][: len(formats)]  # a segment of exactly one tile, and partial ones
    got, want = run(mode, "matmul_segmented", list(formats), 33, ns, rng)
    for g, w in zip(got, want):
        assert nmse(g, w) < TIGHT


@pytest.mark.parametrize("fmt", ["q6_k", "q5_1"])
@pytest.mark.parametrize("mode", ["mma", "wmma", "plain"])
def test_residual(mode, fmt, rng):
    got, want = run(mode, "matmul_residual", [fmt], 20, [100], rng)
    assert nmse(got[0], want[0]) < TIGHT


def test_residual_in_place(rng):
    """The residual may be the output itself: each element is read before it is written, by one thread."""
    got, want = run("mma", "matmul_residual", ["q6_k"], 20, [100], rng, inplace=True)
    assert nmse(got[0], want[0]) < TIGHT


@pytest.mark.parametrize("splits", [2, 3, 9])  # 9 > the 8 k-tiles: a split with nothing to do writes zeros
@pytest.mark.parametrize("mode", ["mma", "wmma", "plain"])
def test_split_k(mode, splits, rng):
    m = MEMBER[mode] + f"_k{splits}"
    got, want = run(mode, "matmul", ["q4_k"], 40, [72], rng, member=m, k=1024)
    assert nmse(got[0], want[0]) < TIGHT


@pytest.mark.parametrize("mode", ["mma", "wmma", "plain"])
def test_split_k_segmented_and_residual(mode, rng):
    m = MEMBER[mode] + "_k3"
    got, want = run(mode, "matmul_segmented", list(SEGMENTS[0]), 21, [80, 64, 30], rng, member=m, k=768)
    for g, w in zip(got, want):
        assert nmse(g, w) < TIGHT
    got, want = run(mode, "matmul_residual", ["q8_0"], 21, [50], rng, member=m, k=416)
    assert nmse(got[0], want[0]) < TIGHT
