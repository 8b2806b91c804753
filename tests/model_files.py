"""Test helper: copy a GGUF with edited metadata or tensor table, through the project's writer."""

from __future__ import annotations

import struct
from pathlib import Path

from gguf import GGUFValueType as V

from llmplan.models.gguf import GGUFFile, MetaValue
from llmplan.models.gguf_write import GGUFWriter


def u32(v: int) -> MetaValue:
    return MetaValue(V.UINT32, v)


def rewrite(src: Path, dst: Path, set_meta: dict[str, MetaValue] | None = None, drop_meta: tuple[str, ...] = (),
            drop_tensors: tuple[str, ...] = (), add_tensors: dict[str, tuple[str, tuple[int, ...]]] | None = None,
            reshape: dict[str, tuple[int, ...]] | None = None) -> Path:
    """A copy of `src` with metadata keys set or dropped and tensors dropped, added (name -> (source
    tensor whose bytes to reuse, shape)) or given another shape of the same byte size."""
    f = GGUFFile(src)
    w = GGUFWriter(dst, f.alignment)
    meta = {k: v for k, v in f.metadata.items() if k not in drop_meta and k != "general.alignment"}
    meta.update(set_meta or {})
    for k, v in meta.items():
        w.add(k, v)
    sources = []
    for name, t in f.tensors.items():
        if name in drop_tensors:
            continue
        w.add_tensor(name, (reshape or {}).get(name, t.shape), t.type)
        sources.append(name)
    for name, (src_name, shape) in (add_tensors or {}).items():
        w.add_tensor(name, shape, f.tensors[src_name].type)
        sources.append(src_name)
    w.write([[f.tensor_bytes(n)] for n in sources])
    return dst


def retype(path: Path, name: str, ttype: int) -> Path:
    """Declare tensor `name` of the GGUF at `path` as type `ttype`, in place, keeping its data region: for a
    file in a format our writer cannot write (the new type must need no more bytes than the old)."""
    data = bytearray(path.read_bytes())
    key = struct.pack("<Q", len(name)) + name.encode()
    at = data.index(key) + len(key)  # tensor names appear once, in the tensor infos
    n_dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at + 4 + 8 * n_dims, ttype)
    path.write_bytes(bytes(data))
    return path
