"""Inputs and the error measure of the GPU kernel tests (ggml's method: fresh random inputs, never zeros).

Weights: quantized blocks with random bytes in every quantized field (every bit pattern of a format's
packing is exercised) and moderate random f16 scales of either sign, in the planar relayout the kernels
read (core/formats.planes). Activations: arena-style packed buffers (field planes, with a
cpu_kernels.Packed view of the same bytes for the CPU twins), filled either with random fields or by
the twins' own packing of real values. The paged K/V cache: a page table over the cache's blocks in a
scrambled order, and a cache whose every cell a kernel has no business reading is NaN. nmse: docs/numerics.md's
normalized mean squared error.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmplan.core import numerics as num
from llmplan.core.formats import ACTIVATION_FORMATS, FORMATS, Format, dequantize, planes
from llmplan.runtime.numpy_kernels import Packed


def _fmt(fmt: str | Format) -> Format:
    return fmt if isinstance(fmt, Format) else FORMATS[fmt.upper()]


def random_blocks(rng: np.random.Generator, fmt: str | Format, n: int, k: int) -> np.ndarray:
    """n rows of k values in format `fmt` as a flat array of blocks: random bytes in every quantized
    field, moderate random f16 scales (either sign); F16 / F32 / BF16 values standard normal."""
    f = _fmt(fmt)
    nb = n * k // f.block
    if f.name == "F16":
        return rng.standard_normal(nb).astype(np.float16).view(f.layout).reshape(-1)
    if f.name in ("F32", "BF16"):
        vals = rng.standard_normal(nb).astype(np.float32)
        return (vals if f.name == "F32" else (vals.view(np.uint32) >> 16).astype(np.int16)).view(f.layout).reshape(-1)
    raw = rng.integers(0, 256, nb * f.block_bytes, dtype=np.uint8)
    b = raw.view(f.layout).reshape(-1).copy()
    for name in f.layout.names:
        if f.layout[name].base == np.float16:
            b[name] = (rng.uniform(0.002, 0.05, nb) * rng.choice([-1.0, 1.0], nb)).astype(np.float16)
    return b


def planar_bytes(fmt: str | Format, blocks: np.ndarray, rows: int, k: int) -> np.ndarray:
    """The planar relayout (core/formats.planes) of `rows` rows of blocks, as bytes."""
    f = _fmt(fmt)
    blocks = np.ascontiguousarray(blocks).reshape(-1)
    ps, total = planes(f, rows, k)
    out = np.zeros(total, np.uint8)
    for p in ps:
        out[p.offset:p.offset + p.nbytes] = np.ascontiguousarray(blocks[p.name]).view(np.uint8).reshape(-1)
    return out


def random_weight(rng: np.random.Generator, fmt: str | Format, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(planar bytes, the exactly dequantized float32 matrix [n, k]) of a random weight."""
    f = _fmt(fmt)
    blocks = random_blocks(rng, f, n, k)
    dense = dequantize(blocks.view(np.uint8).reshape(-1), f, (n, k))
    return planar_bytes(f, blocks, n, k), dense


def packed_buffer(fmt: str, rows: int, k: int, poison: bool = True) -> tuple[np.ndarray, Packed]:
    """An arena-style packed activation buffer [rows, k]: (raw bytes, cpu_kernels.Packed view of them),
    poisoned with 0xFF bytes (NaN halves and floats, -1 integers) or zeros."""
    ps, size = planes(ACTIVATION_FORMATS[fmt.upper()], rows, k)
    raw = np.full(size, 0xFF if poison else 0, np.uint8)
    return raw, Packed(fmt, {p.name: raw[p.offset:p.offset + p.nbytes].view(p.dtype).reshape(p.shape) for p in ps})


def random_activation(rng: np.random.Generator, fmt: str, rows: int, k: int) -> tuple[np.ndarray, Any]:
    """(the buffer a kernel reads, what the CPU twin reads) of random activations [rows, k]: random
    fields that are consistent with each other (q8_1 sums, q8_k 16-value sums), or f16 rows."""
    if fmt == "f16":
        a = rng.standard_normal((rows, k)).astype(np.float16)
        return a, a
    buf, x = packed_buffer(fmt, rows, k, poison=False)
    qs = rng.integers(-127, 128, x["qs"].shape).astype(np.int8)
    x["qs"][...] = qs
    if fmt == "q8_k":
        x["d"][...] = (rng.uniform(0.004, 0.03, x["d"].shape) * rng.choice([-1.0, 1.0], x["d"].shape))
        x["bsums"][...] = qs.reshape(rows, -1, 16, 16).astype(np.int32).sum(-1)
    else:
        x["d"][...] = rng.uniform(0.004, 0.03, x["d"].shape).astype(np.float16)
        if fmt == "q8_1":
            x["s"][...] = (x["d"].astype(np.float32) * qs.reshape(rows, -1, 32).astype(np.float32).sum(-1)).astype(
                np.float16)
    return buf, x


def pack_activation(x: np.ndarray, fmt: str) -> tuple[np.ndarray, Any]:
    """(the buffer a kernel reads, what the CPU twin reads) of real values x [rows, k]: f16 rows, or x
    packed by the CPU twins' own packing (core/numerics.pack_blocks) into the field planes."""
    if fmt == "f16":
        a = x.astype(np.float16)
        return a, a
    raw, packed = packed_buffer(fmt, *x.shape, poison=False)
    blocks = num.pack_blocks(x, fmt)
    for name in blocks.dtype.names:
        packed[name][...] = blocks[name]
    return raw, packed


def page_table(rng: np.random.Generator, seqs: int, pages: int, spare: int = 3) -> tuple[np.ndarray, int]:
    """(page table i32 [seqs, pages], blocks): every sequence's pages are distinct cache blocks in a
    scrambled order, with `spare` blocks that no page names (a kernel that ignores the table, or reads
    the wrong entry, lands on the wrong block)."""
    blocks = seqs * pages + spare
    return rng.permutation(blocks)[:seqs * pages].reshape(seqs, pages).astype(np.int32), blocks


def paged_cache(rng: np.random.Generator, layers: int, kv: int, table: np.ndarray, blocks: int,
                readable: dict[int, tuple[int, int]], scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(cache f16 [layers, 2, blocks, PAGE, kv], the table as the kernel gets it): random values at the
    positions [lo, hi) of readable[s] of each sequence s, NaN in every other cell (other positions,
    spare blocks); the table's entries for pages outside a sequence's range point at an all-NaN spare
    block, so a kernel that reads a cell or a table entry it should not gets NaN."""
    cache = np.full((layers, 2, blocks, num.PAGE, kv), np.nan, np.float16)
    table = table.copy()
    nan_block = np.setdiff1d(np.arange(blocks), table)[0]
    for s in range(table.shape[0]):
        lo, hi = readable.get(s, (0, 0))
        p = np.arange(lo, hi)
        cache[:, :, table[s, p // num.PAGE], p % num.PAGE] = (rng.standard_normal((layers, 2, len(p), kv))
                                                                 * scale).astype(np.float16)
        used = np.arange(table.shape[1])
        table[s, (used < lo // num.PAGE) | (used * num.PAGE >= hi)] = nan_block
    return cache, table


def nmse(got: np.ndarray, want: np.ndarray) -> float:
    """Normalized mean squared error sum((got - want)^2) / sum(want^2)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(((got - want) ** 2).sum() / max((want ** 2).sum(), 1e-300))


def random_mask(rng: np.random.Generator, rows: int, vocab: int) -> np.ndarray:
    """Token masks [rows, ceil(vocab / 32)] (core/numerics.py's layout) that cover the cases: row 0
    allows every token, row 1 one token, row 2 none (the argmax is NO_TOKEN), the rest about a tenth
    of the vocabulary at random. The bits past the vocabulary are random too: kernels must not read them."""
    words = num.mask_words(vocab)
    bits = rng.random((rows, words * 32)) < 0.1
    bits[0] = True
    if rows > 1:
        bits[1] = False
        bits[1, rng.integers(vocab)] = True
    if rows > 2:
        bits[2, :vocab] = False
    return np.packbits(bits, axis=-1, bitorder="little").view(np.int32).reshape(rows, words)


def near_tie_routing(rng: np.random.Generator, rows: int, experts: int) -> tuple[np.ndarray, np.ndarray]:
    """A router's (x [rows, 16], gate [experts, 16]) whose logits every summation order computes exactly
    (x in units of 2^-11 up to 1, the gate in units of 2^-12 below 1/8, neither zero: each partial sum a
    multiple of 2^-23 below 2), so the kernels and the twin softmax the same logits; and full of near ties:
    x[:, 0] is one unit, and every second expert copies its neighbour's gate row with column 0 moved by
    -1, 0, 1 or 2 units: logits equal or 2^-23 .. 2^-22 apart, probabilities equal or an ulp or two apart."""
    units = lambda n, shape: rng.choice([-1, 1], shape) * rng.integers(1, n + 1, shape)  # noqa: E731
    x = units(2048, (rows, 16)).astype(np.float32) / 2048
    x[:, 0] = rng.choice([-1, 1], rows) / 2048
    gate = units(500, (experts, 16)).astype(np.float32) / 4096
    gate[1::2] = gate[0::2]
    gate[1::2, 0] += rng.integers(-1, 3, experts // 2) / 4096
    gate[gate == 0] = 1 / 4096  # a moved unit may land on zero
    return x, gate
