"""The weight layouts a plan names (core/layouts.py): the rows16 records decoded here field by field, as
codegen/cpu/rows16.h describes them, give back the weight, with the sizes the planner records."""

from __future__ import annotations

import numpy as np
import pytest

from llmplan.core import layouts
from llmplan.core.formats import FORMATS, dequantize

from kernel_inputs import random_blocks


def _values(vectors: np.ndarray) -> np.ndarray:
    """[.., g, t, row, byte] 4-bit pairs -> [.., row, 256] values: value 64g + 32 half + 4t + byte is the
    low (half 0) or high (half 1) nibble of vector (g, t)."""
    v = np.stack([vectors & 15, vectors >> 4], axis=-4)  # (.., g, half, t, row, byte)
    return np.moveaxis(v, -2, -5).reshape(*v.shape[:-5], 16, 256)


def decode_rows16(fmt: str, data: np.ndarray, rows: int, k: int) -> np.ndarray:
    """The float32 weight [rows, k] a rows16 buffer holds."""
    nsb, groups = k // FORMATS[fmt].block, -(-rows // 16)
    rec = data.reshape(groups, nsb, layouts.ROWS16_RECORD[fmt])
    d = rec[..., 0:32].copy().view(np.float16).astype(np.float32)[..., None]  # (group, sb, row, 1)
    if fmt == "Q8_0":  # d (u - 128), vectors (t, half, row, byte): value 16 half + 4t + byte
        u = rec[..., 32:].reshape(groups, nsb, 4, 2, 16, 4).transpose(0, 1, 4, 3, 2, 5).reshape(groups, nsb, 16, 32)
        w = d * (u.astype(np.float32) - 128)
    elif fmt in ("Q4_0", "Q5_0"):  # d (u - 8) or d (u - 16); u's low nibbles values 4t + byte, high 16 + 4t + byte
        v = rec[..., 32:288].reshape(groups, nsb, 4, 16, 4).transpose(0, 1, 3, 2, 4)  # (.., row, t, byte)
        u = np.stack([v & 15, v >> 4], axis=-3).reshape(groups, nsb, 16, 32)  # (.., row, half, t, byte)
        if fmt == "Q5_0":  # bit 4 half + t of the row's byte `byte`
            qh = rec[..., 288:].reshape(groups, nsb, 16, 1, 1, 4)
            u = u | ((qh >> np.arange(8, dtype=np.uint8).reshape(2, 4, 1) & 1) << 4).reshape(groups, nsb, 16, 32)
        w = d * (u.astype(np.float32) - (16 if fmt == "Q5_0" else 8))
    elif fmt == "Q4_K":  # d sc u - dmin m per 32 values
        dmin = rec[..., 32:64].copy().view(np.float16).astype(np.float32)[..., None]
        sc = np.repeat(np.swapaxes(rec[..., 64:192].reshape(groups, nsb, 8, 16), -1, -2), 32, axis=-1)
        m = rec[..., 192:320].reshape(groups, nsb, 4, 16, 2).transpose(0, 1, 3, 2, 4).reshape(groups, nsb, 16, 8)
        u = _values(rec[..., 320:].reshape(groups, nsb, 4, 8, 16, 4))
        w = d * sc * u.astype(np.float32) - dmin * np.repeat(m, 32, axis=-1).astype(np.float32)
    else:  # d sc (q - 32) per 16 values, q's bits 4..5 at bits 2i of the qh vectors
        sc = np.repeat(np.swapaxes(rec[..., 32:288].view(np.int8).reshape(groups, nsb, 16, 16), -1, -2), 16, axis=-1)
        per_g = rec[..., 288:].reshape(groups, nsb, 2, 1536)  # per 128 values G: (ql 2G, qh G) by t, ql 2G + 1
        pairs = per_g[..., :1024].reshape(groups, nsb, 2, 8, 2, 16, 4)  # (.., G, t, ql or qh, row, byte)
        ql = np.stack([pairs[..., 0, :, :], per_g[..., 1024:].reshape(groups, nsb, 2, 8, 16, 4)], axis=3)
        low = _values(ql.reshape(groups, nsb, 4, 8, 16, 4))  # (.., g = 2G + odd, t, row, byte)
        qh = pairs[..., 1, :, :]
        top = np.stack([qh >> 2 * i & 3 for i in range(4)], axis=-4)  # (.., G, i, t, row, byte)
        top = np.moveaxis(top, -2, -5).reshape(groups, nsb, 16, 256)
        w = d * sc.astype(np.float32) * ((low | top << 4).astype(np.float32) - 32)
    return w.transpose(0, 2, 1, 3).reshape(groups * 16, k)[:rows]  # (group, row, sb, value)


@pytest.mark.parametrize("fmt", ["Q4_K", "Q6_K", "Q8_0", "Q4_0", "Q5_0"])
@pytest.mark.parametrize("rows", [16, 37])
def test_rows16_holds_the_weight(fmt, rows):
    rng = np.random.default_rng(rows)
    k = 512
    raw = random_blocks(rng, fmt, rows, k).view(np.uint8).reshape(-1)
    data = layouts.make("rows16", raw, fmt, (rows, k))
    size = -(-rows // 16) * (k // FORMATS[fmt].block) * layouts.ROWS16_RECORD[fmt]
    assert data.nbytes == layouts.layout_bytes("rows16", fmt, (rows, k)) == size
    want = dequantize(raw, FORMATS[fmt], (rows, k))
    np.testing.assert_allclose(decode_rows16(fmt, data, rows, k), want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
    if rows % 16:
        assert not decode_rows16(fmt, data, 48, k)[rows:].any(), "rows past the weight's end are zero"


def test_rows16_is_for_q4_k_q6_k_q8_0_q4_0_and_q5_0():
    with pytest.raises(ValueError, match="Q4_K, Q6_K, Q8_0, Q4_0, Q5_0 weights, not Q5_K"):
        layouts.layout_bytes("rows16", "Q5_K", (16, 256))


def test_a_copys_maker_reports_every_byte_done_and_one_read_in_place_none():
    """The runtime releases the file pages a maker says it is done with (runtime/executor.py): a copy's
    maker reports all of them, rows16 chunk by chunk in order, a layout read in place none."""
    rng = np.random.default_rng(0)
    rows, k = 1029, 256  # 65 row groups: two chunks
    raw = random_blocks(rng, "Q6_K", rows, k).view(np.uint8).reshape(-1)
    for layout, chunks in (("rows16", 2), ("f32", 1), ("blocks", 0)):
        done = []
        layouts.make(layout, raw, "Q6_K", (rows, k), lambda lo, hi: done.append((lo, hi)))
        assert len(done) == chunks, layout
        if chunks:
            assert done[0][0] == 0 and done[-1][1] == raw.nbytes
            assert all(a[1] == b[0] for a, b in zip(done, done[1:])), layout
