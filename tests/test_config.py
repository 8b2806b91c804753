"""ModelConfig from metadata: the known shapes of the fixtures and the real Gemma 3 270M, llama.cpp's
defaults, and hyperparameters that make no sense rejected with a message naming them."""

import math

import numpy as np
import pytest
from gguf import GGUFValueType as V

from llmplan.models.config import config_from_gguf, config_to_metadata, gemma3_swa_layers
from llmplan.models.errors import ConfigError
from llmplan.models.gguf import GGUFFile, MetaValue
from llmplan.models.model import expected_tensors, open_model

from conftest import TINY_BPE, TINY_SPM, VOCAB_BPE
from model_files import rewrite, u32


def test_gemma3_270m_config(gemma3_path):
    m = open_model(gemma3_path)
    c = m.config
    assert (c.arch, c.n_layers, c.dim, c.n_heads, c.head_dim, c.n_kv_heads) == ("gemma3", 18, 640, 4, 256, 1)
    assert (c.vocab_size, c.ffn_dim, c.context_length) == (262144, 2048, 32768)
    assert c.tied_output and "output.weight" not in m.weights
    assert c.activation == "gelu_tanh" and c.qk_norm and c.sandwich_norms
    assert c.embed_scale == pytest.approx(math.sqrt(640))
    assert c.attn_scale == pytest.approx(1 / 16)
    assert c.swa_window == 512
    assert [i for i in range(18) if not c.is_swa(i)] == [5, 11, 17]
    assert c.layer_rope(0) == (10000.0, 1.0) and c.layer_rope(5) == (1e6, 1.0)
    assert c.norm_eps == pytest.approx(1e-6)
    assert len(m.weights) == 236


def test_tiny_llama_spm_config():
    c = open_model(TINY_SPM).config
    assert (c.arch, c.n_layers, c.dim, c.n_heads, c.head_dim, c.n_kv_heads, c.ffn_dim, c.vocab_size) == \
        ("llama", 4, 512, 8, 64, 2, 1536, 3000)
    assert (c.rope_base, c.rope_dims, c.rope_freqs, c.tied_output) == (10000.0, 64, False, False)
    assert c.activation == "silu" and not c.qk_norm and not c.swa_layers and c.embed_scale == 1.0


def test_tiny_llama3_bpe_config():
    c = open_model(TINY_BPE).config
    assert (c.n_layers, c.dim, c.n_heads, c.head_dim, c.n_kv_heads, c.ffn_dim, c.vocab_size) == \
        (2, 1024, 8, 128, 2, 2816, 3000)
    assert c.rope_base == 500000.0 and c.rope_freqs and c.context_length == 131072


def test_vocab_only_file_has_config_but_no_tensors():
    f = GGUFFile(VOCAB_BPE)
    c = config_from_gguf(f)
    assert (c.n_layers, c.dim, c.vocab_size) == (32, 4096, 128256)
    assert not f.tensors and not c.tied_output


def test_expected_tensor_order_is_llama_cpp_file_order(gemma3_path):
    for path in (TINY_SPM, TINY_BPE, gemma3_path):
        f = GGUFFile(path)
        assert list(expected_tensors(config_from_gguf(f))) == list(f.tensors)


def test_a_float32_value_is_its_shortest_decimal():
    """The file holds float32 1e-5 (9.999999747378752e-06 as a double): the config and the printed IR say
    1e-05, and float32 of it is the file's value again."""
    f = GGUFFile(TINY_BPE)
    c = config_from_gguf(f)
    assert c.norm_eps == 1e-05 and np.float32(c.norm_eps) == np.float32(f.metadata["llama.attention.layer_norm_rms_epsilon"].value)


def _held(v):
    return np.float32(v.value) if v.type == V.FLOAT32 else v.value


def test_metadata_round_trip(tmp_path, gemma3_path):
    for path in (TINY_SPM, TINY_BPE, gemma3_path):
        f = GGUFFile(path)
        c = config_from_gguf(f)
        keys = dict(config_to_metadata(c))
        for k, v in keys.items():
            if k in f.metadata:  # a float32 value is the float32 the file holds (the config keeps its decimal)
                assert f.metadata[k].type == v.type and _held(f.metadata[k]) == _held(v), k
        arch_keys = {k for k in f.metadata if k.startswith(c.arch + ".")}
        assert arch_keys <= set(keys)
        copy = rewrite(path, tmp_path / "copy.gguf",
                       drop_meta=tuple(k for k in f.metadata if k.startswith(c.arch + ".")), set_meta=keys)
        assert config_from_gguf(GGUFFile(copy)) == c


BAD = [
    ({"llama.block_count": u32(0)}, "block_count is 0"),
    ({"llama.block_count": u32(4096)}, "block_count is 4096"),
    ({"llama.block_count": u32(9)}, "block_count is 9 but the tensor table has layers 0..3 only"),
    ({"llama.attention.head_count": u32(0)}, "head_count is 0"),
    ({"llama.attention.head_count": u32(7)}, "head_count 7 does not divide embedding_length 512"),
    ({"llama.attention.head_count_kv": u32(3)}, "head_count_kv 3 does not divide head_count 8"),
    ({"llama.rope.dimension_count": u32(128)}, "dimension_count 128 must equal the head size 64"),
    ({"llama.feed_forward_length": u32(0)}, "feed_forward_length is 0"),
    ({"llama.context_length": MetaValue(V.STRING, "4096")}, "context_length must be an integer, is STRING"),
    ({"llama.attention.layer_norm_rms_epsilon": MetaValue(V.FLOAT32, 0.0)}, "epsilon is 0.0"),
    ({"llama.attention.layer_norm_rms_epsilon": MetaValue(V.FLOAT32, float("nan"))}, "epsilon is nan"),
    ({"llama.rope.scaling.type": MetaValue(V.STRING, "yarn")}, "scaling.type 'yarn' is not supported"),
    ({"llama.attention.head_count": MetaValue(V.INT32, -8)}, "head_count is negative"),
    ({"general.architecture": MetaValue(V.STRING, "bert")}, "architecture 'bert' is not supported .*llama, gemma3"),
]


@pytest.mark.parametrize("edit,message", BAD, ids=[m.split(" ")[0] + str(i) for i, (_, m) in enumerate(BAD)])
def test_bad_hyperparameters_rejected(tmp_path, edit, message):
    path = rewrite(TINY_SPM, tmp_path / "bad.gguf", set_meta=edit)
    with pytest.raises(ConfigError, match=message):
        open_model(path)


def test_rope_dims_beyond_head_size_rejected(tmp_path, gemma3_path):
    path = rewrite(gemma3_path, tmp_path / "bad.gguf", set_meta={"gemma3.rope.dimension_count": u32(512)})
    with pytest.raises(ConfigError, match="dimension_count 512 must be even and within the head size 256"):
        open_model(path)


def test_missing_key_named(tmp_path):
    path = rewrite(TINY_SPM, tmp_path / "bad.gguf", drop_meta=("llama.embedding_length",))
    with pytest.raises(ConfigError, match="missing metadata key llama.embedding_length"):
        open_model(path)


def test_tensor_binding_errors(tmp_path):
    missing = rewrite(TINY_SPM, tmp_path / "missing.gguf", drop_tensors=("blk.2.ffn_up.weight",))
    with pytest.raises(ConfigError, match=r"missing tensor blk.2.ffn_up.weight \(shape \(512, 1536\)\)"):
        open_model(missing)
    extra = rewrite(TINY_SPM, tmp_path / "extra.gguf",
                    add_tensors={"blk.0.attn_q_norm.weight": ("blk.0.attn_norm.weight", (512,))})
    with pytest.raises(ConfigError, match="unexpected tensor blk.0.attn_q_norm.weight for architecture llama"):
        open_model(extra)
    wrong = rewrite(TINY_SPM, tmp_path / "wrong.gguf", reshape={"blk.1.attn_k.weight": (256, 256)})
    with pytest.raises(ConfigError, match=r"blk.1.attn_k.weight has shape \(256, 256\), the config implies \(512, 128\)"):
        open_model(wrong)


def test_tied_output_when_output_absent(tmp_path):
    path = rewrite(TINY_SPM, tmp_path / "tied.gguf", drop_tensors=("output.weight",))
    m = open_model(path)
    assert m.config.tied_output and "output.weight" not in m.weights


def test_gemma3_pattern_and_rope_keys(tmp_path, gemma3_path):
    f = GGUFFile(gemma3_path)
    assert config_from_gguf(f).swa_layers == gemma3_swa_layers(18)
    path = rewrite(gemma3_path, tmp_path / "g.gguf", set_meta={
        "gemma3.attention.sliding_window_pattern": u32(3),
        "gemma3.rope.freq_base_swa": MetaValue(V.FLOAT32, 20000.0),
        "gemma3.rope.scaling.factor": MetaValue(V.FLOAT32, 8.0),
    })
    c = config_from_gguf(GGUFFile(path))
    assert [i for i in range(18) if not c.is_swa(i)] == [2, 5, 8, 11, 14, 17]
    assert c.layer_rope(0) == (20000.0, 1.0) and c.layer_rope(2) == (1e6, 0.125)
