"""The prefill GEMM family (codegen/families/gemm.py, codegen/kernels/gemm.cu + mma.cuh).

- Launch records: names, grids, arguments (planar weights, scalars, the split-K scratch and fix-up),
  member choice and errors.
- Builds: every member x weight format, plus segmented / residual / split-K epilogues and the fix-up
  kernels, for all five targets (gfx942 has no MMA member: the target declares gemm_mma unsupported),
  one translation unit per target: no spills, no stack, the matrix-core or dot-product instructions
  present, static shared memory exactly what shared_bytes() reports.
- Numbers: tests/test_codegen_gemm_emu.py (the kernels on the CPU with emulated fragments).
"""

from __future__ import annotations

import dataclasses

import pytest

from llmplan.codegen.build import BuildError
from llmplan.codegen.families import gemm
from llmplan.codegen.kernel import Context
from llmplan.codegen.targets import TARGETS

from codegen_checks import built
from launch_records import lowered, phase_buffers, wire

FORMATS = list(gemm.WEIGHT_FORMATS)
SEGMENTS = [("q8_0", "q5_0")]  # (and q4_k/q4_k/q6_k with split-K below)
SMEM_LIMIT = {"cuda": 48 * 1024, "hip": 64 * 1024}  # per block without opt-in (CUDA) / LDS (AMD)


def context(target: str, weights: dict, buffers: list) -> Context:
    return Context(phase_buffers(buffers), weights, TARGETS[target])


# --- Launch records -------------------------------------------------------------------------------

def test_plain_launch():
    ctx = context("sm_90", {"blk.0.attn_output.weight": ("Q4_K", (4096, 4096))},
                  [{"dtype": "q8_k", "shape": ["rows", 4096]}, {"dtype": "f32", "shape": ["rows", 4096]}])
    launch = lowered({"op": "matmul", "attrs": {}, "args": [{"buf": 0}, {"weight": "blk.0.attn_output.weight"}],
              "outs": [{"buf": 1}], "member": "mma_128x128"})
    (ln,) = gemm.launches(launch, ctx)
    k = ln.kernel
    assert k.name == "lp_gemm_mma_128x128_q4_k_res0"
    assert (k.family, k.source, k.block, k.expects) == ("gemm_mma", "gemm.cu", 256, ("imma",))
    assert ln.grid == (32, ("rows", 128), 1)
    assert ln.smem == 0
    assert wire(ln.args) == [{"buf": 0}, {"weight": "blk.0.attn_output.weight", "layout": "planar"}, {"buf": 1},
                             {"i32": "rows"}, {"i32": 4096}, {"i32": 4096}]
    assert k.entry.startswith("LP_KERNEL void __launch_bounds__(256) lp_gemm_mma_128x128_q4_k_res0(const void* x, "
                              "const void* w0, float* y0, int rows, int k, int n0) { lp_gemm<128, 128, 0, LP_FMT_Q4_K, "
                              "LP_FMT_Q4_K, LP_FMT_Q4_K, 1, 0, 0>(")


def test_segmented_launch():
    ws = {"q": ("Q4_K", (4096, 4096)), "k": ("Q4_K", (1024, 4096)), "v": ("Q6_K", (1000, 4096))}
    ctx = context("gfx1151", ws, [{"dtype": "q8_k", "shape": ["rows", 4096]}] +
                  [{"dtype": "f32", "shape": ["rows", n]} for n in (4096, 1024, 1000)])
    launch = lowered({"op": "matmul_segmented", "attrs": {}, "args": [{"buf": 0}, *({"weight": w} for w in ws)],
              "outs": [{"buf": 1}, {"buf": 2}, {"buf": 3}], "member": "mma_64x128"})
    (ln,) = gemm.launches(launch, ctx)
    assert ln.kernel.name == "lp_gemm_mma_64x128_q4_k_q4_k_q6_k_res0"
    assert ln.kernel.block == 256
    assert ln.grid == (32 + 8 + 8, ("rows", 64), 1)  # each segment starts its own column tiles
    assert wire(ln.args) == [{"buf": 0}, *({"weight": w, "layout": "planar"} for w in "qkv"), {"buf": 1}, {"buf": 2},
                             {"buf": 3}, {"i32": "rows"}, {"i32": 4096}, {"i32": 4096}, {"i32": 1024}, {"i32": 1000}]


def test_residual_launch_on_the_dot_product_member():
    ctx = context("gfx942", {"w": ("Q6_K", (4096, 14336))},
                  [{"dtype": "q8_k", "shape": ["rows", 14336]}, {"dtype": "f32", "shape": ["rows", 4096]},
                   {"dtype": "f32", "shape": ["rows", 4096]}])
    launch = lowered({"op": "matmul_residual", "attrs": {}, "args": [{"buf": 0}, {"weight": "w"}, {"buf": 2}],
              "outs": [{"buf": 1}], "member": "dot4_64x64"})
    (ln,) = gemm.launches(launch, ctx)
    assert ln.kernel.name == "lp_gemm_dot4_64x64_q6_k_res1"
    assert ln.kernel.family == "gemm_dot4" and ln.kernel.block == 128
    assert ln.kernel.expects == ("dot4",)
    assert ln.grid == (64, ("rows", 64), 1)
    assert wire(ln.args)[2] == {"buf": 2} and wire(ln.args)[3] == {"buf": 1}  # the residual, then the output


def test_split_k_launches_a_fixup():
    ctx = context("sm_89", {"gate": ("Q4_K", (14336, 4096)), "up": ("Q4_K", (14336, 4096))},
                  [{"dtype": "q8_k", "shape": ["rows", 4096]}, {"dtype": "f32", "shape": ["rows", 14336]},
                   {"dtype": "f32", "shape": ["rows", 14336]}])
    launch = lowered({"op": "matmul_segmented", "attrs": {}, "args": [{"buf": 0}, {"weight": "gate"}, {"weight": "up"}],
              "outs": [{"buf": 1}, {"buf": 2}], "member": "mma_64x64_k4"})
    main, fix = gemm.launches(launch, ctx)
    scratch = {"scratch": "gemm_splitk", "dtype": "f32", "shape": [4, "rows", 2 * 14336], "offset": 0, "bytes": 0}
    assert main.kernel.name == "lp_gemm_mma_64x64_q4_k_q4_k_res0_sk"
    assert main.grid == (2 * 224, ("rows", 64), 4)
    assert wire(main.args)[-2:] == [scratch, {"i32": 4}]
    assert fix.kernel.name == "lp_gemm_fixup_seg2_res0" and fix.kernel.family == "gemm_fixup"
    assert fix.grid == (112, ("rows", 1))
    assert wire(fix.args) == [scratch, {"i32": 4}, {"i32": "rows"}, {"buf": 1}, {"i32": 14336}, {"buf": 2}, {"i32": 14336}]
    assert wire(fix.args)[0] is wire(main.args)[-2] or wire(fix.args)[0] == wire(main.args)[-2]


def test_split_k_with_a_residual():
    ctx = context("sm_90", {"w": ("Q8_0", (640, 2048))},
                  [{"dtype": "q8_0", "shape": ["rows", 2048]}, {"dtype": "f32", "shape": ["rows", 640]},
                   {"dtype": "f32", "shape": ["rows", 640]}])
    launch = lowered({"op": "matmul_residual", "attrs": {}, "args": [{"buf": 0}, {"weight": "w"}, {"buf": 2}],
              "outs": [{"buf": 1}], "member": "mma_128x128_k2"})
    main, fix = gemm.launches(launch, ctx)
    assert main.kernel.name == "lp_gemm_mma_128x128_q8_0_res1_sk"
    assert fix.kernel.name == "lp_gemm_fixup_seg1_res1"
    assert wire(fix.args)[-1] == {"buf": 2} and wire(fix.args)[3] == {"buf": 1}


def test_f16_weights_use_f16_matrix_cores():
    k = gemm.kernel("mma_64x64", ("f16",))
    assert k.expects == ("hmma",)
    assert gemm.kernel("dot4_64x64", ("f16",)).expects == ()  # plain f32 FMAs


def test_default_members():
    assert gemm.default_member(TARGETS["sm_90"]) == "mma_128x128"
    assert gemm.default_member(TARGETS["gfx1100"]) == "mma_128x128"
    assert gemm.default_member(TARGETS["gfx942"]) == "dot4_64x64"
    assert gemm.members(TARGETS["gfx942"]) == ["dot4_64x64"]
    assert gemm.members(TARGETS["sm_89"]) == ["mma_128x128", "mma_64x128", "mma_64x64", "dot4_64x64"]
    ctx = context("gfx942", {"w": ("Q4_0", (64, 256))},
                  [{"dtype": "q8_0", "shape": ["rows", 256]}, {"dtype": "f32", "shape": ["rows", 64]}])
    launch = lowered({"op": "matmul", "attrs": {}, "args": [{"buf": 0}, {"weight": "w"}], "outs": [{"buf": 1}]})
    assert gemm.launches(launch, ctx)[0].kernel.name == "lp_gemm_dot4_64x64_q4_0_res0"
    assert gemm.launches(dataclasses.replace(launch, member="numpy"), ctx)[0].kernel.name == "lp_gemm_dot4_64x64_q4_0_res0"


def test_errors_name_the_problem():
    ctx = context("gfx942", {"w": ("Q4_K", (64, 256))},
                  [{"dtype": "q8_k", "shape": ["rows", 256]}, {"dtype": "f32", "shape": ["rows", 64]}])
    launch = lowered({"op": "matmul", "attrs": {}, "args": [{"buf": 0}, {"weight": "w"}], "outs": [{"buf": 1}],
              "member": "mma_128x128"})
    with pytest.raises(BuildError, match="no kernel for gfx942: CDNA3 MFMA"):
        gemm.launches(launch, ctx)
    with pytest.raises(BuildError, match="not one of"):
        gemm.launches(dataclasses.replace(launch, member="mma_96x96"), ctx)
    bf = context("sm_90", {"w": ("BF16", (64, 256))},
                 [{"dtype": "bf16", "shape": ["rows", 256]}, {"dtype": "f32", "shape": ["rows", 64]}])
    with pytest.raises(BuildError, match="weight w is BF16; the kernels read"):
        gemm.launches(dataclasses.replace(launch, member="mma_64x64"), bf)
    odd = context("sm_90", {"w": ("F16", (64, 100))},
                  [{"dtype": "f16", "shape": ["rows", 100]}, {"dtype": "f32", "shape": ["rows", 64]}])
    with pytest.raises(BuildError, match="not a multiple"):
        gemm.launches(dataclasses.replace(launch, member="mma_64x64"), odd)
    mixed = context("sm_90", {"a": ("Q4_K", (64, 256)), "b": ("Q8_0", (64, 256))},
                    [{"dtype": "q8_k", "shape": ["rows", 256]}] + [{"dtype": "f32", "shape": ["rows", 64]}] * 2)
    with pytest.raises(BuildError, match="different activations"):
        gemm.launches(lowered({"op": "matmul_segmented", "attrs": {}, "args": [{"buf": 0}, {"weight": "a"}, {"weight": "b"}],
                               "outs": [{"buf": 1}, {"buf": 2}], "member": "mma_64x64"}), mixed)


def test_names_are_stable():
    assert [gemm.kernel(m, f).name for m, f in [("mma_128x128", ("q6_k",)), ("mma_64x64", ("f16", "f16")),
                                                ("dot4_64x64", ("q5_k", "q2_k", "q3_k"))]] == [
        "lp_gemm_mma_128x128_q6_k_res0", "lp_gemm_mma_64x64_f16_f16_res0", "lp_gemm_dot4_64x64_q5_k_q2_k_q3_k_res0"]
    assert gemm.kernel("mma_64x128", ("q4_1",), residual=True, split=True).name == "lp_gemm_mma_64x128_q4_1_res1_sk"
    assert gemm.fixup_kernel(3, False).name == "lp_gemm_fixup_seg3_res0"


def test_shared_memory_fits_every_target_without_opt_in():
    for m in gemm.MEMBERS:
        for f in FORMATS:
            assert gemm.shared_bytes(m, [f]) <= min(SMEM_LIMIT.values()), (m, f)
    assert gemm.shared_bytes("mma_128x128", ["q2_k"]) == 45568  # the largest: 16-value scales and mins
    assert gemm.shared_bytes("mma_128x128", ["q4_k", "q4_k", "q6_k"]) == max(
        gemm.shared_bytes("mma_128x128", ["q4_k"]), gemm.shared_bytes("mma_128x128", ["q6_k"]))


# --- builds ---------------------------------------------------------------------------------------

def variants(t) -> list[tuple[str, tuple[str, ...], bool, bool]]:
    """(member, segment formats, residual, split) of every GEMM kernel the test builds for `t`."""
    out = []
    for m in gemm.members(t):
        out += [(m, (f,), False, False) for f in FORMATS] + [(m, s, False, False) for s in SEGMENTS]
        out += [(m, ("q6_k",), True, False), (m, ("q4_k", "q4_k", "q6_k"), False, True), (m, ("q8_0",), True, True)]
    return out


def catalog(t) -> list:
    ks = [gemm.kernel(m, f, r, s) for m, f, r, s in variants(t)]
    return ks + [gemm.fixup_kernel(n, r) for n, r in ((1, False), (1, True), (2, False), (3, False))]


@pytest.mark.parametrize("target", list(TARGETS))
def test_every_member_format_and_epilogue_builds(target):
    t = TARGETS[target]
    b = built(catalog, target)  # the gates (no spills, device code, expected instructions), no stack
    kernels = catalog(t)
    members = gemm.members(t)
    assert len(b.manifests) == len(kernels) == len(members) * (len(FORMATS) + len(SEGMENTS) + 3) + 4
    assert ("gemm_mma" in t.unsupported) == (target == "gfx942")
    shapes = {gemm.kernel(m, f, r, s).name: (m, f) for m, f, r, s in variants(t)}
    for k in kernels:
        m = b.manifests[k.name]
        assert 0 < m.registers <= (255 if t.nvidia else 256), (k.name, m.registers)
        assert m.threads == k.block
        if k.family == "gemm_fixup":
            assert m.shared_bytes == 0
            continue
        member, formats = shapes[k.name]
        assert m.shared_bytes == gemm.shared_bytes(member, formats), (k.name, m.shared_bytes)
        assert m.shared_bytes <= SMEM_LIMIT[t.vendor]
        assert m.instructions["load128"] > 0, k.name
        f16 = "_f16" in k.name
        if k.family == "gemm_mma":
            assert m.instructions["hmma" if f16 else "imma"] > 0, k.name
        elif not f16:
            assert m.instructions["dot4"] > 0, k.name
