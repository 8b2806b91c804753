"""Malformed GGUF files: each one raises the typed error naming the field, quickly, without reading
past the end of the file.

- CASES: hand-made files (tests/gguf_bytes.py), each a valid file with exactly one defect, one or
  more per check the reader must enforce (docs/architecture.md, "Model input").
- every prefix of the tiny-llama-spm fixture's header (0 .. header_bytes) is rejected.
- a hypothesis mutation test over the fixture headers: each mutant loads, or raises GGUFError.
- metadata of a (sparse) 5 GB file is read without touching its tensor data.
"""

from __future__ import annotations

import os
import re
import struct
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import llmplan.models.gguf as gguf_mod
from llmplan.models.errors import GGUFEndianError, GGUFError
from llmplan.models.gguf import GGUFFile

from conftest import TINY_BPE, TINY_SPM, VOCAB_SPM
from gguf_bytes import (
    ARRAY,
    BOOL,
    F32,
    INT32,
    Q4_0,
    Q4_K,
    Q8_0,
    STRING,
    UINT8,
    UINT32,
    UINT64,
    Tensor,
    array,
    build,
    gstr,
    header_len,
    kv,
    kv_arr,
    kv_str,
    kv_u32,
    nbytes,
    u8,
    u32,
    u64,
    value,
)

U64_MAX = 2**64 - 1
I64_MAX = 2**63 - 1
TIME_LIMIT_S = 1.0
HAVE_PROC_IO = sys.platform.startswith("linux") and os.path.exists("/proc/self/io")


# --- instruments -------------------------------------------------------------------------------


def rchar() -> int:
    """Bytes this process has obtained from read()-family calls so far (Linux)."""
    with open("/proc/self/io", "rb") as f:
        for line in f.read().splitlines():
            if line.startswith(b"rchar:"):
                return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


class _SpyFile:
    """Wraps the reader's file object; records any seek or read request beyond the end of the file."""

    def __init__(self, f, log: list[str]):
        self._f, self._log = f, log
        self._size = os.fstat(f.fileno()).st_size

    def seek(self, pos, whence=0):
        r = self._f.seek(pos, whence)
        if r > self._size:
            self._log.append(f"seek to {r} in a {self._size}-byte file")
        return r

    def read(self, n=-1):
        pos = self._f.tell()
        if n is not None and n >= 0 and pos + n > self._size:
            self._log.append(f"read({n}) at {pos} in a {self._size}-byte file")
        return self._f.read(n)

    def readinto(self, b):
        pos = self._f.tell()
        if pos + len(b) > self._size:
            self._log.append(f"readinto({len(b)}) at {pos} in a {self._size}-byte file")
        return self._f.readinto(b)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


class Violations(list):
    """Requests past the end of the file; `opened` counts the files the reader opened."""

    opened = 0


def spy_open(mp: pytest.MonkeyPatch) -> Violations:
    """Make the reader's `open` return spied files; returns the list of violations."""
    log = Violations()

    def _open(path, mode="r", *args, **kwargs):
        f = open(path, mode, *args, **kwargs)
        log.opened += 1
        return _SpyFile(f, log) if "r" in mode else f

    mp.setattr(gguf_mod, "open", _open, raising=False)
    return log


def scratch_dir(tmp_path_factory) -> Path:
    """A RAM-backed directory when there is one: the sweep truncates its files tens of thousands of times."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return Path(tempfile.mkdtemp(prefix="llmplan-gguf-", dir=shm))
    return tmp_path_factory.mktemp("gguf")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    d = scratch_dir(tmp_path_factory)
    yield d
    for p in d.iterdir():
        p.unlink()
    if str(d).startswith("/dev/shm/"):
        d.rmdir()


# --- the corpus --------------------------------------------------------------------------------


@dataclass
class Case:
    id: str
    data: bytes
    field: str  # must appear in GGUFError.field
    says: tuple[str, ...] = ()  # must appear in the message (the offending value)
    exc: type = GGUFError  # the exact class expected


ARCH = kv_str("general.architecture", "llama")
T32 = Tensor("t", (32,), F32)


def ok(kvs=(ARCH,), tensors=(T32,), **kw) -> bytes:
    return build(list(kvs), list(tensors), **kw)


def _be_header() -> bytes:
    """A header written big-endian throughout (as a big-endian converter would)."""
    key = b"general.architecture"
    return (b"GGUF" + struct.pack(">I", 3) + struct.pack(">Q", 0) + struct.pack(">Q", 1)
            + struct.pack(">Q", len(key)) + key + struct.pack(">I", STRING) + struct.pack(">Q", 5) + b"llama")


def _cases() -> list[Case]:
    c: list[Case] = []
    add = lambda *a, **k: c.append(Case(*a, **k))  # noqa: E731
    good = ok()
    body = good[4:]

    # magic
    add("magic-empty-file", b"", "header.magic", ("b''",))
    add("magic-2-bytes", b"GG", "header.magic", ("b'GG'",))
    add("magic-ggml", b"GGML" + body, "header.magic", ("GGML",))
    add("magic-lowercase", b"gguf" + body, "header.magic", ("gguf",))
    add("magic-swapped", b"FUGG" + body, "header.magic", ("FUGG",))
    add("all-zeros", bytes(4096), "header.magic", ("\\x00",))

    # version
    for v in (0, 4, 7, 0xFFFFFFFF):
        add(f"version-{v}", ok(version=v), "header.version", (f"unsupported version {v}",))
    add("version-1", ok(version=1), "header.version", ("version 1",))
    for v in (1, 2, 3):
        add(f"version-{v}-byteswapped", ok(version=v << 24), "header.version",
            ("big-endian", f"version {v}"), GGUFEndianError)
    add("big-endian-header", _be_header(), "header.version", ("big-endian",), GGUFEndianError)
    add("truncated-after-version", b"GGUF" + u32(3), "header.tensor_count", ("needs 8 bytes",))
    add("truncated-after-tensor-count", b"GGUF" + u32(3) + u64(0), "header.kv_count", ("needs 8 bytes",))

    # counts against the file size
    for n in (U64_MAX, 2**63, 2**40):
        add(f"kv-count-{n}", ok(n_kv=n), "header.kv_count", (str(n),))
        add(f"tensor-count-{n}", ok(n_tensors=n), "header.tensor_count", (str(n),))
    add("tensor-count-one-too-many", build([], [T32], n_tensors=2, pad=False), "header.tensor_count", ("2 tensor",))
    add("kv-count-one-too-many", build([ARCH], [], n_kv=2, pad=False), "kv[1].key", ("needs 8 bytes",))

    # string lengths against the bytes left
    k = b"general.name"
    add("key-length-u64-max", ok([u64(U64_MAX) + k + u32(UINT8) + u8(0)]), "kv[0].key", (str(U64_MAX),))
    add("key-length-one-past-eof", build([], [], n_kv=1, pad=False) + u64(13) + k, "kv[0].key",
        ("string length 13", "12 bytes left"))
    add("string-value-length-2^63", ok([gstr(k) + u32(STRING) + u64(2**63) + b"x"]), "key 'general.name'",
        (str(2**63),))
    add("string-value-one-past-eof", build([gstr(k) + u32(STRING) + u64(6) + b"llama"], [], pad=False),
        "key 'general.name'", ("string length 6", "5 bytes left"))

    # keys
    add("empty-key", ok([kv("", UINT8, u8(0))]), "kv[0].key", ("empty key",))
    add("duplicate-key", ok([ARCH, ARCH]), "key 'general.architecture'", ("duplicate key",))
    add("duplicate-key-other-type", ok([ARCH, kv_u32("general.architecture", 1)]), "key 'general.architecture'",
        ("duplicate key",))

    # invalid UTF-8 (keys, string values, string array elements, tensor names)
    add("key-invalid-utf8", ok([kv(b"general.\xff", UINT8, u8(0))]), "kv[0].key", ("UTF-8",))
    add("key-utf8-surrogate", ok([kv(b"k\xed\xa0\x80", UINT8, u8(0))]), "kv[0].key", ("UTF-8",))
    add("string-invalid-utf8", ok([kv_str("general.name", b"\xc3\x28")]), "key 'general.name'", ("UTF-8",))
    add("string-overlong-utf8", ok([kv_str("general.name", b"\xc0\xaf")]), "key 'general.name'", ("UTF-8",))
    add("string-cut-utf8", ok([kv_str("general.name", b"ab\xe2\x82")]), "key 'general.name'", ("UTF-8",))
    add("string-array-invalid-utf8", ok([kv_arr("tokenizer.ggml.tokens", STRING, ["a", b"\xff"])]),
        "key 'tokenizer.ggml.tokens'[1]", ("UTF-8",))
    add("string-array-char-split-across-strings",  # "aé" as a whole, but "\xc3" and "\xa9" are not UTF-8
        ok([kv_arr("tokenizer.ggml.tokens", STRING, ["a", b"\xc3", b"\xa9"])]), "key 'tokenizer.ggml.tokens'[1]",
        ("UTF-8",))
    add("tensor-name-invalid-utf8", ok(tensors=[Tensor(b"\xfe\xff", (32,))]), "tensor[0].name", ("UTF-8",))

    # value types
    add("unknown-value-type-13", ok([kv("x", 13, u8(0))]), "key 'x' type", ("unknown value type 13",))
    add("unknown-value-type-u32-max", ok([kv("x", 0xFFFFFFFF, u8(0))]), "key 'x' type",
        (f"unknown value type {0xFFFFFFFF}",))
    add("unknown-array-element-type", ok([kv("x", ARRAY, u32(99) + u64(0))]), "key 'x' element type",
        ("unknown value type 99",))
    add("nested-array", ok([kv("x", ARRAY, u32(ARRAY) + u64(1) + array(UINT8, [0]))]), "key 'x'", ("nested arrays",))

    # bools
    add("bool-2", ok([kv("b", BOOL, u8(2))]), "key 'b'", ("bool value is 2",))
    add("bool-255", ok([kv("b", BOOL, u8(255))]), "key 'b'", ("bool value is 255",))
    add("bool-array-2", ok([kv_arr("b", BOOL, [0, 1, 2])]), "key 'b'[2]", ("bool value is 2",))

    # array lengths against the bytes left
    add("array-u32-count-2^62", ok([kv_arr("a", UINT32, [1, 2, 3], count=2**62)]), "key 'a'",
        (f"array of {2**62} UINT32",))
    add("array-u64-count-2^63", ok([kv_arr("a", UINT64, [1], count=2**63)]), "key 'a'", (f"array of {2**63}",))
    add("array-one-element-past-eof", build([kv_arr("a", INT32, [1, 2, 3], count=4)], [], pad=False), "key 'a'",
        ("array of 4 INT32", "needs at least 16 bytes", "12 left"))
    add("string-array-count-u64-max", ok([kv_arr("tok", STRING, ["a", "b"], count=U64_MAX)]), "key 'tok'",
        (f"array of {U64_MAX} STRING",))
    add("string-array-element-length-2^63",
        ok([kv("tok", ARRAY, u32(STRING) + u64(2) + gstr("a") + u64(2**63) + b"b")]), "key 'tok'[1]",
        (f"string length {2**63}",))

    # general.alignment
    for a in (0, 3, 48, 0xFFFFFFFF):
        add(f"alignment-{a}", ok([kv_u32("general.alignment", a)]), "general.alignment",
            (f"{a} is not a non-zero power of two",))
    add("alignment-uint64", ok([kv("general.alignment", UINT64, u64(32))]), "general.alignment", ("UINT64",))
    add("alignment-int32", ok([kv("general.alignment", INT32, value(INT32, 32))]), "general.alignment", ("INT32",))
    add("alignment-string", ok([kv_str("general.alignment", "32")]), "general.alignment", ("STRING",))

    # tensor names
    add("tensor-name-empty", ok(tensors=[Tensor("", (32,))]), "tensor[0].name", ("empty tensor name",))
    add("tensor-name-64-bytes", ok(tensors=[Tensor("n" * 64, (32,))]), "tensor[0].name", ("64 bytes",))
    add("tensor-name-64-utf8-bytes", ok(tensors=[Tensor("é" * 32, (32,))]), "tensor[0].name", ("64 bytes",))
    add("tensor-name-length-u64-max", ok(tensors=[Tensor("t", (32,), name_len=U64_MAX)]), "tensor[0].name",
        (str(U64_MAX),))
    add("tensor-name-duplicate", ok(tensors=[Tensor("a", (32,)), Tensor("b", (32,)), Tensor("a", (32,))]),
        "tensor 'a'", ("duplicate tensor name",))

    # dimensions
    add("n-dims-0", ok(tensors=[Tensor("t", ())]), "tensor 't' n_dims", ("0 dimensions",))
    add("n-dims-5", ok(tensors=[Tensor("t", (32, 1, 1, 1, 1))]), "tensor 't' n_dims", ("5 dimensions",))
    add("n-dims-u32-max", ok(tensors=[Tensor("t", (32,), n_dims=0xFFFFFFFF)]), "tensor 't' n_dims",
        (f"{0xFFFFFFFF} dimensions",))
    add("dim-0", ok(tensors=[Tensor("t", (32, 0))]), "tensor 't' dims[1]", ("dimension 0",))
    add("dim-2^63", ok(tensors=[Tensor("t", (2**63,))], data_size=128), "tensor 't' dims[0]",
        (f"dimension {2**63}",))
    add("dim-u64-max", ok(tensors=[Tensor("t", (32, U64_MAX))], data_size=128), "tensor 't' dims[1]",
        (f"dimension {U64_MAX}",))
    add("dims-product-2^64", ok(tensors=[Tensor("t", (2**32, 2**32))], data_size=128), "tensor 't' dims",
        ("overflows int64",))
    add("dims-product-2^63", ok(tensors=[Tensor("t", (2**61, 2, 2))], data_size=128), "tensor 't' dims",
        ("overflows int64", str(2**61)))
    # element count fits int64 but the byte size (4 * (2^63 - 1)) cannot be in the file
    add("byte-size-past-int64", ok(tensors=[Tensor("t", (I64_MAX,))], data_size=64), "tensor 't' offset",
        (str(4 * I64_MAX),))
    add("byte-size-past-file", ok(tensors=[Tensor("t", (1024, 1024))], data_size=128), "tensor 't' offset",
        (str(4 * 1024 * 1024), "128 bytes"))

    # tensor types and blocks
    for tid in (4, 5, 1000, 0xFFFFFFFF):
        add(f"tensor-type-{tid}", ok(tensors=[Tensor("t", (32,), tid)], data_size=128), "tensor 't' type",
            (f"unknown tensor type id {tid}",))
    add("q4k-row-100", ok(tensors=[Tensor("t", (100, 2), Q4_K)], data_size=512), "tensor 't' dims[0]",
        ("100", "Q4_K", "256"))
    add("q8_0-row-33", ok(tensors=[Tensor("t", (33,), Q8_0)], data_size=64), "tensor 't' dims[0]", ("33", "32"))
    add("q4_0-row-16", ok(tensors=[Tensor("t", (16,), Q4_0)], data_size=64), "tensor 't' dims[0]", ("16", "Q4_0"))

    # data section and offsets
    hl = header_len([ARCH], [T32])
    assert hl % 32, "the unpadded header must not end on the alignment for this case"
    add("data-section-past-eof", ok(pad=False), "data section", (str(-(-hl // 32) * 32), f"({hl} bytes)"))
    add("data-section-past-eof-2^31-alignment",
        ok([kv_u32("general.alignment", 2**31)], alignment=32), "data section", (str(2**31),))
    add("tensor-data-1-byte-short", ok(data_size=127), "tensor 't' offset", ("[0, 128)", "127 bytes"))
    add("offset-unaligned", ok(tensors=[Tensor("t", (32,), offset=4)], data_size=256), "tensor 't' offset",
        ("4 is not a multiple of the alignment 32",))
    add("offset-unaligned-custom-alignment",
        ok([kv_u32("general.alignment", 64)], [Tensor("t", (32,), offset=32)], alignment=64, data_size=256),
        "tensor 't' offset", ("32", "alignment 64"))
    add("offset-2^40", ok(tensors=[Tensor("t", (32,), offset=2**40)], data_size=128), "tensor 't' offset",
        (str(2**40),))
    add("offset-near-u64-max", ok(tensors=[Tensor("t", (32,), offset=2**64 - 32)], data_size=128),
        "tensor 't' offset", (str(2**64 - 32),))
    add("offset-at-data-end", ok(tensors=[Tensor("t", (32,), offset=128)], data_size=128), "tensor 't' offset",
        ("[128, 256)",))
    add("overlap-same-offset", ok(tensors=[Tensor("a", (32,), offset=0), Tensor("b", (32,), offset=0)]),
        "tensor 'b' offset", ("overlaps tensor 'a'",))
    add("overlap-partial", ok(tensors=[Tensor("a", (64,), offset=0), Tensor("b", (32,), offset=128)]),
        "tensor 'b' offset", ("overlaps tensor 'a'",))
    add("overlap-out-of-order",
        ok(tensors=[Tensor("c", (32,), offset=256), Tensor("b", (64,), offset=128), Tensor("a", (64,), offset=0)]),
        "tensor 'b' offset", ("overlaps tensor 'a'",))
    return c


CASES = _cases()


def test_spy_sees_the_readers_io(tmp_path, monkeypatch):
    """Positive control for the read-past-the-end check used below. If the reader stops opening
    files with the builtin `open`, update spy_open() to follow it."""
    p = tmp_path / "ok.gguf"
    p.write_bytes(ok())
    log = spy_open(monkeypatch)
    GGUFFile(p)
    assert log.opened == 1 and log == []
    with gguf_mod.open(p, "rb") as f:
        f.seek(len(ok()) - 4)
        f.read(8)
    assert log == [f"read(8) at {len(ok()) - 4} in a {len(ok())}-byte file"]


def test_corpus_is_large_and_unique():
    assert len(CASES) >= 40
    assert len({c.id for c in CASES}) == len(CASES)
    assert len({c.data for c in CASES}) == len(CASES)


@pytest.mark.parametrize("tensors,kw", [
    ([T32], {}),
    ([T32], {"alignment": 64, "kvs": [ARCH, kv_u32("general.alignment", 64)]}),
    ([Tensor("a", (32,)), Tensor("b", (64,)), Tensor("c", (32,))], {}),
    ([Tensor("t", (256, 2), Q4_K), Tensor("u", (32, 3), Q8_0), Tensor("v", (32,), Q4_0)], {}),
    ([], {"pad": False}),
])
def test_baselines_load(tmp_path, tensors, kw):
    """The corpus mutates these: each is valid, so every error below comes from the one defect."""
    p = tmp_path / "ok.gguf"
    p.write_bytes(ok(tensors=tensors, **kw))
    g = GGUFFile(p)
    assert list(g.tensors) == [t.name for t in tensors]
    for t in tensors:
        assert g.tensors[t.name].nbytes == nbytes(t.dims, t.type)
        assert len(g.tensor_bytes(t.name)) == nbytes(t.dims, t.type)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_malformed_file_raises_typed_error(case: Case, tmp_path, monkeypatch):
    path = tmp_path / "bad.gguf"
    path.write_bytes(case.data)
    violations = spy_open(monkeypatch)
    r0 = rchar() if HAVE_PROC_IO else 0
    t0 = time.perf_counter()
    with pytest.raises(GGUFError) as info:
        GGUFFile(path)
    elapsed = time.perf_counter() - t0
    r1 = rchar() if HAVE_PROC_IO else 0
    e = info.value
    assert type(e) is case.exc, f"{type(e).__name__}: {e}"
    assert case.field in e.field, str(e)
    assert case.field in str(e)
    for s in case.says:
        assert s in str(e), f"{s!r} not in {str(e)!r}"
    assert str(path) in str(e)
    assert elapsed < TIME_LIMIT_S, f"took {elapsed:.3f} s"
    assert violations == [], violations
    if HAVE_PROC_IO:  # at most the file itself, plus the /proc/self/io read in between
        assert r1 - r0 <= len(case.data) + 4096


# --- truncation at every byte of a fixture header -----------------------------------------------

SWEEP_CHUNKS = 8


@pytest.fixture(scope="module")
def spm_header(fixtures_dir) -> bytes:
    hb = GGUFFile(TINY_SPM).header_bytes
    with open(TINY_SPM, "rb") as f:
        return f.read(hb)


def _sweep_lengths(header_bytes: int, chunk: int, worker: int = 0, workers: int = 1) -> range:
    """The prefix lengths one chunk (and one of its workers) opens, longest first. Strided rather
    than contiguous: a prefix costs about its length to parse, so every chunk costs the same."""
    step = SWEEP_CHUNKS * workers
    first = chunk + SWEEP_CHUNKS * worker
    if first > header_bytes:
        return range(0)
    top = first + (header_bytes - first) // step * step
    return range(top, first - 1, -step)


def _sweep(job: tuple[Path, bytes, range]) -> dict:
    """Open every prefix length in `lengths` (descending) of `header`: one file, written once at
    the longest length and then shortened with ftruncate, so no prefix is rewritten."""
    path, header, lengths = job
    out = {"checked": 0, "worst": 0.0, "allowed": 0, "read": 0, "failures": [], "violations": []}
    if not lengths:
        return out
    path.write_bytes(header[: lengths[0]])
    failures = out["failures"]
    with pytest.MonkeyPatch.context() as mp:
        out["violations"] = spy_open(mp)
        r0 = rchar() if HAVE_PROC_IO else 0
        fd = os.open(path, os.O_RDWR)
        try:
            for n in lengths:
                os.ftruncate(fd, n)
                t0 = time.perf_counter()
                try:
                    GGUFFile(path)
                except GGUFError as e:
                    if not e.field:
                        failures.append(f"prefix {n}: no field in {e}")
                except Exception as e:  # noqa: BLE001 - any other exception is what we look for
                    failures.append(f"prefix {n}: {type(e).__name__}: {e}")
                else:
                    failures.append(f"prefix {n}: loaded")
                out["worst"] = max(out["worst"], time.perf_counter() - t0)
                out["checked"] += 1
                out["allowed"] += n
                if len(failures) > 20:
                    break
        finally:
            os.close(fd)
            path.unlink()
        out["read"] = (rchar() - r0) if HAVE_PROC_IO else 0
    out["violations"] = list(out["violations"])
    return out


def _sweep_processes() -> int:
    """Fork workers for the sweep, unless pytest-xdist already spreads the chunks over the CPUs."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not hasattr(os, "fork"):
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 8))


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(SWEEP_CHUNKS))
def test_every_prefix_of_spm_header_is_rejected(chunk, spm_header, scratch):
    """Prefixes of length 0..header_bytes (inclusive): every byte, none sampled. The range is split
    in chunks so xdist can spread them, and each chunk over forked workers when xdist is absent."""
    hb = len(spm_header)
    k = _sweep_processes()
    jobs = [(scratch / f"prefix-{chunk}-{i}.gguf", spm_header, _sweep_lengths(hb, chunk, i, k)) for i in range(k)]
    if k == 1:
        results = [_sweep(jobs[0])]
    else:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(k) as pool:
            results = pool.map(_sweep, jobs)
    failures = [f for r in results for f in r["failures"]]
    violations = [v for r in results for v in r["violations"]]
    assert failures == []
    assert sum(r["checked"] for r in results) == len(_sweep_lengths(hb, chunk))
    assert max(r["worst"] for r in results) < TIME_LIMIT_S
    assert violations == [], violations[:5]
    for r in results:  # never more than the bytes in the files (plus the /proc/self/io reads)
        assert r["read"] <= r["allowed"] + 4096


def test_sweep_covers_every_prefix(spm_header):
    hb = len(spm_header)
    assert 60_000 < hb < 80_000  # about 68.7 KB
    for k in (1, 2, 3, 8):
        seen = [n for c in range(SWEEP_CHUNKS) for i in range(k) for n in _sweep_lengths(hb, c, i, k)]
        assert sorted(seen) == list(range(hb + 1))  # 0 .. header_bytes, each exactly once
        for c in range(SWEEP_CHUNKS):
            assert sorted(n for i in range(k) for n in _sweep_lengths(hb, c, i, k)) == sorted(_sweep_lengths(hb, c))


# --- hypothesis: mutated fixture headers load, or raise GGUFError ---------------------------------


def _field_offsets(path: Path, header_bytes: int) -> tuple[list[int], list[int]]:
    """Positions of structural fields (counts, key lengths, value types, tensor-info fields), found
    by walking the header with struct: mutations aimed there reach deeper checks than random bytes."""
    with open(path, "rb") as f:
        h = f.read(header_bytes)
    offs = [4, 8, 16]
    n_tensors, n_kv = struct.unpack_from("<QQ", h, 8)
    pos = 24
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip_str(p):
        (n,) = struct.unpack_from("<Q", h, p)
        return p + 8 + n

    for _ in range(n_kv):
        offs.append(pos)
        pos = skip_str(pos)
        offs.append(pos)
        (vt,) = struct.unpack_from("<I", h, pos)
        pos += 4
        offs.append(pos)
        if vt == STRING:
            pos = skip_str(pos)
        elif vt == ARRAY:
            et, cnt = struct.unpack_from("<IQ", h, pos)
            offs += [pos + 4, pos + 12]
            pos += 12
            if et == STRING:
                for i in range(cnt):
                    if i < 3:
                        offs.append(pos)
                    pos = skip_str(pos)
            else:
                pos += cnt * sizes[et]
        else:
            pos += sizes[vt]
    kv_offs, offs = offs, []
    for _ in range(n_tensors):
        offs.append(pos)
        pos = skip_str(pos)
        (nd,) = struct.unpack_from("<I", h, pos)
        offs.append(pos)  # n_dims
        offs += [pos + 4 + 8 * d for d in range(nd)]
        pos += 4 + 8 * nd
        offs += [pos, pos + 4]  # type, offset
        pos += 12
    assert pos == header_bytes
    kv_offs = sorted(set(kv_offs) - {4, 8, 16}) + [4, 8, 16]  # hypothesis favours early elements
    return kv_offs, offs or kv_offs


class _Source:
    def __init__(self, path: Path):
        self.path = path
        self.data = path.read_bytes()
        self.header_bytes = GGUFFile(path).header_bytes
        self.kv_fields, self.tensor_fields = _field_offsets(path, self.header_bytes)


_SOURCES: dict[str, _Source] = {}


def _source(name: str) -> _Source:
    if name not in _SOURCES:
        _SOURCES[name] = _Source({"tiny-spm": TINY_SPM, "tiny-bpe": TINY_BPE, "vocab-spm": VOCAB_SPM}[name])
    return _SOURCES[name]


BOUNDARY_INTS = [0, 1, 2, 3, 4, 5, 31, 32, 63, 64, 255, 256, 2**16 - 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
                 2**62, 2**63 - 1, 2**63, 2**64 - 1]
boundary_bytes = st.one_of(
    st.sampled_from(BOUNDARY_INTS).flatmap(
        lambda v: st.sampled_from([w for w in (1, 2, 4, 8) if v < 256**w]).map(lambda w: v.to_bytes(w, "little"))),
    st.sampled_from([b"\x00", b"\xff", b"\xff" * 8, b"\x80", b"\xc0\xaf", b"\xed\xa0\x80", b"\x7f\xff\xff\xff"]),
    st.binary(min_size=1, max_size=16),
)


class Mutant:
    """A recipe (source file + edits), applied lazily so a failing example prints short."""

    def __init__(self, source: str):
        self.source, self.ops, self.cut = source, [], None

    def __repr__(self) -> str:
        cut = "" if self.cut is None else f", cut at {self.cut}"
        return f"Mutant({self.source}: {'; '.join(self.ops)}{cut})"

    def apply(self, header: bytearray, op: str, p: int, arg) -> None:
        self.ops.append(f"{op}@{p} {arg!r}")
        if op == "flip":
            header[p] ^= 1 << arg
        elif op in ("overwrite", "fill"):
            header[p : p + len(arg)] = arg
        elif op == "insert":
            header[p:p] = arg
        else:
            del header[p : p + arg]


@st.composite
def mutants(draw) -> tuple[Mutant, bytes]:
    name = draw(st.sampled_from(["tiny-spm", "tiny-bpe", "vocab-spm"]))
    src = _source(name)
    m = Mutant(name)
    header = bytearray(src.data[: src.header_bytes])
    ops = draw(st.lists(st.sampled_from(["flip", "overwrite", "fill", "insert", "delete"]), min_size=1, max_size=3))
    for op in ops:
        n = len(header)
        if n == 0:
            break
        # a random byte past the fixed 24-byte start (magic and version are the corpus's job), or
        # the start of a field: a count, key length, value type, tensor name length, n_dims, dim...
        p = draw(st.one_of(st.integers(min(24, n - 1), n - 1),
                           st.sampled_from(src.kv_fields).map(lambda q: q % n),
                           st.sampled_from(src.tensor_fields).map(lambda q: q % n)))
        if op == "flip":
            arg = draw(st.integers(0, 7))
        elif op == "overwrite" or op == "insert":
            arg = draw(boundary_bytes)
        elif op == "fill":
            arg = bytes([draw(st.sampled_from([0x00, 0xFF, 0x80, 0x7F]))]) * min(draw(st.integers(1, 64)), n - p)
        else:
            arg = draw(st.integers(1, 64))
        m.apply(header, op, p, arg)
    blob = bytes(header) + src.data[src.header_bytes :]
    if draw(st.sampled_from([False] * 7 + [True])):  # sometimes also cut the whole file short
        m.cut = draw(st.integers(min(8, len(blob)), len(blob)))
        blob = blob[: m.cut]
    return m, blob


_FIELD_KIND = re.compile(r"'[^']*'|\[\d+\]")  # drop names and indices: one event per kind of field


@pytest.fixture(scope="module")
def mutant_path(scratch) -> Path:
    return scratch / "mutant.gguf"


@pytest.mark.slow
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutant=mutants())
def test_mutated_fixture_headers_load_or_raise_typed_error(mutant, mutant_path):
    recipe, blob = mutant
    mutant_path.write_bytes(blob)
    with pytest.MonkeyPatch.context() as mp:
        violations = spy_open(mp)
        t0 = time.perf_counter()
        try:
            g = GGUFFile(mutant_path)
        except GGUFError as e:  # anything else propagates and fails the test
            assert e.field and str(mutant_path) in str(e)
            event(f"{type(e).__name__}: {_FIELD_KIND.sub('_', e.field)}")
            g = None
        else:
            event("loaded")
        elapsed = time.perf_counter() - t0
    assert violations == []
    assert elapsed < TIME_LIMIT_S
    if g is not None:  # whatever loaded must be self-consistent and inside the file
        assert g.header_bytes <= g.size == len(blob)
        end = g.data_offset if g.tensors else g.header_bytes
        for t in sorted(g.tensors.values(), key=lambda t: t.offset):
            assert t.offset % g.alignment == 0 and t.offset >= end and t.nbytes > 0
            assert 1 <= len(t.shape) <= 4 and all(d >= 1 for d in t.shape) and 0 < len(t.name.encode()) < 64
            end = t.offset + t.nbytes
            assert len(g.tensor_bytes(t.name)) == t.nbytes
        assert end <= g.size
        g.close()


# --- a 5 GB file: metadata without reading the data ---------------------------------------------


@pytest.mark.skipif(not HAVE_PROC_IO, reason="needs Linux /proc/self/io")
def test_metadata_of_5gb_file_does_not_read_tensor_data(tmp_path):
    """Header + tensor table describing 5 GiB of F32 data; the file is extended with truncate()
    (sparse: no data written), so any read of the data section would show in rchar."""
    gib = 2**30
    tensors = [Tensor(f"blk.{i}.w", (16384, 16384), F32) for i in range(5)]  # 1 GiB each
    kvs = [ARCH, kv_arr("tokenizer.ggml.tokens", STRING, [f"tok{i}" for i in range(1000)])]
    head = build(kvs, tensors, data_size=0)
    path = tmp_path / "big.gguf"
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + 5 * gib)
    size = path.stat().st_size
    assert size > 5 * gib
    r0 = rchar()
    t0 = time.perf_counter()
    g = GGUFFile(path)
    elapsed = time.perf_counter() - t0
    read = rchar() - r0
    assert elapsed < TIME_LIMIT_S, f"took {elapsed:.3f} s"
    assert read < 4 * 2**20, f"read {read} bytes for a {len(head)}-byte header"
    assert len(g.tensors) == 5 and len(g.get("tokenizer.ggml.tokens")) == 1000
    last = g.tensors["blk.4.w"]
    assert last.offset + last.nbytes == size and last.nbytes == gib
    view = g.tensor_bytes("blk.4.w")  # a mapping, not a read
    assert len(view) == gib
    assert rchar() - r0 < 4 * 2**20
    g.close()
