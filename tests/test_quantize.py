"""quantize() ports llama.cpp's reference quantizers; random_blocks() draws synthetic quantized weights.

Byte identity is checked against gguf-py (bit-exact with ggml for the formats it implements) and,
for the K formats, against hashes of what ggml's C `quantize_row_*_ref` (ggml-quants.c, gcc -O2
without FMA contraction) wrote for a fixed, exactly reproducible input; for IQ4_NL and IQ4_XS against
llama.cpp's own library (llama-cpp-python's, built without FMA) where it is importable, and hashes of
what it wrote.
"""

import ctypes
import hashlib

import numpy as np
import pytest
from gguf import quants
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from llmplan.commands import llama_cpp
from llmplan.core.errors import FormatError, InputError
from llmplan.core.formats import FORMATS, dequantize
from llmplan.models.quantize import QUANTIZABLE, quantize, random_blocks

GGUF_PY_FORMATS = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]
QUANTIZED = [f for f in QUANTIZABLE if FORMATS[f].block > 1]

# Measured on N(0, 1) data plus ~20% headroom: error RMSE / data RMSE.
REL_RMSE = {"F32": 0.0, "F16": 3e-4, "BF16": 2e-3, "Q8_0": 0.0065, "Q4_0": 0.1, "Q4_1": 0.095, "Q5_0": 0.05,
            "Q5_1": 0.046, "Q4_K": 0.085, "Q5_K": 0.044, "Q6_K": 0.022, "IQ4_NL": 0.09, "IQ4_XS": 0.09}
# Worst error in a block / largest magnitude in it: half a step of each format's grid (Q4_0 and Q5_0
# cannot reach +max when d = max/-8 is set by a negative max, hence a full step), plus slack; IQ4's
# least-squares scales and uneven grid: measured (0.096, 0.117) plus ~20%.
BLOCK_MAX_ERR = {"F32": 0.0, "F16": 2**-11, "BF16": 2**-8, "Q8_0": 0.006, "Q4_0": 0.13, "Q4_1": 0.07,
                 "Q5_0": 0.066, "Q5_1": 0.035, "Q4_K": 0.11, "Q5_K": 0.065, "Q6_K": 0.023, "IQ4_NL": 0.115,
                 "IQ4_XS": 0.14}


def _roundtrip(x, fmt):
    return dequantize(quantize(x, fmt), fmt, np.shape(x))


# --- llama.cpp's own test (tests/test-quantize-fns.cpp) ----------------------------------------


def _llama_signal(offset, n=4096, amplitude=2.0):
    """generate_data(): dst[i] = 0.1 + amplitude*cosf(i + offset), the sum done in double."""
    c = np.float32(amplitude) * np.cos(np.arange(n, dtype=np.float32) + np.float32(offset))
    return (0.1 + c.astype(np.float64)).astype(np.float32)


def _llama_array_rmse(a, b):
    """llama.cpp's array_rmse, which despite its name is sqrt(sum of squares) / n, i.e. the true
    RMSE divided by sqrt(n) (64 for n = 4096)."""
    d = a.astype(np.float64) - b.astype(np.float64)
    return np.sqrt(np.sum(d * d)) / d.size


# True RMSE on the signal (RMS about 1.42), measured plus ~15% headroom.
SIGNAL_RMSE = {"F32": 0.0, "F16": 3.5e-4, "BF16": 2.6e-3, "Q8_0": 0.0055, "Q4_0": 0.082, "Q4_1": 0.084,
               "Q5_0": 0.044, "Q5_1": 0.041, "Q4_K": 0.072, "Q5_K": 0.039, "Q6_K": 0.019, "IQ4_NL": 0.092,
               "IQ4_XS": 0.093}


@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("fmt", QUANTIZABLE)
def test_llama_cpp_total_quantization_error(fmt, offset):
    x = _llama_signal(offset)
    y = _roundtrip(x, fmt)
    assert _llama_array_rmse(x, y) <= 0.002  # MAX_QUANTIZATION_TOTAL_ERROR, for every >= 4-bit type
    assert np.sqrt(np.mean((x.astype(np.float64) - y) ** 2)) <= SIGNAL_RMSE[fmt]


# --- byte identity --------------------------------------------------------------------------------


def _awkward_rows(rng):
    """(12, 512) rows: normal data at several scales with zero, constant, tied and one-spike blocks."""
    rows = [rng.standard_normal(512) * s for s in (1e-3, 0.02, 1.0, 300.0)]
    rows += [rng.uniform(0, 1, 512), rng.uniform(-3, -2, 512), rng.laplace(size=512) * 5]
    zero_and_const = np.repeat(rng.standard_normal(16), 32)
    zero_and_const[:64] = 0
    ties = rng.standard_normal(512)
    ties[::32], ties[1::32] = 2.0, -2.0  # equal magnitudes of both signs: the first one wins
    spike = np.zeros(512)
    spike[::37] = rng.standard_normal(spike[::37].size) * 10
    rows += [zero_and_const, ties, spike, np.zeros(512), np.full(512, -0.7)]
    return np.stack(rows).astype(np.float32)


@pytest.mark.parametrize("fmt", GGUF_PY_FORMATS)
def test_matches_gguf_py(fmt):
    x = _awkward_rows(np.random.default_rng(GGUF_PY_FORMATS.index(fmt)))
    expected = np.ascontiguousarray(quants.quantize(x, FORMATS[fmt].type)).view(np.uint8)
    ours = quantize(x, fmt)
    assert ours.dtype == np.uint8 and ours.shape == expected.shape
    assert np.array_equal(ours, expected)


def _golden_input():
    """1024 super-blocks computed with integer hashing and exact float32 steps (so identical on every
    machine): roughly normal values (a sum of four uniforms), cubed in alternate blocks for heavy
    tails, sub-block scales 2^-5..2^5, some blocks off-centre, zero and constant (sub-)blocks."""
    i = np.arange(1024 * 256, dtype=np.uint32)

    def uniform(k):
        h = ((i + np.uint32(k * 0x9E3779B9 & 0xFFFFFFFF)) * np.uint32(2654435761)) >> np.uint32(8)
        h = (h ^ (h >> np.uint32(7))) * np.uint32(2246822519) >> np.uint32(8)
        return (h & np.uint32(0xFFFFFF)).astype(np.float32) / np.float32(1 << 24) - np.float32(0.5)

    g = uniform(1) + uniform(2) + uniform(3) + uniform(4)
    x = np.where((i // 512) % 2 == 1, g * g * g, g)
    x = np.ldexp(x, ((i // 32) % 11).astype(np.int32) - 5)
    x = x + np.where((i // 256) % 3 == 2, np.float32(0.25), np.float32(0))
    x[1024:1056] = 0
    x[2048:2080] = 0.75
    x[3072:3328] = 0
    x[4096:4352] = -1.5
    return x.astype(np.float32)


# sha256 of ggml's quantize_row_*_ref output for _golden_input()
GGML_REFERENCE_SHA256 = {
    "Q4_K": "9b2a680a85e1f06193f4bd187c5703cd69ebb948c4e87a3e08dfa91acb1d031a",
    "Q5_K": "77513bef846f20c5652e54133880224c3771427cb69e57fdba03f20385d53f97",
    "Q6_K": "18e899e5dd1ec284c9c72885891d50f03431c1fe266f4698e0c833f335b71863",
    "Q4_0": "8de794fda976d9de777d9413b58665792dd6e5078f95d25af11af1ad16eebfdb",
    "Q4_1": "e10d98b4e01ef406821a8fb86c4338ceb269dc59052fb6b5b68566d470131159",
    "Q5_0": "8d74cf87692d9973e3dfb7cacb096b094957068d6e882fffb868a8c2fb67a6e4",
    "Q5_1": "c7700d16380c5e82f773741ab330b0710964345b2303f43de2e57dbe772f38e7",
    "Q8_0": "3d4c7007777296c40421f1ed7df382f397155724c773a517d847ba5681152c92",
}


@pytest.mark.parametrize("fmt", list(GGML_REFERENCE_SHA256))
def test_matches_ggml_c_reference(fmt):
    out = quantize(_golden_input(), fmt)
    assert hashlib.sha256(out.tobytes()).hexdigest() == GGML_REFERENCE_SHA256[fmt]


# sha256 of what llama-cpp-python 0.3.36's ggml_quantize_chunk (which llama_model_quantize calls, and
# test_matches_llama_cpps_quantizer below) wrote for _golden_input(); for IQ4_NL it is not
# quantize_row_iq4_nl_ref, which tries no other scales
LLAMA_CPP_QUANTIZE_SHA256 = {
    "IQ4_NL": "70a352b3aa1b68151609959cbfdc504064d71c47ed7fdde893b616ed13abac9f",
    "IQ4_XS": "71c444a1e17cd0a7948de2145a5de354d51546043af7c47ee852e6e2b20af9a2",
}


@pytest.mark.parametrize("fmt", list(LLAMA_CPP_QUANTIZE_SHA256))
def test_matches_what_llama_cpp_wrote(fmt):
    out = quantize(_golden_input(), fmt)
    assert hashlib.sha256(out.tobytes()).hexdigest() == LLAMA_CPP_QUANTIZE_SHA256[fmt]


def _llama_cpp_quantize(x, fmt):
    """x quantized row by row by llama.cpp's library (ggml_quantize_chunk, no importance matrix)."""
    from llama_cpp.llama_cpp import _lib

    f = FORMATS[fmt]
    out = np.zeros((x.shape[0], f.row_bytes(x.shape[1])), np.uint8)
    fn = _lib.ggml_quantize_chunk
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_void_p]
    fn(int(f.type), np.ascontiguousarray(x).ctypes.data, out.ctypes.data, 0, x.shape[0], x.shape[1], None)
    return out


@pytest.mark.skipif(not llama_cpp.available(), reason="llama-cpp-python is not installed (not a dependency)")
@pytest.mark.parametrize("fmt", list(LLAMA_CPP_QUANTIZE_SHA256))
def test_matches_llama_cpps_quantizer(fmt):
    rng = np.random.default_rng(list(LLAMA_CPP_QUANTIZE_SHA256).index(fmt))
    for x in [_awkward_rows(rng), _golden_input().reshape(-1, 1024),
              *((rng.standard_normal((64, 512)) * s).astype(np.float32) for s in (1e-4, 0.02, 1.0, 3e3))]:
        assert np.array_equal(quantize(x, fmt), _llama_cpp_quantize(x, fmt))


# --- round trips and edge cases ------------------------------------------------------------------


@pytest.mark.parametrize("scale", [1e-2, 1.0, 1e3])
@pytest.mark.parametrize("fmt", QUANTIZABLE)
def test_round_trip_error(fmt, scale):
    x = (np.random.default_rng(7).standard_normal((3, 8, 1024)) * scale).astype(np.float32)
    raw = quantize(x, fmt)
    assert raw.shape == (3, 8, FORMATS[fmt].row_bytes(1024))
    y = dequantize(raw, fmt, x.shape)
    assert np.sqrt(np.mean((y - x) ** 2)) <= REL_RMSE[fmt] * scale
    block = max(FORMATS[fmt].block, 32)
    err = np.abs(y - x).reshape(-1, block).max(axis=1)
    assert np.all(err <= BLOCK_MAX_ERR[fmt] * np.abs(x).reshape(-1, block).max(axis=1))


@pytest.mark.parametrize("fmt", QUANTIZABLE)
def test_zero_and_constant_blocks(fmt):
    x = np.zeros((4, 256), np.float32)
    x[1], x[2], x[3, :128] = 0.37, -2.5, 0.125  # all-zero, constant, half constant
    y = _roundtrip(x, fmt)
    assert np.array_equal(y[0], x[0])
    assert np.allclose(y, x, rtol=2**-7, atol=0)  # a constant lands on a grid point up to float16 rounding


@pytest.mark.parametrize("fmt", QUANTIZABLE)
def test_extreme_magnitudes_stay_finite(fmt):
    big = np.finfo(np.float32).max
    x = np.stack([np.full(256, big), np.tile(np.float32([big, -big]), 128), np.full(256, 1e30),
                  np.linspace(-1e-30, 1e-30, 256), np.full(256, 1e-42), np.linspace(-1e7, 1e7, 256)])
    y = _roundtrip(x.astype(np.float32), fmt)
    assert np.isfinite(y).all()
    assert np.all(np.abs(y[3:5]) <= 1e-29)  # tiny stays tiny (or becomes 0)
    assert np.all(np.sign(y[0]) >= 0)  # huge is clipped to the format's range, not wrapped


@settings(max_examples=40, deadline=None)
@given(hnp.arrays(np.float32, 256, elements=st.floats(width=32, allow_nan=False, allow_infinity=False)))
def test_any_finite_input_gives_finite_output(x):
    for fmt in QUANTIZABLE:
        assert np.isfinite(_roundtrip(x, fmt)).all(), fmt


@pytest.mark.parametrize("fmt", ["Q6_K", "Q8_0", "BF16"])
def test_large_input_is_processed_in_chunks_seamlessly(fmt):
    x = np.random.default_rng(2).standard_normal((3, 390 * 256)).astype(np.float32)  # > 1 internal chunk
    assert np.array_equal(quantize(x, fmt), np.stack([quantize(row, fmt) for row in x]))


def test_rejects_what_it_cannot_quantize():
    with pytest.raises(FormatError, match="cannot quantize to Q2_K"):
        quantize(np.zeros(256, np.float32), "Q2_K")
    with pytest.raises(FormatError, match="not a multiple of the block size 256"):
        quantize(np.zeros(100, np.float32), "Q4_K")
    with pytest.raises(FormatError, match="NaN or infinite"):
        quantize(np.full(32, np.nan, np.float32), "Q8_0")
    with pytest.raises(FormatError, match="scalar"):
        quantize(np.float32(1), "F32")


# --- random blocks --------------------------------------------------------------------------------


@pytest.mark.parametrize("std", [0.02, 1.5])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_random_blocks_statistics(fmt, std):
    f = FORMATS[fmt]
    blocks = random_blocks(fmt, 65536 // f.block, np.random.default_rng(1), std)
    assert blocks.dtype == f.layout and blocks.shape == (65536 // f.block,)
    y = dequantize(blocks.view(np.uint8), f)
    assert np.isfinite(y).all()
    assert 0.85 * std <= y.std() <= 1.15 * std
    assert abs(y.mean()) <= 0.05 * std


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_random_blocks_deterministic(fmt):
    a = random_blocks(fmt, 100, np.random.default_rng(3), 0.1)
    b = random_blocks(fmt, 100, np.random.default_rng(3), 0.1)
    c = random_blocks(fmt, 100, np.random.default_rng(4), 0.1)
    assert a.tobytes() == b.tobytes() != c.tobytes()


@pytest.mark.parametrize("fmt", [f for f in FORMATS if "d" in FORMATS[f].layout.names])
def test_random_blocks_vary_their_scales(fmt):
    d = random_blocks(fmt, 1000, np.random.default_rng(0), 0.1)["d"].astype(np.float32)
    assert np.unique(np.abs(d)).size > 100 and np.all(d != 0)


def test_random_blocks_rejects_bad_std():
    with pytest.raises(InputError, match="positive"):
        random_blocks("Q4_K", 10, np.random.default_rng(0), 0.0)
    with pytest.raises(FormatError, match="float16"):
        random_blocks("Q6_K", 10, np.random.default_rng(0), 1e-7)
    with pytest.raises(FormatError, match="float16"):
        random_blocks("Q4_0", 10, np.random.default_rng(0), 1e6)
