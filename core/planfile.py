"""The plan file: one msgpack file holding everything the runtime needs besides the GGUF.

Layout: MAGIC, u32 format version, u32 header length, header (msgpack), SHA-256 of the header, u64 body
length, body (msgpack), SHA-256 of the body. The header is small and read first: a plan for another
device, another model file or another format version is refused, with what to run instead, before
the body is even read. Checksums catch truncation and flipped bits; msgpack is unpacked with size
limits so a hostile file cannot make us allocate without bound.
"""

from __future__ import annotations

import hashlib
import os
import struct
from typing import Any, Protocol

import msgpack

from .errors import InputError
from .plan_records import PlanBody, PlanHeader, SchemaError, record_from_wire, to_wire
from .plan_schema import check_body

MAGIC = b"LLMPLAN\0"
FORMAT_VERSION = 3  # 2: self-describing bodies (step state, cache, kernel parameters, weight layouts); 3: the cpu section
MAX_HEADER_BYTES = 1 << 20
MAX_BODY_BYTES = 1 << 31
_DIGEST = 32


class PlanError(InputError):
    """A plan file that cannot be used here; the message says what to do instead."""


class ModelFile(Protocol):
    """What a plan knows of the GGUF it was compiled from (models/gguf.py GGUFFile is one)."""

    path: str
    size: int
    kv_end: int  # the metadata's end
    header_bytes: int  # the tensor table's end


def model_fingerprint(f: ModelFile) -> dict[str, Any]:
    """File size and hashes of the metadata and of the tensor table (not the weights: too slow to hash)."""
    digests = []
    with open(f.path, "rb") as fh:
        for left in (f.kv_end, f.header_bytes - f.kv_end):
            h = hashlib.sha256()
            while left > 0:  # 1 MiB at a time: with 262144 tokens the metadata is 6 MiB (see gguf.py's _Cursor)
                chunk = fh.read(min(left, 1 << 20))
                if not chunk:
                    break
                h.update(chunk)
                left -= len(chunk)
            digests.append(h.hexdigest())
    return {"file_size": f.size, "metadata_sha256": digests[0], "tensors_sha256": digests[1]}


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _unpack(data: bytes, what: str, path: str) -> Any:
    # Unpacker bounds every string, array and map by the buffer it was given
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(len(data), 1))
    try:
        unpacker.feed(data)
        obj = unpacker.unpack()
        if unpacker.tell() != len(data):
            raise ValueError("trailing bytes")
        return obj
    except Exception as e:  # msgpack raises several types for malformed input
        raise PlanError(f"{path}: the plan's {what} does not decode ({type(e).__name__}): recompile the plan") from None


def write_plan(path: str | os.PathLike, header: PlanHeader, body: PlanBody) -> int:
    """Write atomically; returns the file size."""
    h, b = _pack(to_wire(header)), _pack(to_wire(body))
    data = b"".join([MAGIC, struct.pack("<II", FORMAT_VERSION, len(h)), h, hashlib.sha256(h).digest(),
                     struct.pack("<Q", len(b)), b, hashlib.sha256(b).digest()])
    tmp = os.fspath(path) + ".part"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return len(data)


def recompile_hint(header: PlanHeader | None, device: str | None = None) -> str:
    model = header.model.path if header else "MODEL.gguf"
    dev = device or (header.device.backend if header else "cpu")
    return f"recompile with: plan compile {model} --device {dev}"


def read_header(path: str | os.PathLike) -> tuple[PlanHeader, int]:
    """The checked header and the offset where the body section starts."""
    path = os.fspath(path)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(16)
        if len(head) < 16 or head[:8] != MAGIC:
            raise PlanError(f"{path}: not a plan file (it does not start with {MAGIC!r})")
        version, hlen = struct.unpack("<II", head[8:16])
        if version != FORMAT_VERSION:
            newer = "a newer" if version > FORMAT_VERSION else "an older"
            raise PlanError(f"{path}: plan format {version} was written by {newer} llmplan; this one reads format "
                            f"{FORMAT_VERSION}: {recompile_hint(None)}")
        if hlen > MAX_HEADER_BYTES or 16 + hlen + _DIGEST > size:
            raise PlanError(f"{path}: the plan is truncated or its header length ({hlen}) is corrupt: {recompile_hint(None)}")
        h = f.read(hlen)
        if hashlib.sha256(h).digest() != f.read(_DIGEST):
            raise PlanError(f"{path}: the plan's header is corrupt (checksum mismatch): {recompile_hint(None)}")
    raw = _unpack(h, "header", path)
    try:
        header = record_from_wire(PlanHeader, raw, "header")
    except SchemaError as e:
        raise PlanError(f"{path}: the plan's header is malformed ({e}): {recompile_hint(None)}") from None
    if header.format != FORMAT_VERSION:
        raise PlanError(f"{path}: the plan's header is malformed: {recompile_hint(None)}")
    return header, 16 + hlen + _DIGEST


def check_header(path: str, header: PlanHeader, device_key: str | None, model: ModelFile | None) -> None:
    """Refuse a plan for another device (unless `device_key` is None: the emulated GPU runs any GPU plan)
    or from another model file."""
    want = header.device.key
    if device_key is not None and want != device_key:
        here = device_key.split(":")[0]
        raise PlanError(f"{path}: compiled for {header.device.arch} ({want}), this device is {device_key}: "
                        f"{recompile_hint(header, here)}")
    if model is not None and header.model.fingerprint != model_fingerprint(model):
        raise PlanError(f"{path}: compiled from another model file than {model.path} (size or hashes differ): "
                        f"{recompile_hint(header)}")


def read_body(path: str | os.PathLike, offset: int, header: PlanHeader | None = None) -> PlanBody:
    path = os.fspath(path)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        f.seek(offset)
        raw = f.read(8)
        if len(raw) < 8:
            raise PlanError(f"{path}: the plan is truncated: {recompile_hint(None)}")
        (blen,) = struct.unpack("<Q", raw)
        if blen > MAX_BODY_BYTES or offset + 8 + blen + _DIGEST != size:
            raise PlanError(f"{path}: the plan is truncated or has trailing bytes: {recompile_hint(None)}")
        b = f.read(blen)
        if hashlib.sha256(b).digest() != f.read(_DIGEST):
            raise PlanError(f"{path}: the plan's body is corrupt (checksum mismatch): {recompile_hint(None)}")
    raw = _unpack(b, "body", path)
    try:
        body = record_from_wire(PlanBody, raw, "")
        check_body(body)
    except SchemaError as e:
        raise PlanError(f"{path}: the plan's body is inconsistent: {e}: {recompile_hint(header)}") from None
    return body


def read_plan(path: str | os.PathLike, device_key: str | None,
              model: ModelFile | None = None) -> tuple[PlanHeader, PlanBody]:
    """Header and body of a plan usable on `device_key` (and compiled from `model`, when given)."""
    header, offset = read_header(path)
    check_header(os.fspath(path), header, device_key, model)
    return header, read_body(path, offset, header)
