"""The synthetic-model builder writes files our reader validates and binds, deterministically, with
finite weights of the intended scale, for every preset and recipe."""

import math

import numpy as np
import pytest

from llmplan.core.errors import InputError
from llmplan.core.formats import dequantize
from llmplan.models.builder import llama31_rope_factors, plan_build
from llmplan.models.errors import ConfigError
from llmplan.models.gguf import GGUFFile
from llmplan.models.model import expected_tensors, open_model
from llmplan.models.presets import PRESETS, preset_config
from llmplan.models.recipes import RECIPES

from conftest import VOCAB_BPE


def _build(tmp_path, preset, recipe="Q4_K_M", name="m.gguf", **kw):
    b = plan_build(tmp_path / name, preset, recipe, **kw)
    b.write(progress=False)
    return b, tmp_path / name


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-llama3", "tiny-gemma3"])
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_tiny_presets_every_recipe(tmp_path, preset, recipe):
    b, path = _build(tmp_path, preset, recipe)
    m = open_model(path)
    assert m.config == b.config == preset_config(preset)
    assert path.stat().st_size == b.file_size
    assert {n: t.type for n, t in m.weights.items()} == {n: f.type for n, f in b.formats.items()}
    for name, t in m.weights.items():
        x = dequantize(m.file.tensor_bytes(name), t.type)
        assert np.isfinite(x).all(), name
        if len(t.shape) == 2:
            assert 0.015 < x.std() < 0.025 and abs(x.mean()) < 0.002, name
    assert m.file.get("tokenizer.ggml.tokens") is not None


def test_deterministic_per_seed(tmp_path):
    _, a = _build(tmp_path, "tiny-llama", name="a.gguf", seed=1)
    _, b = _build(tmp_path, "tiny-llama", name="b.gguf", seed=1)
    _, c = _build(tmp_path, "tiny-llama", name="c.gguf", seed=2)
    assert a.read_bytes() == b.read_bytes()
    fa, fc = GGUFFile(a), GGUFFile(c)
    assert not np.array_equal(fa.tensor_bytes("blk.0.attn_q.weight"), fc.tensor_bytes("blk.0.attn_q.weight"))


def test_block_weights_for_big_models_have_sane_scale(tmp_path):
    b, path = _build(tmp_path, "tiny-gemma3", weights="blocks")
    assert b.weights == "blocks"
    m = open_model(path)
    for name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.5.ffn_down.weight"):
        x = dequantize(m.file.tensor_bytes(name), m.weights[name].type)
        assert np.isfinite(x).all() and 0.01 < x.std() < 0.04, name


def test_big_presets_plan_without_writing(tmp_path):
    b = plan_build(tmp_path / "g.gguf", "gemma3-270m")
    assert b.weights == "blocks" and not (tmp_path / "g.gguf").exists()
    c = b.config
    assert (c.n_layers, c.dim, c.n_heads, c.head_dim, c.n_kv_heads, c.vocab_size, c.tied_output) == \
        (18, 640, 4, 256, 1, 262144, True)
    l8 = plan_build(tmp_path / "l.gguf", "llama3-8b").config
    assert (l8.n_layers, l8.dim, l8.n_heads, l8.n_kv_heads, l8.ffn_dim, l8.vocab_size, l8.rope_base) == \
        (32, 4096, 32, 8, 14336, 128256, 500000.0)


def test_gemma3_270m_preset_has_the_real_models_tensor_table(gemma3_path):
    real = open_model(gemma3_path)
    assert expected_tensors(preset_config("gemma3-270m")) == {n: t.shape for n, t in real.weights.items()}


def test_vocab_from_copies_tokenizer(tmp_path):
    _, path = _build(tmp_path, "tiny-llama3", vocab_from=str(VOCAB_BPE), overrides={"n_layers": "1"})
    ours, theirs = GGUFFile(path), GGUFFile(VOCAB_BPE)
    assert ours.get("tokenizer.ggml.tokens") == theirs.get("tokenizer.ggml.tokens")
    assert ours.get("tokenizer.ggml.merges") == theirs.get("tokenizer.ggml.merges")
    assert open_model(path).config.vocab_size == 128256


def test_overrides(tmp_path):
    c = preset_config("tiny-gemma3", {"n_layers": "12", "swa_window": "32"})
    assert c.n_layers == 12 and [i for i in range(12) if not c.is_swa(i)] == [5, 11]
    with pytest.raises(InputError, match="cannot set 'embed_scale'"):
        preset_config("tiny-llama", {"embed_scale": "2"})
    with pytest.raises(InputError, match="expected a int"):
        preset_config("tiny-llama", {"dim": "big"})
    with pytest.raises(ConfigError, match="head_count_kv 3 does not divide head_count 4"):
        preset_config("tiny-llama", {"n_kv_heads": "3"})
    with pytest.raises(InputError, match="unknown preset 'huge'"):
        preset_config("huge")


def test_llama31_rope_factors():
    f = llama31_rope_factors(128, 500000.0)
    assert f.shape == (64,) and f[0] == 1.0 and f[-1] == 8.0
    assert np.all(np.diff(f) >= 0)  # low frequencies are stretched most


def test_every_preset_keeps_its_shape():
    """A preset's config has the shape it declares, and the real models' presets their parameter counts
    (Meta-Llama-3.1-8B and Gemma 3 270M: their model cards' exact figures)."""
    real = {"llama3-8b": 8_030_261_248, "gemma3-270m": 268_098_176}
    for name, p in PRESETS.items():
        c = preset_config(name)
        assert c.arch == p.arch and c.name == name
        for k, v in p.shape.items():
            assert getattr(c, k) == v or isinstance(v, float) and math.isclose(getattr(c, k), v, rel_tol=1e-7), (name, k)
        if name in real:
            shapes = expected_tensors(c)
            assert sum(math.prod(s) for n, s in shapes.items() if n != "rope_freqs.weight") == real[name]
