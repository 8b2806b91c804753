"""The CPU target's attention (codegen/cpu_families/attention.py, codegen/cpu/attention.h) against the
NumPy twins runtime/numpy_kernels.py attention, attention_partial, attention_reduce(_pack), on every SIMD
path this machine has.

The cache is paged through a scrambled page table; every cell a row has no business reading (other
positions, other sequences, spare blocks) is NaN, so reading one shows. Partials and outputs are
poisoned. The float sums' order and the exp differ from the twin's (accumulation-order class,
docs/numerics.md: NMSE < 5e-4; measured up to a few 1e-9, where an f16 exp weight rounds the other way), and
prefill (`attention`) and decode (partials + reduce) give a row the same bits.
"""

from __future__ import annotations

import numpy as np
import pytest

from llmplan.codegen.cpu_families import attention as at
from llmplan.core import numerics as num
from llmplan.runtime import numpy_kernels as ck

from cpu_native import ISAS, context, cxx, each_compiler, library, needs_compiler, rng, run  # noqa: F401 (rng: a fixture)
from kernel_inputs import nmse, packed_buffer, page_table, paged_cache
from launch_records import lowered, wire

OUT_FORMATS = ["f32", "q8_0", "q8_1", "q8_k", "f16", "bf16"]


def catalog():
    groups = sorted({c[1] for c in CASES})
    return [*(at.attention_kernel(g) for g in groups), *(at.partial_kernel(g) for g in groups),
            *(at.reduce_kernel(f) for f in OUT_FORMATS)]


# (head_dim, group, kv_heads, chunk, ctx, window, seq, pos): each row's sequence and position
CASES = [
    (128, 4, 2, 64, 256, 0, [2, 0], [200, 0]),       # Llama-3 shape, several slices; a first token
    (256, 4, 1, 64, 192, 40, [1], [150]),            # Gemma 3 local layer: a window across two slices
    (80, 2, 2, 32, 96, 0, [0, 2, 1], [95, 31, 32]),  # odd head size; the last position; slice edges
    (64, 1, 3, 256, 512, 0, [0, 1], [300, 511]),     # the 256-position slices prefill and decode use
]


def setup(case, rng):
    d, g, kvh, chunk, ctx_len, window, seq, pos = case
    layers, seqs, heads, rows = 2, 3, g * kvh, len(seq)
    npages = ctx_len // num.PAGE
    table, blocks = page_table(rng, seqs, npages)
    readable = {s: (num.first_position(p, window), p + 1) for s, p in zip(seq, pos)}
    cache, pages = paged_cache(rng, layers, kvh * d, table, blocks, readable, scale=2.0)
    q = rng.standard_normal((rows, heads * d)).astype(np.float32)
    attrs = {"chunk": chunk, "heads": heads, "kv_heads": kvh, "layer": 1, "scale": float(d**-0.5), "window": window}
    arrays = {"cache": cache, "state:seq": np.array(seq, np.int32), "state:pages": pages,
              "state:pos": np.array(pos, np.int32), "buf:0": q}
    dims = {"rows": rows, "pages": npages, "blocks": blocks, "splits": -(-npages * num.PAGE // chunk)}
    return attrs, arrays, dims, heads, d


ARGS = [{"buf": 0}, {"cache": 1}, {"state": "seq"}, {"state": "pages"}, {"state": "pos"}]


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("case", CASES, ids=[f"d{c[0]}_g{c[1]}_c{c[3]}" for c in CASES])
def test_partial_matches_the_twin(case, isa, rng):
    attrs, arrays, dims, heads, d = setup(case, rng)
    rows, splits = dims["rows"], dims["splits"]
    ctx = context([{"dtype": "f32", "shape": ["rows", heads * d]},
                   {"dtype": "f32", "shape": ["rows", heads, "splits", d + 2]}], {})
    launches = at.launches(lowered({"op": "attention_partial", "attrs": attrs, "args": ARGS, "outs": [{"buf": 1}]}), ctx)
    part = np.full((rows, heads, splits, d + 2), np.nan, np.float32)
    run(library(catalog, isa), launches, {**arrays, "buf:1": part}, dims)
    want = np.zeros_like(part)
    ck.attention_decode("attention_partial", attrs, [want], arrays["buf:0"], arrays["cache"], arrays["state:seq"],
                         arrays["state:pages"], arrays["state:pos"])
    assert np.isfinite(want[..., :d]).all(), "the twin reads only the readable cells"
    assert not np.isnan(part).any(), "every slice written, no NaN cell read"
    used = np.isfinite(want[..., d])
    assert np.array_equal(np.isfinite(part[..., d]), used)
    assert (part[~used][:, :d] == 0).all() and (part[~used][:, d + 1] == 0).all()  # (0, -inf, 0)
    # an f16 exp weight may round the other way when a score differs in its last bit: about 1e-9
    assert nmse(part[used], want[used]) < 1e-6
    assert np.allclose(part[used][:, d], want[used][:, d], rtol=1e-5, atol=1e-5)  # the max scores


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("case", CASES, ids=[f"d{c[0]}_g{c[1]}_c{c[3]}" for c in CASES])
def test_prefill_attention_matches_the_twin_and_decode(case, isa, rng):
    """`attention` against the twin, and equal bit for bit to partials over 256-position slices + reduce."""
    attrs, arrays, dims, heads, d = setup(case, rng)
    rows = dims["rows"]
    lib = library(catalog, isa)
    ctx = context([{"dtype": "f32", "shape": ["rows", heads * d]}, {"dtype": "f32", "shape": ["rows", heads * d]}], {})
    full = {k: v for k, v in attrs.items() if k != "chunk"}
    out = np.full((rows, heads * d), np.nan, np.float32)
    run(lib, at.launches(lowered({"op": "attention", "attrs": full, "args": ARGS, "outs": [{"buf": 1}]}), ctx),
        {**arrays, "buf:1": out}, dims)
    want = np.empty_like(out)
    ck.attention("attention", full, [want], arrays["buf:0"], arrays["cache"], arrays["state:seq"],
                 arrays["state:pages"], arrays["state:pos"])
    assert not np.isnan(out).any()
    assert nmse(out, want) < 1e-6
    # decode's two launches over slices of SLICE positions give the same bits
    splits = -(-dims["pages"] * num.PAGE // num.SLICE)
    ctx = context([{"dtype": "f32", "shape": ["rows", heads * d]},
                   {"dtype": "f32", "shape": ["rows", heads, "splits", d + 2]},
                   {"dtype": "f32", "shape": ["rows", heads * d]}], {})
    part = np.full((rows, heads, splits, d + 2), np.nan, np.float32)
    dec = np.full_like(out, np.nan)
    launches = at.launches(lowered({"op": "attention_partial", "attrs": {**attrs, "chunk": num.SLICE}, "args": ARGS,
                            "outs": [{"buf": 1}]}), ctx)
    launches += at.launches(lowered({"op": "attention_reduce", "attrs": {}, "args": [{"buf": 1}], "outs": [{"buf": 2}]}), ctx)
    run(lib, launches, {**arrays, "buf:1": part, "buf:2": dec}, {**dims, "splits": splits})
    assert np.array_equal(dec, out)


def _partials(rng, rows, heads, d, splits):
    """Partials as attention_partial leaves them: some slices empty (0, -inf, 0), others random."""
    part = np.zeros((rows, heads, splits, d + 2), np.float32)
    part[..., d] = -np.inf
    for r in range(rows):
        for j in rng.choice(splits, size=1 + r % splits, replace=False):
            part[r, :, j, :d] = rng.standard_normal((heads, d))
            part[r, :, j, d] = rng.uniform(-5, 5, heads)
            part[r, :, j, d + 1] = rng.uniform(1, 50, heads)
    return part


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", OUT_FORMATS)
def test_reduce_matches_the_twin(fmt, isa, rng):
    heads, d, rows, splits = 2, 128, 3, 6
    part = _partials(rng, rows, heads, d, splits)
    op = "attention_reduce" if fmt == "f32" else "attention_reduce_pack"
    attrs = {"format": fmt} if fmt != "f32" else {}
    ctx = context([{"dtype": "f32", "shape": ["rows", heads, "splits", d + 2]},
                   {"dtype": fmt, "shape": ["rows", heads * d]}], {})
    launches = at.launches(lowered({"op": op, "args": [{"buf": 0}], "outs": [{"buf": 1}], "attrs": attrs}), ctx)
    dims = {"rows": rows, "splits": splits}
    if fmt in ("f32", "f16", "bf16"):
        dtype = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[fmt]
        out = np.full((rows, heads * d), 0xFFFF if fmt == "bf16" else np.nan, dtype)
        run(library(catalog, isa), launches, {"buf:0": part, "buf:1": out}, dims)
        want = np.zeros_like(out)
        ck.attention_decode(op, attrs, [want], part)
        assert not np.isnan(ck.values(out)).any()
        assert nmse(ck.values(out), ck.values(want)) < 1e-12
        return
    runs = []
    for poison in (True, False):  # 8-bit planes take any value: two poisons prove every byte written
        raw, packed = packed_buffer(fmt, rows, heads * d, poison)
        run(library(catalog, isa), launches, {"buf:0": part, "buf:1": raw}, dims)
        runs.append(packed)
    for name, plane in runs[0].planes.items():
        assert np.array_equal(plane, runs[1][name]), name
    _, want = packed_buffer(fmt, rows, heads * d)
    ck.attention_decode(op, attrs, [want], part)
    assert np.mean(runs[0]["qs"] == want["qs"]) > 0.999
    assert nmse(ck.values(runs[0]), ck.values(want)) < 1e-7


def test_launch_records():
    ctx = context([{"dtype": "f32", "shape": [1, 1024]}, {"dtype": "f32", "shape": [1, 4, "splits", 258]}], {})
    attrs = {"chunk": 256, "heads": 4, "kv_heads": 1, "layer": 6, "scale": 0.0625, "window": 512}
    (ln,) = at.launches(lowered({"op": "attention_partial", "attrs": attrs, "args": ARGS, "outs": [{"buf": 1}]}), ctx)
    assert ln.kernel.name == "lp_cpu_attention_partial_g4" and ln.grid == (1,)
    # the contract's arguments (operands.attention_params), then rows, heads, d, chunk
    assert wire(ln.args)[5:] == [{"buf": 1}, {"i32": 6}, {"i32": "pages"}, {"i32": "blocks"}, {"i32": 1},
                                 {"i32": "splits"}, {"i32": 512}, {"f32": 0.0625}, {"i32": 1}, {"i32": 4}, {"i32": 256},
                                 {"i32": 256}]
