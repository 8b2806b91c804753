"""Weight formats: the byte layout of one block of each GGML type, and dequantization.

Each layout is a NumPy structured dtype, so `raw.view(fmt.layout)` names every field of every block
without copying. Dequantization follows gguf-py's `gguf.quants.dequantize` operation for operation
(the same float32 products in the same order), so results are bit-identical to it; the tests check
that on every tensor of the real model files.

These tables are the one source of the format facts: the kernels' C++/CUDA/HIP format codes, block
sizes and field bytes are generated from them (codegen/format_header.py writes codegen/kernels/formats.h).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType as T

from .errors import FormatError

QK_K = 256


@dataclass(frozen=True)
class Format:
    name: str
    type: T
    block: int  # values per block
    layout: np.dtype  # one block
    sub: int = 0  # values per scale: a K-quant's sub-block; left 0, the whole block (one scale)

    def __post_init__(self):
        if not self.sub:
            object.__setattr__(self, "sub", self.block)

    @property
    def block_bytes(self) -> int:
        return self.layout.itemsize

    @property
    def has_min(self) -> bool:
        """Whether a block subtracts a scaled min (field m or dmin) besides its scale."""
        return "m" in self.layout.names or "dmin" in self.layout.names

    def row_bytes(self, n: int) -> int:
        if n % self.block:
            raise FormatError(f"{self.name}: row length {n} is not a multiple of the block size {self.block}")
        return n // self.block * self.block_bytes

    def blocks(self, raw: np.ndarray | bytes) -> np.ndarray:
        """View raw bytes as an array of blocks (no copy)."""
        raw = np.frombuffer(raw, np.uint8) if isinstance(raw, (bytes, bytearray, memoryview)) else raw
        raw = raw.reshape(-1)
        if raw.size % self.block_bytes:
            raise FormatError(f"{self.name}: {raw.size} bytes is not a whole number of {self.block_bytes}-byte blocks")
        return raw.view(self.layout)


def _layout(*fields: tuple) -> np.dtype:
    return np.dtype(list(fields))


F16_, U8, I8 = "<f2", "u1", "i1"

FORMATS: dict[str, Format] = {
    f.name: f
    for f in [
        Format("F32", T.F32, 1, _layout(("v", "<f4"))),
        Format("F16", T.F16, 1, _layout(("v", F16_))),
        Format("BF16", T.BF16, 1, _layout(("v", "<i2"))),
        Format("Q4_0", T.Q4_0, 32, _layout(("d", F16_), ("qs", U8, 16))),
        Format("Q4_1", T.Q4_1, 32, _layout(("d", F16_), ("m", F16_), ("qs", U8, 16))),
        Format("Q5_0", T.Q5_0, 32, _layout(("d", F16_), ("qh", "<u4"), ("qs", U8, 16))),
        Format("Q5_1", T.Q5_1, 32, _layout(("d", F16_), ("m", F16_), ("qh", "<u4"), ("qs", U8, 16))),
        Format("Q8_0", T.Q8_0, 32, _layout(("d", F16_), ("qs", I8, 32))),
        Format("Q2_K", T.Q2_K, QK_K, _layout(("scales", U8, 16), ("qs", U8, 64), ("d", F16_), ("dmin", F16_)),
               sub=16),
        Format("Q3_K", T.Q3_K, QK_K, _layout(("hmask", U8, 32), ("qs", U8, 64), ("scales", U8, 12), ("d", F16_)),
               sub=16),
        Format("Q4_K", T.Q4_K, QK_K, _layout(("d", F16_), ("dmin", F16_), ("scales", U8, 12), ("qs", U8, 128)),
               sub=32),
        Format("Q5_K", T.Q5_K, QK_K,
               _layout(("d", F16_), ("dmin", F16_), ("scales", U8, 12), ("qh", U8, 32), ("qs", U8, 128)), sub=32),
        Format("Q6_K", T.Q6_K, QK_K, _layout(("ql", U8, 128), ("qh", U8, 64), ("scales", I8, 16), ("d", F16_)),
               sub=16),
    ]
}
_BY_TYPE = {f.type: f for f in FORMATS.values()}

# Activations packed for a weight's dot product (llama.cpp's vec_dot types): Q8_0 as above, Q8_1 adds
# the block's scaled sum for formats with a min, Q8_K is the 256-value block the K-quants take.
ACTIVATION_FORMATS: dict[str, Format] = {
    f.name: f
    for f in [
        FORMATS["Q8_0"],
        Format("Q8_1", T.Q8_1, 32, _layout(("d", F16_), ("s", F16_), ("qs", I8, 32))),
        Format("Q8_K", T.Q8_K, QK_K, _layout(("d", "<f4"), ("qs", I8, QK_K), ("bsums", "<i2", QK_K // 16))),
    ]
}


# The activation format each weight format's dot product takes, as in llama.cpp's CPU backend:
# 32-value blocks with an f16 scale (q8_0; q8_1 adds the block sum for formats with a min) for the
# 32-value weight formats, 256-value blocks with an f32 scale (q8_k) for the K-quants.
ACTIVATION_FORMAT = {
    "f32": "f32", "f16": "f16", "bf16": "bf16",
    "q4_0": "q8_0", "q5_0": "q8_0", "q8_0": "q8_0", "q4_1": "q8_1", "q5_1": "q8_1",
    "q2_k": "q8_k", "q3_k": "q8_k", "q4_k": "q8_k", "q5_k": "q8_k", "q6_k": "q8_k",
}
PACK_BLOCK = {"q8_0": 32, "q8_1": 32, "q8_k": 256, "f16": 1, "bf16": 1}  # values per packed block
# The activation formats a kernel takes or stores, in the order the kernels number them (LP_ACT_*): the
# pack formats, 8-bit blocks first, then plain f32 values.
ACTIVATIONS = (*PACK_BLOCK, "f32")


# --- field planes --------------------------------------------------------------------------------
#
# On a GPU, blocks of 18, 34 or 210 bytes defeat 16-byte loads. Weights and packed activations there
# (and packed activations in every backend's arena, so the CPU twins share the GPU kernels' interface)
# are stored field by field: each field of the block layout becomes one contiguous plane
# [rows, blocks per row, *field shape], planes in field order, each on a PLANE_ALIGN boundary.

PLANE_ALIGN = 256


@dataclass(frozen=True)
class Plane:
    name: str
    dtype: np.dtype  # element type
    shape: tuple[int, ...]  # [rows, blocks per row, *field shape]
    offset: int

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


def planes(fmt: Format, rows: int, k: int) -> tuple[list[Plane], int]:
    """The planes of `rows` rows of `k` values in format `fmt`, and their total size in bytes."""
    nb = k // fmt.block
    out, offset = [], 0
    for name in fmt.layout.names:
        base, sub = fmt.layout[name].base, fmt.layout[name].shape
        plane = Plane(name, base, (rows, nb, *sub), offset)
        out.append(plane)
        offset += -(-plane.nbytes // PLANE_ALIGN) * PLANE_ALIGN
    return out, offset


def format_of(t: T | int | str) -> Format:
    """The Format for a GGML type (enum, id or name); unsupported types raise FormatError."""
    if isinstance(t, str):
        f, name = FORMATS.get(t.upper()), t
    else:
        try:
            t = T(t)
            f, name = _BY_TYPE.get(t), t.name
        except ValueError:
            f, name = None, f"type id {t}"
    if f is None:
        raise FormatError(f"weight format {name} is not supported (supported: {', '.join(FORMATS)})")
    return f


# --- integer field unpacking, shared by dequantization and quantizer tests --------------------

def nibbles(qs: np.ndarray, groups: int) -> np.ndarray:
    """Split packed 4-bit values: each run of `groups`-wide bytes yields its low nibbles, then its high ones."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, groups) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & np.uint8(0x0F)).reshape(n, -1)


def bits(packed: np.ndarray, width: int, group: int) -> np.ndarray:
    """Split packed `width`-bit values: each run of `group` bytes yields its lowest field, then the next."""
    n = packed.shape[0]
    sh = np.arange(0, 8, width, dtype=np.uint8).reshape(1, 1, -1, 1)
    q = packed.reshape(n, -1, 1, group) >> sh
    return (q & np.uint8((1 << width) - 1)).reshape(n, -1)


def k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: eight 6-bit scales and eight 6-bit mins packed into 12 bytes."""
    n = scales.shape[0]
    s = scales.reshape(n, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def q3k_scales(scales: np.ndarray) -> np.ndarray:
    """Q3_K: sixteen 6-bit signed scales (stored +32) packed into 12 bytes."""
    n = scales.shape[0]
    lo = nibbles(np.ascontiguousarray(scales[:, :8]), 8)
    hi = bits(np.ascontiguousarray(scales[:, 8:]), 2, 4)
    return ((lo | (hi << np.uint8(4))).astype(np.int8) - np.int8(32)).reshape(n, 16)


# --- dequantization ----------------------------------------------------------------------------

def _f32(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32)


def _col(x: np.ndarray) -> np.ndarray:
    return _f32(x).reshape(-1, 1)


def _q4_0(b):
    return _col(b["d"]) * _f32(nibbles(b["qs"], 16).astype(np.int8) - np.int8(8))


def _q4_1(b):
    return _col(b["d"]) * _f32(nibbles(b["qs"], 16)) + _col(b["m"])


def _q5_high(b):
    return (b["qh"].reshape(-1, 1) >> np.arange(32, dtype=np.uint32)).astype(np.uint8) & np.uint8(1)


def _q5_0(b):
    q = (nibbles(b["qs"], 16) | (_q5_high(b) << np.uint8(4))).astype(np.int8) - np.int8(16)
    return _col(b["d"]) * _f32(q)


def _q5_1(b):
    q = nibbles(b["qs"], 16) | (_q5_high(b) << np.uint8(4))
    return _col(b["d"]) * _f32(q) + _col(b["m"])


def _q8_0(b):
    return _f32(b["qs"]) * _col(b["d"])


def _q2_k(b):
    n = b.shape[0]
    sc = b["scales"]
    dl = (_col(b["d"]) * _f32(sc & 0xF)).reshape(n, 16, 1)
    ml = (_col(b["dmin"]) * _f32(sc >> 4)).reshape(n, 16, 1)
    q = _f32(bits(b["qs"], 2, 32)).reshape(n, 16, 16)
    return (dl * q - ml).reshape(n, QK_K)


def _q3_k(b):
    n = b.shape[0]
    dl = (_col(b["d"]) * _f32(q3k_scales(b["scales"]))).reshape(n, 16, 1)
    low = bits(b["qs"], 2, 32)
    high = bits(b["hmask"], 1, 32) ^ np.uint8(1)  # a clear mask bit means "subtract 4"
    q = _f32(low.astype(np.int8) - (high << np.uint8(2)).astype(np.int8)).reshape(n, 16, 16)
    return (dl * q).reshape(n, QK_K)


def _k_scaled(b, q):
    n = b.shape[0]
    sc, mn = k_scale_min(b["scales"])
    d = (_col(b["d"]) * _f32(sc)).reshape(n, 8, 1)
    dm = (_col(b["dmin"]) * _f32(mn)).reshape(n, 8, 1)
    return (d * _f32(q).reshape(n, 8, 32) - dm).reshape(n, QK_K)


def _q4_k(b):
    return _k_scaled(b, nibbles(b["qs"], 32))


def _q5_k(b):
    return _k_scaled(b, nibbles(b["qs"], 32) | (bits(b["qh"], 1, 32) << np.uint8(4)))


def q6k_values(b: np.ndarray) -> np.ndarray:
    """Q6_K blocks' 6-bit values 0..63 [n, 256], before the offset of 32."""
    return nibbles(b["ql"], 64) | (bits(b["qh"], 2, 32) << np.uint8(4))


def _q6_k(b):
    n = b.shape[0]
    d = (_col(b["d"]) * _f32(b["scales"])).reshape(n, 16, 1)
    q = q6k_values(b).astype(np.int8) - np.int8(32)
    return (d * _f32(q).reshape(n, 16, 16)).reshape(n, QK_K)


_DEQUANT: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "F32": lambda b: b["v"].astype(np.float32),
    "F16": lambda b: b["v"].astype(np.float32),
    "BF16": lambda b: (b["v"].astype(np.int32) << 16).view(np.float32),
    "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0,
    "Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k,
}

_CHUNK_BLOCKS = 1 << 16  # bounds the temporaries when dequantizing a large tensor


def dequantize(raw: np.ndarray | bytes, fmt: Format | T | int | str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Dequantize raw bytes to float32; with `shape` (NumPy order) the result is reshaped to it."""
    fmt = fmt if isinstance(fmt, Format) else format_of(fmt)
    blocks = fmt.blocks(raw)
    fn = _DEQUANT[fmt.name]
    out = np.empty(blocks.shape[0] * fmt.block, np.float32)
    step = _CHUNK_BLOCKS
    for s in range(0, blocks.shape[0], step):
        part = blocks[s : s + step]
        out[s * fmt.block : (s + part.shape[0]) * fmt.block] = fn(part).reshape(-1)
    return out if shape is None else out.reshape(shape)


# Element sizes of the plain dtypes an activation, state input or cache may have.
SCALAR_BYTES = {"f32": 4, "i32": 4, "f16": 2, "bf16": 2}


def value_bytes(dtype: str, shape: tuple[int, ...] | list[int]) -> int:
    """Bytes of a value of `dtype` (a plain dtype, or a packed activation format held as field planes)
    and a bound shape."""
    n = 1
    for d in shape:
        n *= d
    if dtype in SCALAR_BYTES:
        return n * SCALAR_BYTES[dtype]
    return planes(ACTIVATION_FORMATS[dtype.upper()], n // shape[-1], shape[-1])[1]
