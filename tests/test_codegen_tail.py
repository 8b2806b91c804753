"""The fused tail (codegen/families/tail.py, codegen/kernels/tail.cu): norm + pack, head mat-vec with a
per-slice argmax, and the final reduction to one token per row.

Launch records (three launches and the scratch references they share); builds of every head format and
activation format for all five targets; and on the CPU emulator (tests/kernel_emu.py) against the CPU
twin runtime/numpy_kernels.py tail_argmax: the packed rows byte for byte against the twin's packing, the
final token of every row, the per-slice partial results against the twin's logits, ties (the lower
index wins, as np.argmax) and NaN logits (the first NaN wins).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

from llmplan.codegen.build import BuildError
from llmplan.codegen.families import matvec, tail
from llmplan.codegen.kernel import Context
from llmplan.codegen.targets import TARGETS
from llmplan.core import numerics as num
from llmplan.core.formats import ACTIVATION_FORMAT, ACTIVATION_FORMATS, dequantize, planes
from llmplan.runtime.numpy_kernels import tail_argmax as cpu_tail

from codegen_checks import built, needs_emulator, rng  # noqa: F401 (rng: a fixture)
from kernel_emu import runner
from kernel_inputs import planar_bytes, random_blocks, random_weight
from launch_records import lowered, phase_buffers, wire

EPS = 1e-5


def tail_launch(fmt, vocab, k, rows, target="sm_90", member=None, act=None):
    ctx = Context(phase_buffers([{"dtype": "f32", "shape": [rows, k]}, {"dtype": "i32", "shape": [rows]}]),
                  {"output_norm.weight": ("F32", (k,)), "output.weight": (fmt, (vocab, k))}, TARGETS[target])
    launch = lowered({"op": "tail_argmax", "attrs": {"eps": EPS, "format": act or ACTIVATION_FORMAT[fmt.lower()]},
              "args": [{"buf": 0}, {"weight": "output_norm.weight"}, {"weight": "output.weight"}],
              "outs": [{"buf": 1}]})
    return tail.launches(dataclasses.replace(launch, member=member or ""), ctx)


# --- the Launch records ---------------------------------------------------------------------------------

def test_launches():
    pack, logits, reduce = tail_launch("Q6_K", 128256, 4096, "rows", member="c1")
    blocks = -(-128256 // tail.SLICE)
    packed = {"scratch": "tail_argmax.x", "dtype": "q8_k", "shape": ["rows", 4096], "offset": 0, "bytes": 0}
    part = {"scratch": "tail_argmax.part", "dtype": "f32", "shape": ["rows", blocks, 2], "offset": 0, "bytes": 0}
    assert pack.kernel.name == "lp_tail_pack_q8_k" and pack.kernel.family == "tail_argmax"
    assert pack.kernel.block == 256 and pack.grid == (("rows", 1),) and pack.smem == 0
    assert wire(pack.args) == [{"buf": 0}, {"weight": "output_norm.weight"}, packed, {"i32": "rows"}, {"i32": 4096},
                         {"f32": EPS}]
    assert logits.kernel.name == "lp_tail_logits_q6_k_c1" and logits.kernel.family == "tail_argmax"
    assert logits.kernel.block == 128 and logits.kernel.expects == ("dot4", "load128")
    assert "__launch_bounds__(128, 1) lp_tail_logits_q6_k_c1(" in logits.kernel.entry
    assert logits.grid == (blocks, ("rows", 1)) and logits.smem == 0
    assert wire(logits.args) == [packed, {"weight": "output.weight", "layout": "planar"}, part, {"i32": "rows"},
                           {"i32": 4096}, {"i32": 128256}, {"i32": tail.SLICE}]
    assert reduce.kernel.name == "lp_tail_argmax_reduce" and reduce.kernel.block == 256 and reduce.smem == 0
    assert reduce.grid == (("rows", 1),)
    assert wire(reduce.args) == [part, {"buf": 1}, {"i32": blocks}]


def test_members_targets_and_formats():
    (_, logits, _) = tail_launch("Q8_0", 1000, 2048, 3)
    assert logits.kernel.name == "lp_tail_logits_q8_0_c3" and logits.grid == (-(-1000 // tail.SLICE), 1)
    (pack, logits, _) = tail_launch("F16", 262144, 640, "rows", target="gfx942")
    assert pack.kernel.name == "lp_tail_pack_f16" and pack.args[2].dtype == "f16"
    assert logits.kernel.name == "lp_tail_logits_f16_c8" and logits.kernel.expects == ("load128",)
    assert logits.kernel.block == 256 and "__launch_bounds__(256) lp_tail_logits_f16_c8(" in logits.kernel.entry


def test_errors():
    with pytest.raises(BuildError, match="packs q8_0"):
        tail_launch("Q6_K", 1000, 4096, 1, act="q8_0")
    with pytest.raises(BuildError, match="the kernels read"):
        tail_launch("BF16", 1000, 4096, 1, act="bf16")


# --- builds ---------------------------------------------------------------------------------------------

def catalog(target) -> list:
    return ([tail.pack_kernel(a) for a in tail.ACT_CODES] + [tail.reduce_kernel()]
            + [tail.logits_kernel(f, c, target) for f in matvec.FORMATS for c in (1, 8)])


@pytest.mark.parametrize("target", list(TARGETS))
def test_every_head_format_builds(target):
    t = TARGETS[target]
    b = built(catalog, target)  # no spills, no stack
    assert "tail_argmax" not in t.unsupported
    for k in catalog(t):
        m = b.manifests[k.name]
        # one row (decode): room for many waves; 8 rows: the compiler keeps more activations in registers
        assert 0 < m.registers <= (96 if k.name.endswith("_c1") else 255), (k.name, m.registers)
        assert m.shared_bytes <= 2048, (k.name, m.shared_bytes)  # the norm's and the waves' scratch
        if "logits" in k.name:
            assert m.instructions["load128"] > 0, k.name


# --- numbers on the emulator ------------------------------------------------------------------------------

@functools.cache
def emu(wave: int):
    t = TARGETS["gfx942" if wave == 64 else "sm_90"]
    ks = [tail.pack_kernel(a) for a in tail.ACT_CODES] + [tail.reduce_kernel()]
    ks += [tail.logits_kernel(f, 3, t) for f in matvec.FORMATS] + [tail.logits_kernel("Q8_0", 8, t)]
    return runner(ks, wave), t


def run_tail(wave, fmt, head_planar, head, rows, rng, member="c3", x=None):
    """Run the three launches on the emulator and the CPU twin; returns (the kernels' tokens, the twin's,
    the second kernel's partial results [rows, blocks] as (values, indices), the twin's logits)."""
    e, t = emu(wave)
    vocab, k = head.shape
    act = ACTIVATION_FORMAT[fmt.lower()]
    x = rng.standard_normal((rows, k)).astype(np.float32) if x is None else x
    norm = rng.uniform(0.5, 1.5, k).astype(np.float32)
    launches = tail_launch(fmt, vocab, k, "rows", target=t.name, member=member)
    blocks = launches[1].args[2].shape[1]
    if act == "f16":
        packed = np.full((rows, k), np.nan, np.float16)
    else:
        packed = np.full(planes(ACTIVATION_FORMATS[act.upper()], rows, k)[1], 0x80, np.uint8)  # poison
    part = np.full((rows, blocks, 2), np.nan, np.float32)
    out = np.full(rows + 1, -7, np.int32)  # poisoned, with a guard element
    scratch = {"tail_argmax.x": packed, "tail_argmax.part": part}

    def bind(ref):
        if "scratch" in ref:
            return scratch[ref["scratch"]]
        if "weight" in ref:
            return head_planar if ref["weight"] == "output.weight" else norm
        return x if ref["buf"] == 0 else out

    for ln in launches:
        e.launch(ln, bind, {"rows": rows})
    assert out[rows] == -7
    want = np.full(rows, -1, np.int32)
    cpu_tail("tail_argmax", {"eps": EPS, "format": act}, [want], x, norm, head)
    normed = num.rmsnorm(x, norm, EPS)
    # the packed rows are the twin's packing of the same norm, byte for byte
    if act == "f16":
        np.testing.assert_array_equal(packed.view(np.uint16), normed.astype(np.float16).view(np.uint16))
    else:
        ref = num.pack_blocks(normed, act)
        for p in planes(ACTIVATION_FORMATS[act.upper()], rows, k)[0]:
            got = packed[p.offset:p.offset + p.nbytes].view(p.dtype).reshape(p.shape)
            np.testing.assert_array_equal(got.view(np.uint8), np.ascontiguousarray(ref[p.name]).view(np.uint8),
                                          err_msg=f"packed {p.name}")
    logits = num.packed_values(normed, act) @ head.T
    return out[:rows], want, (part[..., 0], part[..., 1].view(np.int32)), logits


@needs_emulator
@pytest.mark.parametrize("wave", [32, 64])
@pytest.mark.parametrize("fmt", matvec.FORMATS)
def test_tail_matches_the_cpu_twin(fmt, wave, rng):
    vocab, k, rows = 600, 512, 5  # 3 slices (the last partial); 2 column blocks (the last partial)
    planar, head = random_weight(rng, fmt, vocab, k)
    got, want, (values, index), logits = run_tail(wave, fmt, planar, head, rows, rng)
    np.testing.assert_array_equal(got, want)
    for b in range(values.shape[1]):
        sl = logits[:, b * tail.SLICE:(b + 1) * tail.SLICE]
        np.testing.assert_allclose(values[:, b], sl.max(axis=1), rtol=1e-5, atol=1e-5 * np.abs(sl).max())
        top2 = np.sort(sl, axis=1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 1e-4 * np.abs(sl).max()
        np.testing.assert_array_equal(index[clear, b] - b * tail.SLICE, sl.argmax(axis=1)[clear])


@needs_emulator
@pytest.mark.parametrize("wave", [32, 64])
def test_ties_go_to_the_lower_index(wave, rng):
    """The best head row copied into later rows of the same and of later slices (equal logits, bit for
    bit): the first copy wins, as np.argmax."""
    vocab, k, rows = 800, 256, 4
    x = np.tile(rng.standard_normal((1, k)).astype(np.float32), (rows, 1))
    head16 = (rng.standard_normal((vocab, k)) * 0.01).astype(np.float16)
    for row in (300, 301, 450, 700, 777):  # 300 and 301: one slice, two waves; the others later slices
        head16[row] = (np.sign(x[0]) * 0.5).astype(np.float16)
    blocks = head16.reshape(-1).view(np.dtype([("v", "<f2")]))
    got, want, _, logits = run_tail(wave, "F16", planar_bytes("F16", blocks, vocab, k), head16.astype(np.float32),
                                    rows, rng, x=x)
    assert (logits[:, 300] == logits[:, 777]).all() and (logits.argmax(axis=1) == 300).all()
    assert (want == 300).all()
    np.testing.assert_array_equal(got, want)


@needs_emulator
def test_equal_rows_everywhere_give_row_zero(rng):
    """A head of identical rows: every logit ties, the answer is 0 for every row, in every slice."""
    vocab, k = 700, 256
    blocks = random_blocks(rng, "Q8_0", vocab, k).reshape(vocab, -1)
    blocks[:] = blocks[0]
    blocks = blocks.reshape(-1)
    head = dequantize(blocks.view(np.uint8).reshape(-1), "Q8_0", (vocab, k))
    got, want, (values, index), _ = run_tail(32, "Q8_0", planar_bytes("Q8_0", blocks, vocab, k), head, 9, rng,
                                             member="c8")  # 9 rows: two column blocks of 8
    assert (got == 0).all() and (want == 0).all()
    assert (index == np.arange(values.shape[1]) * tail.SLICE).all()  # each slice: its first row


@needs_emulator
def test_nan_logits_win_like_np_argmax(rng):
    """F16 head rows holding a NaN give NaN logits; np.argmax returns the first NaN."""
    vocab, k = 600, 256
    head16 = (rng.standard_normal((vocab, k)) * 0.05).astype(np.float16)
    head16[420, 7] = np.nan
    head16[555, 3] = np.nan
    blocks = head16.reshape(-1).view(np.dtype([("v", "<f2")]))
    got, want, _, _ = run_tail(32, "F16", planar_bytes("F16", blocks, vocab, k), head16.astype(np.float32), 3, rng)
    assert (want == 420).all()
    np.testing.assert_array_equal(got, want)


@needs_emulator
def test_fewer_head_rows_than_waves(rng):
    """A slice with idle waves (vocab 3): their empty bests must lose to every real logit."""
    planar, head = random_weight(rng, "Q8_0", 3, 256)
    got, want, _, _ = run_tail(64, "Q8_0", planar, head, 2, rng)
    np.testing.assert_array_equal(got, want)
