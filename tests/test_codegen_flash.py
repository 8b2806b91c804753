"""Prefill attention (codegen/families/attention_prefill.py, codegen/kernels/flash_attention.cu).

- Launch records: names, grids (GQA groups per flash block), arguments, member choice and errors.
- Builds: the flash member (head dims 64, 128, 256) and the row member for all five targets (gfx942
  declares flash_attention unsupported), one translation unit per target: no spills, no stack, f16
  matrix-core instructions in the flash kernels, static shared memory as shared_bytes() says.
- Numbers on the CPU (tests/kernel_emu.py, mma.sync and WMMA fragments emulated; the row member also
  on waves of 64) against the CPU twin (core/numerics.py attention): chunks spanning several
  sequences in one tile, GQA groups that do and do not divide a block, sliding windows, contexts of
  many K/V tiles; the cache is paged, read through a page table in scrambled block order, with NaN in
  every cell the rows may not read (before a window inside its first page, past the last row's
  position) and behind every page-table entry outside the sequence's range; a permuted placement of
  the same pages gives the same bits.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from llmplan.codegen.build import BuildError
from llmplan.codegen.families import attention_prefill as attn
from llmplan.codegen.kernel import Context
from llmplan.codegen.targets import TARGETS
from llmplan.core import numerics as num

from codegen_checks import built, needs_emulator, rng  # noqa: F401 (rng: a fixture)
from kernel_emu import runner
from kernel_inputs import nmse, page_table, paged_cache
from launch_records import lowered, phase_buffers, wire

DIMS = (64, 128, 256)
# online softmax rounds exp(s - running max) to f16 where the twin rounds exp(s - final max): the
# accumulation-order class (5e-4); observed errors are ~1e-9
LOOSE = 1e-6


def attention_launch(heads, kv_heads, member=None, window=0, layer=1, scale=0.125):
    d = {"op": "attention", "attrs": {"layer": layer, "heads": heads, "kv_heads": kv_heads, "scale": scale,
                                      "window": window},
         "args": [{"buf": 0}, {"cache": 1}, {"state": "seq"}, {"state": "pages"}, {"state": "pos"}],
         "outs": [{"buf": 1}]}
    return lowered(d | ({"member": member} if member else {}))


def ctx_for(target, width):
    return Context(phase_buffers([{"dtype": "f32", "shape": ["rows", width]}] * 2), {}, TARGETS[target])


# --- Launch records -------------------------------------------------------------------------------

def test_flash_launch():
    (ln,) = attn.launches(attention_launch(32, 8, "flash"), ctx_for("sm_90", 32 * 128))
    k = ln.kernel
    assert (k.name, k.family, k.source, k.block, k.expects) == (
        "lp_attention_flash_d128", "flash_attention", "flash_attention.cu", 128, ("hmma",))
    assert ln.grid == (("rows", 16), 8)  # 64 query vectors per block = 16 rows x 4 heads of a group
    assert ln.smem == 0
    assert wire(ln.args) == [{"buf": 0}, {"cache": 1}, {"state": "seq"}, {"state": "pages"}, {"state": "pos"}, {"buf": 1},
                       {"i32": "rows"}, {"i32": 32}, {"i32": 8}, {"i32": "pages"}, {"i32": "blocks"}, {"i32": 1},
                       {"f32": 0.125}, {"i32": 0}]


def test_flash_geometry_per_head_dim():
    (ln,) = attn.launches(attention_launch(4, 1, "flash", window=512), ctx_for("gfx1151", 4 * 256))  # gemma 3
    assert ln.kernel.name == "lp_attention_flash_d256" and ln.kernel.block == 64
    assert ln.grid == (("rows", 8), 1)
    (ln,) = attn.launches(attention_launch(6, 2, "flash"), ctx_for("gfx1100", 6 * 64))  # group of 3: 21 rows
    assert ln.grid == (("rows", 21), 2) and ln.kernel.block == 128


def test_rows_launch():
    (ln,) = attn.launches(attention_launch(4, 2, "rows"), ctx_for("gfx942", 4 * 64))
    assert (ln.kernel.name, ln.kernel.family, ln.kernel.block, ln.kernel.expects) == (
        "lp_attention_rows_d64", "attention_rows", 128, ())
    assert ln.grid == (("rows", 1), 4)


def test_default_members():
    assert attn.launches(attention_launch(8, 2), ctx_for("sm_89", 8 * 128))[0].kernel.name == "lp_attention_flash_d128"
    assert attn.launches(attention_launch(8, 2, "numpy"), ctx_for("gfx942", 8 * 128))[0].kernel.name == \
        "lp_attention_rows_d128"
    assert attn.launches(attention_launch(4, 4), ctx_for("sm_90", 4 * 96))[0].kernel.name == "lp_attention_rows_d96"
    assert attn.members(TARGETS["gfx942"], 128, 4) == ["rows"]
    assert attn.members(TARGETS["sm_90"], 128, 128) == ["rows"]  # a group wider than a flash block
    assert attn.members(TARGETS["gfx942"], 96) == []  # rows need a multiple of the 64-wide wave there


def test_errors_name_the_problem():
    with pytest.raises(BuildError, match="no kernel for head dim 128, group 4 on gfx942: CDNA3"):
        attn.launches(attention_launch(8, 2, "flash"), ctx_for("gfx942", 8 * 128))
    with pytest.raises(BuildError, match="not one of"):
        attn.launches(attention_launch(8, 2, "paged"), ctx_for("sm_90", 8 * 128))
    with pytest.raises(BuildError, match="do not fit"):
        attn.launches(attention_launch(8, 3, "flash"), ctx_for("sm_90", 8 * 128))


def test_shared_memory():
    assert [attn.shared_bytes("flash", d) for d in DIMS] == [28464, 37152, 38032]
    assert attn.shared_bytes("rows", 256, 64) == 4 * (256 + 4 + 2 * 256)


# --- builds ---------------------------------------------------------------------------------------

def catalog(t) -> list:
    ks = [attn.kernel("rows", d) for d in DIMS if d % t.wave == 0]
    if "flash_attention" not in t.unsupported:
        ks += [attn.kernel("flash", d) for d in DIMS]
    return ks


@pytest.mark.parametrize("target", list(TARGETS))
def test_every_member_builds(target):
    t = TARGETS[target]
    b = built(catalog, target)  # the gates (no spills, device code, expected instructions), no stack
    kernels = catalog(t)
    assert len(kernels) == (3 if target == "gfx942" else 6)
    for k in kernels:
        m = b.manifests[k.name]
        d = int(k.name.rsplit("_d", 1)[1])
        assert 0 < m.registers <= (255 if t.nvidia else 256), (k.name, m.registers)
        assert m.threads == k.block
        member = "flash" if k.family == "flash_attention" else "rows"
        assert m.shared_bytes == attn.shared_bytes(member, d, t.wave), (k.name, m.shared_bytes)
        assert m.shared_bytes <= 48 * 1024
        assert m.instructions["load128"] > 0, k.name
        if member == "flash":
            assert m.instructions["hmma"] > 0, k.name


# --- numbers on the CPU ---------------------------------------------------------------------------

@functools.cache
def emulator(mode: str, wave: int):
    member = "rows" if mode == "plain" else "flash"
    return runner([attn.kernel(member, d) for d in DIMS], wave, mode)


LAYER = 1


def paged_inputs(rng, d, heads, kv_heads, seq, pos, window, ctx, seqs):
    """(q, cache, page table) for query rows of these sequences and positions: the pages in scrambled
    blocks, random values in each sequence's positions [first of its rows, last of its rows], NaN in
    every other cell and behind every other table entry (numerics.attention reads none of them)."""
    table, blocks = page_table(rng, seqs, -(-ctx // num.PAGE))
    readable = {s: (min(num.first_position(p, window) for p in pos[seq == s]), pos[seq == s].max() + 1)
                for s in np.unique(seq)}
    cache, pages = paged_cache(rng, 2, kv_heads * d, table, blocks, readable, scale=0.7)
    q = (rng.standard_normal((len(seq), heads * d)) * 1.5).astype(np.float32)
    return q, cache, pages


def attend(mode, wave, q, cache, seq, pages, pos, heads, kv_heads, window):
    """The member's output for these inputs, run on the emulator through its Launch record."""
    member = "rows" if mode == "plain" else "flash"
    target = {"mma": "sm_90", "wmma": "gfx1151", "plain": "gfx942" if wave == 64 else "sm_89"}[mode]
    rows, width = q.shape
    scale = 1.0 / np.sqrt(width // heads)
    out = np.full((rows + 1, width), np.nan, np.float32)  # poisoned, with a guard row
    (ln,) = attn.launches(attention_launch(heads, kv_heads, member, window, LAYER, scale), ctx_for(target, width))
    state = {"seq": seq, "pages": pages, "pos": pos}

    def bind(ref):
        if "cache" in ref:
            return cache
        if "state" in ref:
            return state[ref["state"]]
        return q if ref["buf"] == 0 else out

    emulator(mode, wave).launch(ln, bind, {"rows": rows, "pages": pages.shape[1], "blocks": cache.shape[2]})
    assert np.isnan(out[rows]).all(), "wrote past the output rows"
    return out[:rows]


def run(mode, d, heads, kv_heads, seq, pos, rng, window=0, ctx=96, seqs=3, wave=32):
    """(kernel output, twin output) for query rows with these sequences and positions."""
    seq, pos = np.asarray(seq, np.int32), np.asarray(pos, np.int32)
    q, cache, pages = paged_inputs(rng, d, heads, kv_heads, seq, pos, window, ctx, seqs)
    got = attend(mode, wave, q, cache, seq, pages, pos, heads, kv_heads, window)
    want = num.attention(q, cache, seq, pages, pos, LAYER, heads, kv_heads, 1.0 / np.sqrt(d), window)
    assert not np.isnan(want).any(), "the twin reads only what the inputs make readable"
    return got, want


MODES = ["mma", "wmma", "plain"]
# a prefill chunk over three sequences: sequence 2 at positions 10..30, 0 from 0..20, 1 at 40
MIXED = ([2] * 21 + [0] * 21 + [1], list(range(10, 31)) + list(range(21)) + [40])


@needs_emulator
@pytest.mark.parametrize("d", DIMS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("heads,kv_heads", [(4, 1), (6, 2), (3, 3)])  # groups of 4, 3 (21-row blocks), 1
def test_mixed_sequences_match_the_twin(mode, d, heads, kv_heads, rng):
    got, want = run(mode, d, heads, kv_heads, *MIXED, rng)
    assert not np.isnan(got).any()
    assert nmse(got, want) < LOOSE


@needs_emulator
@pytest.mark.parametrize("d", DIMS)
@pytest.mark.parametrize("mode", MODES)
def test_sliding_window_and_long_context(mode, d, rng):
    """A 40-row chunk at positions 120..159 of one sequence (many K/V tiles, the causal edge inside
    tiles), with and without a window of 37."""
    seq, pos = [1] * 40, list(range(120, 160))
    for window in (0, 37):
        got, want = run(mode, d, 8, 2, seq, pos, rng, window=window, ctx=176)
        assert nmse(got, want) < LOOSE, window


@needs_emulator
@pytest.mark.parametrize("mode", MODES)
def test_the_page_table_places_the_positions(mode, rng):
    """The same pages moved to other blocks, the table moved with them, give the same bits (and no
    NaN: nothing outside the rows' positions is read)."""
    seq, pos = np.array(MIXED[0], np.int32), np.array(MIXED[1], np.int32)
    q, cache, pages = paged_inputs(rng, 128, 4, 2, seq, pos, 0, 96, 3)
    perm = rng.permutation(cache.shape[2])
    moved = np.empty_like(cache)
    moved[:, :, perm] = cache
    got = attend(mode, 32, q, cache, seq, pages, pos, 4, 2, 0)
    assert not np.isnan(got).any()
    assert np.array_equal(attend(mode, 32, q, moved, seq, perm[pages].astype(np.int32), pos, 4, 2, 0), got)


@needs_emulator
@pytest.mark.parametrize("mode", MODES)
def test_single_rows_and_decode_like_chunks(mode, rng):
    """One row per sequence (a chunk of decode-like rows of four sequences), position 0 alone, and a
    row past the twin's first 256-position slice."""
    got, want = run(mode, 64, 4, 1, [3, 0, 2, 1], [50, 0, 7, 300], rng, ctx=320, seqs=4)
    assert nmse(got, want) < LOOSE


@needs_emulator
@pytest.mark.parametrize("d", DIMS)
def test_rows_on_a_wave_of_64(d, rng):
    """The row member is what gfx942 runs, on waves of 64: mixed sequences, then a window."""
    got, want = run("plain", d, 6, 2, *MIXED, rng, wave=64)
    assert nmse(got, want) < LOOSE
    got, want = run("plain", d, 8, 2, [1] * 40, list(range(120, 160)), rng, window=37, ctx=176, wave=64)
    assert nmse(got, want) < LOOSE
