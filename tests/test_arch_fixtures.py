"""The reference fixtures of the architectures issues 26 and 27 add (tests/data, made by
scripts/arch_fixtures.py; issue 27's are the mixtures of experts, MOE_NAMES):
each file holds exactly the tensors llama.cpp's load_arch_tensors takes, has its architecture's features
on, carries the formats llama.cpp's quantizer chose (which our Q4_K_M recipe predicts), and its
references were recorded from it."""

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import FIXTURES, LLAMA_CPP_SPREAD, llama_cpp_bound
from llmplan.commands import llama_cpp
from llmplan.models.config import config_from_gguf
from llmplan.models.gguf import GGUFFile
from llmplan.models.recipes import tensor_formats
from llmplan.models.tokenizer import load_tokenizer
from llmplan.models.tensor_table import expected_tensors
from model_files import rewrite, u32

DATA = Path(__file__).parent / "data"

# Global tensors and one layer's, names and GGUF shapes, as load_arch_tensors (src/models/<arch>.cpp,
# create_tensor_qkv) creates them for each file's hyperparameters: written out from llama.cpp's source.
LLAMA_CPP_TENSORS = {
    "tiny-qwen2-bpe-Q4_K_M": (  # dim 384, 6 heads x 64, 2 KV heads, ffn 768, tied output
        {"token_embd.weight": (384, 2998), "output_norm.weight": (384,)},
        {"attn_norm.weight": (384,), "attn_q.weight": (384, 384), "attn_k.weight": (384, 128),
         "attn_v.weight": (384, 128), "attn_q.bias": (384,), "attn_k.bias": (128,), "attn_v.bias": (128,),
         "attn_output.weight": (384, 384), "ffn_norm.weight": (384,), "ffn_gate.weight": (384, 768),
         "ffn_down.weight": (768, 384), "ffn_up.weight": (384, 768)}),
    "tiny-qwen3-bpe-Q4_K_M": (  # dim 256, 4 heads x 128, 2 KV heads, ffn 768
        {"token_embd.weight": (256, 2998), "output_norm.weight": (256,), "output.weight": (256, 2998)},
        {"attn_norm.weight": (256,), "attn_q.weight": (256, 512), "attn_k.weight": (256, 256),
         "attn_v.weight": (256, 256), "attn_output.weight": (512, 256), "attn_k_norm.weight": (128,),
         "attn_q_norm.weight": (128,), "ffn_norm.weight": (256,), "ffn_gate.weight": (256, 768),
         "ffn_down.weight": (768, 256), "ffn_up.weight": (256, 768)}),
    "tiny-phi3-spm-Q4_K_M": (  # dim 256, 2 heads x 128, 2 KV heads, rotary 96, ffn 768
        {"token_embd.weight": (256, 3003), "output_norm.weight": (256,), "output.weight": (256, 3003),
         "rope_factors_long.weight": (48,), "rope_factors_short.weight": (48,)},
        {"attn_norm.weight": (256,), "attn_qkv.weight": (256, 768), "attn_output.weight": (256, 256),
         "ffn_norm.weight": (256,), "ffn_down.weight": (768, 256), "ffn_up.weight": (256, 1536)}),
    "tiny-mistral-bpe-Q4_K_M": (  # llama; dim 512, 2 heads x 128, 1 KV head, ffn 512, tied output
        {"token_embd.weight": (512, 3000), "output_norm.weight": (512,)},
        {"attn_norm.weight": (512,), "attn_q.weight": (512, 256), "attn_k.weight": (512, 128),
         "attn_v.weight": (512, 128), "attn_output.weight": (256, 512), "ffn_norm.weight": (512,),
         "ffn_gate.weight": (512, 512), "ffn_down.weight": (512, 512), "ffn_up.weight": (512, 512)}),
}
# the mixtures of experts (src/models/qwen3moe.cpp, llama.cpp's llama with n_expert > 0): the router's
# gate {n_embd, n_expert} and each projection of every expert in one tensor, experts last
MOE_TENSORS = {
    "tiny-qwen3moe-bpe-Q4_K_M": (  # dim 256, 4 heads x 128, 2 KV heads, 16 experts of 256, 4 routed
        {"token_embd.weight": (256, 2998), "output_norm.weight": (256,), "output.weight": (256, 2998)},
        {"attn_norm.weight": (256,), "attn_q.weight": (256, 512), "attn_k.weight": (256, 256),
         "attn_v.weight": (256, 256), "attn_output.weight": (512, 256), "attn_k_norm.weight": (128,),
         "attn_q_norm.weight": (128,), "ffn_norm.weight": (256,), "ffn_gate_inp.weight": (256, 16),
         "ffn_gate_exps.weight": (256, 256, 16), "ffn_down_exps.weight": (256, 256, 16),
         "ffn_up_exps.weight": (256, 256, 16)}),
    "tiny-mixtral-spm-Q4_K_M": (  # llama; dim 256, 4 heads x 64, 2 KV heads, 8 experts of 512, 2 routed
        {"token_embd.weight": (256, 3000), "output_norm.weight": (256,), "output.weight": (256, 3000)},
        {"attn_norm.weight": (256,), "attn_q.weight": (256, 256), "attn_k.weight": (256, 128),
         "attn_v.weight": (256, 128), "attn_output.weight": (256, 256), "ffn_norm.weight": (256,),
         "ffn_gate_inp.weight": (256, 8), "ffn_gate_exps.weight": (256, 512, 8),
         "ffn_down_exps.weight": (512, 256, 8), "ffn_up_exps.weight": (256, 512, 8)}),
}
NAMES = list(LLAMA_CPP_TENSORS)
MOE_NAMES = list(MOE_TENSORS)
ALL_NAMES = NAMES + MOE_NAMES


def _file(name):
    return GGUFFile(DATA / f"{name}.gguf")


@pytest.mark.parametrize("name", ALL_NAMES)
def test_tensors_are_the_ones_llama_cpp_takes(name):
    top, layer = (LLAMA_CPP_TENSORS | MOE_TENSORS)[name]
    f = _file(name)
    want = top | {f"blk.{i}.{k}": shape for i in range(2) for k, shape in layer.items()}
    assert {n: t.shape for n, t in f.tensors.items()} == want
    assert list(f.tensors) == list(expected_tensors(config_from_gguf(f)))  # and our reader expects them in order


def test_features_on():
    qwen2, qwen3, phi3, mistral = (config_from_gguf(_file(n)) for n in NAMES)
    assert (qwen2.arch, qwen2.qkv_bias, qwen2.tied_output, qwen2.rope_mode) == ("qwen2", True, True, "neox")
    assert (qwen3.arch, qwen3.qk_norm, qwen3.head_dim, qwen3.dim // qwen3.n_heads, qwen3.tied_output) == \
        ("qwen3", True, 128, 64, False)
    assert (phi3.arch, phi3.fused_qkv, phi3.fused_gate_up, phi3.longrope, phi3.rope_dims, phi3.head_dim) == \
        ("phi3", True, True, True, 96, 128)
    # llama.cpp's context (256 here) is past the original 32: the long factors, scaled by the attention factor
    assert phi3.rope_factors(256) == "rope_factors_long.weight"
    assert phi3.rope_attn_factor == pytest.approx(1.5492, abs=1e-4)
    assert (mistral.arch, mistral.tied_output, mistral.rope_freqs, mistral.head_dim) == ("llama", True, False, 128)
    assert mistral.dim // mistral.n_heads == 256


def test_moe_features_on():
    """qwen3moe: expert_feed_forward_length apart from feed_forward_length; Mixtral: a llama file whose
    experts are feed_forward_length wide; both divide the routed weights by their sum."""
    qwen3moe, mixtral = (config_from_gguf(_file(n)) for n in MOE_NAMES)
    assert (qwen3moe.arch, qwen3moe.n_experts, qwen3moe.n_experts_used, qwen3moe.expert_ffn_dim, qwen3moe.ffn_dim,
            qwen3moe.qk_norm, qwen3moe.expert_weights_norm) == ("qwen3moe", 16, 4, 256, 768, True, True)
    assert (mixtral.arch, mixtral.n_experts, mixtral.n_experts_used, mixtral.expert_ffn_dim, mixtral.tied_output,
            mixtral.expert_weights_norm) == ("llama", 8, 2, 512, False, True)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_our_recipe_predicts_llama_cpps_formats(name):
    """llama.cpp's quantizer chose every format (Q5_0 and Q8_0 where rows of 384 do not fit Q4_K and Q6_K;
    attn_qkv on attn_v's schedule; an 8-expert model's attn_k and attn_v at Q8_0 and attn_output at Q5_K,
    ffn_down_exps on ffn_down's schedule, the router's gate left f32); our Q4_K_M recipe makes the same
    choice for each tensor."""
    f = _file(name)
    c = config_from_gguf(f)
    ours = {n: fmt.type for n, fmt in tensor_formats(c, "Q4_K_M", expected_tensors(c)).items()}
    assert ours == {n: t.type for n, t in f.tensors.items()}


@pytest.mark.parametrize("name", ALL_NAMES)
def test_references_complete(name):
    ref = json.loads((DATA / f"ref_{name}.json").read_text())
    rows = np.load(DATA / f"ref_{name}.npz")
    strings = json.loads((FIXTURES / "strings.json").read_text())
    prompts = json.loads((FIXTURES / "prompts.json").read_text())
    assert ref["model"] == f"{name}.gguf"
    texts = [t["text"] for t in ref["tokenize"][::2]]
    assert texts[:len(strings)] == strings and len(texts) == len(strings) + 2  # and the two chat strings
    assert [g["prompt"] for g in ref["generate"]] == prompts
    vocab = len(_file(name).get("tokenizer.ggml.tokens"))
    eog = load_tokenizer(_file(name)).eog
    for k, g in enumerate(ref["generate"]):
        n = len(g["greedy_ids"])  # 24 steps, or fewer ending at an end-of-generation token (llama.cpp's stop)
        assert n == len(g["top1_margin"]) == len(g["top5"]) and (n == 24 or (n < 24 and g["greedy_ids"][-1] in eog))
        assert not eog & set(g["greedy_ids"][:-1])
        row = rows[f"p{k}_last_prompt"]
        assert row.shape == (vocab,) and row.dtype == np.float32 and np.isfinite(row).all()
        assert g["greedy_ids"][0] == int(np.argmax(row))
    spread = LLAMA_CPP_SPREAD[name]
    assert spread["fixture settings"]["nmse"] == [0.0] * len(prompts)  # the recording build reran
    assert llama_cpp_bound(name) >= 1e-3


@pytest.mark.parametrize("name", ALL_NAMES)
def test_our_tokenizer_gives_llama_cpps_ids(name):
    """Every recorded string, with BOS and special tokens as text and without BOS with them parsed, and
    every prompt: llama.cpp's ids (Phi-3's special tokens swallow the whitespace after them)."""
    ref = json.loads((DATA / f"ref_{name}.json").read_text())
    tok = load_tokenizer(_file(name))
    for case in ref["tokenize"]:
        assert tok.encode(case["text"], add_special=case["add_bos"], parse_special=not case["add_bos"]) == \
            case["ids"], case["text"]
    for case in ref["generate"]:
        assert tok.encode(case["prompt"], add_special=True, parse_special=True) == case["prompt_ids"]


@pytest.mark.skipif(not llama_cpp.available(), reason="llama-cpp-python is not installed (not a dependency)")
@pytest.mark.parametrize("name", ALL_NAMES)
def test_references_come_from_these_files(name):
    """llama.cpp with the recording's settings gives the recorded row bit for bit."""
    ref = json.loads((DATA / f"ref_{name}.json").read_text())
    llm = llama_cpp.load(str(DATA / f"{name}.gguf"), 256, threads=2)
    row, _ = llama_cpp.greedy(llm, ref["generate"][0]["prompt_ids"], 0)
    assert np.array_equal(row, np.load(DATA / f"ref_{name}.npz")["p0_last_prompt"])


@pytest.mark.skipif(not llama_cpp.available(), reason="llama-cpp-python is not installed (not a dependency)")
def test_phi3_references_use_the_long_factors(tmp_path):
    """At llama.cpp's context of 256 the file's short factors go unused (overwriting them with the long ones
    changes no bit), and with an original context of 512 llama.cpp takes the short ones instead, as our
    config does, and the row moves far from the recorded one."""
    name = "tiny-phi3-spm-Q4_K_M"
    prompt = json.loads((DATA / f"ref_{name}.json").read_text())["generate"][0]["prompt_ids"]
    recorded = np.load(DATA / f"ref_{name}.npz")["p0_last_prompt"]

    def row(path):
        return llama_cpp.greedy(llama_cpp.load(str(path), 256, threads=2), prompt, 0)[0]

    long_only = rewrite(DATA / f"{name}.gguf", tmp_path / "long.gguf", drop_tensors=("rope_factors_short.weight",),
                        add_tensors={"rope_factors_short.weight": ("rope_factors_long.weight", (48,))})
    assert np.array_equal(row(long_only), recorded)
    short = rewrite(DATA / f"{name}.gguf", tmp_path / "short.gguf",
                    set_meta={"phi3.rope.scaling.original_context_length": u32(512)})
    assert config_from_gguf(GGUFFile(short)).rope_factors(256) == "rope_factors_short.weight"
    moved = row(short)
    assert ((moved - recorded) ** 2).sum() / (recorded ** 2).sum() > 10 * llama_cpp_bound(name)
