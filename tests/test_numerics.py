"""core/numerics.py properties the engine relies on: a projection's row never depends on the rows
computed beside it, so batching sequences or recomputing them changes no bit."""

from __future__ import annotations

import numpy as np
import pytest

from llmplan.core import numerics as num

# (K, N): the fixtures' and Gemma 3 270M's projection shapes, a head-sized one, an odd N
SHAPES = [(512, 1536), (1024, 2816), (2816, 1024), (640, 1536), (2048, 640), (640, 40960), (96, 333)]


@pytest.mark.parametrize("k,n", SHAPES)
def test_matmul_rows_are_independent_of_the_batch(k, n):
    rng = np.random.default_rng(k * 7 + n)
    w = rng.standard_normal((n, k), dtype=np.float32)
    x = rng.standard_normal((9, k), dtype=np.float32)
    alone = np.concatenate([num.matmul(x[i:i + 1], w) for i in range(len(x))])
    np.testing.assert_allclose(alone, x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-4, atol=1e-3)
    for panel in (num.PANEL_BYTES, 64 * k * 4, 1, 0):  # one panel, several, the 16-row floor, all of w
        for rows in (2, 3, 8, 9):
            got = num.matmul(x[:rows], w, panel)
            assert np.array_equal(got, alone[:rows]), (panel, rows)
        other = x.copy()
        other[::2] = rng.standard_normal(other[::2].shape, dtype=np.float32)  # different neighbours
        assert np.array_equal(num.matmul(other, w, panel)[1::2], alone[1::2]), panel
