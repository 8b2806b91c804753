"""The CPU backend's kernels (runtime/numpy_kernels.py) against the reference interpreter (ir/interpret.py).

ggml's test-backend-ops method (docs/numerics.md, "Kernel by kernel"): for every kernel family and every op it
serves, fresh random inputs (never zeros) in several shapes, outputs poisoned before the call (NaN for
float outputs, 0x80 bytes for packed values, bf16 bit patterns and int32), the kernel called through
`KERNELS[TRAITS[op].family](op, attrs, outs, *inputs)` as the cpu driver calls it, its outputs checked
fully written and compared with `IMPLS[op]` on the same values: normalized MSE under 1e-7 for
exact-arithmetic kernels and 5e-4 for accumulation-order-sensitive ones, NaN/Inf positions equal.
Kernels and interpreter share core/numerics.py, so most comparisons are bit-exact and assert that too.

Packed outputs are also checked byte by byte against references that do not use our packing code:
models/quantize.py's Q8_0 quantizer (q8_0 and q8_1 `d`/`qs`), f16(d * sum(qs)) (q8_1 `s`), a transcription
of llama.cpp's quantize_row_q8_K_ref (q8_k), an independent round-to-nearest-even (bf16).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from llmplan.core import numerics as num
from llmplan.core.formats import ACTIVATION_FORMATS, FORMATS, dequantize, format_of, planes
from llmplan.core.numerics import PAGE
from llmplan.core.op_traits import FAMILIES, TRAITS
from llmplan.ir.interpret import IMPLS
from llmplan.ir.ops import with_defaults
from llmplan.models.quantize import quantize
from llmplan.runtime.numpy_kernels import KERNELS, MappedRows, Packed

from kernel_inputs import random_mask

F32, F16, U16 = np.float32, np.float16, np.uint16
EXACT = 1e-7  # packing, norms, integer-valued dots, elementwise
ORDER = 5e-4  # accumulation-order-sensitive (BLAS dots, attention softmax sums)
Q8 = ("q8_0", "q8_1", "q8_k")
PACK_FORMATS = Q8 + ("f16", "bf16")

# every op with a kernel family must appear here (test_every_catalog_op_is_tested_here checks it)
TESTED_OPS = {
    "embed", "rmsnorm", "rmsnorm_pack", "pack", "matmul", "matmul_segmented", "matmul_residual", "rope_kv",
    "norm_rope_kv", "attention", "attention_partial", "attention_reduce", "attention_reduce_pack", "glu_pack",
    "add", "mul", "scale", "silu", "gelu_tanh", "softcap", "take_rows", "tail_argmax", "moe_router", "matmul_experts",
    "matmul_experts_residual",
}


@pytest.fixture
def rng(request):
    """A generator seeded by the test's id: fresh data per case, the same data every run."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


# --- helpers ---------------------------------------------------------------------------------------

def run(op, attrs, outs, *inputs):
    KERNELS[TRAITS[op].family](op, attrs, outs, *inputs)


POISON = 0x80  # as int8 -128, which no q8 value takes; as int16/int32/bf16 bits, nothing a kernel writes


def poisoned(shape, dtype):
    """An output buffer full of poison: NaN for floats, 0x80 bytes for packed values, bf16 bits and ints."""
    dtype = np.dtype(dtype)
    out = np.empty(shape, dtype)
    if dtype.kind == "f":
        out.fill(np.nan)
    else:
        out.reshape(-1).view(np.uint8).fill(POISON)
    return out


def planar(blocks, fmt):
    """Blocks (a structured array of the format's layout) as the field planes the backend stores."""
    return Packed(fmt, {name: np.ascontiguousarray(blocks[name]) for name in blocks.dtype.names})


def act_buffer(fmt, rows, k):
    """A poisoned activation buffer as the cpu driver lays it out (runtime/drivers/cpu.py view)."""
    if fmt in Q8:
        f = ACTIVATION_FORMATS[fmt.upper()]
        return Packed(fmt, {p.name: poisoned(p.shape, p.dtype) for p in planes(f, rows, k)[0]})
    return poisoned((rows, k), {"f32": F32, "f16": F16, "bf16": U16}[fmt])


def assert_written(out):
    """No poison left: no NaN in float outputs, no element of all-POISON bytes in the others."""
    if isinstance(out, Packed):
        for plane in out.planes.values():
            assert_written(plane)
        return
    if out.dtype.kind == "f":
        assert not np.isnan(out).any(), f"{np.isnan(out).sum()} of {out.size} outputs left unwritten (NaN)"
    else:
        b = out.reshape(-1).view(np.uint8).reshape(out.size, out.dtype.itemsize)
        left = (b == POISON).all(axis=1).sum()
        assert left == 0, f"{left} of {out.size} output elements still hold the poison"


def values(a):
    """The float32 values an activation stands for, decoded here independently of cpu_kernels._values."""
    if isinstance(a, Packed):
        return (a["qs"].astype(F32) * a["d"].astype(F32)[..., None]).reshape(a.shape[0], -1)
    if a.dtype == U16:
        return (a.astype(np.uint32) << 16).view(F32)
    return a.astype(F32)


def nmse(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    fin = np.isfinite(want)
    return ((got[fin] - want[fin]) ** 2).sum() / max((want[fin] ** 2).sum(), 1e-300)


def assert_close(got, want, tol):
    """Same shape, NaN/+Inf/-Inf in the same places, normalized MSE of the finite rest under tol."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    for what, test in (("NaN", np.isnan), ("+Inf", np.isposinf), ("-Inf", np.isneginf)):
        np.testing.assert_array_equal(test(got), test(want), err_msg=f"{what} positions differ")
    err = nmse(got, want)
    assert err < tol, f"normalized MSE {err:.3g} >= {tol:g}"


def assert_same(got, want):
    """Bit-for-bit equal values (NaN where NaN): the kernel and the interpreter share core/numerics.py."""
    assert_close(got, want, EXACT)
    np.testing.assert_array_equal(got, want)


def normal(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(F32)


def random_activation(rng, fmt, rows, k):
    """A fresh activation in `fmt` drawn directly in its layout (no packing code involved), and its values."""
    if fmt == "f32":
        a = normal(rng, rows, k)
    elif fmt == "f16":
        a = normal(rng, rows, k).astype(F16)
    elif fmt == "bf16":
        a = (normal(rng, rows, k).view(np.uint32) >> 16).astype(U16)
    else:
        f = ACTIVATION_FORMATS[fmt.upper()]
        a = np.zeros((rows, k // f.block), f.layout)
        qs = rng.integers(1, 128, a.shape + (f.block,)) * rng.choice([-1, 1], a.shape + (f.block,))
        a["qs"] = qs.astype(np.int8)
        d = rng.uniform(0.004, 0.03, a.shape)
        if fmt == "q8_k":
            a["d"] = (d * rng.choice([-1, 1], a.shape)).astype(F32)  # q8_k scales carry the max's sign
            a["bsums"] = qs.reshape(*a.shape, 16, 16).sum(-1)
        else:
            a["d"] = d.astype(F16)
        if fmt == "q8_1":
            a["s"] = (a["d"].astype(F32) * qs.sum(-1).astype(F32)).astype(F16)
        a = planar(a, fmt)
    return a, values(a)


# --- independent references for packed bytes -------------------------------------------------------

def _nearest_int(fval: np.float32) -> int:
    """ggml's nearest_int: add 1.5 * 2^23 in float32 and read the mantissa (round half to even)."""
    val = np.float32(fval + np.float32(12582912.0))
    return (int(np.array(val, F32).view(np.int32)) & 0x007FFFFF) - 0x00400000


def quantize_row_q8_K_ref(x: np.ndarray):
    """llama.cpp's quantize_row_q8_K_ref (ggml-quants.c), transcribed loop for loop in float32."""
    nb = x.size // 256
    d, qs, bsums = np.zeros(nb, F32), np.zeros((nb, 256), np.int8), np.zeros((nb, 16), np.int16)
    for i in range(nb):
        xb = x[i * 256:(i + 1) * 256]
        amax, mx = np.float32(0), np.float32(0)
        for j in range(256):
            ax = abs(xb[j])
            if ax > amax:
                amax, mx = ax, xb[j]
        if not amax:
            continue  # d = 0, qs = 0
        iscale = np.float32(-127.0) / mx
        for j in range(256):
            qs[i, j] = min(127, _nearest_int(np.float32(iscale * xb[j])))
        for j in range(16):
            bsums[i, j] = int(qs[i, j * 16:(j + 1) * 16].astype(np.int32).sum())
        d[i] = np.float32(1.0) / iscale
    return d, qs, bsums


def bf16_bits_ref(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even to bf16 by comparing the two neighbouring bf16 values in float64."""
    x = np.asarray(x, F32)
    lo = (x.view(np.uint32) >> 16).astype(np.uint32)
    lo_v = (lo << 16).view(F32).astype(np.float64)
    hi_v = ((lo + 1) << 16).view(F32).astype(np.float64)
    x64 = x.astype(np.float64)
    dlo, dhi = np.abs(x64 - lo_v), np.abs(hi_v - x64)
    up = (dhi < dlo) | ((dhi == dlo) & (lo & 1 == 1))
    return (lo + up).astype(U16)


def check_packed(out: np.ndarray, x: np.ndarray, fmt: str) -> None:
    """The bytes of an activation `out` packed from float32 x [rows, K], against outside references."""
    rows = x.shape[0]
    if fmt == "f16":
        np.testing.assert_array_equal(out.view(U16), x.astype(F16).view(U16))
        return
    if fmt == "bf16":
        np.testing.assert_array_equal(out, bf16_bits_ref(x))
        return
    if fmt == "q8_k":
        for r in range(rows):
            d, qs, bsums = quantize_row_q8_K_ref(x[r])
            np.testing.assert_array_equal(out["d"][r].view(np.uint32), d.view(np.uint32), err_msg=f"d, row {r}")
            np.testing.assert_array_equal(out["qs"][r], qs, err_msg=f"qs, row {r}")
            np.testing.assert_array_equal(out["bsums"][r], bsums, err_msg=f"bsums, row {r}")
        # and bsums are the 16-value sums of the block's own qs
        np.testing.assert_array_equal(out["bsums"], out["qs"].reshape(rows, -1, 16, 16).astype(np.int32).sum(-1))
        return
    ref = quantize(x, "Q8_0").reshape(-1).view(FORMATS["Q8_0"].layout).reshape(rows, -1)
    np.testing.assert_array_equal(out["d"].view(U16), ref["d"].view(U16), err_msg="d differs from quantize(Q8_0)")
    # quantize multiplies by 1/(amax/127), we (like llama.cpp's x86 path) by 127/amax: an ulp apart, so a
    # value within a hair of a rounding tie may round either way. Random data has almost none of those.
    b = x.reshape(rows, -1, 32).astype(np.float64)
    amax = np.abs(b).max(-1, keepdims=True)
    with np.errstate(invalid="ignore"):  # all-zero blocks: NaN, never near
        t = np.abs(b * 127 / amax)
    near = np.abs(t % 1 - 0.5) < 1e-4
    assert near.sum() <= max(2, near.size // 500)  # the escape hatch stays rare
    np.testing.assert_array_equal(out["qs"][~near], ref["qs"][~near], err_msg="qs differs from quantize(Q8_0)")
    assert (np.abs(out["qs"][near].astype(int) - ref["qs"][near]) <= 1).all()
    if fmt == "q8_1":
        d32 = (np.abs(x.reshape(rows, -1, 32)).max(-1) / F32(127)).astype(F32)
        s = (d32 * out["qs"].astype(np.int32).sum(-1).astype(F32)).astype(F16)
        np.testing.assert_array_equal(out["s"].view(U16), s.view(U16), err_msg="s != f16(d * sum(qs))")


def tie_free(rng, rows, k, block, scale=1.0):
    """Normal data nudged so that no value sits within 0.03 of a rounding tie of its block's 8-bit grid
    (quantize() rounds ties away from zero, the activation packers to even)."""
    x = normal(rng, rows, k, scale=scale)
    b = x.reshape(rows, -1, block)
    amax = np.abs(b).max(-1, keepdims=True)
    t = np.abs(b.astype(np.float64) * 127 / amax)
    near = np.abs(t % 1 - 0.5) < 0.03
    b[...] = np.where(near, b - np.sign(b) * F32(0.06) * amax / F32(127), b)  # toward zero: amax unchanged
    return x


# --- catalog ---------------------------------------------------------------------------------------

def test_every_family_has_a_kernel_and_every_op_an_interpreter_implementation():
    assert set(FAMILIES) <= set(KERNELS), f"families without a CPU kernel: {sorted(set(FAMILIES) - set(KERNELS))}"
    assert set(KERNELS) <= set(FAMILIES), f"CPU kernels of no family: {sorted(set(KERNELS) - set(FAMILIES))}"
    missing = sorted(op for op, t in TRAITS.items() if t.family and op not in IMPLS)
    assert not missing, f"catalog ops the interpreter cannot run: {missing}"


def test_every_catalog_op_is_tested_here():
    assert TESTED_OPS == {op for op, t in TRAITS.items() if t.family}


# --- embed_rows ------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_1", "Q4_K", "Q6_K", "IQ4_NL", "IQ4_XS"])
def test_embed_rows(rng, fmt):
    vocab, n = 37, 512
    raw = quantize(normal(rng, vocab, n), fmt).reshape(-1)  # uint8, as mapped from the file
    tokens = np.array([5, 0, 36, 5, 17, 2], np.int32)  # repeats, first and last rows
    out = poisoned((len(tokens), n), F32)
    run("embed", {}, [out], MappedRows(raw, fmt, format_of(fmt).row_bytes(n)), tokens)
    assert_written(out)
    want = IMPLS["embed"]({}, dequantize(raw, fmt, (vocab, n)), tokens)
    assert_same(out, want)  # the same dequantization of the same rows


# --- rmsnorm, rmsnorm_pack, pack -------------------------------------------------------------------

@pytest.mark.parametrize("rows,k,group", [(1, 256, 256), (5, 384, 384), (4, 128, 32)])  # last: per-head
def test_rmsnorm(rng, rows, k, group):
    x, w = normal(rng, rows, k, scale=3.0), normal(rng, group)
    a = {"eps": 1e-6}
    out = poisoned((rows, k), F32)
    run("rmsnorm", a, [out], x, w)
    assert_written(out)
    assert_same(out, IMPLS["rmsnorm"](a, x, w))  # shared numerics.rmsnorm
    x64 = x.astype(np.float64).reshape(rows, -1, group)
    direct = (x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * w).reshape(rows, k)
    assert_close(out, direct, EXACT)


@pytest.mark.parametrize("fmt", PACK_FORMATS)
@pytest.mark.parametrize("rows,k", [(1, 256), (4, 512)])
def test_pack(rng, fmt, rows, k):
    block = 256 if fmt == "q8_k" else 32
    x = tie_free(rng, rows, k, block, scale=2.0)
    a = {"format": fmt}
    out = act_buffer(fmt, rows, k)
    run("pack", a, [out], x)
    assert_written(out)
    assert_same(values(out), IMPLS["pack"](a, x))  # same rounding as the interpreter
    check_packed(out, x, fmt)


def test_pack_blocks_of_zeros(rng):
    """An all-zero block (one in an otherwise random row) packs to d = 0, qs = 0 as llama.cpp does."""
    x = normal(rng, 2, 512)
    x[1, 256:] = 0
    for fmt in Q8:
        out = act_buffer(fmt, 2, 512)
        run("pack", {"format": fmt}, [out], x)
        assert_same(values(out), IMPLS["pack"]({"format": fmt}, x))
        check_packed(out, x, fmt)


@pytest.mark.parametrize("fmt", Q8)
def test_pack_rounds_exact_ties_to_even(rng, fmt):
    """Exact ties (block max 127, so the scale is 1): half to even, as llama.cpp's x86 packers and
    nearest_int do, not quantize()'s half away from zero."""
    k = 256
    x = np.round(normal(rng, 2, k, scale=30.0)) + F32(0.25)  # off-tie filler
    ties = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -125.5], F32)
    for blk in range(k // 32):
        x[:, blk * 32] = 127.0
        x[:, blk * 32 + 1:blk * 32 + 1 + len(ties)] = ties
    x = np.clip(x, -126.75, 127.0)
    out = act_buffer(fmt, 2, k)
    run("pack", {"format": fmt}, [out], x)
    assert_written(out)
    assert_same(values(out), IMPLS["pack"]({"format": fmt}, x))
    sign = -1 if fmt == "q8_k" else 1  # q8_k's scale is -max/127
    qs = out["qs"].reshape(2, -1, 32)[:, :, 1:1 + len(ties)] * sign
    np.testing.assert_array_equal(qs, np.broadcast_to(np.array([0, 2, 2, 0, -2, -2, 126, -126]), qs.shape))
    if fmt == "q8_k":
        check_packed(out, x, fmt)


@pytest.mark.parametrize("fmt", PACK_FORMATS)
@pytest.mark.parametrize("rows", [1, 3])
def test_rmsnorm_pack(rng, fmt, rows):
    k = 512
    x, w = normal(rng, rows, k, scale=0.5), normal(rng, k)
    a = {"eps": 1e-5, "format": fmt}
    out = act_buffer(fmt, rows, k)
    run("rmsnorm_pack", a, [out], x, w)
    assert_written(out)
    assert_same(values(out), IMPLS["rmsnorm_pack"](a, x, w))
    check_packed(out, IMPLS["rmsnorm"](a, x, w), fmt)  # the unfused norm's values, packed as llama.cpp would


# --- matmul family ---------------------------------------------------------------------------------

def _matmul_reference(x, w):
    return x.astype(np.float64) @ w.astype(np.float64).T


@pytest.mark.parametrize("fmt", ("f32", "f16", "bf16") + Q8)
@pytest.mark.parametrize("rows", [1, 6])
def test_matmul(rng, fmt, rows):
    k, n = 512, 48
    x, xv = random_activation(rng, fmt, rows, k)
    w = normal(rng, n, k, scale=0.05)
    out = poisoned((rows, n), F32)
    run("matmul", {}, [out], x, w)
    assert_written(out)
    assert_close(out, IMPLS["matmul"]({}, xv, w), ORDER)  # float32 BLAS: order-sensitive (bit-equal here)
    assert_close(out, _matmul_reference(xv, w), ORDER)


@pytest.mark.parametrize("fmt", ["q8_0", "q8_k", "bf16"])
def test_matmul_segmented(rng, fmt):
    rows, k = 4, 256
    x, xv = random_activation(rng, fmt, rows, k)
    ws = [normal(rng, n, k, scale=0.05) for n in (64, 16, 16)]  # q | k | v
    outs = [poisoned((rows, w.shape[0]), F32) for w in ws]
    run("matmul_segmented", {}, outs, x, *ws)
    want = IMPLS["matmul_segmented"]({}, xv, *ws)
    assert isinstance(want, tuple) and len(want) == 3
    for o, wt, w in zip(outs, want, ws):
        assert_written(o)
        assert_close(o, wt, ORDER)
        assert_close(o, _matmul_reference(xv, w), ORDER)


@pytest.mark.parametrize("fmt", ["f32", "q8_0", "q8_1"])
@pytest.mark.parametrize("rows", [1, 5])
def test_matmul_residual(rng, fmt, rows):
    k, n = 256, 96
    x, xv = random_activation(rng, fmt, rows, k)
    w, r = normal(rng, n, k, scale=0.05), normal(rng, rows, n)
    out = poisoned((rows, n), F32)
    run("matmul_residual", {}, [out], x, w, r)
    assert_written(out)
    assert_close(out, IMPLS["matmul_residual"]({}, xv, w, r), ORDER)
    assert_close(out, r + _matmul_reference(xv, w), ORDER)


# --- mixture of experts ----------------------------------------------------------------------------

@pytest.mark.parametrize("experts, top", [(8, 2), (128, 8)])
def test_moe_router(rng, experts, top):
    rows, k = 6, 128
    x, gate = normal(rng, rows, k), normal(rng, experts, k, scale=0.1)
    ids, w = poisoned((rows, top), np.int32), poisoned((rows, top), F32)
    run("moe_router", {"k": top, "norm": True}, [ids, w], x, gate)
    assert_written(ids)
    assert_written(w)
    want_ids, want_w = IMPLS["moe_router"]({"k": top, "norm": True}, x, gate)
    assert_same(ids, want_ids)
    assert_same(w, want_w)
    p = np.exp(_matmul_reference(x, gate))
    p /= p.sum(axis=1, keepdims=True)
    assert (ids == np.argsort(-p, axis=1)[:, :top]).all()  # independent of our softmax and sort
    chosen = np.take_along_axis(p, ids, axis=1)
    assert_close(w, chosen / chosen.sum(axis=1, keepdims=True), EXACT)


@pytest.mark.parametrize("fmt", ["f32", "q8_0", "q8_k"])
@pytest.mark.parametrize("rows, sliced", [(1, False), (5, True)])
def test_matmul_experts(rng, fmt, rows, sliced):
    experts, top, k, n = 6, 3, 256, 32
    x, xv = random_activation(rng, fmt, rows, top * k if sliced else k)
    w = normal(rng, experts, n, k, scale=0.05)
    ids = rng.integers(0, experts, (rows, top)).astype(np.int32)
    out = poisoned((rows, top * n), F32)
    run("matmul_experts", {}, [out], x, w, ids)
    assert_written(out)
    assert_close(out, IMPLS["matmul_experts"]({}, xv, w, ids), ORDER)
    xs = xv.reshape(rows, -1, k) if sliced else np.repeat(xv[:, None], top, axis=1)
    for j in range(top):
        want = np.einsum("rk,rnk->rn", xs[:, j].astype(np.float64), w[ids[:, j]].astype(np.float64))
        assert_close(out[:, j * n:(j + 1) * n], want, ORDER)


@pytest.mark.parametrize("fmt", ["q8_0", "q8_k"])
def test_matmul_experts_residual(rng, fmt):
    rows, experts, top, k, n = 4, 5, 2, 256, 48
    x, xv = random_activation(rng, fmt, rows, top * k)
    w, r = normal(rng, experts, n, k, scale=0.05), normal(rng, rows, n)
    ids = rng.integers(0, experts, (rows, top)).astype(np.int32)
    wt = rng.random((rows, top)).astype(F32)
    out = poisoned((rows, n), F32)
    run("matmul_experts_residual", {}, [out], x, w, ids, wt, r)
    assert_written(out)
    assert_close(out, IMPLS["matmul_experts_residual"]({}, xv, w, ids, wt, r), ORDER)
    xs = xv.reshape(rows, top, k).astype(np.float64)
    want = r + sum(wt[:, j:j + 1] * np.einsum("rk,rnk->rn", xs[:, j], w[ids[:, j]].astype(np.float64)) for j in range(top))
    assert_close(out, want, ORDER)


# --- rope_kv, norm_rope_kv -------------------------------------------------------------------------

ROPE_CASES = [  # heads, kv_heads, head_dim, dims, mode, factors, scale
    (4, 2, 16, 16, "norm", False, 1.0),
    (4, 2, 16, 16, "norm", True, 1.0),
    (8, 1, 32, 32, "neox", False, 1.0),
    (4, 4, 32, 16, "neox", True, 0.25),  # partial rotary: features past `dims` pass through
    (6, 2, 16, 8, "norm", False, 0.5),
]


def _page_table(rng, slots, ctx):
    """Each of `slots` sequences' pages, for `ctx` positions, as blocks in a random order."""
    n = -(-ctx // PAGE)
    return rng.permutation(slots * n).astype(np.int32).reshape(slots, n)


def _paged(logical, pages):
    """A cache written as [layers, 2, slots, ctx, kv] (readable in tests) as the kernels' paged cache
    [layers, 2, blocks, PAGE, kv] through the page table; positions past ctx are NaN."""
    layers, _, slots, ctx, kv = logical.shape
    n = pages.shape[1]
    padded = np.full((layers, 2, slots, n * PAGE, kv), np.nan, logical.dtype)
    padded[:, :, :, :ctx] = logical
    paged = np.empty((layers, 2, slots * n, PAGE, kv), logical.dtype)
    paged[:, :, pages.reshape(-1)] = padded.reshape(layers, 2, slots * n, PAGE, kv)
    return paged


def _logical(paged, pages, ctx):
    """The inverse of _paged."""
    layers, _, _, _, kv = paged.shape
    slots, n = pages.shape
    return paged[:, :, pages.reshape(-1)].reshape(layers, 2, slots, n * PAGE, kv)[:, :, :, :ctx]


def _rope_inputs(rng, heads, kv_heads, d):
    layers, slots, ctx = 3, 3, 24
    seq = np.array([0, 2, 2, 2, 1], np.int32)
    pos = np.array([23, 0, 1, 2, 9], np.int32)  # unique (slot, position) cells
    rows = len(seq)
    q, k, v = normal(rng, rows, heads * d), normal(rng, rows, kv_heads * d), normal(rng, rows, kv_heads * d)
    cache = normal(rng, layers, 2, slots, ctx, kv_heads * d).astype(F16)
    return q, k, v, pos, seq, cache


def _check_rope_kv(op, a, q, k, v, pos, seq, cache, extra, rng):
    layer, ctx = a["layer"], cache.shape[3]
    before = cache.copy()
    for kv in (0, 1):  # poison the cells the kernel must write
        cache[layer, kv, seq, pos] = np.nan
    pages = _page_table(rng, cache.shape[2], ctx)
    paged, ref_cache = _paged(cache, pages), _paged(before, pages)
    out = poisoned(q.shape, F32)
    run(op, a, [out, paged], q, k, v, pos, seq, pages, paged, *extra)
    assert_written(out)
    cache = _logical(paged, pages, ctx)
    assert not np.isnan(cache).any(), "cache cells left unwritten"
    want_q, want_cache = IMPLS[op](with_defaults(op, a), q, k, v, pos, seq, pages, ref_cache, *extra)
    assert_same(out, want_q)
    np.testing.assert_array_equal(paged.view(U16), want_cache.view(U16))
    np.testing.assert_array_equal(_logical(want_cache, pages, ctx).view(U16), cache.view(U16))
    # side effects: exactly the [layer, K/V, seq[r], pos[r]] cells changed, holding f16 roped K and f16 V
    written = np.zeros(cache.shape[:4], bool)
    written[layer, :, seq, pos] = True
    np.testing.assert_array_equal(cache[~written].view(U16), before[~written].view(U16))
    ka = k if op == "rope_kv" else IMPLS["rmsnorm"](a, k, extra[1])
    rope_a = with_defaults("rope", {key: a[key] for key in ("dims", "base", "scale", "mode")})
    k_roped = IMPLS["rope"]({**rope_a, "heads": a["kv_heads"]}, ka, pos, *extra[:1] if op == "rope_kv" else ())
    np.testing.assert_array_equal(cache[layer, 0, seq, pos].view(U16), k_roped.astype(F16).view(U16))
    np.testing.assert_array_equal(cache[layer, 1, seq, pos].view(U16), v.astype(F16).view(U16))


@pytest.mark.parametrize("heads,kv_heads,d,dims,mode,with_factors,scale", ROPE_CASES)
def test_rope_kv(rng, heads, kv_heads, d, dims, mode, with_factors, scale):
    q, k, v, pos, seq, cache = _rope_inputs(rng, heads, kv_heads, d)
    a = {"heads": heads, "kv_heads": kv_heads, "dims": dims, "base": 10000.0, "scale": scale, "mode": mode, "layer": 1}
    extra = [rng.uniform(1.0, 8.0, dims // 2).astype(F32)] if with_factors else []
    _check_rope_kv("rope_kv", a, q, k, v, pos, seq, cache, extra, rng)


@pytest.mark.parametrize("heads,kv_heads,d,dims,mode", [(4, 1, 32, 32, "neox"), (4, 2, 16, 16, "norm")])
def test_norm_rope_kv(rng, heads, kv_heads, d, dims, mode):
    q, k, v, pos, seq, cache = _rope_inputs(rng, heads, kv_heads, d)
    q, k = q * 4, k * 4
    a = {"heads": heads, "kv_heads": kv_heads, "dims": dims, "base": 1e6, "scale": 1.0, "mode": mode, "layer": 2,
         "eps": 1e-6}
    _check_rope_kv("norm_rope_kv", a, q, k, v, pos, seq, cache, [normal(rng, d), normal(rng, d)], rng)


# --- attention -------------------------------------------------------------------------------------

ATTN_CASES = {  # heads, kv_heads, d, ctx, chunk, window, seq, pos
    "decode-gqa": (4, 2, 16, 48, 16, 0, [0, 1, 2], [37, 5, 20]),
    "prefill-mqa-window": (8, 1, 16, 40, 8, 7, [1] * 6 + [0], [10, 11, 12, 13, 14, 15, 33]),
    "mha-window-over-chunks": (2, 2, 32, 64, 16, 20, [0, 1, 0], [63, 19, 40]),
    "one-chunk": (4, 2, 16, 32, 32, 0, [0, 1], [31, 3]),
}


def _attention_inputs(rng, case):
    heads, kv_heads, d, ctx, chunk, window, seq, pos = ATTN_CASES[case]
    layers, slots, layer = 2, 3, 1
    seq, pos = np.array(seq, np.int32), np.array(pos, np.int32)
    q = normal(rng, len(seq), heads * d)
    cache = normal(rng, layers, 2, slots, ctx, kv_heads * d).astype(F16)
    # cells no row may read are NaN: any leak past the causal mask or the window shows in the output
    readable = np.zeros(cache.shape[:4], bool)
    for s, p in zip(seq, pos):
        lo = max(0, p - window + 1) if window else 0
        readable[layer, :, s, lo:p + 1] = True
    cache[~readable] = np.nan
    a = {"layer": layer, "heads": heads, "kv_heads": kv_heads, "scale": float(d ** -0.5), "window": window}
    pages = _page_table(rng, slots, ctx)
    return a, chunk, q, cache, _paged(cache, pages), seq, pages, pos


def _naive_attention(q, cache, seq, pos, layer, heads, kv_heads, scale, window):
    """float64 softmax attention of f16-rounded queries, per row and head."""
    d = q.shape[1] // heads
    qf = q.astype(F16).astype(np.float64)
    out = np.zeros(q.shape, np.float64)
    for r, (s, p) in enumerate(zip(seq, pos)):
        lo = max(0, p - window + 1) if window else 0
        kk = cache[layer, 0, s, lo:p + 1].astype(np.float64).reshape(-1, kv_heads, d)
        vv = cache[layer, 1, s, lo:p + 1].astype(np.float64).reshape(-1, kv_heads, d)
        for h in range(heads):
            kh = h // (heads // kv_heads)
            sc = kk[:, kh] @ qf[r, h * d:(h + 1) * d] * scale
            e = np.exp(sc - sc.max())
            out[r, h * d:(h + 1) * d] = e @ vv[:, kh] / e.sum()
    return out


@pytest.mark.parametrize("case", ATTN_CASES)
def test_attention(rng, case):
    a, _, q, cache, paged, seq, pages, pos = _attention_inputs(rng, case)
    out = poisoned(q.shape, F32)
    run("attention", a, [out], q, paged, seq, pages, pos)
    assert_written(out)
    assert_same(out, IMPLS["attention"](a, q, paged, seq, pages, pos))  # shared numerics.attention
    assert_close(out, _naive_attention(q, cache, seq, pos, **a), ORDER)


@pytest.mark.parametrize("case", ATTN_CASES)
def test_attention_partial_and_reduce(rng, case):
    a, chunk, q, cache, paged, seq, pages, pos = _attention_inputs(rng, case)
    heads, d, splits = a["heads"], q.shape[1] // a["heads"], -(-pages.shape[1] * PAGE // chunk)
    pa = {**a, "chunk": chunk}
    part = poisoned((q.shape[0], heads, splits, d + 2), F32)
    run("attention_partial", pa, [part], q, paged, seq, pages, pos)
    assert_written(part)  # unused slices too: (0, -inf, 0)
    want = IMPLS["attention_partial"](pa, q, paged, seq, pages, pos)
    assert_same(part, want)  # -inf in the same places
    assert np.isneginf(part[..., d]).any() == (splits > 1)
    out = poisoned(q.shape, F32)
    run("attention_reduce", {}, [out], part)
    assert_written(out)
    assert_same(out, IMPLS["attention_reduce"]({}, part))
    whole = IMPLS["attention"](a, q, paged, seq, pages, pos)
    assert_close(out, whole, ORDER)  # split-context = unsplit up to the per-slice f16 weights
    if splits == 1:
        np.testing.assert_array_equal(out, whole)  # one slice: the same bits
    assert_close(out, _naive_attention(q, cache, seq, pos, **a), ORDER)


def _random_partials(rng, rows, heads, splits, d):
    """Fresh partials: positive exp sums, finite maxima, some leading and trailing slices empty."""
    part = np.zeros((rows, heads, splits, d + 2), F32)
    part[..., :d] = normal(rng, rows, heads, splits, d, scale=3.0)
    part[..., d] = normal(rng, rows, heads, splits, scale=2.0)
    part[..., d + 1] = rng.uniform(1.0, 20.0, (rows, heads, splits))
    for r in range(rows):
        used = slice(r % 2, splits - (r % 3))
        empty = np.ones(splits, bool)
        empty[used] = False
        part[r, :, empty, :d], part[r, :, empty, d], part[r, :, empty, d + 1] = 0, -np.inf, 0
    return part


def _combine64(part):
    d = part.shape[3] - 2
    p = part.astype(np.float64)
    m = p[..., d]
    w = np.where(np.isfinite(m), np.exp(m - m.max(-1, keepdims=True)), 0)
    return ((p[..., :d] * w[..., None]).sum(-2) / (p[..., d + 1] * w).sum(-1)[..., None]).reshape(part.shape[0], -1)


@pytest.mark.parametrize("rows,heads,splits,d", [(1, 4, 3, 16), (5, 8, 6, 32)])
def test_attention_reduce_random_partials(rng, rows, heads, splits, d):
    part = _random_partials(rng, rows, heads, splits, d)
    out = poisoned((rows, heads * d), F32)
    run("attention_reduce", {}, [out], part)
    assert_written(out)
    assert_same(out, IMPLS["attention_reduce"]({}, part))
    assert_close(out, _combine64(part), ORDER)


@pytest.mark.parametrize("fmt", PACK_FORMATS)
@pytest.mark.parametrize("rows", [1, 3])
def test_attention_reduce_pack(rng, fmt, rows):
    heads, splits, d = 8, 4, 64  # 512 features: whole q8_k blocks
    part = _random_partials(rng, rows, heads, splits, d)
    a = {"format": fmt}
    out = act_buffer(fmt, rows, heads * d)
    run("attention_reduce_pack", a, [out], part)
    assert_written(out)
    assert_same(values(out), IMPLS["attention_reduce_pack"](a, part))
    check_packed(out, IMPLS["attention_reduce"]({}, part), fmt)


# --- glu_pack --------------------------------------------------------------------------------------

@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("fmt", PACK_FORMATS)
def test_glu_pack(rng, act, fmt):
    rows, k = 3, 512
    gate, up = normal(rng, rows, k, scale=2.0), normal(rng, rows, k)
    a = {"act": act, "format": fmt}
    out = act_buffer(fmt, rows, k)
    run("glu_pack", a, [out], gate, up)
    assert_written(out)
    assert_same(values(out), IMPLS["glu_pack"](a, gate, up))
    check_packed(out, IMPLS["mul"]({}, IMPLS[act]({}, gate), up), fmt)


# --- elementwise -----------------------------------------------------------------------------------

ELEMENTWISE = {  # op: (attrs, operand count, input scale, the definition in float64)
    "add": ({}, 2, 1.0, lambda a, x, y: x + y), "mul": ({}, 2, 1.0, lambda a, x, y: x * y),
    "scale": ({"factor": 0.0625}, 1, 1.0, lambda a, x: x * a["factor"]),
    "silu": ({}, 1, 4.0, lambda a, x: x / (1 + np.exp(-x))),
    "gelu_tanh": ({}, 1, 4.0, lambda a, x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))),
    "softcap": ({"cap": 30.0}, 1, 40.0, lambda a, x: np.tanh(x / a["cap"]) * a["cap"]),
}


@pytest.mark.parametrize("op", ELEMENTWISE)
@pytest.mark.parametrize("shape", [(1, 64), (7, 300)])
def test_elementwise(rng, op, shape):
    a, n, scale, definition = ELEMENTWISE[op]
    xs = [normal(rng, *shape, scale=scale) for _ in range(n)]
    out = poisoned(shape, F32)
    run(op, a, [out], *xs)
    assert_written(out)
    assert_same(out, IMPLS[op](a, *xs))
    assert_close(out, definition(a, *(x.astype(np.float64) for x in xs)), EXACT)


# --- take_rows -------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["f32", "q8_0"])
def test_take_rows(rng, fmt):
    x, xv = random_activation(rng, fmt, 6, 64)
    idx = np.array([5, 2, 2, 0], np.int32)
    out = act_buffer(fmt, len(idx), 64)
    run("take_rows", {}, [out], x, idx)
    assert_written(out)
    assert_same(values(out), IMPLS["take_rows"]({}, xv, idx))


# --- tail_argmax -----------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", PACK_FORMATS)
@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("masked", [False, True])
def test_tail_argmax(rng, fmt, rows, masked):
    k, vocab = 512, 300
    x, norm, head = normal(rng, rows, k, scale=2.0), normal(rng, k), normal(rng, vocab, k, scale=0.05)
    mask = random_mask(rng, rows, vocab) if masked else np.full((rows, num.mask_words(vocab)), -1, np.int32)
    a = {"eps": 1e-6, "format": fmt}
    out = poisoned((rows,), np.int32)
    run("tail_argmax", a, [out], x, norm, head, mask)
    assert_written(out)
    want = IMPLS["tail_argmax"](a, x, norm, head, mask)
    np.testing.assert_array_equal(out, want)
    # the best allowed token of the unfused ops' logits, computed in float64 (NO_TOKEN: none allowed)
    logits = _matmul_reference(IMPLS["rmsnorm_pack"](a, x, norm), head)
    ok = num.allowed(mask, vocab)
    best = np.where(ok.any(-1), np.where(ok, logits, -np.inf).argmax(-1), num.NO_TOKEN)
    np.testing.assert_array_equal(out, best)


# --- NaN / Inf -------------------------------------------------------------------------------------

def _with_specials(x):
    x = x.copy()
    x[0, 3], x[0, 40], x[-1, 7] = np.nan, np.inf, -np.inf
    return x


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN cast to int8 while packing a NaN block
@pytest.mark.parametrize("op,attrs", [
    ("add", {}), ("mul", {}), ("scale", {"factor": 3.0}), ("silu", {}), ("gelu_tanh", {}), ("softcap", {"cap": 20.0}),
    ("rmsnorm", {"eps": 1e-6}),
    *[("pack", {"format": f}) for f in PACK_FORMATS],
    *[("rmsnorm_pack", {"eps": 1e-6, "format": f}) for f in PACK_FORMATS],
    ("glu_pack", {"act": "silu", "format": "f16"}), ("glu_pack", {"act": "gelu_tanh", "format": "q8_0"}),
    ("matmul", {}),
])
def test_nan_and_inf_propagate_as_in_the_interpreter(rng, op, attrs):
    rows, k = 3, 256
    x = _with_specials(normal(rng, rows, k))
    if op in ("add", "mul", "glu_pack"):
        ins = [x, normal(rng, rows, k)]
    elif op in ("rmsnorm", "rmsnorm_pack"):
        ins = [x, normal(rng, k)]
    elif op == "matmul":
        ins = [x, normal(rng, 16, k)]
    else:
        ins = [x]
    fmt = attrs.get("format", "f32")
    out = act_buffer(fmt, rows, k) if op != "matmul" else poisoned((rows, 16), F32)
    run(op, attrs, [out], *ins)
    want = IMPLS[op](attrs, *ins)
    got = values(out)
    assert np.isnan(want).any()  # the case does exercise non-finite values
    assert_close(got, want, ORDER if op == "matmul" else EXACT)
    if op != "matmul":
        np.testing.assert_array_equal(got, want)


def test_bf16_pack_keeps_every_nan_a_nan():
    """As ggml_compute_fp32_to_bf16: rounding must not carry a NaN's low payload into the Inf pattern."""
    x = np.array([[1.0, 2.0]], F32)
    x.view(np.uint32)[0, 0] = 0x7F800001  # a NaN whose payload lies in the low 16 bits
    out = act_buffer("bf16", 1, 2)
    run("pack", {"format": "bf16"}, [out], x)
    assert np.isnan(values(out)[0, 0])
