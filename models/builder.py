"""The synthetic-model builder: valid GGUF files with random weights for any shape of the supported
architectures.

Key and tensor names, tensor order and per-tensor formats are llama.cpp's, so llama.cpp loads the
files. Small models get normally distributed weights (std 0.02, or with weights="fan-in" scaled per
matrix as the reference fixtures' are) quantized with our quantizers; big ones get
random quantized blocks with sane scales drawn directly (quantizing 8 billion floats would take far
too long). Every tensor draws from its own generator seeded by (seed, tensor name), so a file is a
pure function of its arguments.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
import zlib
from dataclasses import dataclass
from typing import Iterator

import numpy as np
from gguf import GGUFValueType as V

from .config import ModelConfig, config_to_metadata
from llmplan.core.errors import InputError
from llmplan.core.formats import Format, format_of
from .gguf import GGUFFile, MetaValue
from .gguf_write import GGUFWriter
from .presets import PRESETS, preset_config
from .quantize import quantize, random_blocks
from .recipes import file_type, tensor_formats
from .synth_vocab import tokenizer_metadata
from .tensor_table import expected_tensors

WEIGHT_STD = 0.02
# weights="fan-in", the reference fixtures' weights (as measured in ../shared/fixtures' files): a matrix's
# std is gain / sqrt(row length), so its outputs spread about as much as the gain; the embedding table's is 1.
# A tied table is drawn at 1 / sqrt(dim) and output_norm carries the head's gain instead: a table as large as
# the layers' outputs would make every position predict its own token.
FAN_IN_GAINS = {"attn_q": 1.5, "attn_k": 1.5, "attn_v": 1.0, "attn_output": 0.5, "ffn_gate": 1.0, "ffn_up": 1.0,
                "ffn_down": 0.5, "output": 12.0, "ffn_gate_inp": 1.0, "ffn_gate_exps": 1.0, "ffn_up_exps": 1.0,
                "ffn_down_exps": 0.5}
# A bias spreads as its matrix's outputs do, v's a tenth as much: v's bias reaches every position's
# output alike, and in a random model that pulls every prediction towards one token.
BIAS_SHARE = {"attn_q": 1.0, "attn_k": 1.0, "attn_v": 0.1}
FLOAT_WEIGHTS_MAX_PARAMS = 64_000_000  # above this, draw quantized blocks directly
_CHUNK_BYTES = 32 << 20
QUANTIZATION_VERSION = 2


@dataclass
class Build:
    """What a build will write; `write()` writes it."""

    config: ModelConfig
    recipe: str
    seed: int
    formats: dict[str, Format]
    shapes: dict[str, tuple[int, ...]]
    writer: GGUFWriter
    weights: str  # "float", "fan-in" or "blocks"

    @property
    def file_size(self) -> int:
        return self.writer.file_size

    def write(self, progress: bool = True) -> float:
        """Write the file; returns the seconds it took."""
        from tqdm import tqdm

        t0 = time.perf_counter()
        name = os.path.basename(self.writer.path)
        with tqdm(total=self.file_size, unit="B", unit_scale=True, desc=name, file=sys.stderr,
                  delay=2.0, disable=not progress) as bar:
            self.writer.write((self._tensor_data(n) for n in self.shapes), progress=bar.update)
        return time.perf_counter() - t0

    def _tensor_data(self, name: str) -> Iterator[np.ndarray]:
        shape, fmt = self.shapes[name], self.formats[name]
        rng = np.random.default_rng([self.seed, zlib.crc32(name.encode())])
        if name.endswith(".bias"):
            matrix = name.removesuffix(".bias") + ".weight"
            spread = self._row_std(matrix) * np.float32(math.sqrt(self.shapes[matrix][0]))
            spread *= self._per_row(matrix, BIAS_SHARE)
            yield quantize(rng.standard_normal(shape[0], dtype=np.float32) * spread, fmt)
            return
        if len(shape) == 1:
            x = _vector(name, shape[0], self.config, rng)
            if name == "output_norm.weight" and self.weights == "fan-in" and self.config.tied_output:
                x *= np.float32(FAN_IN_GAINS["output"])
            yield quantize(x, fmt)
            return
        ncols, nrows = shape[0], math.prod(shape[1:])
        std = self._row_std(name)
        rows_per_chunk = max(1, _CHUNK_BYTES // fmt.row_bytes(ncols))
        for r in range(0, nrows, rows_per_chunk):
            n = min(rows_per_chunk, nrows - r)
            if self.weights == "blocks":
                yield random_blocks(fmt, n * ncols // fmt.block, rng, WEIGHT_STD)
            else:
                yield quantize(rng.standard_normal((n, ncols), dtype=np.float32) * std[r:r + n, None], fmt)

    def _row_std(self, name: str) -> np.ndarray:
        """The std each row of a matrix is drawn at."""
        ncols, nrows = self.shapes[name][0], math.prod(self.shapes[name][1:])
        if self.weights != "fan-in":
            return np.full(nrows, WEIGHT_STD, np.float32)
        if name == "token_embd.weight":
            return np.full(nrows, 1 / math.sqrt(ncols) if self.config.tied_output else 1.0, np.float32)
        return self._per_row(name, FAN_IN_GAINS) / np.float32(math.sqrt(ncols))

    def _per_row(self, name: str, table: dict[str, float]) -> np.ndarray:
        """The table's value for each row of a matrix, by its role (blk.N.<role>.weight); attn_qkv's rows take
        attn_q's, attn_k's and attn_v's."""
        role, c = name.split(".")[-2], self.config
        if role == "attn_qkv":
            return np.repeat(np.float32([table["attn_q"], table["attn_k"], table["attn_v"]]),
                             [c.q_dim, c.kv_dim, c.kv_dim])
        return np.full(math.prod(self.shapes[name][1:]), table[role], np.float32)


def _vector(name: str, n: int, c: ModelConfig, rng: np.random.Generator) -> np.ndarray:
    if name == "rope_freqs.weight":
        return llama31_rope_factors(c.head_dim, c.rope_base)
    if name.startswith("rope_factors_"):
        return longrope_factors(n, long=name == "rope_factors_long.weight")
    # norm weights hover around 1 (Gemma stores them with the +1 already folded in, as llama.cpp expects)
    return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)


def llama31_rope_factors(head_dim: int, base: float, factor: float = 8.0, low: float = 1.0, high: float = 4.0,
                         original_context: int = 8192) -> np.ndarray:
    """Llama 3.1's per-frequency rope divisors, computed as llama.cpp's converter does."""
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    low_wavelen, high_wavelen = original_context / low, original_context / high
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (original_context / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def longrope_factors(n: int, long: bool) -> np.ndarray:
    """LongRoPE divisors for the n rotary frequencies, shaped like Phi-3.5-mini's: the short ones near 1,
    the long ones rising from 1 at the highest frequency to about 50 at the lowest (stretched most)."""
    ramp = np.arange(n, dtype=np.float32) / max(n - 1, 1)
    return (1.0 + 49.0 * ramp**2 if long else 1.0 + 0.1 * ramp).astype(np.float32)


def _vocab_from(path: str) -> list[tuple[str, MetaValue]]:
    f = GGUFFile(path)
    keys = [(k, v) for k, v in f.metadata.items() if k.startswith("tokenizer.")]
    if not any(k == "tokenizer.ggml.tokens" for k, _ in keys):
        raise InputError(f"{path}: has no tokenizer vocabulary to copy")
    return keys


def plan_build(path: str | os.PathLike, preset: str, recipe: str = "Q4_K_M", seed: int = 0,
               vocab_from: str | None = None, weights: str = "auto",
               overrides: dict[str, str] | None = None, formats: dict[str, str] | None = None) -> Build:
    """Everything about a synthetic model file short of its bytes: config, formats, header, size.
    `formats` names tensors whose format is not the recipe's (a mix of formats in one file)."""
    cfg = preset_config(preset, overrides)
    if vocab_from:
        tok = _vocab_from(vocab_from)
        cfg = dataclasses.replace(cfg, vocab_size=len(dict(tok)["tokenizer.ggml.tokens"].value))
    else:
        tok = tokenizer_metadata(PRESETS[preset].tokenizer, cfg.vocab_size, seed)
    shapes = expected_tensors(cfg)
    chosen = formats or {}
    unknown = sorted(set(chosen) - set(shapes))
    if unknown:
        raise InputError(f"no tensor named {unknown[0]} in a {preset} model")
    formats = tensor_formats(cfg, recipe, shapes) | {name: format_of(f) for name, f in chosen.items()}
    if weights == "auto":
        params = sum(math.prod(s) for s in shapes.values())
        weights = "float" if params <= FLOAT_WEIGHTS_MAX_PARAMS else "blocks"
    elif weights not in ("float", "fan-in", "blocks"):
        raise InputError(f"weights must be auto, float, fan-in or blocks, got {weights!r}")

    w = GGUFWriter(path)
    for k, v in config_to_metadata(cfg):
        w.add(k, v)
    w.add("general.file_type", MetaValue(V.UINT32, file_type(recipe)))
    if any(f.block > 1 for f in formats.values()):
        w.add("general.quantization_version", MetaValue(V.UINT32, QUANTIZATION_VERSION))
    for k, v in tok:
        w.add(k, v)
    for name, shape in shapes.items():
        w.add_tensor(name, shape, formats[name].type)
    return Build(cfg, recipe, seed, formats, shapes, w, weights)
