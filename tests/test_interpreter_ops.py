"""The reference interpreter's ops against direct, independent formulations."""

import numpy as np
import pytest

from llmplan.core.formats import dequantize
from llmplan.ir.interpret import IMPLS, Interpreter
from llmplan.ir.ops import REGISTRY
from llmplan.ir.trace import Tracer
from llmplan.ir.types import Type
from llmplan.models.quantize import quantize

rng = np.random.default_rng(7)


def test_every_op_is_implemented():
    assert set(REGISTRY) - {"input", "weight"} == set(IMPLS)


def test_every_op_has_its_traits():
    """core/op_traits.py (family, in-place operand: what the stages after the IR read) names the IR's ops."""
    from llmplan.core.op_traits import TRAITS

    assert set(TRAITS) == set(REGISTRY)


def test_rmsnorm_whole_row_and_per_head():
    x = rng.standard_normal((3, 8)).astype(np.float32)
    w = rng.standard_normal(8).astype(np.float32)
    want = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(IMPLS["rmsnorm"]({"eps": 1e-5}, x, w), want, rtol=1e-6)
    wh = w[:4]
    heads = x.reshape(3, 2, 4)
    want = heads / np.sqrt((heads.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5) * wh
    np.testing.assert_allclose(IMPLS["rmsnorm"]({"eps": 1e-5}, x, wh), want.reshape(3, 8), rtol=1e-6)


@pytest.mark.parametrize("mode", ["norm", "neox"])
def test_rope_is_a_rotation_by_position(mode):
    heads, d, dims = 2, 8, 6
    x = rng.standard_normal((3, heads * d)).astype(np.float32)
    pos = np.array([0, 1, 5], np.int32)
    factors = np.array([1.0, 2.0, 4.0], np.float32)
    a = {"heads": heads, "dims": dims, "base": 100.0, "scale": 0.5, "mode": mode, "mscale": 1.0}
    out = IMPLS["rope"](a, x, pos, factors).reshape(3, heads, d)
    xh = x.reshape(3, heads, d)
    for r in range(3):
        for i in range(dims // 2):
            theta = pos[r] * 0.5 * 100.0 ** (-2 * i / dims) / factors[i]
            j, k = (2 * i, 2 * i + 1) if mode == "norm" else (i, i + dims // 2)
            z = complex(xh[r, 0, j], xh[r, 0, k]) * complex(np.cos(theta), np.sin(theta))
            assert out[r, 0, j] == pytest.approx(z.real, abs=1e-5) and out[r, 0, k] == pytest.approx(z.imag, abs=1e-5)
    np.testing.assert_array_equal(out[:, :, dims:], xh[:, :, dims:])  # features past `dims` pass through
    np.testing.assert_allclose(out[0], xh[0], atol=1e-6)  # position 0 is the identity


def _naive_attention(q, k_all, v_all, pos, heads, kv_heads, scale, window):
    """Per row and head; Q and the (unnormalized) exp weights rounded to f16 like the f16 K/V they meet."""
    f16 = lambda a: np.asarray(a, np.float16).astype(np.float64)  # noqa: E731
    q = f16(q)
    d = q.shape[1] // heads
    out = np.zeros_like(q)
    for r in range(q.shape[0]):
        for h in range(heads):
            kvh = h // (heads // kv_heads)
            keys = [j for j in range(pos[r] + 1) if window == 0 or pos[r] - j < window]
            s = np.array([q[r, h * d:(h + 1) * d] @ k_all[j, kvh * d:(kvh + 1) * d] for j in keys]) * scale
            e = np.exp(s - s.max())
            acc = sum(ej * v_all[j, kvh * d:(kvh + 1) * d] for ej, j in zip(f16(e), keys))
            out[r, h * d:(h + 1) * d] = acc / e.sum()
    return out


@pytest.mark.parametrize("window", [0, 3])
def test_kv_store_then_attention_is_causal_gqa_attention(window):
    heads, kv_heads, d, n = 4, 2, 8, 20  # positions 0-15 on the sequence's first page, 16-19 on its second
    cache = np.zeros((1, 2, 4, 16, kv_heads * d), np.float16)
    k = rng.standard_normal((n, kv_heads * d)).astype(np.float32)
    v = rng.standard_normal((n, kv_heads * d)).astype(np.float32)
    q = rng.standard_normal((n, heads * d)).astype(np.float32)
    pos = np.arange(n, dtype=np.int32)
    seq = np.ones(n, np.int32)
    pages = np.array([[0, 1], [3, 2]], np.int32)
    cache = IMPLS["kv_store"]({"layer": 0}, cache, k, v, seq, pages, pos)
    assert not cache[0, :, :2].any()  # sequence 0's blocks untouched
    np.testing.assert_array_equal(cache[0, 0, 3], k[:16].astype(np.float16))
    np.testing.assert_array_equal(cache[0, 1, 2, :4], v[16:].astype(np.float16))
    a = {"layer": 0, "heads": heads, "kv_heads": kv_heads, "scale": 0.3, "window": window}
    got = IMPLS["attention"](a, q, cache, seq, pages, pos)
    k16, v16 = k.astype(np.float16).astype(np.float32), v.astype(np.float16).astype(np.float32)
    np.testing.assert_allclose(got, _naive_attention(q, k16, v16, pos, heads, kv_heads, 0.3, window), atol=1e-5)


def test_pack_q8_0_matches_the_q8_0_weight_format():
    x = rng.standard_normal((4, 128)).astype(np.float32) * 3
    got = IMPLS["pack"]({"format": "q8_0"}, x)
    want = dequantize(quantize(x, "Q8_0"), "Q8_0").reshape(x.shape)  # same grid; ties have probability ~0
    np.testing.assert_array_equal(got, want)


def test_pack_q8_k_matches_llama_cpp_reference_loop():
    x = rng.standard_normal((2, 512)).astype(np.float32)
    x[1, 256:] = 0.0
    got = IMPLS["pack"]({"format": "q8_k"}, x)
    want = np.zeros_like(x)
    for r in range(2):
        for b in range(2):
            blk = x[r, b * 256:(b + 1) * 256]
            mx = blk[np.argmax(np.abs(blk))]
            if mx == 0:
                continue
            iscale = np.float32(-127.0) / mx
            q = np.minimum(np.rint(iscale * blk), 127)
            want[r, b * 256:(b + 1) * 256] = q * (np.float32(1.0) / iscale)
    np.testing.assert_array_equal(got, want)
    assert np.abs(got - x).max() <= np.abs(x).max() / 127


def test_pack_f16_and_bf16():
    x = rng.standard_normal((2, 8)).astype(np.float32)
    np.testing.assert_array_equal(IMPLS["pack"]({"format": "f16"}, x), x.astype(np.float16).astype(np.float32))
    bf = IMPLS["pack"]({"format": "bf16"}, x)
    assert (bf.view(np.uint32) & 0xFFFF == 0).all() and np.abs(bf - x).max() <= np.abs(x).max() / 128


def test_activations():
    x = np.linspace(-6, 6, 101, dtype=np.float32)
    np.testing.assert_allclose(IMPLS["silu"]({}, x), x / (1 + np.exp(-x)), rtol=1e-6)
    gelu = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(IMPLS["gelu_tanh"]({}, x), gelu, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(IMPLS["softcap"]({"cap": 5.0}, x), np.tanh(x / 5) * 5, rtol=1e-6)


def test_interpreter_copies_a_cache_that_is_still_read():
    cache_t = Type("f16", (2, 2, "blocks", 16, 4))
    nn = Tracer("t", "decode", {"e": Type("f32", (10, 4))}, cache_t, 64)
    x = nn.embed(nn.weight("e"), nn.tokens)
    c1 = nn.kv_store(nn.cache, x, x, nn.seq, nn.pages, nn.pos, layer=0)
    old = nn.attention(x, nn.cache, nn.seq, nn.pages, nn.pos, layer=0, heads=1, kv_heads=1, scale=1.0, window=0)
    g = nn.finish(new=c1, old=old)
    cache = np.zeros((2, 2, 1, 16, 4), np.float16)
    cache[0, 1, 0, 0] = 5.0  # what the old version holds at position 0
    out = Interpreter(g, lambda n: np.arange(40, dtype=np.float32).reshape(10, 4)).run(
        {"tokens": np.array([3], np.int32), "pos": np.array([0], np.int32), "seq": np.array([0], np.int32),
         "pages": np.array([[0]], np.int32), "cache": cache})
    np.testing.assert_array_equal(out["old"], np.full((1, 4), 5.0, np.float32))  # read before the store
    assert out["new"][0, 0, 0, 0].tolist() == [12.0, 13.0, 14.0, 15.0]


def test_split_context_attention_matches_attention_across_many_slices():
    heads, kv_heads, d = 4, 2, 8
    cache = rng.standard_normal((1, 2, 7, 16, kv_heads * d)).astype(np.float16)
    q = rng.standard_normal((3, heads * d)).astype(np.float32)
    pos = np.array([99, 40, 5], np.int32)
    seq = np.zeros(3, np.int32)
    pages = np.array([[6, 5, 4, 3, 2, 1, 0]], np.int32)  # 112 positions, blocks in reverse
    for window in (0, 30):
        a = {"layer": 0, "heads": heads, "kv_heads": kv_heads, "scale": 0.3, "window": window}
        whole = IMPLS["attention"](a, q, cache, seq, pages, pos)
        parts = IMPLS["attention_partial"]({**a, "chunk": 16}, q, cache, seq, pages, pos)
        assert parts.shape == (3, heads, 7, d + 2)
        split = IMPLS["attention_reduce"]({}, parts)
        assert ((split - whole) ** 2).sum() / (whole**2).sum() < 1e-6  # f16-rounded weights per slice
        one = IMPLS["attention_reduce"]({}, IMPLS["attention_partial"]({**a, "chunk": 128}, q, cache, seq, pages, pos))
        assert np.array_equal(one, whole)  # one slice: the same arithmetic, bit for bit
