"""Per-tensor formats of our recipes equal llama.cpp's: on the files its quantizer wrote, on the
Llama-3.1-8B shape whose Q4_K_M layout is well known, and (IQ4_NL, IQ4_XS) on what llama.cpp's quantizer
makes of our own F32 models, tensor bytes included."""

import numpy as np
import pytest

from llmplan.commands import llama_cpp
from llmplan.core.errors import InputError
from llmplan.models.builder import plan_build
from llmplan.models.gguf import GGUFFile
from llmplan.models.model import expected_tensors, open_model
from llmplan.models.presets import preset_config
from llmplan.models.recipes import tensor_formats, use_more_bits

from conftest import TINY_BPE, TINY_SPM


def _table(path, recipe="Q4_K_M"):
    m = open_model(path)
    ours = tensor_formats(m.config, recipe, expected_tensors(m.config))
    return {n: f.name for n, f in ours.items()}, {n: t.type.name for n, t in m.weights.items()}


@pytest.mark.parametrize("path", [TINY_SPM, TINY_BPE], ids=["tiny-llama-spm", "tiny-llama3-bpe"])
def test_q4_k_m_matches_llama_cpp_quantizer(path):
    ours, theirs = _table(path)
    assert ours == theirs
    assert "Q6_K" in theirs.values()  # the table exercises the more-bits rules, not just the default


def test_q4_k_m_matches_real_gemma3(gemma3_path):
    # 640-wide rows are not a multiple of 256: Q4_K falls back to Q5_0, Q6_K to Q8_0, and the tied
    # embedding takes the output head's rule
    ours, theirs = _table(gemma3_path)
    assert ours == theirs
    assert theirs["token_embd.weight"] == "Q8_0"


@pytest.mark.slow
@pytest.mark.skipif(not llama_cpp.available(), reason="llama-cpp-python is not installed (not a dependency)")
def test_iq4_xs_matches_llama_cpp_requantizing_real_gemma3(gemma3_path, tmp_path):
    llama_cpp.quantize(gemma3_path, tmp_path / "iq4_xs.gguf", "IQ4_XS", requantize=True)
    ours, theirs = _table(tmp_path / "iq4_xs.gguf", "IQ4_XS")
    assert ours == theirs
    assert set(theirs.values()) == {"IQ4_XS", "IQ4_NL", "Q5_K", "Q5_1", "Q8_0", "F32"}


def test_use_more_bits_schedule():
    assert [i for i in range(32) if use_more_bits(i, 32)] == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]


def test_llama3_8b_q4_k_m_layout(tmp_path):
    b = plan_build(tmp_path / "x.gguf", "llama3-8b", "Q4_K_M")
    f = {n: fmt.name for n, fmt in b.formats.items()}
    more = [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert [i for i in range(32) if f[f"blk.{i}.attn_v.weight"] == "Q6_K"] == more
    assert [i for i in range(32) if f[f"blk.{i}.ffn_down.weight"] == "Q6_K"] == more
    assert f["output.weight"] == "Q6_K" and f["token_embd.weight"] == "Q4_K"
    assert {f[n] for n in f if n.endswith(("attn_q.weight", "attn_k.weight", "attn_output.weight",
                                           "ffn_gate.weight", "ffn_up.weight"))} == {"Q4_K"}
    assert {f[n] for n in f if n.endswith("norm.weight")} == {"F32"} and f["rope_freqs.weight"] == "F32"
    tensor_bytes = sum(t[4] for t in b.writer.tensors)
    # llama.cpp reports this model as "4.58 GiB" (llama-bench, Llama-3.1-8B Q4_K_M)
    assert tensor_bytes == 4_912_898_304 and round(tensor_bytes / 2**30, 2) == 4.58


@pytest.mark.parametrize("recipe,expect", [
    ("F32", {"F32"}), ("F16", {"F16", "F32"}), ("Q8_0", {"Q8_0", "F32"}), ("Q6_K", {"Q6_K", "F32"}),
])
def test_uniform_recipes(recipe, expect):
    c = preset_config("tiny-llama")
    assert {f.name for f in tensor_formats(c, recipe, expected_tensors(c)).values()} == expect


def test_iq4_rules():
    """llama.cpp's IQ4 rules without an importance matrix: attn_v at Q5_K where 4 or more query heads
    share a K/V head, the first eighth of ffn_down at Q5_K, the head at Q6_K; IQ4_XS rows that are not
    whole super-blocks fall back to IQ4_NL (and Q5_K to Q5_1, Q6_K to Q8_0)."""
    c = preset_config("tiny-llama3", {"n_layers": "16"})  # 4 query heads per K/V head
    for recipe in ("IQ4_NL", "IQ4_XS"):
        f = {n: fmt.name for n, fmt in tensor_formats(c, recipe, expected_tensors(c)).items()}
        assert {f[f"blk.{i}.attn_v.weight"] for i in range(16)} == {"Q5_K"}
        assert [i for i in range(16) if f[f"blk.{i}.ffn_down.weight"] == "Q5_K"] == [0, 1]
        assert f["output.weight"] == "Q6_K" and f["token_embd.weight"] == recipe
        assert f["blk.3.ffn_down.weight"] == f["blk.0.attn_q.weight"] == recipe
    c = preset_config("gemma3-270m")  # 640-wide rows, a tied head, 4 query heads per K/V head
    f = {n: fmt.name for n, fmt in tensor_formats(c, "IQ4_XS", expected_tensors(c)).items()}
    assert f["token_embd.weight"] == "Q8_0" and f["blk.0.attn_v.weight"] == "Q5_1"
    assert f["blk.0.attn_q.weight"] == f["blk.0.ffn_up.weight"] == "IQ4_NL"
    assert f["blk.0.attn_output.weight"] == f["blk.5.ffn_down.weight"] == "IQ4_XS"  # rows of 1024, 2048
    assert f["blk.1.ffn_down.weight"] == "Q5_K"


@pytest.mark.skipif(not llama_cpp.available(), reason="llama-cpp-python is not installed (not a dependency)")
@pytest.mark.parametrize("preset, overrides", [("tiny-llama3", {"n_layers": "8"}), ("tiny-gemma3", {"dim": "384"})],
                         ids=["tiny-llama3", "tiny-gemma3-384"])
def test_iq4_models_are_llama_cpps_quantization_of_the_same_floats(tmp_path, preset, overrides):
    """Our IQ4_NL / IQ4_XS model and llama.cpp's quantizer run on our F32 model of the same seed hold the
    same formats and the same bytes in every tensor (the rules above, the IQ4_XS -> IQ4_NL fallback of
    384-wide rows, and our quantizers of IQ4, Q5_K, Q6_K and Q8_0)."""
    plan_build(tmp_path / "f32.gguf", preset, "F32", overrides=overrides).write(progress=False)
    for recipe in ("IQ4_NL", "IQ4_XS"):
        ours, theirs = tmp_path / f"{recipe}.gguf", tmp_path / f"{recipe}.llama.gguf"
        plan_build(ours, preset, recipe, overrides=overrides).write(progress=False)
        llama_cpp.quantize(tmp_path / "f32.gguf", theirs, recipe)
        a, b = GGUFFile(ours), GGUFFile(theirs)
        assert {n: t.type for n, t in a.tensors.items()} == {n: t.type for n, t in b.tensors.items()}
        assert recipe in {t.type.name for t in a.tensors.values()}
        for name in b.tensors:
            assert np.array_equal(a.tensor_bytes(name), b.tensor_bytes(name)), (recipe, name)


def test_fallback_to_f16_when_no_block_fits():
    c = preset_config("tiny-llama", {"dim": "200", "n_heads": "4"})  # 200 is not a multiple of 32
    f = tensor_formats(c, "Q4_K_M", expected_tensors(c))
    assert f["blk.0.attn_q.weight"].name == "F16"
    assert f["blk.1.ffn_down.weight"].name == "Q6_K"  # 768-wide rows still fit


def test_unknown_recipe():
    with pytest.raises(InputError, match="unknown recipe 'Q3_K_S'"):
        tensor_formats(preset_config("tiny-llama"), "Q3_K_S", {})
