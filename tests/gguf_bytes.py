"""Byte-by-byte GGUF encoding for tests, written with `struct` only (independent of any writer).

Every piece can be overridden (counts, lengths, types, offsets), so tests can craft files that are
wrong in exactly one place. All integers are little-endian, as the GGUF specification requires.

    build(kvs=[kv_str("general.architecture", "llama")], tensors=[Tensor("t", (32,), F32)])

returns the bytes of a complete, valid file; pass raw `bytes` instead of a `Tensor` to put a
hand-made tensor-info record in the table, or override `n_kv`/`n_tensors`/`version`/`magic`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

# GGUF value types (gguf specification, `gguf_type`)
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_CODE = {UINT8: "B", INT8: "b", UINT16: "H", INT16: "h", UINT32: "I", INT32: "i", FLOAT32: "f",
         BOOL: "B", UINT64: "Q", INT64: "q", FLOAT64: "d"}

# ggml tensor types used by the tests: id -> (block size, bytes per block)
F32, F16, Q4_0, Q8_0, Q4_K, Q6_K = 0, 1, 2, 8, 12, 14
BLOCK = {F32: (1, 4), F16: (1, 2), Q4_0: (32, 18), Q8_0: (32, 34), Q4_K: (256, 144), Q6_K: (256, 210)}

DEFAULT_ALIGNMENT = 32


def u8(v: int) -> bytes:
    return struct.pack("<B", v)


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def gstr(s: str | bytes, length: int | None = None) -> bytes:
    """A GGUF string: uint64 byte length, then the bytes (no terminator). `length` overrides the prefix."""
    b = s.encode() if isinstance(s, str) else s
    return u64(len(b) if length is None else length) + b


def scalar(vtype: int, v) -> bytes:
    return struct.pack("<" + _CODE[vtype], v)


def value(vtype: int, v) -> bytes:
    """The payload of a value of type `vtype` (no type tag)."""
    if vtype == STRING:
        return gstr(v)
    if vtype == ARRAY:
        raise ValueError("use array() for arrays")
    return scalar(vtype, v)


def array(etype: int, items, count: int | None = None) -> bytes:
    """An array payload: element type, uint64 count (overridable), then the elements."""
    body = b"".join(value(etype, x) for x in items)
    return u32(etype) + u64(len(items) if count is None else count) + body


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    """One key/value record with a raw payload (use value()/array() to make it)."""
    return gstr(key) + u32(vtype) + payload


def kv_str(key: str, s: str | bytes) -> bytes:
    return kv(key, STRING, gstr(s))


def kv_u32(key: str, v: int) -> bytes:
    return kv(key, UINT32, u32(v))


def kv_arr(key: str, etype: int, items, count: int | None = None) -> bytes:
    return kv(key, ARRAY, array(etype, items, count))


def nbytes(dims, ttype: int) -> int:
    block, size = BLOCK[ttype]
    n = 1
    for d in dims:
        n *= d
    return n // block * size


@dataclass
class Tensor:
    """A tensor-info record. offset=None: placed after the previous tensor, aligned."""

    name: str | bytes
    dims: tuple[int, ...]
    type: int = F32
    offset: int | None = None
    n_dims: int | None = None  # overrides the stored dimension count
    name_len: int | None = None  # overrides the stored name length


def tensor_info(name: str | bytes, dims, ttype: int, offset: int, n_dims: int | None = None,
                name_len: int | None = None) -> bytes:
    return (gstr(name, name_len) + u32(len(dims) if n_dims is None else n_dims)
            + b"".join(u64(d) for d in dims) + u32(ttype) + u64(offset))


def align(n: int, a: int) -> int:
    return -(-n // a) * a


def build(kvs=(), tensors=(), *, magic: bytes = b"GGUF", version: int = 3, n_tensors: int | None = None,
          n_kv: int | None = None, alignment: int = DEFAULT_ALIGNMENT, pad: bool = True,
          data_size: int | None = None, tail: bytes = b"") -> bytes:
    """A whole file: header, tensor table, padding to `alignment`, then `data_size` zero bytes
    (default: exactly up to the end of the last tensor; tensors without a known size count as 0)."""
    infos = []
    end = 0
    for t in tensors:
        if isinstance(t, bytes):
            infos.append(t)
            continue
        off = align(end, alignment) if t.offset is None else t.offset
        try:
            size = nbytes(t.dims, t.type)
        except KeyError:
            size = 0
        if t.offset is None or t.offset + size > end:
            end = max(end, off + size)
        infos.append(tensor_info(t.name, t.dims, t.type, off, t.n_dims, t.name_len))
    head = (magic + u32(version) + u64(len(infos) if n_tensors is None else n_tensors)
            + u64(len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + b"".join(infos))
    if not pad:
        return head + tail
    padded = head + b"\0" * (align(len(head), alignment) - len(head))
    if data_size is None and end > 1 << 24:
        raise ValueError(f"tensors span {end} bytes: pass data_size")
    return padded + b"\0" * (end if data_size is None else data_size) + tail


def header_len(kvs=(), tensors=(), **kw) -> int:
    """Length of the unpadded header build() would write."""
    return len(build(kvs, tensors, pad=False, **kw))
