"""The CPU target's row kernels against their NumPy twins (runtime/numpy_kernels.py), on every SIMD path this
machine has: RMSNorm, RMSNorm + pack and pack into every output format, the embedding gather, GLU + pack,
the elementwise ops, row gathers, rope + K/V write.

Packing, norms, gathers, rope and the float64 activations are the exact-arithmetic class: equal to the
twin bit for bit here, except where an ulp of an input (the order of a float64 sum of squares) moves a
rounding (then NMSE < 1e-7, docs/numerics.md's bound). Float outputs are poisoned with NaN; packed outputs are
run twice over buffers poisoned with 0xFF and with zeros, which must come out equal (every byte written).
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from llmplan.codegen import operands
from llmplan.codegen.cpu_families import elementwise as ew
from llmplan.codegen.cpu_families import embed, glu, norm, rope_kv
from llmplan.codegen.families.rope_kv import rope_f32
from llmplan.core import numerics as num
from llmplan.core.formats import ACTIVATIONS
from llmplan.core.numerics import rope_table
from llmplan.runtime import numpy_kernels as ck

from cpu_native import ISAS, context, cxx, each_compiler, library, needs_compiler, rng, run, weight  # noqa: F401 (rng: a fixture)
from kernel_inputs import nmse, packed_buffer, page_table
from launch_records import lowered, wire

OUT_FORMATS = list(ACTIVATIONS)
PLAIN = {"f16": np.float16, "bf16": np.uint16, "f32": np.float32}


def catalog():
    ks = [embed.kernel(f) for f in embed.FORMATS]
    ks += [glu.kernel(a, f) for a in operands.GLU_ACTS for f in OUT_FORMATS]
    ks += [ew.kernel(op) for op in operands.EW_OPS] + [ew.take_rows_kernel()]
    ks += [rope_kv.kernel(m, n) for m in ("norm", "neox") for n in (False, True)]
    ks += [rope_kv.kernel(m, False, True) for m in ("norm", "neox")]
    ctx = context([{"dtype": "f32", "shape": ["rows", 256]}, {"dtype": "f32", "shape": [256]},
                   {"dtype": "f32", "shape": ["rows", 256]}], {})
    ks += [norm.launches(lowered({"op": "rmsnorm", "attrs": {"eps": 1e-5}, "args": [{"buf": 0}, {"buf": 1}],
                          "outs": [{"buf": 2}]}), ctx)[0].kernel]
    for f in OUT_FORMATS:
        for op, args in (("rmsnorm_pack", [{"buf": 0}, {"buf": 1}]), ("pack", [{"buf": 0}])):
            ctx = context([{"dtype": "f32", "shape": ["rows", 256]}, {"dtype": "f32", "shape": [256]},
                           {"dtype": f, "shape": ["rows", 256]}], {})
            ks += [norm.launches(lowered({"op": op, "attrs": {"eps": 1e-5, "format": f}, "args": args, "outs": [{"buf": 2}]}),
                                 ctx)[0].kernel]
    return ks


def out_buffer(fmt: str, rows: int, k: int, poison: bool):
    """(the array the kernel writes, what the twin reads of it)."""
    if fmt in PLAIN:
        size = np.dtype(PLAIN[fmt]).itemsize
        arr = np.full((rows, k * size), 0xFF if poison else 0, np.uint8).view(PLAIN[fmt]).copy()
        if fmt == "f32":
            arr[...] = np.nan if poison else 0
        return arr, arr
    return packed_buffer(fmt, rows, k, poison)


def run_packed(isa, launches, arrays, out_key, fmt, rows, k, dims):
    """Run twice, the output poisoned with 0xFF and with zeros; both runs must agree (every byte written).
    Returns what the twin reads of the output."""
    results = []
    for poison in (True, False):
        raw, view = out_buffer(fmt, rows, k, poison)
        run(library(catalog, isa), launches, {**arrays, out_key: raw}, dims)
        results.append(view)
    a, b = results
    if fmt in PLAIN:
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
    else:
        for name, plane in a.planes.items():
            assert np.array_equal(plane, b[name]), name
    return a


def assert_packed_equal(got, want, fmt):
    """Exact, but for a rare value whose input differs by an ulp (which may move one rounding)."""
    if fmt in PLAIN:
        g, w = ck.values(got), ck.values(want)
        assert np.mean(g == w) > 0.999 and nmse(g, w) < 1e-7
        return
    assert np.mean(got["qs"] == want["qs"]) > 0.999
    assert nmse(ck.values(got), ck.values(want)) < 1e-7


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", OUT_FORMATS)
@pytest.mark.parametrize("op", ["rmsnorm_pack", "pack"])
def test_norm_and_pack_match_the_twin(op, fmt, isa, rng):
    rows, k = 5, 512
    x = (rng.standard_normal((rows, k)) * rng.uniform(0.1, 30, (rows, 1))).astype(np.float32)
    x[1, :32] = 0.0  # an all-zero block: scale 0
    w = rng.uniform(0.5, 1.5, k).astype(np.float32)
    bufs = [{"dtype": "f32", "shape": ["rows", k]}, {"dtype": "f32", "shape": [k]}, {"dtype": fmt, "shape": ["rows", k]}]
    attrs = {"eps": 1e-6, "format": fmt}
    args = [{"buf": 0}, {"buf": 1}] if op == "rmsnorm_pack" else [{"buf": 0}]
    launches = norm.launches(lowered({"op": op, "attrs": attrs, "args": args, "outs": [{"buf": 2}]}), context(bufs, {}))
    got = run_packed(isa, launches, {"buf:0": x, "buf:1": w}, "buf:2", fmt, rows, k, {"rows": rows})
    want = out_buffer(fmt, rows, k, False)[1]
    ck.norm(op, attrs, [want], x, *([w] if op == "rmsnorm_pack" else []))
    assert_packed_equal(got, want, fmt)


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("group", [384, 64])
def test_rmsnorm_matches_the_twin(group, isa, rng):
    rows, k = 4, 384
    x = (rng.standard_normal((rows, k)) * 3).astype(np.float32)
    w = rng.uniform(0.5, 1.5, group).astype(np.float32)
    x[2, 5] = np.nan  # NaN / Inf as the twin: a NaN makes its group NaN, an Inf its own value
    x[3, 7] = np.inf
    bufs = [{"dtype": "f32", "shape": ["rows", k]}, {"dtype": "f32", "shape": [group]}, {"dtype": "f32", "shape": ["rows", k]}]
    launches = norm.launches(lowered({"op": "rmsnorm", "attrs": {"eps": 1e-5}, "args": [{"buf": 0}, {"buf": 1}],
                              "outs": [{"buf": 2}]}), context(bufs, {}))
    out = np.full_like(x, np.nan)
    run(library(catalog, isa), launches, {"buf:0": x, "buf:1": w, "buf:2": out}, {"rows": rows})
    want = np.empty_like(x)
    with np.errstate(invalid="ignore"):
        ck.norm("rmsnorm", {"eps": 1e-5}, [want], x, w)
    assert np.array_equal(np.isnan(out), np.isnan(want)) and np.isnan(out[2, :group]).all()
    fin = np.isfinite(want)
    assert nmse(out[fin], want[fin]) < 1e-13


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", embed.FORMATS)
def test_embed_is_bit_exact(fmt, isa, rng):
    vocab, k = 11, 512
    raw, dense = weight(rng, fmt, vocab, k)
    tokens = np.array([3, 10, 0, 3, 11, -1], np.int32)  # repeats; two outside the table
    launch = lowered({"op": "embed", "attrs": {}, "args": [{"weight": "t"}, {"state": "tokens"}], "outs": [{"buf": 0}]})
    (ln,) = embed.launches(launch, context([{"dtype": "f32", "shape": ["rows", k]}], {"t": (fmt, (vocab, k))}))
    assert wire(ln.args)[0] == {"weight": "t", "layout": "blocks"}
    out = np.zeros((len(tokens), k), np.float32)
    run(library(catalog, isa), [ln], {"weight:t": raw, "state:tokens": tokens, "buf:0": out}, {"rows": len(tokens)})
    assert np.array_equal(out[:4], dense[tokens[:4]])
    assert np.isnan(out[4:]).all()


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("act", list(operands.GLU_ACTS))
@pytest.mark.parametrize("fmt", ["q8_0", "q8_1", "q8_k", "f16", "bf16"])
def test_glu_pack_matches_the_twin(act, fmt, isa, rng):
    rows, k = 3, 768
    gate = (rng.standard_normal((rows, k)) * 3).astype(np.float32)
    up = rng.standard_normal((rows, k)).astype(np.float32)
    bufs = [{"dtype": "f32", "shape": ["rows", k]}] * 2 + [{"dtype": fmt, "shape": ["rows", k]}]
    attrs = {"act": act, "format": fmt}
    launches = glu.launches(lowered({"op": "glu_pack", "attrs": attrs, "args": [{"buf": 0}, {"buf": 1}], "outs": [{"buf": 2}]}),
                            context(bufs, {}))
    got = run_packed(isa, launches, {"buf:0": gate, "buf:1": up}, "buf:2", fmt, rows, k, {"rows": rows})
    want = out_buffer(fmt, rows, k, False)[1]
    ck.glu_pack("glu_pack", attrs, [want], gate, up)
    if fmt not in PLAIN:
        assert_packed_equal(got, want, fmt)
        return
    # f16 / bf16 keep the tiny values of gelu_tanh below x = -5, where the twin's float64 1 + tanh(y)
    # cancels to a few bits (rows.h): there the two differ; elsewhere by one rounding of the format at most
    g, w = ck.values(got), ck.values(want)
    off = g != w
    step = np.spacing(np.abs(w).astype(np.float16 if fmt == "f16" else np.float32)).astype(np.float64)
    step *= 1 if fmt == "f16" else 2**16
    assert np.all((np.abs(g - w) <= step)[off] | (np.abs(w[off]) < 1e-9))
    assert np.mean(off & (np.abs(w) >= 1e-9)) < 0.01 and nmse(g, w) < 1e-7


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("op", list(operands.EW_OPS))
def test_elementwise_matches_the_twin(op, isa, rng):
    rows, k = 3, 1000
    x = (rng.standard_normal((rows, k)) * 4).astype(np.float32)
    x[0, :10] = [0.0, -0.0, 1e-30, -1e-30, 88.0, -90.0, 500.0, -500.0, np.nan, np.inf]
    y = rng.standard_normal((rows, k)).astype(np.float32)
    attrs = {"scale": {"factor": 25.298221281347036}, "softcap": {"cap": 30.0}}.get(op, {})
    args = [{"buf": 0}, {"buf": 1}] if op in operands.EW_BINARY else [{"buf": 0}]
    launches = ew.launches(lowered({"op": op, "attrs": attrs, "args": args, "outs": [{"buf": 2}]}),
                           context([{"dtype": "f32", "shape": ["rows", k]}] * 3, {}))
    out = np.full_like(x, np.nan)
    run(library(catalog, isa), launches, {"buf:0": x, "buf:1": y, "buf:2": out}, {"rows": rows})
    want = np.empty_like(x)
    with np.errstate(all="ignore"):
        ck.elementwise(op, attrs, [want], x, *([y] if op in operands.EW_BINARY else []))
    assert np.array_equal(np.isnan(out), np.isnan(want)) and np.array_equal(np.isinf(out), np.isinf(want))
    fin = np.isfinite(want)
    if op in ("add", "mul", "scale"):
        assert np.array_equal(out[fin], want[fin])
        return
    # float64 math rounded once, as the twin, but libm's exp and tanh are not NumPy's (they differ in the
    # last bit of a float64 now and then): within an ulp of the float32 result; where the twin's
    # 1 + tanh(y) cancels (gelu_tanh below x = -5) both carry an error of about |x| 2^-53
    err = np.where(fin, np.abs(out.astype(np.float64) - np.where(fin, want, 0)), 0)
    ulps = err / np.spacing(np.maximum(np.abs(want), np.float32(1e-30)))
    if op == "gelu_tanh":
        ulps = np.where(err <= np.abs(x) * 2.0**-51, 0, ulps)
    assert ulps[fin].max() <= 1, (op, ulps[fin].max())
    assert nmse(out[fin], want[fin]) < 1e-13


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype,k", [("f32", 640), ("f16", 5), ("i32", 3)])
def test_take_rows_matches_the_twin(dtype, k, isa, rng):
    np_dtype = {"f32": np.float32, "f16": np.float16, "i32": np.int32}[dtype]
    x = (rng.standard_normal((9, k)) * 100).astype(np_dtype)
    last = np.array([8, 0, 3, 3], np.int32)
    bufs = [{"dtype": dtype, "shape": ["rows", k]}, {"dtype": dtype, "shape": ["seqs", k]}]
    launches = ew.launches(lowered({"op": "take_rows", "attrs": {}, "args": [{"buf": 0}, {"state": "last"}],
                            "outs": [{"buf": 1}]}), context(bufs, {}))
    out = np.zeros((len(last), k), np_dtype)
    run(library(catalog, isa), launches, {"buf:0": x, "state:last": last, "buf:1": out}, {"rows": 9, "seqs": 4})
    want = np.empty_like(out)
    ck.elementwise("take_rows", {}, [want], x, last)
    assert np.array_equal(out, want)


def llama31_factors(dims: int) -> np.ndarray:
    """Rope frequency factors between 1 and 8, as Llama 3.1's rope_freqs holds."""
    return np.linspace(1.0, 8.0, dims // 2).astype(np.float32)


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("op,mode,d,dims,heads,kvh,bias", [("rope_kv", "norm", 128, 128, 4, 2, False),
                                                           ("rope_kv", "neox", 96, 64, 2, 1, False),
                                                           ("norm_rope_kv", "neox", 256, 256, 4, 1, False),
                                                           ("norm_rope_kv", "norm", 64, 32, 2, 2, False),
                                                           ("rope_kv", "neox", 64, 48, 4, 2, True)])
def test_rope_kv_matches_the_twin(op, mode, d, dims, heads, kvh, bias, isa, rng):
    """bias: Qwen2's q/k/v biases, with a LongRoPE attention factor (mscale) and partial rotary."""
    rows, layers, seqs, ctx_len, layer = 3, 2, 3, 64, 1
    pages, blocks = page_table(rng, seqs, ctx_len // num.PAGE)
    q = (rng.standard_normal((rows, heads * d)) * 2).astype(np.float32)
    k = (rng.standard_normal((rows, kvh * d)) * 2).astype(np.float32)
    v = rng.standard_normal((rows, kvh * d)).astype(np.float32)
    pos, seq = np.array([0, 63, 17], np.int32), np.array([2, 0, 1], np.int32)
    weights = {"qn": rng.uniform(0.5, 1.5, d).astype(np.float32), "kn": rng.uniform(0.5, 1.5, d).astype(np.float32),
               "f": llama31_factors(dims)}
    weights |= {n: rng.standard_normal(w).astype(np.float32) for n, w in (("qb", heads * d), ("kb", kvh * d), ("vb", kvh * d))}
    mscale = 1.19 if bias else 1.0
    attrs = {"base": 10000.0, "dims": dims, "heads": heads, "kv_heads": kvh, "layer": layer, "mode": mode, "scale": 1.0}
    extra = [{"weight": "f"}] if mode == "norm" and op == "rope_kv" else []
    if op == "norm_rope_kv":
        attrs["eps"] = 1e-6
        extra = [{"weight": "qn"}, {"weight": "kn"}]
    if bias:
        attrs |= {"bias": True, "mscale": mscale}
        extra += [{"weight": "qb"}, {"weight": "kb"}, {"weight": "vb"}]
    bufs = [{"dtype": "f32", "shape": ["rows", w]} for w in (heads * d, kvh * d, kvh * d, heads * d)]
    launch = lowered({"op": op, "attrs": attrs, "args": [{"buf": 0}, {"buf": 1}, {"buf": 2}, {"state": "pos"}, {"state": "seq"},
              {"state": "pages"}, {"cache": 1}, *extra], "outs": [{"buf": 3}, {"cache": 1}]})
    launches = rope_kv.launches(launch, context(bufs, {n: ("F32", w.shape) for n, w in weights.items()}))
    twin_extra = [weights[e["weight"]] for e in extra]
    table = rope_table(ctx_len, dims, 10000.0, 1.0, weights["f"] if mode == "norm" and op == "rope_kv" else None, mscale)
    cache = rng.standard_normal((layers, 2, blocks, num.PAGE, kvh * d)).astype(np.float16)
    want_cache = cache.copy()
    q_out = np.full_like(q, np.nan)
    arrays = {"buf:0": q, "buf:1": k, "buf:2": v, "buf:3": q_out, "state:pos": pos, "state:seq": seq,
              "state:pages": pages, "cache": cache, "table": table,
              **{f"weight:{n}": w for n, w in weights.items()}}
    run(library(catalog, isa), launches, arrays, {"rows": rows, "pages": pages.shape[1], "blocks": blocks})
    want_q = np.empty_like(q)
    ck.rope_kv(op, attrs, [want_q, want_cache], q, k, v, pos, seq, pages, want_cache, *twin_extra)
    assert nmse(q_out, want_q) < 1e-13  # exact-arithmetic class (< 1e-7)
    qn = num.rmsnorm(q, weights["qn"], 1e-6) if op == "norm_rope_kv" else q + weights["qb"] if bias else q
    assert np.array_equal(q_out, rope_f32(qn, pos, heads, dims, mode, table))  # the GPU kernel's arithmetic
    block, offset = pages[seq, pos // num.PAGE], pos % num.PAGE
    written = np.zeros(cache.shape, bool)
    written[layer, :, block, offset] = True
    assert np.array_equal(cache[~written], want_cache[~written])  # nothing else touched
    assert np.array_equal(cache[layer, 1, block, offset], want_cache[layer, 1, block, offset])  # V exact
    kg, kw = cache[layer, 0, block, offset].astype(np.float32), want_cache[layer, 0, block, offset].astype(np.float32)
    assert np.all(np.abs(kg - kw) <= np.spacing(np.abs(kw).astype(np.float16)).astype(np.float32))
    assert np.mean(kg == kw) > 0.99


@each_compiler
def test_the_pool_runs_every_task_once_launch_after_launch(rng):
    """Hundreds of launches of many sizes back to back (the pool's shares, stolen halves, late workers,
    sleeping and waking): every task runs exactly once, every time (the add is in place, so a task
    skipped leaves x and a task run twice adds y twice)."""
    lib = library(catalog, ISAS[-1])
    lib.set_threads(3)  # more threads than this machine may have free: workers are descheduled now and then
    (ln,) = ew.launches(lowered({"op": "add", "attrs": {}, "args": [{"buf": 0}, {"buf": 1}], "outs": [{"buf": 2}]}),
                        context([{"dtype": "f32", "shape": ["rows", 4096]}] * 3, {}))
    x = rng.standard_normal((64, 4096)).astype(np.float32)
    y = rng.standard_normal((64, 4096)).astype(np.float32)
    for i in range(400):
        rows = int(rng.integers(1, 65))
        out = x[:rows].copy()
        run(lib, [ln], {"buf:0": out, "buf:1": np.ascontiguousarray(y[:rows]), "buf:2": out}, {"rows": rows})
        assert np.array_equal(out, x[:rows] + y[:rows]), f"launch {i}"
        if i % 100 == 99:
            time.sleep(0.01)  # long enough for the workers to fall asleep
    lib.set_threads(len(os.sched_getaffinity(0)))
