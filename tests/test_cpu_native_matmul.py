"""The CPU target's projections (codegen/cpu_families/matmul.py, codegen/cpu/matmul.h + unpack.h + quant.cuh)
against the NumPy twin runtime/numpy_kernels.py matmul, on every SIMD path this machine has.

Weights are random blocks as a GGUF stores them (every quant bit pattern, moderate scales of either
sign), read in place; activations random packed blocks (or f16 / bf16 / f32 values). The integer dot
products are exact and only the float sums' order differs from the twin's BLAS: a wrong bit or index
shows as an NMSE far above 1e-6, rounding lands near 1e-13, so the bound here is 1e-9 (docs/numerics.md's 5e-4
is the contract). Outputs are poisoned (NaN) with a guard row, and checked fully written. A row's result
must not depend on the rows beside it, the task size or the thread count: checked bit for bit.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from llmplan.codegen.build import BuildError
from llmplan.codegen import cpu_build
from llmplan.codegen.cpu_families import matmul
from llmplan.core import layouts
from llmplan.core.formats import ACTIVATION_FORMAT, FORMATS, dequantize
from llmplan.runtime.numpy_kernels import matmul as twin_matmul

from cpu_native import ISAS, context, cxx, each_compiler, library, needs_compiler, rng, run, weight  # noqa: F401 (rng: a fixture)
from kernel_inputs import nmse, random_activation
from launch_records import lowered, wire

TIGHT = 1e-9
# q|k|v and gate|up as recipes make them: IQ4_XS keeps a Q5_K attn_v in one launch (both take q8_k)
SEGMENTS = [["Q4_K", "Q4_K", "Q6_K"], ["Q5_0", "Q5_0", "Q8_0"], ["Q5_K", "Q3_K", "Q2_K"], ["Q4_1", "Q5_1"],
            ["F16", "F16"], ["IQ4_XS", "IQ4_XS", "Q5_K"], ["IQ4_NL", "Q8_0"]]


def catalog():
    ks = [matmul.kernel([f], False) for f in matmul.FORMATS] + [matmul.relayout(f) for f in matmul.RELAYOUT]
    ks += [matmul.kernel_in_place(f) for f in matmul.RELAYOUT] + [matmul.kernel_tile_twin(f) for f in matmul.RELAYOUT]
    ks += [matmul.kernel([f], True) for f in matmul.FORMATS]
    ks += [matmul.kernel(s, False) for s in SEGMENTS]
    return ks


def k_for(fmt: str) -> int:
    """Several blocks per row; float weights with a row that is not a multiple of 8 (the lanes' tail)."""
    return {"F32": 109, "F16": 109, "BF16": 109}.get(fmt, 256 * 3 if FORMATS[fmt].block == 256 else 32 * 13)


def activation(rng, fmt: str, rows: int, k: int):
    """(the buffer the kernel reads, what the twin reads) for a weight format's activation."""
    act = ACTIVATION_FORMAT[fmt.lower()]
    if act == "f32":
        a = rng.standard_normal((rows, k)).astype(np.float32)
        return a, a
    if act == "bf16":
        a = (rng.standard_normal((rows, k)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return a, a
    return random_activation(rng, act, rows, k)


def project(isa, op, formats, rows, ns, rng, member=None, residual=False, inplace=False, x=None, ws=None,
            threads=None, nan_free=True):
    """Run the family's launch; returns (outputs [rows, n] each, twin outputs, (x, weights) used). With
    nan_free, every output must be a number (the poison overwritten)."""
    lib = library(catalog, isa)
    if threads is not None:
        lib.set_threads(threads)
    k = k_for(formats[0])
    xbuf, xt = x if x is not None else activation(rng, formats[0], rows, k)
    ws = ws or [weight(rng, f, n, k) for f, n in zip(formats, ns)]
    names = [f"w{i}" for i in range(len(formats))]
    act = ACTIVATION_FORMAT[formats[0].lower()]
    bufs = [{"dtype": act, "shape": ["rows", k]}] + [{"dtype": "f32", "shape": ["rows", n]} for n in ns]
    args = [{"buf": 0}, *({"weight": w} for w in names)]
    arrays = {"buf:0": xbuf, **{f"weight:{w}": raw for w, (raw, _) in zip(names, ws)}}
    ys = [np.full((rows + 1, n), np.nan, np.float32) for n in ns]  # a poisoned guard row after the outputs
    for i, y in enumerate(ys):
        arrays[f"buf:{1 + i}"] = y
    r = None
    if residual:
        bufs.append({"dtype": "f32", "shape": ["rows", ns[0]]})
        args.append({"buf": len(bufs) - 1})
        r = rng.standard_normal((rows, ns[0])).astype(np.float32)
        if inplace:
            ys[0][:rows] = r
        arrays[f"buf:{len(bufs) - 1}"] = ys[0] if inplace else r
    ctx = context(bufs, {w: (f, (n, k)) for w, f, n in zip(names, formats, ns)})
    launch = lowered({"op": op, "attrs": {}, "args": args, "outs": [{"buf": 1 + i} for i in range(len(ns))], "member": member})
    run(lib, matmul.launches(launch, ctx), arrays, {"rows": rows}, ctx.weights)
    want = [np.empty((rows, n), np.float32) for n in ns]
    dense = [d for _, d in ws]
    if residual:
        twin_matmul(op, {}, want, xt, dense[0], r)
    else:
        twin_matmul(op, {}, want, xt, *dense)
    for y in ys:
        assert np.isnan(y[rows]).all(), "wrote past the output rows"
        assert not nan_free or not np.isnan(y[:rows]).any(), f"{np.isnan(y[:rows]).sum()} outputs left unwritten"
    return [y[:rows] for y in ys], want, ((xbuf, xt), ws)


# --- the Launch records ---------------------------------------------------------------------------------

def test_launch_record():
    ctx = context([{"dtype": "q8_k", "shape": ["rows", 2048]}, {"dtype": "f32", "shape": ["rows", 640]},
                   {"dtype": "f32", "shape": ["rows", 640]}], {"blk.0.ffn_down.weight": ("Q6_K", (640, 2048))})
    launch = lowered({"op": "matmul_residual", "attrs": {}, "member": "t32",
              "args": [{"buf": 0}, {"weight": "blk.0.ffn_down.weight"}, {"buf": 1}], "outs": [{"buf": 2}]})
    (ln,) = matmul.launches(launch, ctx)
    assert ln.kernel.name == "lp_cpu_matmul_q6_k_r16_seg1_res1" and ln.kernel.source == "matmul.h"
    assert ln.grid == (1,)
    assert wire(ln.args) == [{"buf": 0}, {"weight": "blk.0.ffn_down.weight", "layout": "rows16"}, {"buf": 1}, {"buf": 2},
                       {"i32": "rows"}, {"i32": 2048}, {"i32": 640}, {"i32": 32}, {"i32": matmul.DEFAULT_AHEAD},
                       {"i32": matmul.DEFAULT_COLS}]
    assert ln.kernel.entry.startswith("LP_KERNEL void lp_cpu_matmul_q6_k_r16_seg1_res1(const void* x, const void* w0, "
                                      "const float* r, float* y0, int rows, int k, int n0, int task_rows, int ahead, "
                                      "int cols) {")


def test_names_and_members():
    assert matmul.kernel(["Q4_K", "Q4_K", "Q6_K"], False).name == "lp_cpu_matmul_q4_k_r16_q4_k_r16_q6_k_r16_seg3_res0"
    assert matmul.kernel(["Q5_0", "Q5_0"], False).name == "lp_cpu_matmul_q5_0_r16_seg2_res0"
    assert matmul.kernel(["Q5_1", "Q5_1"], False).name == "lp_cpu_matmul_q5_1_seg2_res0"
    default = (matmul.DEFAULT_TASK_ROWS, matmul.DEFAULT_AHEAD, matmul.DEFAULT_COLS)
    assert matmul.schedule("t64") == (64, matmul.DEFAULT_AHEAD, 0) and matmul.schedule("") == default
    assert matmul.schedule("t8a0") == (8, 0, 0) and matmul.schedule("t8a3") == default
    assert matmul.schedule("t16c6") == (16, matmul.DEFAULT_AHEAD, 6)
    assert matmul.schedule("t16a1c2") == (16, 1, 2) and matmul.schedule("t16c5") == default
    assert matmul.candidates({}, None)[0] == f"t{matmul.DEFAULT_TASK_ROWS}"
    assert all(matmul.member(*matmul.schedule(m)) == m for m in matmul.MEMBERS)


@pytest.mark.parametrize("weights, fmt, message", [
    ({"w": ("Q4_K", (64, 288))}, "q8_k", "not a multiple of 256"),
    ({"w": ("Q4_K", (64, 256))}, "q8_0", "takes q8_k activations"),
    ({"w": ("IQ2_XS", (64, 256))}, "q8_k", "the kernels read"),
])
def test_errors(weights, fmt, message):
    k = weights["w"][1][1]
    ctx = context([{"dtype": fmt, "shape": ["rows", k]}, {"dtype": "f32", "shape": ["rows", 64]}], weights)
    with pytest.raises(BuildError, match=message):
        matmul.launches(lowered({"op": "matmul", "attrs": {}, "args": [{"buf": 0}, {"weight": "w"}], "outs": [{"buf": 1}]}), ctx)


def test_segments_must_share_the_activation_format():
    ctx = context([{"dtype": "q8_k", "shape": ["rows", 256]}] + [{"dtype": "f32", "shape": ["rows", 64]}] * 2,
                  {"a": ("Q4_K", (64, 256)), "b": ("Q8_0", (64, 256))})
    with pytest.raises(BuildError, match="different activations"):
        matmul.launches(lowered({"op": "matmul_segmented", "attrs": {}, "args": [{"buf": 0}, {"weight": "a"}, {"weight": "b"}],
                                 "outs": [{"buf": 1}, {"buf": 2}]}), ctx)


# --- numbers ---------------------------------------------------------------------------------------------

@each_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", matmul.FORMATS)
def test_matmul_matches_the_twin(fmt, isa, rng):
    got, want, _ = project(isa, "matmul", [fmt], 7, [37], rng, "t8")  # partial tasks and tiles
    assert nmse(got[0], want[0]) < TIGHT


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", matmul.FORMATS)
def test_matmul_residual_matches_the_twin(fmt, isa, rng):
    got, want, _ = project(isa, "matmul_residual", [fmt], 3, [21], rng, residual=True)
    assert nmse(got[0], want[0]) < TIGHT


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
def test_matmul_residual_in_place(isa, rng):
    """The residual may be the output buffer itself: each element is read before it is written."""
    got, want, _ = project(isa, "matmul_residual", ["Q6_K"], 3, [21], rng, residual=True, inplace=True)
    assert nmse(got[0], want[0]) < TIGHT


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("formats", SEGMENTS, ids="/".join)
def test_matmul_segmented_matches_the_twin(formats, isa, rng):
    got, want, _ = project(isa, "matmul_segmented", formats, 5, [19, 6, 9][: len(formats)], rng, "t8")
    for g, w in zip(got, want):
        assert nmse(g, w) < TIGHT


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", ["Q4_K", "Q6_K", "Q5_0", "Q8_0", "Q4_1", "F16", "IQ4_NL", "IQ4_XS"])
def test_a_row_alone_gets_the_same_bits(fmt, isa, rng):
    """Batching never changes a row's result: 9 rows at once, each row alone (with each prefetch distance),
    another task size, one thread instead of the pool and each pass width give the same bits."""
    rows, n = 9, 45
    got, _, (x, ws) = project(isa, "matmul", [fmt], rows, [n], rng, "t8")
    other, _, _ = project(isa, "matmul", [fmt], rows, [n], rng, "t32", x=x, ws=ws, threads=1)
    assert np.array_equal(got[0], other[0])
    library(catalog, isa).set_threads(2)
    for cols in matmul.COLS:
        other, _, _ = project(isa, "matmul", [fmt], rows, [n], rng, f"t16c{cols}", x=x, ws=ws)
        assert np.array_equal(got[0], other[0]), f"{cols} columns a pass"
    library(catalog, isa).set_threads(2)
    xbuf, xt = x
    k = k_for(fmt)
    for r in range(rows):
        one = activation(rng, fmt, 1, k)  # the same row, packed as a one-row buffer
        if isinstance(xt, np.ndarray):
            one = (np.ascontiguousarray(xbuf[r:r + 1]), np.ascontiguousarray(xt[r:r + 1]))
        else:
            for name, plane in xt.planes.items():
                one[1][name][...] = plane[r:r + 1]
        alone, _, _ = project(isa, "matmul", [fmt], 1, [n], rng, f"t16a{matmul.AHEAD[r % len(matmul.AHEAD)]}", x=one, ws=ws)
        assert np.array_equal(alone[0][0], got[0][r]), f"row {r} differs alone"


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
def test_nan_and_inf_propagate_as_in_the_twin(isa, rng):
    """A NaN weight scale makes that weight row's outputs NaN for every activation row; an infinite f32
    weight makes them infinite, with the twin's signs."""
    n, rows = 8, 3
    raw, _ = weight(rng, "Q8_0", n, k_for("Q8_0"))
    raw.view(np.dtype([("d", "<f2"), ("qs", "i1", 32)])).reshape(n, -1)["d"][2, 1] = np.nan
    got, want, _ = project(isa, "matmul", ["Q8_0"], rows, [n], rng, ws=[(raw, dequantize(raw, "Q8_0", (n, -1)))],
                          nan_free=False)
    assert np.isnan(got[0][:, 2]).all() and np.array_equal(np.isnan(got[0]), np.isnan(want[0]))
    raw, dense = weight(rng, "F32", n, k_for("F32"))
    raw.view(np.float32).reshape(n, -1)[5, 3] = np.inf
    got, want, _ = project(isa, "matmul", ["F32"], rows, [n], rng, ws=[(raw, dequantize(raw, "F32", (n, -1)))])
    assert np.isinf(got[0][:, 5]).all() and np.array_equal(got[0][:, 5], want[0][:, 5])
    assert np.array_equal(np.isfinite(got[0]), np.isfinite(want[0]))


@each_compiler
@pytest.mark.parametrize("fmt", sorted(matmul.RELAYOUT))
def test_rows16_gives_the_same_bits_on_every_path(fmt, rng):
    """Weights in rows16 records: exact integers per super-block, then the same float steps per row, so
    the scalar, avx2 and avx512 paths agree bit for bit."""
    rows, n = 6, 35
    first, _, (x, ws) = project(ISAS[0], "matmul", [fmt], rows, [n], rng, "t8")
    for isa in ISAS[1:]:
        got, _, _ = project(isa, "matmul", [fmt], rows, [n], rng, "t32", x=x, ws=ws)
        assert np.array_equal(got[0], first[0]), isa


@each_compiler
@pytest.mark.parametrize("fmt", sorted(matmul.RELAYOUT))
def test_the_kernels_make_the_records_numpy_makes(fmt, rng):
    """The records the runtime's cpu driver makes at load (matmul.relayout) are core/layouts.py's, byte for
    byte, whichever row groups a call makes; rows past the weight's end are zero; the file bytes it says
    it is done with cover the weight, in order."""
    rows, k = 1029, 512  # 65 row groups: two calls, the last group partial
    raw, _ = weight(rng, fmt, rows, k)
    want = layouts.make("rows16", raw, fmt, (rows, k))
    lib = library(catalog, ISAS[0])
    done = []
    got = matmul.make_held(lib, "rows16", raw, fmt, (rows, k), lambda lo, hi: done.append((lo, hi)))
    assert np.array_equal(got, want)
    assert done[0][0] == 0 and done[-1][1] == raw.nbytes and all(a[1] == b[0] for a, b in zip(done, done[1:]))
    assert len(done) == 2 and matmul.make_held(lib, "blocks", raw, fmt, (rows, k)) is None


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", sorted(matmul.RELAYOUT))
def test_the_in_place_kernels_of_relaid_out_formats_match_the_twin(fmt, isa, rng):
    """The kernel reading a RELAYOUT format's blocks in place (bench_relayout.py's baseline) stays right."""
    rows, n, k = 7, 37, k_for(fmt)
    raw, dense = weight(rng, fmt, n, k)
    x, xt = activation(rng, fmt, rows, k)
    y = np.full((rows, n), np.nan, np.float32)
    fn = library(catalog, isa).entry(matmul.kernel_in_place(fmt).name)[0]
    fn(x.ctypes.data, raw.ctypes.data, y.ctypes.data, rows, k, n, 8, matmul.DEFAULT_AHEAD, matmul.DEFAULT_COLS)
    want = np.empty((rows, n), np.float32)
    twin_matmul("matmul", {}, [want], xt, dense)
    assert nmse(y, want) < TIGHT


# --- the amx path: AMX int8 tiles over rows16 records (codegen/cpu/tiles.h) -----------------------------

NO_AMX = "this machine has no AMX (CPU flags amx_tile and amx_int8, and the kernel's arch_prctl permission)"


def tile_twin(isa, fmt, x, raw, rows, n, task_rows=16):
    """The tile engine's scalar twin on path `isa`: outputs [rows, n], poisoned first and checked written."""
    y = np.full((rows + 1, n), np.nan, np.float32)
    fn = library(catalog, isa).entry(matmul.kernel_tile_twin(fmt).name)[0]
    records = layouts.make("rows16", raw, fmt, (n, k_for(fmt)))
    fn(x.ctypes.data, records.ctypes.data, y.ctypes.data, rows, k_for(fmt), n, task_rows, matmul.DEFAULT_AHEAD,
       matmul.DEFAULT_COLS)
    assert np.isnan(y[rows]).all() and not np.isnan(y[:rows]).any()
    return y[:rows]


@needs_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", sorted(matmul.RELAYOUT))
def test_the_tile_twin_gives_the_other_paths_bits(fmt, isa, rng):
    """The amx path's code with its tile loads, dot products and stores computed in memory: for blocks of
    16 activation rows and a partial last block, the same bits as the scalar reference path and this
    path's own rows16 engine, and each row's result the same alone."""
    rows, n = 37, 35
    first, _, ((x, xt), ws) = project(ISAS[0], "matmul", [fmt], rows, [n], rng, "t8")
    want = first[0]
    path, _, _ = project(isa, "matmul", [fmt], rows, [n], rng, "t32", x=(x, xt), ws=ws)
    got = tile_twin(isa, fmt, x, ws[0][0], rows, n)
    assert np.array_equal(got, want) and np.array_equal(got, path[0])
    for r in (0, 17, 36):
        one, planes = activation(rng, fmt, 1, k_for(fmt))  # the same row, packed as a one-row buffer
        for name, plane in xt.planes.items():
            planes[name][...] = plane[r:r + 1]
        assert np.array_equal(tile_twin(isa, fmt, one, ws[0][0], 1, n, 32)[0], want[r]), f"row {r} differs alone"


@needs_compiler
@pytest.mark.skipif("amx" not in ISAS, reason=NO_AMX)
@pytest.mark.parametrize("fmt", sorted(matmul.RELAYOUT))
def test_the_amx_path_gives_the_other_paths_bits(fmt, rng):
    """On AMX: for more activation rows than one vector pass takes (tiles: full and partial blocks of 16)
    and for fewer (the vector engine), the scalar reference path's bits and the twin's."""
    n = 35
    for rows in (5, 7, 16, 33):
        want, _, ((x, xt), ws) = project(ISAS[0], "matmul", [fmt], rows, [n], rng, "t8")
        got, _, _ = project("amx", "matmul", [fmt], rows, [n], rng, "t16", x=(x, xt), ws=ws)
        assert np.array_equal(got[0], want[0]), f"{rows} rows"
        assert np.array_equal(tile_twin("amx", fmt, x, ws[0][0], rows, n), want[0]), f"{rows} rows, twin"


@each_compiler
def test_the_amx_path_compiles_to_tile_instructions(cxx, tmp_path):
    """Every machine compiles the amx path (-mamx-tile -mamx-int8) with each compiler (g++'s tile
    intrinsics are macros that paste a literal tile number into the instruction, clang's are builtins):
    its rows16 kernels configure the tiles, load them, take TDPBSUD and release them."""
    source = cpu_build.render([matmul.kernel([f], False) for f in sorted(matmul.RELAYOUT)])
    command = [*cxx.command, *cpu_build.FLAGS, *cpu_build.ISAS["amx"], "-x", "c++"]
    asm = subprocess.run([*command, "-S", "-o", "-", "-"], input=source, capture_output=True, text=True, check=True).stdout
    built = subprocess.run([*command, "-c", "-o", str(tmp_path / "amx.o"), "-"], input=source, capture_output=True,
                           text=True)  # the assembler reads what -S leaves as text (g++'s inline asm)
    assert built.returncode == 0, built.stderr[-2000:]
    for instruction in ("ldtilecfg", "tileloadd", "tdpbsud", "tilestored", "tilerelease"):
        assert f"\t{instruction}" in asm, instruction
