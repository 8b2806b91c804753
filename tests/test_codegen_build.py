"""The kernel build on a machine without a GPU: one translation unit per target, manifests read from
the compilers, gates, a cache, and errors that name the kernel and the target; kernel sources that
leave vendor differences to vendor.h and mma.cuh."""

import dataclasses
import re

import pytest

from llmplan.codegen.build import KERNEL_DIR, BuildError, Manifest, build, gate, render
from llmplan.codegen.families import norm
from llmplan.codegen.kernel import Context, Kernel
from llmplan.codegen.targets import TARGETS

from conftest import require_compiler
from launch_records import lowered, phase_buffers

ALL = list(TARGETS)


def _norm_kernels():
    bufs = [{"dtype": "f32", "shape": ["rows", 1024]}, {"dtype": "q8_k", "shape": ["rows", 1024]},
            {"dtype": "q8_0", "shape": ["rows", 1024]}, {"dtype": "q8_1", "shape": ["rows", 1024]},
            {"dtype": "f32", "shape": ["rows", 1024]}]
    ctx = Context(phase_buffers(bufs), {"w": ("F32", (1024,))}, TARGETS["sm_90"])
    out = []
    for op, fmt, dst in [("rmsnorm_pack", "q8_k", 1), ("rmsnorm_pack", "q8_0", 2), ("rmsnorm_pack", "q8_1", 3),
                         ("pack", "q8_k", 1), ("pack", "q8_0", 2), ("pack", "q8_1", 3), ("rmsnorm", None, 4)]:
        args = [{"buf": 0}] if op == "pack" else [{"buf": 0}, {"weight": "w"}]
        launch = lowered({"op": op, "attrs": {"eps": 1e-5} | ({"format": fmt} if fmt else {}), "args": args,
                  "outs": [{"buf": dst}]})
        out += norm.launches(launch, ctx)
    return out


@pytest.mark.parametrize("target", ALL)
def test_norm_family_builds_everywhere(tmp_path, monkeypatch, target):
    require_compiler(TARGETS[target])  # skipped where it is missing (a GPU machine has no clang++-19); CI has it
    monkeypatch.setenv("LLMPLAN_CACHE", str(tmp_path))
    launches = _norm_kernels()
    b = build([ln.kernel for ln in launches], TARGETS[target])
    assert set(b.manifests) == {"lp_rmsnorm_pack_q8_k", "lp_rmsnorm_pack_q8_0", "lp_rmsnorm_pack_q8_1",
                                "lp_pack_q8_k", "lp_pack_q8_0", "lp_pack_q8_1", "lp_rmsnorm_f32"}
    for m in b.manifests.values():
        assert m.spill_bytes == 0 and m.stack_bytes == 0 and 0 < m.registers <= 64
        assert m.wave == TARGETS[target].wave and m.threads == 256
    assert b.manifests["lp_rmsnorm_pack_q8_k"].shared_bytes == 256  # the double per wave of the block sum
    assert b.binary[:4] in (b"\x7fELF", b"\x50\xed\x55\xba")  # an AMDGPU code object, or a CUDA fatbin


def test_cache_hits_and_recovers(tmp_path, monkeypatch):
    require_compiler(TARGETS["gfx1151"])
    monkeypatch.setenv("LLMPLAN_CACHE", str(tmp_path))
    kernels = [ln.kernel for ln in _norm_kernels()]
    first = build(kernels, TARGETS["gfx1151"])
    second = build(kernels, TARGETS["gfx1151"])
    assert not first.cached and second.cached and second.binary == first.binary
    assert second.manifests == first.manifests
    (entry,) = list((tmp_path / "kernels" / "gfx1151").glob("*.bin"))
    entry.write_bytes(b"garbage")  # a corrupt entry is rebuilt, not believed
    third = build(kernels, TARGETS["gfx1151"])
    assert not third.cached and third.binary == first.binary


def test_render_is_self_contained():
    src = render([ln.kernel for ln in _norm_kernels()])
    assert '#include "' not in src and src.count("// ---- vendor.h ----") == 1
    assert src.count("LP_KERNEL void") == 7


def test_compile_error_names_kernel_and_target(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMPLAN_CACHE", str(tmp_path))
    bad = Kernel("lp_broken", "norm", "norm.cu",
                 "LP_KERNEL void __launch_bounds__(256) lp_broken(float* x) { undefined_thing(x); }", 256)
    for target in ("sm_90", "gfx1151"):
        require_compiler(TARGETS[target])
        with pytest.raises(BuildError, match=rf"^kernel lp_broken for {target}: .*error.*undefined_thing"):
            build([bad], TARGETS[target])


def test_gates():
    k = Kernel("lp_k", "norm", "norm.cu", "", 256, expects=("dot4",))
    ok = Manifest("lp_k", "sm_90", 256, 40, 0, 0, 0, instructions={"dot4": 3, "load128": 0})
    gate([k], {"lp_k": ok}, TARGETS["sm_90"])
    with pytest.raises(BuildError, match="lp_k for sm_90: spills 16 bytes"):
        gate([k], {"lp_k": dataclasses.replace(ok, spill_bytes=16)}, TARGETS["sm_90"])
    with pytest.raises(BuildError, match=r"lp_k for gfx1151: does not use dot4 \(v_dot4_i32_iu8"):
        gate([k], {"lp_k": dataclasses.replace(ok, instructions={"dot4": 0})}, TARGETS["gfx1151"])
    with pytest.raises(BuildError, match="no device code"):
        gate([k], {"lp_k": dataclasses.replace(ok, instructions={})}, TARGETS["sm_90"])


def test_unsupported_family_is_refused_with_its_reason():
    k = Kernel("lp_mma", "gemm_mma", "norm.cu", "", 128)
    with pytest.raises(BuildError, match="lp_mma for gfx942: family gemm_mma is unsupported there: CDNA3 MFMA"):
        build([k], TARGETS["gfx942"])


VENDOR_BRANCH = re.compile(r"\s*#\s*(?:if|elif|ifdef|ifndef)\b.*\bLP_(?:MMA|WMMA|HIP|CUDA|CDNA|RDNA)\b")


def vendor_branches(source: str) -> list[str]:
    """The preprocessor branches on the vendor in a kernel source outside its tuning tables (struct
    Lp...Cfg): what differs between vendors belongs in vendor.h and mma.cuh, so that a kernel reads
    the same on every target."""
    tables = []
    for m in re.finditer(r"struct Lp\w*Cfg\b[^;{]*\{", source):
        depth, end = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(source[end], 0)
            end += 1
        tables.append((m.start(), end))
    return [m.group().strip() for m in re.finditer(r"(?m)^.*$", source)
            if VENDOR_BRANCH.match(m.group()) and not any(a <= m.start() < b for a, b in tables)]


def test_kernels_leave_vendor_differences_to_the_vendor_headers():
    assert {p.name: vendor_branches(p.read_text()) for p in KERNEL_DIR.glob("*.cu")} == \
        {p.name: [] for p in KERNEL_DIR.glob("*.cu")}
    injected = "struct LpXCfg {\n#if defined(LP_WMMA)\n#endif\n};\nvoid k() {\n#elif defined(LP_MMA)\n}\n"
    assert vendor_branches(injected) == ["#elif defined(LP_MMA)"]
