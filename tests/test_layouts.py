"""The weight layouts a plan names (core/layouts.py): sizes as the planner records them, and the rows16
record decoded here field by field, as codegen/cpu/rows16.h describes it, giving back the weight."""

from __future__ import annotations

import numpy as np
import pytest

from kernel_inputs import random_blocks
from llmplan.core import layouts
from llmplan.core.formats import FORMATS, dequantize


def decode_rows16(data: np.ndarray, rows: int, k: int) -> np.ndarray:
    """The float32 weight [rows, k] a rows16 buffer holds: value = d * sc * u - dmin * m per 32 values."""
    nsb, groups = k // 256, -(-rows // 16)
    rec = data.reshape(groups, nsb, layouts.ROWS16_RECORD)
    d = rec[..., 0:32].copy().view(np.float16).astype(np.float32)  # (group, sb, row)
    dmin = rec[..., 32:64].copy().view(np.float16).astype(np.float32)
    sc = rec[..., 64:192].reshape(groups, nsb, 8, 16).astype(np.float32)  # (.., sub-block, row)
    m = rec[..., 192:320].reshape(groups, nsb, 4, 16, 2).transpose(0, 1, 2, 4, 3).reshape(groups, nsb, 8, 16)
    qs = rec[..., 320:].reshape(groups, nsb, 4, 8, 16, 4)  # (.., g, t, row, byte)
    u = np.stack([qs & 15, qs >> 4], axis=3)  # (.., g, half, t, row, byte): sub-block 2g + half
    u = u.reshape(groups, nsb, 8, 8, 16, 4).transpose(0, 1, 2, 4, 3, 5).reshape(groups, nsb, 8, 16, 32)
    w = (d[:, :, None, :, None] * sc[..., None] * u - dmin[:, :, None, :, None] * m[..., None].astype(np.float32))
    w = w.transpose(0, 3, 1, 2, 4).reshape(groups * 16, k)  # (group, row, sb, sub-block, value)
    return w[:rows]


@pytest.mark.parametrize("rows", [16, 37])
def test_rows16_holds_the_weight(rows):
    rng = np.random.default_rng(rows)
    k = 512
    raw = random_blocks(rng, "Q4_K", rows, k).view(np.uint8).reshape(-1)
    data = layouts.make("rows16", raw, "Q4_K", (rows, k))
    assert data.nbytes == layouts.layout_bytes("rows16", "Q4_K", (rows, k)) == -(-rows // 16) * 2 * 2368
    want = dequantize(raw, FORMATS["Q4_K"], (rows, k))
    np.testing.assert_allclose(decode_rows16(data, rows, k), want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
    padding = data.reshape(-1, 2, 2368)[-1, :, 320:].reshape(2, 4, 8, 16, 4)[:, :, :, rows % 16 or 16:]
    assert not padding.any(), "rows past the weight's end are zero"


def test_rows16_is_for_q4_k():
    with pytest.raises(ValueError, match="Q4_K"):
        layouts.layout_bytes("rows16", "Q6_K", (16, 256))
