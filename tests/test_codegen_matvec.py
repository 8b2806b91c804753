"""The wave mat-vec family (codegen/families/matvec.py, codegen/kernels/matvec.cu + quant.cuh).

Three kinds of check:
- the Launch records the family makes of lowered launches (names, grid, block, argument order, errors);
- builds: every weight format x variant (plain with 1 and 8 activation columns, 1..8 for Q4_K and Q6_K;
  residual; segmented with mixed formats) in one translation unit per target, for all five targets,
  with no spills, sane registers, no shared memory or stack, and the integer-dot and 128-bit-load
  instructions present;
- numbers: the kernels run on the CPU emulator (tests/kernel_emu.py: the same source, every lane a
  fiber, wave 32 and wave 64) against the CPU twin runtime/numpy_kernels.py matmul on random planar
  weights (every quant bit pattern) and packed activations, outputs poisoned and checked fully written.
  The sums differ from the twin's float32 BLAS only in order: a wrong index or bit shows as an NMSE
  above 1e-4, rounding below 1e-12, so the bound here is 1e-9 (docs/numerics.md's 5e-4 is the contract).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from llmplan.codegen.build import BuildError
from llmplan.codegen.families import matvec
from llmplan.codegen.kernel import Context
from llmplan.codegen.targets import TARGETS
from llmplan.core.formats import ACTIVATION_FORMAT
from llmplan.runtime.numpy_kernels import matmul as cpu_matmul

from codegen_checks import built, needs_emulator, rng  # noqa: F401 (rng: a fixture)
from kernel_emu import runner
from kernel_inputs import nmse, random_activation, random_weight
from launch_records import lowered, phase_buffers, wire

TIGHT = 1e-9
SEGMENTS = [["Q4_K", "Q4_K", "Q6_K"], ["Q4_K", "Q6_K"], ["Q5_K", "Q3_K", "Q2_K"], ["Q8_0", "Q4_0", "Q5_0"],
            ["Q4_1", "Q5_1"], ["F16", "F16", "F16"], ["Q6_K", "Q6_K", "Q6_K"]]


def context(target, weights: dict, buffers: list) -> Context:
    return Context(phase_buffers(buffers), weights, TARGETS[target])


# --- the Launch records ---------------------------------------------------------------------------------

def test_plain_launch():
    ctx = context("sm_90", {"blk.0.ffn_down.weight": ("Q6_K", (4096, 14336))},
                  [{"dtype": "q8_k", "shape": ["rows", 14336]}, {"dtype": "f32", "shape": ["rows", 4096]}])
    launch = lowered({"op": "matmul", "attrs": {}, "args": [{"buf": 0}, {"weight": "blk.0.ffn_down.weight"}],
              "outs": [{"buf": 1}], "member": "c1"})
    (ln,) = matvec.launches(launch, ctx)
    assert ln.kernel.name == "lp_matvec_q6_k_seg1_res0_c1"
    assert ln.kernel.family == "matmul" and ln.kernel.source == "matvec.cu"
    assert ln.kernel.block == 4 * 32 and ln.smem == 0
    assert ln.kernel.expects == ("dot4", "load128")
    assert ln.grid == (1024, ("rows", 1))
    assert wire(ln.args) == [{"buf": 0}, {"weight": "blk.0.ffn_down.weight", "layout": "planar"}, {"buf": 1},
                       {"i32": "rows"}, {"i32": 14336}, {"i32": 4096}]
    assert ln.kernel.entry.startswith("LP_KERNEL void __launch_bounds__(128, 1) lp_matvec_q6_k_seg1_res0_c1("
                                      "const void* x, const void* w0, float* y0, int rows, int k, int n0) {")


def test_segmented_launch_with_mixed_formats():
    ws = {"q": ("Q4_K", (4096, 4096)), "k": ("Q4_K", (1024, 4096)), "v": ("Q6_K", (1024, 4096))}
    bufs = [{"dtype": "q8_k", "shape": ["rows", 4096]}]
    bufs += [{"dtype": "f32", "shape": ["rows", n]} for n in (4096, 1024, 1024)]
    launch = lowered({"op": "matmul_segmented", "attrs": {},
              "args": [{"buf": 0}, {"weight": "q"}, {"weight": "k"}, {"weight": "v"}],
              "outs": [{"buf": 1}, {"buf": 2}, {"buf": 3}]})
    (ln,) = matvec.launches(launch, context("gfx942", ws, bufs))
    assert ln.kernel.name == "lp_matvec_q4_k_q4_k_q6_k_seg3_res0_c8"  # no member, symbolic rows: 8 columns
    assert ln.kernel.block == 4 * 64
    assert ln.grid == (6144 // 4, ("rows", 8))
    assert wire(ln.args) == [{"buf": 0}, {"weight": "q", "layout": "planar"}, {"weight": "k", "layout": "planar"},
                       {"weight": "v", "layout": "planar"}, {"buf": 1}, {"buf": 2}, {"buf": 3},
                       {"i32": "rows"}, {"i32": 4096}, {"i32": 4096}, {"i32": 1024}, {"i32": 1024}]
    assert "lp_matvec<LP_FMT_Q4_K, LP_FMT_Q4_K, LP_FMT_Q6_K, 3, false, 8>(" in ln.kernel.entry


def test_residual_launch():
    ctx = context("gfx1151", {"o": ("Q4_K", (4096, 4096))},
                  [{"dtype": "q8_k", "shape": [3, 4096]}, {"dtype": "f32", "shape": [3, 4096]},
                   {"dtype": "f32", "shape": [3, 4096]}])
    launch = lowered({"op": "matmul_residual", "attrs": {}, "args": [{"buf": 0}, {"weight": "o"}, {"buf": 1}],
              "outs": [{"buf": 2}]})
    (ln,) = matvec.launches(launch, ctx)
    assert ln.kernel.name == "lp_matvec_q4_k_seg1_res1_c3"  # a known row count: that many columns
    assert ln.grid == (1024, 1)
    assert wire(ln.args) == [{"buf": 0}, {"weight": "o", "layout": "planar"}, {"buf": 1}, {"buf": 2},
                       {"i32": 3}, {"i32": 4096}, {"i32": 4096}]
    assert "const float* r, float* y0" in ln.kernel.entry


def test_f16_weights_expect_no_integer_dots():
    ctx = context("sm_89", {"w": ("F16", (640, 640))},
                  [{"dtype": "f16", "shape": ["rows", 640]}, {"dtype": "f32", "shape": ["rows", 640]}])
    (ln,) = matvec.launches(lowered({"op": "matmul", "attrs": {}, "args": [{"buf": 0}, {"weight": "w"}], "outs": [{"buf": 1}],
                             "member": "c2"}), ctx)
    assert ln.kernel.name == "lp_matvec_f16_seg1_res0_c2" and ln.kernel.expects == ("load128",)


def test_columns():
    assert matvec.columns("", 1) == 1 and matvec.columns("", 5) == 5 and matvec.columns("", 300) == 8
    assert matvec.columns("", "rows") == 8
    assert matvec.columns("c4", "rows") == 4 and matvec.columns("c4", 1) == 4
    assert matvec.MEMBERS == ("c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8")


@pytest.mark.parametrize("target", ["sm_90", "gfx1100", "gfx942"])
def test_names_are_stable_and_the_same_on_every_target(target):
    t = TARGETS[target]
    assert matvec.kernel(["Q4_K"], False, 1, t).name == "lp_matvec_q4_k_seg1_res0_c1"
    assert matvec.kernel(["Q4_K", "Q4_K", "Q4_K"], False, 1, t).name == "lp_matvec_q4_k_seg3_res0_c1"
    assert matvec.kernel(["Q4_K", "Q6_K"], False, 8, t).name == "lp_matvec_q4_k_q6_k_seg2_res0_c8"
    assert matvec.kernel(["Q8_0"], True, 4, t).name == "lp_matvec_q8_0_seg1_res1_c4"


@pytest.mark.parametrize("weights, fmt, message", [
    ({"w": ("BF16", (64, 256))}, "bf16", "the kernels read"),
    ({"w": ("Q4_K", (64, 288))}, "q8_k", "not a multiple of 256"),
    ({"w": ("Q4_K", (64, 256))}, "q8_0", "takes q8_k activations"),
])
def test_errors(weights, fmt, message):
    k = weights["w"][1][1]
    ctx = context("sm_90", weights, [{"dtype": fmt, "shape": ["rows", k]}, {"dtype": "f32", "shape": ["rows", 64]}])
    with pytest.raises(BuildError, match=message):
        matvec.launches(lowered({"op": "matmul", "attrs": {}, "args": [{"buf": 0}, {"weight": "w"}], "outs": [{"buf": 1}]}), ctx)


def test_segments_must_share_the_activation_format():
    ctx = context("sm_90", {"a": ("Q4_K", (64, 256)), "b": ("Q8_0", (64, 256))},
                  [{"dtype": "q8_k", "shape": ["rows", 256]}] + [{"dtype": "f32", "shape": ["rows", 64]}] * 2)
    with pytest.raises(BuildError, match="different activations"):
        matvec.launches(lowered({"op": "matmul_segmented", "attrs": {}, "args": [{"buf": 0}, {"weight": "a"}, {"weight": "b"}],
                         "outs": [{"buf": 1}, {"buf": 2}]}), ctx)


# --- builds ---------------------------------------------------------------------------------------------

BATCHED = ("Q4_K", "Q6_K")  # the Q4_K_M recipe's formats: every column count; the others 1 and 8


def catalog(target) -> list:
    """Every format x variant: plain with 1 and 8 columns (1..8 for BATCHED), residual, mixed segments
    with 1 and 8 columns. (Column counts between 1 and 8 are the same code with fewer registers.)"""
    ks = [matvec.kernel([f], False, c, target) for f in matvec.FORMATS
          for c in (range(1, 9) if f in BATCHED else (1, 8))]
    ks += [matvec.kernel([f], True, 1, target) for f in matvec.FORMATS] + [matvec.kernel(["Q4_K"], True, 8, target)]
    ks += [matvec.kernel(s, False, c, target) for s in SEGMENTS for c in (1, 8)]
    return ks


@pytest.mark.parametrize("target", list(TARGETS))
def test_every_format_and_variant_builds(target):
    t = TARGETS[target]
    b = built(catalog, target)  # no spills, no stack
    assert "matmul" not in t.unsupported
    kernels = catalog(t)
    assert len(b.manifests) == len(kernels) == 11 * 2 + 2 * 6 + 11 + 1 + len(SEGMENTS) * 2
    for k in kernels:
        m = b.manifests[k.name]
        assert m.shared_bytes == 0, (k.name, m)
        # one row (decode): room for many waves per SM/CU; 8 rows keep more activations in registers
        assert 0 < m.registers <= (96 if k.name.endswith("_c1") else 160), (k.name, m.registers)
        assert m.threads == 4 * t.wave
        assert m.instructions["load128"] > 0, k.name
        if "f16" not in k.name:
            assert m.instructions["dot4"] > 0, k.name


# --- numbers on the emulator ------------------------------------------------------------------------------

@functools.cache
def emu(wave: int):
    t = TARGETS["gfx942" if wave == 64 else "sm_90"]
    ks = [matvec.kernel([f], False, 3, t) for f in matvec.FORMATS]
    ks += [matvec.kernel([f], True, 2, t) for f in matvec.FORMATS]
    ks += [matvec.kernel(s, False, 8, t) for s in SEGMENTS]
    ks += [matvec.kernel(["Q4_K"], False, c, t) for c in range(1, 9)]
    return runner(ks, wave), t


def k_for(fmt: str) -> int:
    """A row length whose pieces (values per lane and round) outnumber 64 lanes, with a partial last round."""
    return 256 * 17 if fmt.endswith("_K") else (8 if fmt == "F16" else 32) * 67


def run_matvec(wave, op, formats, rows, ns, rng, member, residual=False, inplace=False):
    """Run the family's launch on the emulator and the CPU twin; returns (outputs, twin outputs)."""
    e, t = emu(wave)
    k = k_for(formats[0])
    act = ACTIVATION_FORMAT[formats[0].lower()]
    xbuf, x = random_activation(rng, act, rows, k)
    planar, dense = zip(*(random_weight(rng, f, n, k) for f, n in zip(formats, ns)))
    names = [f"w{i}" for i in range(len(formats))]
    bufs = [{"dtype": act, "shape": ["rows", k]}] + [{"dtype": "f32", "shape": ["rows", n]} for n in ns]
    args = [{"buf": 0}, *({"weight": w} for w in names)]
    outs = [{"buf": 1 + i} for i in range(len(ns))]
    arrays = {0: xbuf}
    # outputs poisoned, with a poisoned guard row after them: nothing may be written there
    ys = [np.full((rows + 1, n), np.nan, np.float32) for n in ns]
    for i, y in enumerate(ys):
        arrays[1 + i] = y
    if residual:
        bufs.append({"dtype": "f32", "shape": ["rows", ns[0]]})
        args.append({"buf": len(bufs) - 1})
        r = rng.standard_normal((rows, ns[0])).astype(np.float32)
        if inplace:
            ys[0][:rows] = r
            arrays[len(bufs) - 1] = ys[0]
        else:
            arrays[len(bufs) - 1] = r
    ctx = Context(phase_buffers(bufs), {w: (f, (n, k)) for w, f, n in zip(names, formats, ns)}, t)
    (ln,) = matvec.launches(lowered({"op": op, "attrs": {}, "args": args, "outs": outs, "member": member}), ctx)
    by_name = dict(zip(names, planar))
    e.launch(ln, lambda ref: by_name[ref["weight"]] if "weight" in ref else arrays[ref["buf"]], {"rows": rows})
    want = [np.empty((rows, n), np.float32) for n in ns]
    if residual:
        cpu_matmul(op, {}, want, x, dense[0], r)
    else:
        cpu_matmul(op, {}, want, x, *dense)
    for y in ys:
        assert np.isnan(y[rows]).all(), "wrote past the output rows"
        assert not np.isnan(y[:rows]).any(), f"{np.isnan(y[:rows]).sum()} outputs left unwritten"
    return [y[:rows] for y in ys], want


WAVES = [32, 64]


@needs_emulator
@pytest.mark.parametrize("wave", WAVES)
@pytest.mark.parametrize("fmt", matvec.FORMATS)
def test_matmul_matches_the_cpu_twin(fmt, wave, rng):
    got, want = run_matvec(wave, "matmul", [fmt], 5, [19], rng, "c3")  # 2 column blocks, the 2nd partial
    assert nmse(got[0], want[0]) < TIGHT


@needs_emulator
@pytest.mark.parametrize("wave", WAVES)
@pytest.mark.parametrize("fmt", matvec.FORMATS)
def test_matmul_residual_matches_the_cpu_twin(fmt, wave, rng):
    got, want = run_matvec(wave, "matmul_residual", [fmt], 3, [9], rng, "c2", residual=True)
    assert nmse(got[0], want[0]) < TIGHT


@needs_emulator
def test_matmul_residual_in_place(rng):
    """The residual may be the output buffer itself: each element is read before it is written, by the
    same lane."""
    got, want = run_matvec(32, "matmul_residual", ["Q6_K"], 3, [9], rng, "c2", residual=True, inplace=True)
    assert nmse(got[0], want[0]) < TIGHT


@needs_emulator
@pytest.mark.parametrize("wave", WAVES)
@pytest.mark.parametrize("formats", SEGMENTS, ids="/".join)
def test_matmul_segmented_matches_the_cpu_twin(formats, wave, rng):
    ns = [9, 6, 7][: len(formats)]  # segment boundaries inside blocks of 4 waves
    got, want = run_matvec(wave, "matmul_segmented", formats, 8, ns, rng, "c8")
    for g, w in zip(got, want):
        assert nmse(g, w) < TIGHT


@needs_emulator
@pytest.mark.parametrize("columns", range(1, 9))
def test_batched_columns(columns, rng):
    """8 activation rows served C at a time: ceil(8 / C) passes over the weights."""
    got, want = run_matvec(32, "matmul", ["Q4_K"], 8, [6], rng, f"c{columns}")
    assert nmse(got[0], want[0]) < TIGHT
