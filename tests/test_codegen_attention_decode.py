"""Split-context decode attention kernels (codegen/families/attention_decode.py): they build for every
target with no spills and the 128-bit loads they are designed around, their Launch records are what
the runtime needs, and, run on the host emulator (tests/kernel_emu.py) through those records, they
compute what the CPU twins compute, on wave32 and wave64 layouts, reading the paged cache through a
scrambled page table with NaN in every cell and table entry they have no business reading."""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest

from llmplan.codegen.build import KERNEL_DIR, BuildError
from llmplan.codegen.families import attention_decode as ad
from llmplan.codegen.kernel import Context
from llmplan.codegen.targets import TARGETS
from llmplan.core import numerics as num
from llmplan.core.formats import ACTIVATIONS
from llmplan.runtime import numpy_kernels as ck

from codegen_checks import built, needs_emulator
from kernel_emu import runner
from kernel_inputs import nmse, packed_buffer, page_table, paged_cache
from launch_records import lowered, phase_buffers, wire

# (head_dim, group, chunk): Llama-3-8B, Llama-3-70B, Gemma 3, Llama 2 (MHA), small and odd head sizes,
# a head over 256 (two 16-byte slices per lane), a short chunk
PARTIALS = [(128, 4, 256), (128, 8, 256), (256, 4, 256), (128, 1, 256), (64, 1, 256), (80, 2, 256), (512, 1, 256),
            (128, 4, 64)]
NAMES = ["lp_attention_partial_d128_g4_c256", "lp_attention_partial_d128_g8_c256", "lp_attention_partial_d256_g4_c256",
         "lp_attention_partial_d128_g1_c256", "lp_attention_partial_d64_g1_c256", "lp_attention_partial_d80_g2_c256",
         "lp_attention_partial_d512_g1_c256", "lp_attention_partial_d128_g4_c64", "lp_attention_reduce_pack_q8_0",
         "lp_attention_reduce_pack_q8_1", "lp_attention_reduce_pack_q8_k", "lp_attention_reduce_pack_f16",
         "lp_attention_reduce_pack_bf16", "lp_attention_reduce_f32"]


def all_kernels():
    return [ad.partial_kernel(*p) for p in PARTIALS] + [ad.reduce_kernel(f) for f in ACTIVATIONS]


# --- building ------------------------------------------------------------------------------------

def test_names_are_stable():
    assert [k.name for k in all_kernels()] == NAMES
    assert all(k.block == 256 for k in all_kernels())
    # a G x D cross-wave reduction over 4 waves past 32 KiB falls back to 128 threads
    assert ad.partial_threads(256, 8) == 256 and ad.partial_threads(256, 16) == 128


def catalog(target) -> list:
    return [k for k in all_kernels() if k.family not in target.unsupported]


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_builds_without_spills(target):
    t = TARGETS[target]
    b = built(catalog, target)  # the gates (no spills, device code, expected instructions), no stack
    for k in catalog(t):
        m = b.manifests[k.name]
        assert 0 < m.registers <= 128, (k.name, m.registers)
        assert m.wave == t.wave
        if k.family == "attention_partial":
            assert m.instructions["load128"] >= 2, (k.name, m.instructions)  # K and V rows, 16 bytes a lane
            assert m.shared_bytes <= 32768 + 128, (k.name, m.shared_bytes)  # + statistics and page blocks
        else:
            assert m.shared_bytes <= ad.TILE * 4 + 64, (k.name, m.shared_bytes)


def test_the_kernels_page_is_the_caches():
    """common.cuh's LP_PAGE, which every kernel on the cache addresses it by, is numerics.PAGE."""
    page = re.search(r"^#define LP_PAGE (\d+)$", (KERNEL_DIR / "common.cuh").read_text(), re.M)
    assert page and int(page.group(1)) == num.PAGE


def test_shape_errors():
    with pytest.raises(BuildError, match="multiple of 8"):
        ad.partial_kernel(100, 1, 256)
    with pytest.raises(BuildError, match="shared memory"):
        ad.partial_kernel(128, 16, 1024)
    with pytest.raises(BuildError, match="whole 16-position pages"):
        ad.partial_kernel(128, 4, 200)
    with pytest.raises(BuildError, match="format"):
        ad.launches(lowered({"op": "attention_reduce_pack", "args": [{"buf": 1}], "outs": [{"buf": 2}],
                             "attrs": {"format": "q4_k"}}), gemma_context())


# --- launch records ------------------------------------------------------------------------------

def gemma_context(target="sm_89"):
    buffers = [{"dtype": "f32", "shape": ["rows", 1024]}, {"dtype": "f32", "shape": [1, 4, "splits", 258]},
               {"dtype": "q8_k", "shape": [1, 1024]}]
    return Context(phase_buffers(buffers), {}, TARGETS[target])


PARTIAL_LAUNCH = lowered({"op": "attention_partial", "args": [{"buf": 0}, {"cache": 1}, {"state": "seq"}, {"state": "pages"},
                                                     {"state": "pos"}],
                  "outs": [{"buf": 1}], "attrs": {"chunk": 256, "heads": 4, "kv_heads": 1, "layer": 6,
                                                  "scale": 0.0625, "window": 512}})


def test_partial_launch_record():
    (l,) = ad.launches(PARTIAL_LAUNCH, gemma_context())
    assert l.kernel.name == "lp_attention_partial_d256_g4_c256" and l.kernel.block == 256
    assert l.grid == (("splits", 1), 1, 1)
    assert wire(l.args) == [{"buf": 0}, {"cache": 1}, {"state": "seq"}, {"state": "pages"}, {"state": "pos"}, {"buf": 1},
                      {"i32": 6}, {"i32": "pages"}, {"i32": "blocks"}, {"i32": 1}, {"i32": "splits"}, {"i32": 512},
                      {"f32": 0.0625}]
    assert l.smem == 0 and l.kernel.expects == ("load128",)


def test_reduce_launch_records():
    ctx = gemma_context()
    (l,) = ad.launches(lowered({"op": "attention_reduce_pack", "args": [{"buf": 1}], "outs": [{"buf": 2}],
                        "attrs": {"format": "q8_k"}}), ctx)
    assert l.kernel.name == "lp_attention_reduce_pack_q8_k" and l.kernel.family == "attention_reduce"
    assert l.grid == (4, 1)  # 1024 outputs / 256 per block, one row
    assert wire(l.args) == [{"buf": 1}, {"buf": 2}, {"i32": 1}, {"i32": 4}, {"i32": 256}, {"i32": "splits"}]
    (l,) = ad.launches(lowered({"op": "attention_reduce", "args": [{"buf": 1}], "outs": [{"buf": 0}], "attrs": {}}), ctx)
    assert l.kernel.name == "lp_attention_reduce_f32"


# --- emulated runs against the CPU twins ---------------------------------------------------------

# (head_dim, group, kv_heads, chunk, ctx, window, seq, pos): each row's sequence and position
CASES = [
    (128, 4, 2, 64, 256, 0, [2, 0], [200, 0]),       # Llama-3 shape, several splits; a first token
    (256, 4, 1, 64, 192, 40, [1], [150]),            # Gemma 3 local layer: a window across two splits, mid-page
    (80, 2, 2, 32, 96, 0, [0, 2, 1], [95, 31, 32]),  # odd head size; the last position; split edges
    (512, 1, 1, 32, 64, 0, [1], [40]),               # two slices per lane
    (128, 4, 2, 256, 512, 0, [0], [300]),            # the 256-position chunk decode runs: 16 pages a block
]


@pytest.fixture(scope="module")
def emulators():
    """wave -> runner, built on first use (a GPU runner skips the wave width its GPU lacks)."""
    kernels = [ad.partial_kernel(c[0], c[1], c[3]) for c in CASES] + [ad.reduce_kernel(f) for f in ACTIVATIONS]
    return functools.cache(lambda wave: runner(kernels, wave))


@needs_emulator
@pytest.mark.parametrize("wave", [32, 64])
@pytest.mark.parametrize("case", CASES, ids=[f"d{c[0]}_g{c[1]}" for c in CASES])
def test_partial_matches_twin(emulators, wave, case):
    d, g, kvh, chunk, ctx_len, window, seq, pos = case
    rng = np.random.default_rng(d + g + chunk)
    layers, seqs, heads, rows = 2, 3, g * kvh, len(seq)
    npages = ctx_len // num.PAGE
    splits = -(-npages * num.PAGE // chunk)
    table, blocks = page_table(rng, seqs, npages)
    # random values where each row reads (its sequence's positions [first, pos]), NaN in every other cell
    # and behind every other entry of the page table
    readable = {s: (num.first_position(p, window), p + 1) for s, p in zip(seq, pos)}
    cache, pages = paged_cache(rng, layers, kvh * d, table, blocks, readable, scale=2.0)
    q = rng.standard_normal((rows, heads * d)).astype(np.float32)
    seq, pos = np.array(seq, np.int32), np.array(pos, np.int32)
    attrs = {"chunk": chunk, "heads": heads, "kv_heads": kvh, "layer": 1, "scale": float(d**-0.5), "window": window}
    launch = lowered({"op": "attention_partial", "attrs": attrs, "args": [{"buf": 0}, {"cache": 1}, {"state": "seq"},
              {"state": "pages"}, {"state": "pos"}], "outs": [{"buf": 1}]})
    ctx = Context(phase_buffers([{"dtype": "f32", "shape": ["rows", heads * d]},
                   {"dtype": "f32", "shape": ["rows", heads, "splits", d + 2]}]), {}, TARGETS["sm_89"])
    (l,) = ad.launches(launch, ctx)
    part = np.full((rows, heads, splits, d + 2), np.nan, np.float32)
    arrays = {"buf": {0: q, 1: part}, "state": {"seq": seq, "pages": pages, "pos": pos}}
    bind = (lambda ref: cache if "cache" in ref else arrays["buf"][ref["buf"]] if "buf" in ref
            else arrays["state"][ref["state"]])
    emulators(wave).launch(l, bind, {"rows": rows, "splits": splits, "pages": npages, "blocks": blocks})

    want = np.zeros_like(part)
    ck.attention_decode("attention_partial", attrs, [want], q, cache, seq, pages, pos)
    assert np.isfinite(want[..., :d]).all(), "the twin reads only the readable cells"
    assert not np.isnan(part).any(), "every slice written"
    used = np.isfinite(want[..., d])
    assert np.array_equal(np.isfinite(part[..., d]), used)
    assert (part[~used][:, :d] == 0).all() and (part[~used][:, d + 1] == 0).all()  # (0, -inf, 0)
    # accumulation-order class (docs/numerics.md: 5e-4); measured about 1e-9: an f16 weight may round the other
    # way when a score differs in its last bit
    assert nmse(part[used], want[used]) < 1e-6
    assert np.allclose(part[used][:, d], want[used][:, d], rtol=1e-5, atol=1e-5)  # the max scores


def _partials(rng, rows, heads, d, splits):
    """Partials as attention_partial leaves them: some splits empty (0, -inf, 0), others random."""
    part = np.zeros((rows, heads, splits, d + 2), np.float32)
    part[..., d] = -np.inf
    for r in range(rows):
        for j in rng.choice(splits, size=1 + r % splits, replace=False):
            part[r, :, j, :d] = rng.standard_normal((heads, d))
            part[r, :, j, d] = rng.uniform(-5, 5, heads)
            part[r, :, j, d + 1] = rng.uniform(1, 50, heads)
    return part


@needs_emulator
@pytest.mark.parametrize("wave", [32, 64])
@pytest.mark.parametrize("fmt", list(ACTIVATIONS))
def test_reduce_matches_twin(emulators, wave, fmt):
    heads, d = (8, 128) if fmt == "q8_k" else (5, 96)  # 480 outputs: a partial last tile
    rows, splits = 3, 6
    rng = np.random.default_rng(7)
    part = _partials(rng, rows, heads, d, splits)
    op = "attention_reduce" if fmt == "f32" else "attention_reduce_pack"
    ctx = Context(phase_buffers([{"dtype": "f32", "shape": ["rows", heads, "splits", d + 2]},
                   {"dtype": fmt, "shape": ["rows", heads * d]}]), {}, TARGETS["gfx942"])
    (l,) = ad.launches(lowered({"op": op, "args": [{"buf": 0}], "outs": [{"buf": 1}],
                        "attrs": {"format": fmt} if fmt != "f32" else {}}), ctx)
    symbols = {"rows": rows, "splits": splits}
    want_f32 = num.reduce_partials(part)
    if fmt in ("f32", "f16", "bf16"):
        dtype = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[fmt]
        out = np.full((rows, heads * d), 0xFFFF if fmt == "bf16" else np.nan, dtype)
        emulators(wave).launch(l, lambda ref: part if ref["buf"] == 0 else out, symbols)
        want = np.zeros_like(out)
        ck.attention_decode(op, {"format": fmt} if fmt != "f32" else {}, [want], part)
        got_f = ck.values(out)
        assert not np.isnan(got_f).any()
        assert nmse(got_f, ck.values(want)) < 1e-7
        if fmt == "f32":
            assert np.abs(out - want_f32).max() <= 4e-7 * np.abs(want_f32).max()
        return
    runs = []
    for poison in (True, False):  # 8-bit planes take any value: two poisons prove every byte written
        raw, packed = packed_buffer(fmt, rows, heads * d, poison)
        emulators(wave).launch(l, lambda ref: part if ref["buf"] == 0 else raw, symbols)
        runs.append((raw, packed))
    for name, plane in runs[0][1].planes.items():  # (the padding between planes is nobody's)
        assert np.array_equal(plane, runs[1][1][name]), name
    _, want = packed_buffer(fmt, rows, heads * d)
    ck.attention_decode(op, {"format": fmt}, [want], part)
    got = runs[0][1]
    # the packing is exact; its input may differ from the twin's by an ulp (the order of the sums)
    assert np.mean(got["qs"] == want["qs"]) > 0.999
    assert nmse(ck.values(got), ck.values(want)) < 1e-7
