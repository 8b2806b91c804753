"""models/gguf.py against gguf-py's GGUFReader (the reference implementation) on real files.

Every metadata value (with its GGUF type and array element type), the tensor table (names in file
order, shapes in GGUF order, types, absolute offsets, byte sizes) and every tensor's bytes must agree
with gguf-py on both fixture models, both llama.cpp vocabulary-only files and the real Gemma 3 270M.
"""

from __future__ import annotations

import math
import mmap
import struct

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType

from llmplan.models.gguf import GGUFFile, MetaValue
from llmplan.models.strings import StringArray

from conftest import TINY_BPE, TINY_SPM, VOCAB_BPE, VOCAB_SPM
from gguf_bytes import F32, FLOAT32, INT32, Q8_0, STRING, Tensor, build, kv_arr, kv_str, kv_u32

# GGUFReader is slow on big vocabularies (it builds one numpy view per array element): ~10 s for
# the 128k-token vocabulary and for Gemma 3, hence the slow marks there.
FILES = [
    pytest.param("tiny-spm", id="tiny-llama-spm"),
    pytest.param("tiny-bpe", id="tiny-llama3-bpe"),
    pytest.param("vocab-spm", id="vocab-llama-spm"),
    pytest.param("vocab-bpe", id="vocab-llama-bpe", marks=pytest.mark.slow),
    pytest.param("gemma3", id="gemma3-270m", marks=pytest.mark.slow),
]
_PATHS = {"tiny-spm": TINY_SPM, "tiny-bpe": TINY_BPE, "vocab-spm": VOCAB_SPM, "vocab-bpe": VOCAB_BPE}
_CACHE: dict[str, tuple[GGUFFile, GGUFReader]] = {}


@pytest.fixture(params=FILES)
def pair(request) -> tuple[GGUFFile, GGUFReader]:
    """(ours, gguf-py's) for one file, parsed once per session."""
    key = request.param
    if key not in _CACHE:
        if key == "gemma3":
            path = request.getfixturevalue("gemma3_path")
        else:
            request.getfixturevalue("fixtures_dir")  # fails clearly if the fixtures are missing
            path = _PATHS[key]
        _CACHE[key] = (GGUFFile(path), GGUFReader(path))
    return _CACHE[key]


def _reference_value(field) -> tuple[GGUFValueType, object, GGUFValueType | None]:
    main = field.types[0]
    if main != GGUFValueType.ARRAY:
        return main, field.contents(), None
    etype = GGUFValueType(int(field.parts[3][0]))  # parts: key length, key, type, element type, count, ...
    if etype == GGUFValueType.STRING:
        return main, field.contents(), etype
    parts = [field.parts[i] for i in field.data]
    arr = np.concatenate(parts) if parts else np.array([])
    return main, arr, etype


def _same_scalar(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return type(a) is type(b) and a == b


def test_header_matches_gguf_py(pair):
    ours, ref = pair
    assert ours.version == int(ref.fields["GGUF.version"].contents())
    assert ours.alignment == int(ref.alignment)
    assert ours.data_offset == int(ref.data_offset)
    assert len(ours.tensors) == int(ref.fields["GGUF.tensor_count"].contents())
    assert len(ours.metadata) == int(ref.fields["GGUF.kv_count"].contents())
    assert ours.size == len(ref.data)
    assert ours.header_bytes <= ours.data_offset < ours.header_bytes + ours.alignment


def test_metadata_matches_gguf_py(pair):
    ours, ref = pair
    ref_keys = [k for k in ref.fields if not k.startswith("GGUF.")]
    assert list(ours.metadata) == ref_keys  # same keys, same (file) order
    for key in ref_keys:
        mv = ours.metadata[key]
        assert isinstance(mv, MetaValue)
        rtype, rvalue, retype = _reference_value(ref.fields[key])
        assert mv.type == rtype, key
        assert mv.element_type == retype, key
        if rtype != GGUFValueType.ARRAY:
            if rtype == GGUFValueType.BOOL:
                assert mv.value is bool(rvalue), key
            else:
                assert _same_scalar(mv.value, rvalue), (key, mv.value, rvalue)
            assert ours.get(key) is mv.value
        elif retype == GGUFValueType.STRING:
            assert isinstance(mv.value, StringArray), key
            assert list(mv.value) == rvalue, key
        else:
            assert isinstance(mv.value, np.ndarray), key
            assert mv.value.shape == rvalue.shape, key
            if retype == GGUFValueType.BOOL:
                assert mv.value.dtype == np.bool_
            else:
                assert mv.value.dtype == rvalue.dtype, key
            assert np.array_equal(mv.value, rvalue, equal_nan=mv.value.dtype.kind == "f"), key


def test_tensor_table_matches_gguf_py(pair):
    ours, ref = pair
    assert list(ours.tensors) == [t.name for t in ref.tensors]  # file order
    for rt in ref.tensors:
        t = ours.tensors[rt.name]
        assert t.name == rt.name
        assert t.shape == tuple(int(d) for d in rt.shape), rt.name  # GGUF order: shape[0] is the row
        assert t.type == rt.tensor_type, rt.name
        assert t.offset == int(rt.data_offset), rt.name  # absolute position in the file
        assert t.nbytes == int(rt.n_bytes), rt.name
        assert t.n_elements == int(rt.n_elements), rt.name
        assert t.offset % ours.alignment == 0
        assert t.offset + t.nbytes <= ours.size


@pytest.mark.parametrize("pair", [f for f in FILES if not f.values[0].startswith("vocab")], indirect=True)
def test_tensor_bytes_match_gguf_py(pair):  # vocabulary-only files have no tensors
    ours, ref = pair
    assert ref.tensors
    for rt in ref.tensors:
        got = ours.tensor_bytes(rt.name)
        want = np.ascontiguousarray(rt.data).view(np.uint8).reshape(-1)
        assert got.dtype == np.uint8 and got.shape == (ours.tensors[rt.name].nbytes,), rt.name
        assert not got.flags.writeable, rt.name  # read-only view of the mapping
        assert np.array_equal(got, want), rt.name
    ours.close()


def test_vocab_only_files_load_without_tensors(fixtures_dir):
    for path in (VOCAB_SPM, VOCAB_BPE):
        g = GGUFFile(path)
        assert g.tensors == {}
        # the file ends right after the header, not padded to the alignment, and that is fine
        assert g.header_bytes == g.size == path.stat().st_size
        assert g.data_offset >= g.size
        assert len(g.get("tokenizer.ggml.tokens")) > 30000
    assert GGUFFile(VOCAB_SPM).data_offset > GGUFFile(VOCAB_SPM).size  # 723869 is not a multiple of 32


def test_fixture_models_have_expected_layout(fixtures_dir):
    spm = GGUFFile(TINY_SPM)
    assert spm.architecture == "llama"
    assert spm.get("llama.embedding_length") == 512
    assert spm.tensors["token_embd.weight"].shape == (512, 3000)
    assert {t.type.name for t in spm.tensors.values()} == {"Q4_K", "Q6_K", "F32"}
    bpe = GGUFFile(TINY_BPE)
    assert "rope_freqs.weight" in bpe.tensors
    assert "general.alignment" not in bpe and bpe.alignment == 32


def test_gemma3_formats(gemma3_path):
    g = GGUFFile(gemma3_path)
    assert g.architecture == "gemma3"
    assert {t.type.name for t in g.tensors.values()} == {"Q5_0", "Q8_0", "Q4_K", "Q6_K", "F32"}
    assert len(g.get("tokenizer.ggml.tokens")) == 262144


# --- crafted valid files: the reader accepts what the specification allows -------------------


@pytest.mark.parametrize("version", [2, 3])
def test_versions_2_and_3_accepted(tmp_path, version):
    p = tmp_path / "v.gguf"
    p.write_bytes(build([kv_str("general.architecture", "llama")], [Tensor("t", (32,), F32)], version=version))
    g = GGUFFile(p)
    assert g.version == version and list(g.tensors) == ["t"]
    assert GGUFReader(p).tensors[0].name == "t"


@pytest.mark.parametrize("alignment", [1, 8, 64, 4096])
def test_custom_alignment(tmp_path, alignment):
    p = tmp_path / "a.gguf"
    tensors = [Tensor("a", (32,), F32), Tensor("b", (64, 2), Q8_0), Tensor("c", (3,), F32)]
    p.write_bytes(build([kv_u32("general.alignment", alignment)], tensors, alignment=alignment))
    g, ref = GGUFFile(p), GGUFReader(p)
    assert g.alignment == alignment and g.data_offset == ref.data_offset
    assert g.data_offset % alignment == 0
    for rt in ref.tensors:
        t = g.tensors[rt.name]
        assert (t.offset, t.nbytes, t.shape) == (rt.data_offset, rt.n_bytes, tuple(int(d) for d in rt.shape))


def test_boundary_values_accepted(tmp_path):
    """63-byte tensor names, 4 dims, empty arrays and strings, all value types, UTF-8 keys."""
    from gguf_bytes import ARRAY, BOOL, FLOAT64, INT8, INT16, INT64, UINT8, UINT16, UINT64, array, kv, value

    kvs = [kv_str("general.architecture", "llama"), kv_str("empty", ""), kv_arr("empty.arr", INT32, []),
           kv_arr("empty.strs", STRING, []), kv_str("ключ.ü", "значение ✓")]
    for i, (vt, v) in enumerate([(UINT8, 255), (INT8, -128), (UINT16, 65535), (INT16, -32768), (INT32, -1),
                                 (FLOAT32, 1.5), (BOOL, 1), (BOOL, 0), (UINT64, 2**64 - 1), (INT64, -2**63),
                                 (FLOAT64, -0.0)]):
        kvs.append(kv(f"s{i}", vt, value(vt, v)))
    kvs.append(kv("arr.bool", ARRAY, array(BOOL, [0, 1, 1])))
    kvs.append(kv("arr.f32", ARRAY, array(FLOAT32, [0.5, float("inf")])))
    kvs.append(kv("arr.u64", ARRAY, array(UINT64, [2**64 - 1])))
    tensors = [Tensor("n" * 63, (32,), F32), Tensor("four", (2, 3, 4, 5), F32), Tensor("é" * 31, (1,), F32)]
    p = tmp_path / "b.gguf"
    p.write_bytes(build(kvs, tensors))
    g = GGUFFile(p)
    assert g.get("empty") == "" and g.get("empty.strs") == [] and len(g.get("empty.arr")) == 0
    assert g.get("ключ.ü") == "значение ✓"
    assert g.get("s6") is True and g.get("s7") is False and g.get("s8") == 2**64 - 1 and g.get("s9") == -2**63
    assert g.get("arr.bool").tolist() == [False, True, True]
    assert g.get("arr.u64").tolist() == [2**64 - 1]
    assert g.tensors["four"].shape == (2, 3, 4, 5) and g.tensors["four"].nbytes == 480
    assert "n" * 63 in g.tensors


def _resident_pages(view: np.ndarray) -> int:
    """How many of the pages wholly inside a mapped view are resident in this process (/proc/self/pagemap)."""
    start = -(-view.ctypes.data // mmap.PAGESIZE)
    end = (view.ctypes.data + view.nbytes) // mmap.PAGESIZE
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(8 * start)
        entries = struct.unpack(f"{end - start}Q", f.read(8 * (end - start)))
    return sum(e >> 63 for e in entries)


def test_release_drops_a_tensors_pages_and_keeps_its_bytes():
    """A tensor's pages released (a layout copy stands for them) leave this process and read back the same."""
    with GGUFFile(TINY_BPE) as g:
        name = max(g.tensors, key=lambda n: g.tensors[n].nbytes)
        view = g.tensor_bytes(name)
        before = view.copy()
        assert _resident_pages(view) > 0
        g.release(name, 0, view.nbytes // 2)
        g.release(name)
        assert _resident_pages(view) == 0
        assert np.array_equal(view, before)
