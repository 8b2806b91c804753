"""The writer reproduces llama.cpp's files byte for byte and never leaves a half-written model."""

import filecmp

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llmplan.models.gguf import GGUFFile
from llmplan.models.gguf_write import GGUFWriter

from conftest import TINY_BPE, TINY_SPM, VOCAB_SPM
from model_files import rewrite


@pytest.mark.parametrize("path", [TINY_SPM, TINY_BPE, VOCAB_SPM], ids=lambda p: p.name)
def test_rewrite_is_byte_identical(tmp_path, path):
    assert filecmp.cmp(path, rewrite(path, tmp_path / "copy.gguf"), shallow=False)


def test_interrupted_write_leaves_nothing(tmp_path):
    out = tmp_path / "m.gguf"
    w = GGUFWriter(out)
    w.add_tensor("a", (32, 2), T.F32)
    w.add_tensor("b", (32,), T.F32)

    def data():
        yield [np.zeros(64, np.float32)]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        w.write(data())
    assert list(tmp_path.iterdir()) == []


def test_wrong_byte_count_rejected(tmp_path):
    w = GGUFWriter(tmp_path / "m.gguf")
    w.add_tensor("a", (32,), T.Q8_0)
    with pytest.raises(ValueError, match="wrote 33 bytes, declared 34"):
        w.write([[np.zeros(33, np.uint8)]])
    assert list(tmp_path.iterdir()) == []


def test_alignment_and_chunks(tmp_path):
    out = tmp_path / "m.gguf"
    w = GGUFWriter(out, alignment=64)
    w.add_tensor("a", (3,), T.F32)
    w.add_tensor("b", (32, 2), T.Q8_0)
    a = np.arange(3, dtype=np.float32)
    b = np.arange(68, dtype=np.uint8)
    w.write([[a], [b[:10], b[10:].tobytes()]])
    f = GGUFFile(out)
    assert f.alignment == 64 and f.tensors["b"].offset % 64 == 0
    assert np.array_equal(f.tensor_bytes("a").view(np.float32), a)
    assert np.array_equal(f.tensor_bytes("b"), b)
    assert f.size == w.file_size
