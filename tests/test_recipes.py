"""Per-tensor formats of our recipes equal llama.cpp's: on the files its quantizer wrote, and on the
Llama-3.1-8B shape whose Q4_K_M layout is well known."""

import pytest

from llmplan.core.errors import InputError
from llmplan.models.builder import plan_build
from llmplan.models.model import expected_tensors, open_model
from llmplan.models.presets import preset_config
from llmplan.models.recipes import tensor_formats, use_more_bits

from conftest import TINY_BPE, TINY_SPM


def _table(path):
    m = open_model(path)
    ours = tensor_formats(m.config, "Q4_K_M", expected_tensors(m.config))
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


def test_fallback_to_f16_when_no_block_fits():
    c = preset_config("tiny-llama", {"dim": "200", "n_heads": "4"})  # 200 is not a multiple of 32
    f = tensor_formats(c, "Q4_K_M", expected_tensors(c))
    assert f["blk.0.attn_q.weight"].name == "F16"
    assert f["blk.1.ffn_down.weight"].name == "Q6_K"  # 768-wide rows still fit


def test_unknown_recipe():
    with pytest.raises(InputError, match="unknown recipe 'Q3_K_S'"):
        tensor_formats(preset_config("tiny-llama"), "Q3_K_S", {})
