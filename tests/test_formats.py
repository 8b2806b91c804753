"""Dequantization is bit-identical to gguf-py's, on random blocks of every format and on every tensor
of the real model files."""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGUFReader, quants

from llmplan.core.errors import FormatError
from llmplan.core.formats import FORMATS, dequantize, format_of
from llmplan.models.gguf import GGUFFile

from conftest import TINY_BPE, TINY_SPM


def _random_blocks(fmt, n, rng):
    """Random bytes in every field, with the f16 scale fields set to finite values of varied size."""
    raw = rng.integers(0, 256, size=n * fmt.block_bytes, dtype=np.uint8)
    blocks = raw.view(fmt.layout)
    for name in fmt.layout.names:
        if fmt.layout[name].base == np.dtype("<f2"):
            blocks[name] = (rng.standard_normal(blocks[name].shape) * 10.0 ** rng.integers(-4, 2)).astype(np.float16)
    if fmt.name == "F32":
        raw = rng.standard_normal(n).astype(np.float32).view(np.uint8)
    return raw


def _same_bits(a, b):
    a = np.asarray(a, np.float32).reshape(-1)
    b = np.asarray(b, np.float32).reshape(-1)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("name", list(FORMATS))
def test_random_blocks_match_gguf_py(name):
    fmt = FORMATS[name]
    rng = np.random.default_rng(list(FORMATS).index(name))
    raw = _random_blocks(fmt, 3000, rng)
    ours = dequantize(raw, fmt)
    assert ours.dtype == np.float32 and ours.size == 3000 * fmt.block
    assert _same_bits(ours, quants.dequantize(raw, fmt.type))


def test_all_thirteen_formats_with_ggml_block_sizes():
    assert sorted(FORMATS) == sorted(["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                                      "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
    for f in FORMATS.values():
        assert (f.block, f.block_bytes) == GGML_QUANT_SIZES[f.type], f.name


def test_shape_and_chunking():
    fmt = FORMATS["Q4_K"]
    raw = _random_blocks(fmt, 70_000, np.random.default_rng(5))  # more than one internal chunk
    out = dequantize(raw, fmt, shape=(70, 256_000))
    assert out.shape == (70, 256_000)
    assert _same_bits(out, quants.dequantize(raw, fmt.type))


def test_unsupported_and_misaligned():
    with pytest.raises(FormatError, match="IQ2_XXS is not supported"):
        format_of(16)
    with pytest.raises(FormatError, match="not a whole number"):
        dequantize(np.zeros(145, np.uint8), "Q4_K")
    with pytest.raises(FormatError, match="multiple of the block size"):
        FORMATS["Q8_0"].row_bytes(33)


def _check_file(path):
    ours = GGUFFile(path)
    for t in GGUFReader(path).tensors:
        got = dequantize(ours.tensor_bytes(t.name), ours.tensors[t.name].type)
        assert _same_bits(got, quants.dequantize(t.data, t.tensor_type)), t.name


@pytest.mark.parametrize("path", [TINY_SPM, TINY_BPE], ids=["tiny-llama-spm", "tiny-llama3-bpe"])
def test_every_fixture_tensor_matches_gguf_py(path):
    _check_file(path)


@pytest.mark.slow
def test_every_gemma3_tensor_matches_gguf_py(gemma3_path):
    _check_file(gemma3_path)
