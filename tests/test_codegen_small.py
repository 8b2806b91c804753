"""The decode step's small fused kernels: rope + K/V write (rope_kv, norm_rope_kv), GLU + pack, and
elementwise ops / row gathers. They build for every target with no spills, their Launch records are
what the runtime needs, the rope table reproduces core/numerics.rope within the tolerance claimed in
codegen/families/rope_kv.py, and, run on the host emulator (tests/kernel_emu.py) through their
Launch records, they compute what the CPU twins compute."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from llmplan.codegen import operands
from llmplan.codegen.build import BuildError
from llmplan.codegen.families import elementwise as ew
from llmplan.codegen.families import glu, rope_kv
from llmplan.codegen.kernel import Context
from llmplan.codegen.targets import TARGETS
from llmplan.core import numerics as num
from llmplan.models.builder import llama31_rope_factors
from llmplan.runtime import numpy_kernels as ck

from codegen_checks import built, needs_emulator
from kernel_emu import runner
from kernel_inputs import nmse, packed_buffer, page_table
from launch_records import lowered, phase_buffers, wire


def all_kernels():
    return ([rope_kv.kernel(m, n) for m in operands.ROPE_MODES for n in (False, True)]
            + [rope_kv.kernel(m, False, True) for m in operands.ROPE_MODES]
            + [glu.kernel(a, f) for a in operands.GLU_ACTS for f in glu.FORMATS]
            + [ew.kernel(o, v) for o in operands.EW_OPS for v in (4, 1)]
            + [ew.take_rows_kernel(b) for b in (16, 4, 2, 1)])


# --- building ------------------------------------------------------------------------------------

def test_names_are_stable():
    names = [k.name for k in all_kernels()]
    assert names[:6] == ["lp_rope_kv_norm", "lp_norm_rope_kv_norm", "lp_rope_kv_neox", "lp_norm_rope_kv_neox",
                         "lp_rope_kv_norm_bias", "lp_rope_kv_neox_bias"]
    assert names[6:16] == [f"lp_glu_pack_{a}_{f}" for a in ("silu", "gelu_tanh") for f in ("q8_0", "q8_1", "q8_k",
                                                                                             "f16", "bf16")]
    assert names[16:28] == [f"lp_ew_{o}_v{v}" for o in ("add", "mul", "scale", "silu", "gelu_tanh", "softcap")
                            for v in (4, 1)]
    assert names[28:] == ["lp_take_rows_b16", "lp_take_rows_b4", "lp_take_rows_b2", "lp_take_rows_b1"]


def catalog(target) -> list:
    return [k for k in all_kernels() if k.family not in target.unsupported]


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_builds_without_spills(target):
    t = TARGETS[target]
    b = built(catalog, target)  # the gates (no spills, device code, expected instructions), no stack
    for k in catalog(t):
        m = b.manifests[k.name]
        assert 0 < m.registers <= 96, (k.name, m.registers)
        assert m.shared_bytes <= 256, (k.name, m.shared_bytes)  # rope's norm scratch: 32 doubles
        if k.name.endswith(("_v4", "_b16")):
            assert m.instructions["load128"] >= 1


def test_errors():
    gates = Context(phase_buffers([{"dtype": "f32", "shape": ["rows", 64]}] * 2 + [{"dtype": "q8_0", "shape": ["rows", 64]}]),
                    {}, TARGETS["sm_89"])
    with pytest.raises(BuildError, match="activation"):
        glu.launches(lowered({"op": "glu_pack", "attrs": {"act": "relu", "format": "q8_0"}, "args": [{"buf": 0}, {"buf": 1}],
                              "outs": [{"buf": 2}]}), gates)
    with pytest.raises(BuildError, match="elementwise"):
        ew.kernel("div", 4)
    ctx = Context(phase_buffers([{"dtype": "q8_0", "shape": ["rows", 64]}, {"dtype": "i32", "shape": ["seqs"]},
                   {"dtype": "q8_0", "shape": ["seqs", 64]}]), {}, TARGETS["sm_89"])
    with pytest.raises(BuildError, match="take_rows"):
        ew.launches(lowered({"op": "take_rows", "attrs": {}, "args": [{"buf": 0}, {"state": "last"}], "outs": [{"buf": 2}]}),
                    ctx)


# --- launch records ------------------------------------------------------------------------------

def test_rope_kv_launch_records():
    # Llama 3.1: rope_freqs factors go into the table reference, not the kernel
    ctx = Context(phase_buffers([{"dtype": "f32", "shape": ["rows", 1024]}, {"dtype": "f32", "shape": ["rows", 256]},
                   {"dtype": "f32", "shape": ["rows", 256]}, {"dtype": "f32", "shape": ["rows", 1024]}]),
                  {"rope_freqs.weight": ("F32", (64,))}, TARGETS["gfx1151"])
    attrs = {"base": 500000.0, "dims": 128, "heads": 8, "kv_heads": 2, "layer": 1, "mode": "norm", "scale": 1.0}
    (l,) = rope_kv.launches(lowered({"op": "rope_kv", "attrs": attrs, "args": [{"buf": 0}, {"buf": 1}, {"buf": 2},
                             {"state": "pos"}, {"state": "seq"}, {"state": "pages"}, {"cache": 1},
                             {"weight": "rope_freqs.weight"}], "outs": [{"buf": 3}, {"cache": 1}]}), ctx)
    assert l.kernel.name == "lp_rope_kv_norm" and l.kernel.family == "rope_kv" and l.kernel.block == 64
    assert l.grid == (10, ("rows", 1))
    table = {"rope_table": {"base": 500000.0, "scale": 1.0, "dims": 128, "factors": "rope_freqs.weight",
                            "positions": "ctx"}}
    assert wire(l.args) == [{"buf": 0}, {"buf": 1}, {"buf": 2}, {"state": "pos"}, {"state": "seq"}, {"state": "pages"},
                      {"cache": 1}, table, {"buf": 3}, {"i32": 8}, {"i32": 2}, {"i32": 128}, {"i32": 128}, {"i32": 1},
                      {"i32": "pages"}, {"i32": "blocks"}]
    # Gemma 3: per-head norms first, neox pairs, no factors
    ctx = Context(phase_buffers([{"dtype": "f32", "shape": [1, 1024]}, {"dtype": "f32", "shape": [1, 256]},
                   {"dtype": "f32", "shape": [1, 256]}, {"dtype": "f32", "shape": [1, 1024]}]),
                  {"blk.0.attn_q_norm.weight": ("F32", (256,)), "blk.0.attn_k_norm.weight": ("F32", (256,))},
                  TARGETS["gfx942"])
    attrs = {"base": 10000.0, "dims": 256, "eps": 1e-6, "heads": 4, "kv_heads": 1, "layer": 0, "mode": "neox",
             "scale": 1.0}
    norms = [{"weight": "blk.0.attn_q_norm.weight"}, {"weight": "blk.0.attn_k_norm.weight"}]
    (l,) = rope_kv.launches(lowered({"op": "norm_rope_kv", "attrs": attrs, "args": [{"buf": 0}, {"buf": 1}, {"buf": 2},
                             {"state": "pos"}, {"state": "seq"}, {"state": "pages"}, {"cache": 1}, *norms],
                             "outs": [{"buf": 3}, {"cache": 1}]}), ctx)
    assert l.kernel.name == "lp_norm_rope_kv_neox" and l.grid == (5, 1)
    assert wire(l.args)[7] == {"rope_table": {"base": 10000.0, "scale": 1.0, "dims": 256, "factors": None,
                                        "positions": "ctx"}}
    assert wire(l.args)[8:11] == [*norms, {"buf": 3}] and wire(l.args)[-1] == {"f32": 1e-6}
    with pytest.raises(BuildError, match="rotation mode 'glm'"):
        rope_kv.launches(lowered({"op": "norm_rope_kv", "attrs": attrs | {"mode": "glm"},
                                  "args": [{"buf": 0}, {"buf": 1}, {"buf": 2}, {"state": "pos"}, {"state": "seq"},
                                           {"state": "pages"}, {"cache": 1}, *norms], "outs": [{"buf": 3}, {"cache": 1}]}),
                         ctx)


def test_glu_and_elementwise_launch_records():
    ctx = Context(phase_buffers([{"dtype": "f32", "shape": ["rows", 14336]}, {"dtype": "f32", "shape": ["rows", 14336]},
                   {"dtype": "q8_k", "shape": ["rows", 14336]}, {"dtype": "f32", "shape": ["seqs", 14336]},
                   {"dtype": "f32", "shape": ["rows", 6]}]), {}, TARGETS["sm_90"])
    (l,) = glu.launches(lowered({"op": "glu_pack", "attrs": {"act": "silu", "format": "q8_k"}, "args": [{"buf": 0}, {"buf": 1}],
                         "outs": [{"buf": 2}]}), ctx)
    assert l.kernel.name == "lp_glu_pack_silu_q8_k" and l.grid == (28, ("rows", 1))
    assert wire(l.args) == [{"buf": 0}, {"buf": 1}, {"buf": 2}, {"i32": "rows"}, {"i32": 14336}]
    (l,) = ew.launches(lowered({"op": "add", "attrs": {}, "args": [{"buf": 0}, {"buf": 1}], "outs": [{"buf": 0}]}), ctx)
    assert l.kernel.name == "lp_ew_add_v4" and l.grid == (14, ("rows", 1))
    assert wire(l.args) == [{"buf": 0}, {"buf": 1}, {"buf": 0}, {"i32": 14336}]
    (l,) = ew.launches(lowered({"op": "softcap", "attrs": {"cap": 30.0}, "args": [{"buf": 4}], "outs": [{"buf": 4}]}), ctx)
    assert l.kernel.name == "lp_ew_softcap_v1" and wire(l.args) == [{"buf": 4}, {"buf": 4}, {"i32": 6}, {"f32": 30.0}]
    (l,) = ew.launches(lowered({"op": "take_rows", "attrs": {}, "args": [{"buf": 0}, {"state": "last"}],
                        "outs": [{"buf": 3}]}), ctx)
    assert l.kernel.name == "lp_take_rows_b16" and l.kernel.family == "take_rows"
    assert l.grid == (14, ("seqs", 1)) and wire(l.args) == [{"buf": 0}, {"state": "last"}, {"buf": 3}, {"i32": 57344}]


# --- the rope table ------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["norm", "neox"])
@pytest.mark.parametrize("base,dims,head,factors", [(500000.0, 128, 128, True), (10000.0, 256, 256, False),
                                                    (10000.0, 32, 64, False)])
def test_rope_table_matches_numerics(mode, base, dims, head, factors):
    """rope_table (float64 -> float32) + rope_f32 (the device's float32 rotation) against the float64
    twin: the exact-arithmetic class (NMSE < 1e-7), measured about 1e-15, errors of a few ulp."""
    rng = np.random.default_rng(dims)
    positions, heads, rows = 1 << 17, 4, 64
    f = llama31_rope_factors(head, base) if factors else None
    table = num.rope_table(positions, dims, base, 1.0, f)
    assert table.shape == (positions, dims // 2, 2) and table.dtype == np.float32
    x = (rng.standard_normal((rows, heads * head)) * 3).astype(np.float32)
    pos = np.concatenate([[0, 1, positions - 1], rng.integers(0, positions, rows - 3)]).astype(np.int32)
    got = rope_kv.rope_f32(x, pos, heads, dims, mode, table)
    want = num.rope(x, pos, heads, dims, base, 1.0, mode, f)
    assert nmse(got, want) < 1e-13
    ulp = np.spacing(np.abs(x.reshape(rows, heads, -1)).max(axis=-1, keepdims=True)).astype(np.float64)
    err = np.abs(got.astype(np.float64) - want).reshape(rows, heads, -1) / ulp
    assert err.max() <= 4, err.max()
    assert np.array_equal(got.reshape(rows, heads, -1)[..., dims:], x.reshape(rows, heads, -1)[..., dims:])


# --- emulated runs against the CPU twins ---------------------------------------------------------

@pytest.fixture(scope="module")
def emulators():
    """wave -> runner, built on first use (a GPU runner skips the wave width its GPU lacks)."""
    return functools.cache(lambda wave: runner(all_kernels(), wave))


def _bind(arrays, cache=None, weights=None, ctx_len=0):
    def bind(ref):
        if "buf" in ref:
            return arrays[ref["buf"]]
        if "state" in ref:
            return arrays[ref["state"]]
        if "cache" in ref:
            return cache
        if "weight" in ref:
            return weights[ref["weight"]]
        t = ref["rope_table"]
        f = None if t["factors"] is None else weights[t["factors"]]
        return num.rope_table(ctx_len, t["dims"], t["base"], t["scale"], f, t.get("mscale", 1.0))
    return bind


@needs_emulator
@pytest.mark.parametrize("wave", [32, 64])
@pytest.mark.parametrize("op,mode,d,dims,heads,kvh,bias", [("rope_kv", "norm", 128, 128, 4, 2, False),
                                                           ("rope_kv", "neox", 96, 64, 2, 1, False),
                                                           ("norm_rope_kv", "neox", 256, 256, 4, 1, False),
                                                           ("norm_rope_kv", "norm", 64, 32, 2, 2, False),
                                                           ("rope_kv", "neox", 64, 48, 4, 2, True)])
def test_rope_kv_matches_twin(emulators, wave, op, mode, d, dims, heads, kvh, bias):
    """bias: Qwen2's q/k/v biases, with a LongRoPE attention factor (mscale) and partial rotary."""
    rng = np.random.default_rng(d + dims)
    rows, layers, seqs, ctx_len, layer = 3, 2, 3, 64, 1
    pages, blocks = page_table(rng, seqs, ctx_len // num.PAGE)  # scrambled: each row's block is looked up
    q = (rng.standard_normal((rows, heads * d)) * 2).astype(np.float32)
    k = (rng.standard_normal((rows, kvh * d)) * 2).astype(np.float32)
    v = rng.standard_normal((rows, kvh * d)).astype(np.float32)
    pos, seq = np.array([0, 63, 17], np.int32), np.array([2, 0, 1], np.int32)
    weights = {"qn": rng.uniform(0.5, 1.5, d).astype(np.float32), "kn": rng.uniform(0.5, 1.5, d).astype(np.float32),
               "f": llama31_rope_factors(dims, 500000.0)}
    weights |= {n: rng.standard_normal(w).astype(np.float32) for n, w in (("qb", heads * d), ("kb", kvh * d), ("vb", kvh * d))}
    mscale = 1.19 if bias else 1.0
    attrs = {"base": 10000.0, "dims": dims, "heads": heads, "kv_heads": kvh, "layer": layer, "mode": mode,
             "scale": 1.0}
    extra = [{"weight": "f"}] if mode == "norm" and op == "rope_kv" else []
    if op == "norm_rope_kv":
        attrs["eps"] = 1e-6
        extra = [{"weight": "qn"}, {"weight": "kn"}]
    if bias:
        attrs |= {"bias": True, "mscale": mscale}
        extra += [{"weight": "qb"}, {"weight": "kb"}, {"weight": "vb"}]
    ctx = Context(phase_buffers([{"dtype": "f32", "shape": ["rows", heads * d]}, {"dtype": "f32", "shape": ["rows", kvh * d]},
                   {"dtype": "f32", "shape": ["rows", kvh * d]}, {"dtype": "f32", "shape": ["rows", heads * d]}]),
                  {n: ("F32", w.shape) for n, w in weights.items()}, TARGETS["sm_89"])
    launch = lowered({"op": op, "attrs": attrs, "args": [{"buf": 0}, {"buf": 1}, {"buf": 2}, {"state": "pos"},
              {"state": "seq"}, {"state": "pages"}, {"cache": 1}, *extra], "outs": [{"buf": 3}, {"cache": 1}]})
    (l,) = rope_kv.launches(launch, ctx)
    cache = rng.standard_normal((layers, 2, blocks, num.PAGE, kvh * d)).astype(np.float16)
    want_cache = cache.copy()
    q_out = np.full_like(q, np.nan)
    arrays = {0: q, 1: k, 2: v, 3: q_out, "pos": pos, "seq": seq, "pages": pages}
    emulators(wave).launch(l, _bind(arrays, cache, weights, ctx_len),
                           {"rows": rows, "pages": pages.shape[1], "blocks": blocks, "ctx": ctx_len})

    want_q = np.empty_like(q)
    twin_extra = [weights[e["weight"]] for e in extra]
    ck.rope_kv(op, attrs, [want_q, want_cache], q, k, v, pos, seq, pages, want_cache, *twin_extra)
    assert not np.isnan(q_out).any()
    assert nmse(q_out, want_q) < 1e-13  # exact-arithmetic class (< 1e-7)
    # the device is rope_f32 on the table, bit for bit (the host emulation rounds as the GPUs do)
    factors = weights["f"] if mode == "norm" and op == "rope_kv" else None
    table = num.rope_table(ctx_len, dims, 10000.0, 1.0, factors, mscale)
    qn = num.rmsnorm(q, weights["qn"], 1e-6) if op == "norm_rope_kv" else q + weights["qb"] if bias else q
    assert np.array_equal(q_out, rope_kv.rope_f32(qn, pos, heads, dims, mode, table))
    # K rows: the f16 of a float32 value within an ulp or two of the twin's; V rows exact; the rest untouched
    block, offset = pages[seq, pos // num.PAGE], pos % num.PAGE
    written = np.zeros(cache.shape, bool)
    written[layer, :, block, offset] = True
    assert np.array_equal(cache[~written], want_cache[~written])
    assert np.array_equal(cache[layer, 1, block, offset], want_cache[layer, 1, block, offset])
    kg, kw = cache[layer, 0, block, offset].astype(np.float32), want_cache[layer, 0, block, offset].astype(np.float32)
    assert np.all(np.abs(kg - kw) <= np.spacing(np.abs(kw).astype(np.float16)).astype(np.float32))
    assert np.mean(kg == kw) > 0.99


@needs_emulator
@pytest.mark.parametrize("wave", [32, 64])
@pytest.mark.parametrize("act", list(operands.GLU_ACTS))
@pytest.mark.parametrize("fmt", list(glu.FORMATS))
def test_glu_pack_matches_twin(emulators, wave, act, fmt):
    rng = np.random.default_rng(3)
    rows, k = 2, 1280 if fmt != "q8_0" else 1184  # a partial last tile (1184 = 2 x 512 + 160)
    gate = (rng.standard_normal((rows, k)) * 3).astype(np.float32)
    up = rng.standard_normal((rows, k)).astype(np.float32)
    ctx = Context(phase_buffers([{"dtype": "f32", "shape": ["rows", k]}, {"dtype": "f32", "shape": ["rows", k]},
                   {"dtype": fmt, "shape": ["rows", k]}]), {}, TARGETS["sm_89"])
    (l,) = glu.launches(lowered({"op": "glu_pack", "attrs": {"act": act, "format": fmt}, "args": [{"buf": 0}, {"buf": 1}],
                         "outs": [{"buf": 2}]}), ctx)
    symbols = {"rows": rows}
    if fmt in ("f16", "bf16"):
        out = np.full((rows, k), 0xFFFF, np.uint16) if fmt == "bf16" else np.full((rows, k), np.nan, np.float16)
        emulators(wave).launch(l, _bind({0: gate, 1: up, 2: out}), symbols)
        want = np.zeros_like(out)
        ck.glu_pack("glu_pack", {"act": act, "format": fmt}, [want], gate, up)
        got_f, want_f = ck.values(out), ck.values(want)
        assert not np.isnan(got_f).any()
        # a few-ulp activation moves a rounding now and then; and gelu_tanh below x = -5 is accurate
        # here where the twin's float64 1 + tanh(y) cancels to (a few bits of) |values| < 1e-12
        off = out != want
        ulp = np.spacing(np.abs(want_f.astype(np.float16 if fmt == "f16" else np.float32)))
        step = ulp.astype(np.float64) * (1 if fmt == "f16" else 2**16)
        assert np.all((np.abs(got_f - want_f) <= step)[off] | (np.abs(want_f[off]) < 1e-12))
        assert np.mean(off & (np.abs(want_f) >= 1e-12)) < 0.01
        assert nmse(got_f, want_f) < 1e-7
        return
    runs = []
    for poison in (True, False):
        raw, packed = packed_buffer(fmt, rows, k, poison)
        emulators(wave).launch(l, _bind({0: gate, 1: up, 2: raw}), symbols)
        runs.append(packed)
    for name, plane in runs[0].planes.items():
        assert np.array_equal(plane, runs[1][name]), name
    _, want = packed_buffer(fmt, rows, k)
    ck.glu_pack("glu_pack", {"act": act, "format": fmt}, [want], gate, up)
    assert np.mean(runs[0]["qs"] == want["qs"]) > 0.999
    assert nmse(ck.values(runs[0]), ck.values(want)) < 1e-7


@needs_emulator
@pytest.mark.parametrize("wave", [32, 64])
@pytest.mark.parametrize("op", list(operands.EW_OPS))
@pytest.mark.parametrize("k", [2048 + 4, 777])
def test_elementwise_matches_twin(emulators, wave, op, k):
    rng = np.random.default_rng(k)
    rows = 3
    x = (rng.standard_normal((rows, k)) * 4).astype(np.float32)
    x[0, :8] = [0.0, -0.0, 1e-30, -1e-30, 88.0, -90.0, 500.0, -500.0]  # tiny, overflow of exp
    y = rng.standard_normal((rows, k)).astype(np.float32)
    attrs = {"scale": {"factor": 25.298221281347036}, "softcap": {"cap": 30.0}}.get(op, {})
    args = [{"buf": 0}, {"buf": 1}] if op in operands.EW_BINARY else [{"buf": 0}]
    ctx = Context(phase_buffers([{"dtype": "f32", "shape": ["rows", k]}] * 3), {}, TARGETS["sm_89"])
    (l,) = ew.launches(lowered({"op": op, "attrs": attrs, "args": args, "outs": [{"buf": 2}]}), ctx)
    out = np.full_like(x, np.nan)
    emulators(wave).launch(l, _bind({0: x, 1: y, 2: out}), {"rows": rows})
    want = np.empty_like(x)
    ck.elementwise(op, attrs, [want], x, *([y] if op in operands.EW_BINARY else []))
    assert not np.isnan(out).any()
    if op in ("add", "mul", "scale"):
        assert np.array_equal(out, want)
        return
    # float32 through exp (fused.cuh) against float64 rounded once: a few ulp of the result (of 1e-30
    # below that: silu(-90) is -0 here, -7e-38 there)
    ulps = np.abs(out.astype(np.float64) - want) / np.spacing(np.maximum(np.abs(want), np.float32(1e-30)))
    if op == "gelu_tanh":  # the twin's float64 1 + tanh(y) cancels below x = -5: its error is |x| 2^-53
        ulps = np.where(np.abs(out.astype(np.float64) - want) <= np.abs(x) * 2.0**-52, 0, ulps)
    assert ulps.max() <= 8, (op, ulps.max())
    assert nmse(out, want) < 1e-12


@needs_emulator
@pytest.mark.parametrize("wave", [32, 64])
@pytest.mark.parametrize("dtype,k", [("f32", 640), ("f32", 3), ("f16", 5), ("i32", 1024)])
def test_take_rows_matches_twin(emulators, wave, dtype, k):
    rng = np.random.default_rng(k)
    np_dtype = {"f32": np.float32, "f16": np.float16, "i32": np.int32}[dtype]
    x = (rng.standard_normal((9, k)) * 100).astype(np_dtype)
    last = np.array([8, 0, 3, 3], np.int32)
    ctx = Context(phase_buffers([{"dtype": dtype, "shape": ["rows", k]}, {"dtype": dtype, "shape": ["seqs", k]}]), {},
                  TARGETS["sm_89"])
    (l,) = ew.launches(lowered({"op": "take_rows", "attrs": {}, "args": [{"buf": 0}, {"state": "last"}],
                        "outs": [{"buf": 1}]}), ctx)
    out = np.zeros((len(last), k), np_dtype)
    emulators(wave).launch(l, _bind({0: x, 1: out, "last": last}), {"rows": 9, "seqs": len(last)})
    want = np.empty_like(out)
    ck.elementwise("take_rows", {}, [want], x, last)
    assert np.array_equal(out, want)
