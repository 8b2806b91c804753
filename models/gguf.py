"""GGUF reader that validates the whole header before anything trusts it.

The header (key/value metadata and the tensor table) is read with plain `read()` calls, so nothing
past it is touched; tensor data is memory-mapped on first use and never copied. Every length, count
and offset is checked against the bytes actually left in the file using Python ints, so a hostile
header can neither wrap an integer nor make us allocate or read beyond the file.
"""

from __future__ import annotations

import array
import codecs
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from llmplan.core.errors import InputError
from llmplan.core.weight_views import parse_view

from .errors import GGUFEndianError, GGUFError
from .strings import StringArray

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_NAME_BYTES = 63  # ggml's GGML_MAX_NAME is 64 including the terminating NUL
INT64_MAX = 2**63 - 1

# struct codes of the fixed-size scalar value types
SCALAR_CODES = {
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
    GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT32: "f", GGUFValueType.FLOAT64: "d",
    GGUFValueType.BOOL: "B",
}
NUMPY_DTYPES = {
    GGUFValueType.UINT8: "<u1", GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2", GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4", GGUFValueType.INT32: "<i4",
    GGUFValueType.UINT64: "<u8", GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT32: "<f4", GGUFValueType.FLOAT64: "<f8",
    GGUFValueType.BOOL: "<u1",
}
# smallest encodings, used to bound counts by the bytes left before reading any of them
_MIN_KV_BYTES = 8 + 1 + 4 + 1  # key length, one key byte, value type, one value byte
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8  # name length, one name byte, n_dims, one dim, type, offset
_READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table. `shape` is in GGUF order: shape[0] is the contiguous row length."""

    name: str
    shape: tuple[int, ...]
    type: GGMLQuantizationType
    offset: int  # absolute position of the first byte in the file
    nbytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def n_rows(self) -> int:
        return self.n_elements // self.shape[0]

    @property
    def row_bytes(self) -> int:
        return self.nbytes // self.n_rows


@dataclass(frozen=True)
class MetaValue:
    """A metadata value with its GGUF type; `element_type` is set for arrays."""

    type: GGUFValueType
    value: Any
    element_type: GGUFValueType | None = None


class _Cursor:
    """Reads forward through the header, never past the end of the file. `buf` is a window: the bytes
    from file position `base` on, those already read dropped at every refill. (A whole 6 MiB header,
    read and freed, raises glibc's mmap threshold to 6 MiB: later buffers that size then stay in its
    heap, resident for the rest of a run.)"""

    def __init__(self, f: BinaryIO, size: int, path: str):
        self.f, self.size, self.path = f, size, path
        self.buf = bytearray()
        self.base = 0  # the file position of buf[0]
        self.pos = 0

    def fail(self, field: str, problem: str, offset: int | None = None) -> GGUFError:
        return GGUFError(self.path, field, problem, self.pos if offset is None else offset)

    def left(self) -> int:
        return self.size - self.pos

    def need(self, n: int, field: str) -> None:
        if n > self.left():
            raise self.fail(field, f"needs {n} bytes but the file ends after {self.left()} (truncated?)")
        end = self.pos + n
        have = self.base + len(self.buf)
        if end > have:
            del self.buf[: self.pos - self.base]
            self.base = self.pos
            self.f.seek(have)
            self.buf += self.f.read(min(self.size, max(end, have + _READ_CHUNK)) - have)
            if self.base + len(self.buf) < end:
                raise self.fail(field, "file shrank while it was being read")

    def scalar(self, code: str, field: str) -> Any:
        n = struct.calcsize("<" + code)
        self.need(n, field)
        (v,) = struct.unpack_from("<" + code, self.buf, self.pos - self.base)
        self.pos += n
        return v

    def raw(self, n: int, field: str) -> bytes:
        self.need(n, field)
        b = bytes(self.buf[self.pos - self.base : self.pos - self.base + n])
        self.pos += n
        return b

    def string(self, field: str) -> str:
        start = self.pos
        n = self.scalar("Q", f"{field} length")
        if n > self.left():
            raise self.fail(field, f"string length {n} exceeds the {self.left()} bytes left in the file (truncated?)", start)
        b = self.raw(n, field)
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(field, f"string is not valid UTF-8 ({e.reason} at byte {e.start})", start) from None

    def strings(self, count: int, field: str) -> StringArray:
        # Vocabularies hold 10^5 strings: a tight loop that checks every length against the file and
        # copies the bytes into one blob, then one UTF-8 check of the whole blob.
        start = self.pos
        blob = bytearray()
        ends = array.array("q", [0])
        buf, size, base = self.buf, self.size, self.base
        pos = self.pos
        unpack = struct.unpack_from
        for i in range(count):
            if pos + 8 > base + len(buf):
                self.pos = pos
                self.need(8, f"{field}[{i}] length")
                base = self.base
            (n,) = unpack("<Q", buf, pos - base)
            if n > size - pos - 8:
                raise self.fail(f"{field}[{i}]", f"string length {n} exceeds the {size - pos - 8} bytes left (truncated?)", pos)
            pos += 8
            if pos + n > base + len(buf):
                self.pos = pos
                self.need(n, f"{field}[{i}]")
                base = self.base
            blob += buf[pos - base : pos - base + n]
            ends.append(len(blob))
            pos += n
        self.pos = pos
        out = StringArray(bytes(blob), np.frombuffer(ends, np.int64))
        if not _utf8(out):
            for i, raw in enumerate(out.iter_raw()):  # the first string at fault, for the message
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise self.fail(f"{field}[{i}]", f"string is not valid UTF-8 ({e.reason})",
                                    start + 8 * (i + 1) + int(ends[i])) from None
        return out


def _utf8(strings: StringArray) -> bool:
    """Whether every string is valid UTF-8: the blob is, and no string starts inside a character."""
    blob = strings.blob
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        for k in range(0, len(blob), _READ_CHUNK):  # in chunks: the whole blob as one str would be 4x its size
            decoder.decode(memoryview(blob)[k : k + _READ_CHUNK])
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    starts = strings.offsets[:-1]
    first = np.frombuffer(blob, np.uint8)[starts[starts < len(blob)]]
    return not np.any((first & 0xC0) == 0x80)


def _value_type(cur: _Cursor, field: str) -> GGUFValueType:
    start = cur.pos
    t = cur.scalar("I", field)
    try:
        return GGUFValueType(t)
    except ValueError:
        raise cur.fail(field, f"unknown value type {t}", start) from None


def _read_value(cur: _Cursor, vtype: GGUFValueType, field: str) -> MetaValue:
    if vtype == GGUFValueType.STRING:
        return MetaValue(vtype, cur.string(field))
    if vtype == GGUFValueType.ARRAY:
        etype = _value_type(cur, f"{field} element type")
        if etype == GGUFValueType.ARRAY:
            raise cur.fail(field, "nested arrays are not supported", cur.pos - 4)
        start = cur.pos
        count = cur.scalar("Q", f"{field} count")
        min_size = 8 if etype == GGUFValueType.STRING else struct.calcsize("<" + SCALAR_CODES[etype])
        if count * min_size > cur.left():
            raise cur.fail(field, f"array of {count} {etype.name} needs at least {count * min_size} bytes, "
                                  f"{cur.left()} left (truncated?)", start)
        if etype == GGUFValueType.STRING:
            return MetaValue(vtype, cur.strings(count, field), etype)
        nbytes = count * min_size
        cur.need(nbytes, field)
        arr = np.frombuffer(cur.buf, dtype=NUMPY_DTYPES[etype], count=count, offset=cur.pos - cur.base).copy()
        if etype == GGUFValueType.BOOL:
            if np.any(arr > 1):
                i = int(np.argmax(arr > 1))
                raise cur.fail(f"{field}[{i}]", f"bool value is {arr[i]}, not 0 or 1", cur.pos + i)
            arr = arr.astype(bool)
        cur.pos += nbytes
        return MetaValue(vtype, arr, etype)
    start = cur.pos
    v = cur.scalar(SCALAR_CODES[vtype], field)
    if vtype == GGUFValueType.BOOL:
        if v > 1:
            raise cur.fail(field, f"bool value is {v}, not 0 or 1", start)
        v = bool(v)
    return MetaValue(vtype, v)


def _check_version(cur: _Cursor, version: int) -> None:
    if version in SUPPORTED_VERSIONS:
        return
    swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
    if swapped in (1, 2, 3):
        raise GGUFEndianError(cur.path, "header.version",
                              f"reads as {version:#010x}: this is a big-endian GGUF (version {swapped}); "
                              "only little-endian files are supported", 4)
    if version == 1:
        raise GGUFError(cur.path, "header.version", "GGUF version 1 is obsolete; re-convert the model", 4)
    raise GGUFError(cur.path, "header.version", f"unsupported version {version} (supported: 2, 3)", 4)


def _tensor_info(cur: _Cursor, i: int, names: set[str]) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int, int]:
    start = cur.pos
    name = cur.string(f"tensor[{i}].name")
    if not name:
        raise cur.fail(f"tensor[{i}].name", "empty tensor name", start)
    if len(name.encode()) > MAX_NAME_BYTES:
        raise cur.fail(f"tensor[{i}].name", f"name {name[:80]!r} is {len(name.encode())} bytes, "
                                            f"longer than {MAX_NAME_BYTES}", start)
    if name in names:
        raise cur.fail(f"tensor '{name}'", "duplicate tensor name", start)
    field = f"tensor '{name}'"
    n_dims = cur.scalar("I", f"{field} n_dims")
    if not 1 <= n_dims <= MAX_DIMS:
        raise cur.fail(f"{field} n_dims", f"{n_dims} dimensions (must be 1..{MAX_DIMS})", cur.pos - 4)
    dims = []
    n_el = 1
    for d in range(n_dims):
        v = cur.scalar("Q", f"{field} dims[{d}]")
        if not 1 <= v <= INT64_MAX:
            raise cur.fail(f"{field} dims[{d}]", f"dimension {v} is out of range (1..2^63-1)", cur.pos - 8)
        n_el *= v
        if n_el > INT64_MAX:
            raise cur.fail(f"{field} dims", f"element count of {dims + [v]} overflows int64", cur.pos - 8)
        dims.append(v)
    tid = cur.scalar("I", f"{field} type")
    try:
        ttype = GGMLQuantizationType(tid)
        block, type_size = GGML_QUANT_SIZES[ttype]
    except (ValueError, KeyError):
        raise cur.fail(f"{field} type", f"unknown tensor type id {tid}", cur.pos - 4) from None
    if dims[0] % block:
        raise cur.fail(f"{field} dims[0]", f"row length {dims[0]} is not a multiple of the {ttype.name} "
                                          f"block size {block}")
    nbytes = n_el // block * type_size
    offset = cur.scalar("Q", f"{field} offset")
    return name, tuple(dims), ttype, offset, nbytes


def is_gguf(path: str) -> bool:
    """Whether the file starts as a GGUF file does (the CLI tells models from plans by it). A file named
    .gguf that is not one is an error that says so, not a plan file that fails to read."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise InputError(f"{path}: {e.strerror}") from None
    if head != MAGIC and str(path).lower().endswith(".gguf"):
        raise GGUFError(str(path), "header.magic", f"not a GGUF file (starts with {head!r}, expected {MAGIC!r})", 0)
    return head == MAGIC


class GGUFFile:
    """A validated GGUF file: metadata, tensor table, and memory-mapped tensor bytes."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        with open(self.path, "rb") as f:
            self.size = os.fstat(f.fileno()).st_size
            self._parse(_Cursor(f, self.size, self.path))
        self._map: np.memmap | None = None

    def _parse(self, cur: _Cursor) -> None:
        head = cur.raw(min(4, self.size), "header.magic")
        if head != MAGIC:
            raise GGUFError(self.path, "header.magic", f"not a GGUF file (starts with {head!r}, expected {MAGIC!r})", 0)
        self.version = cur.scalar("I", "header.version")
        _check_version(cur, self.version)
        n_tensors = cur.scalar("Q", "header.tensor_count")
        n_kv = cur.scalar("Q", "header.kv_count")
        if n_kv * _MIN_KV_BYTES > cur.left():
            raise cur.fail("header.kv_count", f"{n_kv} key/value pairs cannot fit in the {cur.left()} bytes left", 16)
        if n_tensors * _MIN_TENSOR_INFO_BYTES > cur.left() - n_kv * _MIN_KV_BYTES:
            raise cur.fail("header.tensor_count", f"{n_tensors} tensor infos cannot fit in the file", 8)

        self.metadata: dict[str, MetaValue] = {}
        for i in range(n_kv):
            start = cur.pos
            key = cur.string(f"kv[{i}].key")
            if not key:
                raise cur.fail(f"kv[{i}].key", "empty key", start)
            if key in self.metadata:
                raise cur.fail(f"key '{key}'", "duplicate key", start)
            self.metadata[key] = _read_value(cur, _value_type(cur, f"key '{key}' type"), f"key '{key}'")

        self.kv_end = cur.pos  # where the tensor table starts
        self.alignment = DEFAULT_ALIGNMENT
        if "general.alignment" in self.metadata:
            a = self.metadata["general.alignment"]
            if a.type != GGUFValueType.UINT32:
                raise GGUFError(self.path, "key 'general.alignment'", f"must be UINT32, is {a.type.name}")
            if a.value == 0 or a.value & (a.value - 1):
                raise GGUFError(self.path, "key 'general.alignment'", f"{a.value} is not a non-zero power of two")
            self.alignment = a.value

        infos = []
        names: set[str] = set()
        for i in range(n_tensors):
            info = _tensor_info(cur, i, names)
            names.add(info[0])
            infos.append(info)
        header_end = cur.pos
        self.data_offset = -(-header_end // self.alignment) * self.alignment
        if infos and self.data_offset > self.size:
            raise GGUFError(self.path, "data section", f"starts at byte {self.data_offset}, past the end of the "
                                                      f"file ({self.size} bytes)")
        self.tensors: dict[str, TensorInfo] = {}
        data_bytes = self.size - self.data_offset
        for name, dims, ttype, offset, nbytes in infos:
            field = f"tensor '{name}' offset"
            if offset % self.alignment:
                raise GGUFError(self.path, field, f"{offset} is not a multiple of the alignment {self.alignment}")
            if offset > data_bytes or nbytes > data_bytes - offset:
                raise GGUFError(self.path, field, f"data [{offset}, {offset + nbytes}) runs past the "
                                                  f"{data_bytes} bytes of the data section")
            self.tensors[name] = TensorInfo(name, dims, ttype, self.data_offset + offset, nbytes)
        by_offset = sorted(self.tensors.values(), key=lambda t: t.offset)
        for a, b in zip(by_offset, by_offset[1:]):
            if b.offset < a.offset + a.nbytes:
                raise GGUFError(self.path, f"tensor '{b.name}' offset", f"data overlaps tensor '{a.name}'")
        self.header_bytes = header_end

    # metadata -------------------------------------------------------------------------------

    def get(self, key: str, default: Any = None) -> Any:
        v = self.metadata.get(key)
        return default if v is None else v.value

    def __contains__(self, key: str) -> bool:
        return key in self.metadata

    @property
    def architecture(self) -> str | None:
        return self.get("general.architecture")

    # tensor data ----------------------------------------------------------------------------

    def weight(self, name: str) -> TensorInfo:
        """A tensor of the table, or a view of rows of one (core/weight_views.py): its own TensorInfo,
        whose bytes are that range of the tensor's."""
        view = parse_view(name)
        if view is None:
            return self.tensors[name]
        tensor, lo, hi = view
        t = self.tensors[tensor]
        if hi > t.n_rows:
            raise KeyError(f"{name}: {t.name} has {t.n_rows} rows")
        return TensorInfo(name, (*t.shape[:-1], hi - lo), t.type, t.offset + lo * t.row_bytes, (hi - lo) * t.row_bytes)

    def tensor_bytes(self, name: str) -> np.ndarray:
        """The raw bytes of one weight (a tensor or a view of one) as a read-only uint8 view of the mapped
        file (no copy)."""
        t = self.weight(name)
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        return self._map[t.offset : t.offset + t.nbytes]

    def release(self, name: str, lo: int = 0, hi: int | None = None) -> None:
        """Drop bytes [lo, hi) of one tensor's mapped pages from this process's memory (they are held
        elsewhere, in a layout made from them): the pages wholly inside, read from the file again if
        touched."""
        if self._map is None:
            return
        t = self.weight(name)
        hi = t.nbytes if hi is None else min(hi, t.nbytes)
        start = -(-(t.offset + lo) // mmap.PAGESIZE) * mmap.PAGESIZE
        end = (t.offset + hi) // mmap.PAGESIZE * mmap.PAGESIZE
        if end > start:
            self._map._mmap.madvise(mmap.MADV_DONTNEED, start, end - start)

    def close(self) -> None:
        self._map = None

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
