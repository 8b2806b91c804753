"""The embedding gather (codegen/families/embed.py, codegen/kernels/embed.cu + quant.cuh).

Launch records; a build of every table format for all five targets (no spills, no stack, no float FMA
in the dequantization: the CPU twin rounds every product on its own); and bit-exact rows against the
CPU twin (runtime/numpy_kernels.py embed over core/formats.dequantize) on the CPU emulator
(tests/kernel_emu.py), random quant bytes, with out-of-range tokens giving NaN rows.
"""

from __future__ import annotations

import functools
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest

from llmplan.codegen import build as build_mod
from llmplan.codegen.build import BuildError
from llmplan.codegen.families import embed
from llmplan.codegen.kernel import Context
from llmplan.codegen.targets import TARGETS
from llmplan.core.formats import FORMATS
from llmplan.runtime.numpy_kernels import MappedRows
from llmplan.runtime.numpy_kernels import embed as cpu_embed

from codegen_checks import built, needs_emulator, rng  # noqa: F401 (rng: a fixture)
from conftest import require_compiler
from kernel_emu import runner
from kernel_inputs import planar_bytes, random_blocks
from launch_records import lowered, phase_buffers, wire


def test_launch():
    ctx = Context(phase_buffers([{"dtype": "f32", "shape": ["rows", 4096]}]), {"token_embd.weight": ("Q4_K", (128256, 4096))},
                  TARGETS["sm_90"])
    launch = lowered({"op": "embed", "attrs": {}, "args": [{"weight": "token_embd.weight"}, {"state": "tokens"}],
              "outs": [{"buf": 0}]})
    (ln,) = embed.launches(launch, ctx)
    assert ln.kernel.name == "lp_embed_q4_k" and ln.kernel.family == "embed_rows" and ln.kernel.block == 256
    assert ln.grid == (("rows", 1),) and ln.smem == 0
    assert wire(ln.args) == [{"weight": "token_embd.weight", "layout": "planar"}, {"state": "tokens"}, {"buf": 0},
                       {"i32": 128256}, {"i32": 4096}]
    assert ln.kernel.entry == ("LP_KERNEL void __launch_bounds__(256) lp_embed_q4_k(const void* table, "
                               "const int* tokens, float* out, int vocab, int k) "
                               "{ lp_embed<LP_FMT_Q4_K>(table, tokens, out, vocab, k); }")


def test_unreadable_tables_are_errors():
    ctx = Context(phase_buffers([{"dtype": "f32", "shape": ["rows", 100]}]), {"t": ("Q8_0", (10, 100))}, TARGETS["sm_90"])
    with pytest.raises(BuildError, match="not a multiple"):
        embed.launches(lowered({"op": "embed", "attrs": {}, "args": [{"weight": "t"}, {"state": "tokens"}],
                        "outs": [{"buf": 0}]}), ctx)


def catalog(target) -> list:
    return [embed.kernel(f) for f in embed.FORMATS]


@pytest.mark.parametrize("target", list(TARGETS))
def test_every_format_builds(target):
    b = built(catalog, target)  # no spills, no stack
    for f in embed.FORMATS:
        m = b.manifests[f"lp_embed_{f.lower()}"]
        assert m.shared_bytes == 0, m
        assert 0 < m.registers <= 64, m
    if TARGETS[target].nvidia:  # products are rounded alone (mul.rn), so ptxas cannot fuse them either
        assert "fma.rn.f32" not in b.ptx and "fma.f32" not in b.ptx


@pytest.mark.parametrize("target", ["gfx1151", "gfx942"])
def test_no_float_fma_on_amd(target):
    """The dequantizers' `d * q - m` must not become an FMA (it would round once, NumPy rounds twice)."""
    t = TARGETS[target]
    require_compiler(t)
    ks = catalog(t)
    with tempfile.TemporaryDirectory() as tmp:
        _, asm, _ = build_mod._compile_hip(build_mod.render(ks), t, Path(tmp))
    for k in ks:
        body = re.search(rf"\n{k.name}:[^\n]*\n(.*?)\n\.Lfunc_end", asm, re.S).group(1)
        assert not re.search(r"v_(dual_)?(fma|fmac|mad|mac)\w*_f32|v_pk_fma", body), k.name


@functools.cache
def emu(wave: int):
    return runner([embed.kernel(f) for f in embed.FORMATS], wave)


@needs_emulator
@pytest.mark.parametrize("wave", [32, 64])
@pytest.mark.parametrize("fmt", embed.FORMATS)
def test_rows_are_bit_exact(fmt, wave, rng):
    vocab = 9
    k = {1: 200, 32: 320, 256: 768}[FORMATS[fmt].block]  # k > 256 threads for the small blocks
    blocks = random_blocks(rng, fmt, vocab, k)
    table = planar_bytes(fmt, blocks, vocab, k)
    tokens = np.array([4, 0, 8, 4, 9, -1, 2], np.int32)  # 9 and -1 are outside the table
    inside = (tokens >= 0) & (tokens < vocab)
    out = np.full((len(tokens) + 1, k), 7.0, np.float32)  # the extra row must stay untouched
    ctx = Context(phase_buffers([{"dtype": "f32", "shape": ["rows", k]}]), {"t": (fmt, (vocab, k))}, TARGETS["sm_90"])
    (ln,) = embed.launches(lowered({"op": "embed", "attrs": {}, "args": [{"weight": "t"}, {"state": "tokens"}],
                            "outs": [{"buf": 0}]}), ctx)
    emu(wave).launch(ln, lambda ref: table if "weight" in ref else tokens if "state" in ref else out,
                     {"rows": len(tokens)})
    want = np.empty((inside.sum(), k), np.float32)
    cpu_embed("embed", {}, [want], MappedRows(blocks.view(np.uint8).reshape(-1), fmt, FORMATS[fmt].row_bytes(k)),
              tokens[inside])
    np.testing.assert_array_equal(out[:-1][inside].view(np.uint32), want.view(np.uint32))
    assert np.isnan(out[:-1][~inside]).all()
    assert (out[-1] == 7.0).all()
