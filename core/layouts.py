"""How a weight is held on a device: the layouts a plan names for its launch arguments, one table.

A plan records, for each weight, the layouts its kernels read it in, each with its version and byte
size (the planner sizes them here); the runtime makes them at load from the mapped GGUF with the same
table. Bumping a layout's version makes older plans ask to be recompiled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from .formats import FORMATS, Format, dequantize, k_scale_min, nibbles, planes, q6k_values
from .plan_records import WeightInfo


def _rows_k(shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, row length) of a weight in NumPy order (rows first)."""
    return math.prod(shape[:-1]), shape[-1]


def _planar(raw: np.ndarray, fmt: Format, shape: tuple[int, ...]) -> np.ndarray:
    rows, k = _rows_k(shape)
    blocks = fmt.blocks(raw)
    ps, total = planes(fmt, rows, k)
    out = np.zeros(total, np.uint8)
    for p in ps:
        out[p.offset:p.offset + p.nbytes] = np.ascontiguousarray(blocks[p.name]).view(np.uint8).reshape(-1)
    return out


Consumed = Callable[[int, int], None]
ROWS16 = 16  # rows per record of the rows16 layout
# bytes of a record (codegen/cpu/rows16.h K4, K6, rows16_q8.h Q8, Q4, Q5, through formats.h): a super-block
# of 16 rows, or a 32-value block of them (the same bytes as the rows' blocks)
ROWS16_RECORD = {"Q4_K": 2368, "Q6_K": 3360, "Q8_0": 544, "Q4_0": 288, "Q5_0": 352}


def _rows16_bytes(fmt: Format, shape: tuple[int, ...]) -> int:
    if fmt.name not in ROWS16_RECORD:
        raise ValueError(f"the rows16 layout holds {', '.join(ROWS16_RECORD)} weights, not {fmt.name}")
    rows, k = _rows_k(shape)
    return -(-rows // ROWS16) * (k // fmt.block) * ROWS16_RECORD[fmt.name]


def _chunks(values: np.ndarray) -> np.ndarray:
    """A super-block's 256 values [..., row, 256] as rows16 vectors [..., g, half, t, row, byte]: value
    64g + 32 half + 4t + byte of each row."""
    v = values.reshape(*values.shape[:-2], ROWS16, 4, 2, 8, 4)
    return np.moveaxis(v, -5, -2)


def rows16_chunks(fmt: str, shape: tuple[int, ...]) -> Iterator[tuple[int, int, int, int]]:
    """How a rows16 weight is made, 64 row groups at a time (so that little of both the file's bytes and
    the temporaries is held at once): (first group, past the last, and the file bytes [lo, hi) they are
    made from)."""
    f = FORMATS[fmt.upper()]
    rows, k = _rows_k(shape)
    groups, row_bytes = -(-rows // ROWS16), f.row_bytes(k)
    for g0 in range(0, groups, 64):
        g1 = min(groups, g0 + 64)
        yield g0, g1, g0 * ROWS16 * row_bytes, min(rows, g1 * ROWS16) * row_bytes


def _rows16(raw: np.ndarray, fmt: Format, shape: tuple[int, ...], consumed: Consumed) -> np.ndarray:
    """Q4_K, Q6_K, Q8_0, Q4_0 or Q5_0 blocks of 16 rows side by side (codegen/cpu/rows16.h has the records and why):
    rows padded with zeros to a multiple of 16, records in order (row group, block)."""
    rows, k = _rows_k(shape)
    out = np.empty(_rows16_bytes(fmt, shape), np.uint8)
    blocks = fmt.blocks(raw).reshape(rows, k // fmt.block)
    record = ROWS16_RECORD[fmt.name] * (k // fmt.block)  # bytes of a row group
    for g0, g1, lo, hi in rows16_chunks(fmt.name, shape):
        out[g0 * record:g1 * record] = _rows16_groups(blocks[g0 * ROWS16:g1 * ROWS16], fmt)
        consumed(lo, hi)
    return out


def _rows16_groups(blocks: np.ndarray, fmt: Format) -> np.ndarray:
    """The records of blocks [rows, blocks] (rows padded to a multiple of 16)."""
    rows, nsb = blocks.shape
    groups = -(-rows // ROWS16)
    b = np.zeros((groups * ROWS16, nsb), fmt.layout)
    b[:rows] = blocks
    b = b.reshape(groups, ROWS16, nsb).transpose(0, 2, 1)  # (group, sb, row)
    flat = lambda a, n: np.ascontiguousarray(a).view(np.uint8).reshape(groups, nsb, n)  # noqa: E731
    by_row = lambda a: a.reshape(groups, nsb, ROWS16, -1).transpose(0, 1, 3, 2)  # (.., sub-block, row)  # noqa: E731
    if fmt.name == "Q8_0":  # the values + 128, vectors (t, half, row, byte): value 16 half + 4t + byte
        u = (b["qs"].view(np.uint8) ^ np.uint8(0x80)).reshape(groups, nsb, ROWS16, 2, 4, 4)
        parts = [flat(b["d"], 32), flat(u.transpose(0, 1, 4, 3, 2, 5), 512)]
    elif fmt.name in ("Q4_0", "Q5_0"):  # the rows' qs bytes 4t .. 4t + 3, vectors (t, row, byte)
        parts = [flat(b["d"], 32), flat(b["qs"].reshape(groups, nsb, ROWS16, 4, 4).transpose(0, 1, 3, 2, 4), 256)]
        if fmt.name == "Q5_0":  # the high bits: bit 4 half + t of byte `byte` that of value 16 half + 4t + byte
            high = (b["qh"][..., None] >> np.arange(32, dtype=np.uint32)).astype(np.uint8) & np.uint8(1)
            weights = (np.uint8(1) << np.arange(8, dtype=np.uint8)).reshape(2, 4, 1)
            parts.append(flat((high.reshape(groups, nsb, ROWS16, 2, 4, 4) * weights).sum(axis=(-3, -2), dtype=np.uint8), 64))
    elif fmt.name == "Q4_K":
        sc, mn = k_scale_min(b["scales"].reshape(-1, 12))
        qs = _chunks(nibbles(b["qs"].reshape(-1, 128), 32).reshape(groups, nsb, ROWS16, 256))
        parts = [flat(b["d"], 32), flat(b["dmin"], 32), flat(by_row(sc), 128),
                 flat(mn.reshape(groups, nsb, ROWS16, 4, 2).transpose(0, 1, 3, 2, 4), 128),  # (pair, row, 2)
                 flat(qs[..., 0, :, :, :] | qs[..., 1, :, :, :] << np.uint8(4), 2048)]
    else:
        q = q6k_values(b.reshape(-1)).reshape(groups, nsb, ROWS16, 256)
        lo, hi = _chunks(q & np.uint8(15)), q >> np.uint8(4)
        top = hi.reshape(groups, nsb, ROWS16, 2, 4, 8, 4)  # (.., row, G, i, t, byte): value 128G + 32i + 4t + byte
        top = (top << (2 * np.arange(4, dtype=np.uint8)).reshape(4, 1, 1)).sum(axis=-3, dtype=np.uint8)
        ql = flat(lo[..., 0, :, :, :] | lo[..., 1, :, :, :] << np.uint8(4), 2048).reshape(groups, nsb, 4, 8, 64)
        qh = flat(np.moveaxis(top, -4, -2), 1024).reshape(groups, nsb, 2, 8, 64)  # (G, t, row x byte)
        parts = [flat(b["d"], 32), flat(by_row(b["scales"].reshape(-1, 16)), 256)]
        for G in range(2):  # group 2G's low bits interleaved with G's high bits, then group 2G + 1's
            parts += [flat(np.stack([ql[:, :, 2 * G], qh[:, :, G]], axis=-2), 1024), flat(ql[:, :, 2 * G + 1], 512)]
    return np.concatenate(parts, axis=-1).reshape(-1)


def _whole(make: Callable[[np.ndarray, Format, tuple[int, ...]], np.ndarray]):
    """A copy's maker that is done with all of the file's bytes at once."""
    def made(raw: np.ndarray, fmt: Format, shape: tuple[int, ...], consumed: Consumed) -> np.ndarray:
        out = make(raw, fmt, shape)
        consumed(0, raw.nbytes)
        return out
    return made


@dataclass(frozen=True)
class Layout:
    name: str
    version: int
    copies: bool  # whether the runtime holds a copy (False: the mapped file's bytes are used in place)
    bytes: Callable[[Format, tuple[int, ...]], int]  # size of a weight of this format and shape
    # from the file's bytes; a copy's maker says which of them it is done with as it goes, every byte by
    # its end (the runtime releases those pages), a layout read in place none
    make: Callable[[np.ndarray, Format, tuple[int, ...], Consumed], np.ndarray]
    why: str


def _file_bytes(fmt: Format, shape: tuple[int, ...]) -> int:
    rows, k = _rows_k(shape)
    return rows * (k // fmt.block) * fmt.block_bytes


LAYOUTS: dict[str, Layout] = {
    "plain": Layout("plain", 1, False, _file_bytes, lambda raw, fmt, shape, consumed: raw,
                    "as in the file: norm weights and rope factors the GPU kernels read as stored"),
    "rows": Layout("rows", 1, False, _file_bytes, lambda raw, fmt, shape, consumed: raw,
                   "left quantized in the mapped file: only the rows of the step's tokens are dequantized"),
    "blocks": Layout("blocks", 1, False, _file_bytes, lambda raw, fmt, shape, consumed: raw,
                     "the quantized blocks read in place from the mapped file by the CPU target's compiled kernels "
                     "(integer dot products with the packed activations)"),
    "rows16": Layout("rows16", 2, True, _rows16_bytes, _rows16,
                     "Q4_K, Q6_K, Q8_0, Q4_0 and Q5_0 projections of the CPU target's compiled kernels, made once at load: 16 "
                     "rows' blocks side by side with their scales unpacked (codegen/cpu/rows16.h), so one integer dot "
                     "product instruction serves 16 rows; the file's pages of these tensors are released"),
    "planar": Layout("planar", 1, True, lambda fmt, shape: planes(fmt, *_rows_k(shape))[1], _whole(_planar),
                     "field planes (core/formats.planes): each quantized field of all blocks of a row together, "
                     "so a GPU lane's 16-byte load reads one field of consecutive blocks"),
    "f32": Layout("f32", 1, True, lambda fmt, shape: 4 * math.prod(shape),
                  _whole(lambda raw, fmt, shape: dequantize(raw, fmt, tuple(shape))),
                  "dequantized to float32 at load: the norm vectors the compiled CPU kernels read, and every weight of "
                  "the NumPy CPU backend (NumPy has no int8 GEMV, and float32 BLAS on exactly dequantized weights "
                  "gives the integer block dot products' values)"),
}


def layout_bytes(layout: str, fmt: str, shape: tuple[int, ...]) -> int:
    return LAYOUTS[layout].bytes(FORMATS[fmt.upper()], tuple(shape))


def weight_bytes_beyond_file(w: WeightInfo) -> int:
    """What a plan's weight costs beyond the mapped file: its copies made at load, less its file bytes
    where it has one (the runtime releases those pages as a copy is made; a layout read in place beside
    a copy, as an embedding's rows beside its tied head's records, faults back only the pages it reads)."""
    copies = sum(info.bytes for layout, info in w.layouts.items() if LAYOUTS[layout].copies)
    if any(LAYOUTS[layout].copies for layout in w.layouts):
        copies -= layout_bytes("plain", w.format, tuple(w.shape))
    return copies


def make(layout: str, raw: np.ndarray, fmt: str, shape: tuple[int, ...],
         consumed: Consumed = lambda lo, hi: None) -> np.ndarray:
    """Weight `raw` (its file bytes) in `layout`: the bytes a kernel reads (plain, rows, blocks: `raw` itself).
    consumed(lo, hi) is called for bytes [lo, hi) of `raw` a copy's making is done with (rows16: chunk by
    chunk, so that a caller releasing them holds little of both at once)."""
    return LAYOUTS[layout].make(raw, FORMATS[fmt.upper()], tuple(shape), consumed)
