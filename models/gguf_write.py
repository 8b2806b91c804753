"""GGUF v3 writer that streams tensor data, so a multi-gigabyte model never sits in memory.

The header (metadata and tensor table) is written first; then each tensor's bytes arrive in table
order, in as many chunks as the caller likes, and are padded to the alignment. The file is written
under a temporary name and renamed into place only when complete, so an interrupted build leaves
nothing that looks like a model.
"""

from __future__ import annotations

import os
import struct
from typing import BinaryIO, Iterable

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType as V

from llmplan.core.formats import format_of
from .gguf import DEFAULT_ALIGNMENT, MAGIC, NUMPY_DTYPES, SCALAR_CODES, MetaValue

VERSION = 3


def encode_string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def encode_value(v: MetaValue) -> bytes:
    """Type tag + payload of one metadata value."""
    head = struct.pack("<I", v.type)
    if v.type == V.STRING:
        return head + encode_string(v.value)
    if v.type == V.ARRAY:
        et = v.element_type
        items = list(v.value) if et == V.STRING else np.asarray(v.value)
        head += struct.pack("<IQ", et, len(items))
        if et == V.STRING:
            return head + b"".join(encode_string(s) for s in items)
        return head + items.astype(NUMPY_DTYPES[et]).tobytes()
    return head + struct.pack("<" + SCALAR_CODES[v.type], v.value)


def _pad(n: int, alignment: int) -> int:
    return -n % alignment


class GGUFWriter:
    def __init__(self, path: str | os.PathLike, alignment: int = DEFAULT_ALIGNMENT):
        self.path = os.fspath(path)
        self.alignment = alignment
        self.metadata: dict[str, MetaValue] = {}
        self.tensors: list[tuple[str, tuple[int, ...], GGMLQuantizationType, int, int]] = []
        self._data_size = 0
        if alignment != DEFAULT_ALIGNMENT:
            self.metadata["general.alignment"] = MetaValue(V.UINT32, alignment)

    def add(self, key: str, value: MetaValue) -> None:
        if key in self.metadata:
            raise ValueError(f"duplicate metadata key {key}")
        self.metadata[key] = value

    def add_tensor(self, name: str, shape: tuple[int, ...], ttype: GGMLQuantizationType) -> int:
        """Declare a tensor (shape in GGUF order); returns its byte size."""
        fmt = format_of(ttype)
        n_rows = 1
        for d in shape[1:]:
            n_rows *= d
        nbytes = fmt.row_bytes(shape[0]) * n_rows
        self.tensors.append((name, tuple(shape), fmt.type, self._data_size, nbytes))
        self._data_size += nbytes + _pad(nbytes, self.alignment)
        return nbytes

    def header(self) -> bytes:
        parts = [MAGIC, struct.pack("<IQQ", VERSION, len(self.tensors), len(self.metadata))]
        for key, v in self.metadata.items():
            parts += [encode_string(key), encode_value(v)]
        for name, shape, ttype, offset, _ in self.tensors:
            parts += [encode_string(name), struct.pack("<I", len(shape)),
                      struct.pack(f"<{len(shape)}Q", *shape), struct.pack("<IQ", ttype, offset)]
        head = b"".join(parts)
        if not self.tensors:  # like llama.cpp, a vocabulary-only file ends right after its metadata
            return head
        return head + b"\0" * _pad(len(head), self.alignment)

    @property
    def file_size(self) -> int:
        return len(self.header()) + self._data_size

    def write(self, data: Iterable[Iterable[bytes | np.ndarray]], progress=None) -> None:
        """Write the file; `data` yields, per declared tensor in order, an iterable of byte chunks."""
        tmp = self.path + ".part"
        try:
            with open(tmp, "wb") as f:
                f.write(self.header())
                tensors = iter(self.tensors)
                for chunks in data:
                    name, _, _, _, nbytes = next(tensors)
                    self._write_tensor(f, name, nbytes, chunks, progress)
                if next(tensors, None) is not None:
                    raise ValueError("fewer tensor data streams than declared tensors")
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def _write_tensor(self, f: BinaryIO, name: str, nbytes: int, chunks, progress) -> None:
        written = 0
        for c in chunks:
            b = memoryview(np.ascontiguousarray(c)).cast("B") if isinstance(c, np.ndarray) else memoryview(c)
            f.write(b)
            written += len(b)
            if progress is not None:
                progress(len(b))
        if written != nbytes:
            raise ValueError(f"tensor {name}: wrote {written} bytes, declared {nbytes}")
        f.write(b"\0" * _pad(nbytes, self.alignment))
