"""How a weight is held on a device: the layouts a plan names for its launch arguments, one table.

A plan records, for each weight, the layouts its kernels read it in, each with its version and byte
size (the planner sizes them here); the runtime makes them at load from the mapped GGUF with the same
table. Bumping a layout's version makes older plans ask to be recompiled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .formats import FORMATS, Format, dequantize, k_scale_min, planes


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


ROWS16 = 16  # rows per record of the rows16 layout
ROWS16_RECORD = 2368  # bytes of a record (codegen/cpu/rows16.h R16_BYTES)


def _rows16_bytes(fmt: Format, shape: tuple[int, ...]) -> int:
    if fmt.name != "Q4_K":
        raise ValueError(f"the rows16 layout holds Q4_K weights, not {fmt.name}")
    rows, k = _rows_k(shape)
    return -(-rows // ROWS16) * (k // fmt.block) * ROWS16_RECORD


def _rows16(raw: np.ndarray, fmt: Format, shape: tuple[int, ...]) -> np.ndarray:
    """Q4_K super-blocks of 16 rows side by side (codegen/cpu/rows16.h has the record and why): rows padded
    with zeros to a multiple of 16, records in order (row group, super-block)."""
    _rows16_bytes(fmt, shape)
    rows, k = _rows_k(shape)
    groups, nsb = -(-rows // ROWS16), k // fmt.block
    b = np.zeros((groups * ROWS16, nsb), fmt.layout)
    b[:rows] = fmt.blocks(raw).reshape(rows, nsb)
    b = b.reshape(groups, ROWS16, nsb).transpose(0, 2, 1)  # (group, sb, row)
    sc, mn = k_scale_min(b["scales"].reshape(-1, 12))
    sc, mn = sc.reshape(groups, nsb, ROWS16, 8), mn.reshape(groups, nsb, ROWS16, 8)
    qs = b["qs"].reshape(groups, nsb, ROWS16, 4, 8, 4)  # (.., row, g, t, byte)
    half = lambda f: np.ascontiguousarray(b[f]).view(np.uint8).reshape(groups, nsb, 32)  # noqa: E731
    parts = [half("d"), half("dmin"),
             sc.transpose(0, 1, 3, 2).reshape(groups, nsb, 128),  # (sub-block, row)
             mn.reshape(groups, nsb, ROWS16, 4, 2).transpose(0, 1, 3, 2, 4).reshape(groups, nsb, 128),  # (pair, row, 2)
             qs.transpose(0, 1, 3, 4, 2, 5).reshape(groups, nsb, 2048)]  # (g, t, row, byte)
    out = np.concatenate([p.astype(np.uint8, copy=False) for p in parts], axis=-1).reshape(-1)
    assert out.nbytes == groups * nsb * ROWS16_RECORD
    return out


@dataclass(frozen=True)
class Layout:
    name: str
    version: int
    copies: bool  # whether the runtime holds a copy (False: the mapped file's bytes are used in place)
    bytes: Callable[[Format, tuple[int, ...]], int]  # size of a weight of this format and shape
    make: Callable[[np.ndarray, Format, tuple[int, ...]], np.ndarray]  # from the file's bytes
    why: str


def _file_bytes(fmt: Format, shape: tuple[int, ...]) -> int:
    rows, k = _rows_k(shape)
    return rows * (k // fmt.block) * fmt.block_bytes


LAYOUTS: dict[str, Layout] = {
    "plain": Layout("plain", 1, False, _file_bytes, lambda raw, fmt, shape: raw,
                    "as in the file: norm weights and rope factors the GPU kernels read as stored"),
    "rows": Layout("rows", 1, False, _file_bytes, lambda raw, fmt, shape: raw,
                   "left quantized in the mapped file: only the rows of the step's tokens are dequantized"),
    "blocks": Layout("blocks", 1, False, _file_bytes, lambda raw, fmt, shape: raw,
                     "the quantized blocks read in place from the mapped file by the CPU target's compiled kernels "
                     "(integer dot products with the packed activations)"),
    "rows16": Layout("rows16", 1, True, _rows16_bytes, _rows16,
                     "Q4_K projections of the CPU target's compiled kernels, made once at load: 16 rows' super-blocks "
                     "side by side with their scales unpacked (codegen/cpu/rows16.h), so one integer dot product "
                     "instruction serves 16 rows; the file's pages of these tensors are released"),
    "planar": Layout("planar", 1, True, lambda fmt, shape: planes(fmt, *_rows_k(shape))[1], _planar,
                     "field planes (core/formats.planes): each quantized field of all blocks of a row together, "
                     "so a GPU lane's 16-byte load reads one field of consecutive blocks"),
    "f32": Layout("f32", 1, True, lambda fmt, shape: 4 * math.prod(shape),
                  lambda raw, fmt, shape: dequantize(raw, fmt, tuple(shape)),
                  "dequantized to float32 at load: the norm vectors the compiled CPU kernels read, and every weight of "
                  "the NumPy CPU backend (NumPy has no int8 GEMV, and float32 BLAS on exactly dequantized weights "
                  "gives the integer block dot products' values)"),
}


def layout_bytes(layout: str, fmt: str, shape: tuple[int, ...]) -> int:
    return LAYOUTS[layout].bytes(FORMATS[fmt.upper()], tuple(shape))


def make(layout: str, raw: np.ndarray, fmt: str, shape: tuple[int, ...]) -> np.ndarray:
    """Weight `raw` (its file bytes) in `layout`: the bytes a kernel reads (plain, rows, blocks: `raw` itself)."""
    return LAYOUTS[layout].make(raw, FORMATS[fmt.upper()], tuple(shape))
