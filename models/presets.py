"""Model shapes the synthetic-model builder knows by name: the real models' exact shapes, and tiny
ones with the same structure for fast tests. Any field can be overridden (`plan make-model --set`)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from .config import ARCHITECTURES, ModelConfig, float32_decimal, gemma3_swa_layers, validate_config
from llmplan.core.errors import InputError


@dataclass(frozen=True)
class Preset:
    arch: str
    tokenizer: str  # synth_vocab style
    description: str
    shape: dict[str, Any]


PRESETS: dict[str, Preset] = {
    "tiny-llama": Preset("llama", "llama-spm", "Llama 2 structure, SentencePiece vocabulary; builds in a second", dict(
        n_layers=2, dim=256, n_heads=4, n_kv_heads=2, ffn_dim=768, vocab_size=1024,
        context_length=2048, norm_eps=1e-5, rope_base=10000.0)),
    "tiny-llama3": Preset("llama", "llama3-bpe", "Llama 3.1 structure (GQA 4, rope_freqs), byte-level BPE", dict(
        n_layers=2, dim=256, n_heads=4, n_kv_heads=1, ffn_dim=768, vocab_size=1024,
        context_length=8192, norm_eps=1e-5, rope_base=500000.0, rope_freqs=True)),
    "tiny-gemma3": Preset("gemma3", "gemma3", "Gemma 3 structure: 5 sliding-window layers, 1 global, tied output", dict(
        n_layers=6, dim=256, n_heads=2, n_kv_heads=1, head_dim=128, ffn_dim=512, vocab_size=1024,
        context_length=2048, norm_eps=1e-6, rope_base=1e6, swa_window=64)),
    "tiny-qwen2": Preset("qwen2", "llama3-bpe", "Qwen2.5 structure: q/k/v biases, GQA 3, tied output; 384 wide as "
                         "Qwen2.5-0.5B is 896 (Q4_K_M falls back to Q5_0 and Q8_0)", dict(
        n_layers=2, dim=384, n_heads=6, n_kv_heads=2, ffn_dim=768, vocab_size=1024,
        context_length=32768, norm_eps=1e-6, rope_base=1e6, tied_output=True, qkv_bias=True)),
    "tiny-qwen3": Preset("qwen3", "llama3-bpe", "Qwen3 structure: per-head q/k norms, head_dim 128 with q wider "
                         "than the model (as Qwen3-0.6B)", dict(
        n_layers=2, dim=256, n_heads=4, n_kv_heads=2, head_dim=128, ffn_dim=768, vocab_size=1024,
        context_length=40960, norm_eps=1e-6, rope_base=1e6)),
    "tiny-phi3": Preset("phi3", "phi3-spm", "Phi-3 structure: fused attn_qkv and gate|up, partial rotary (96 of "
                        "128, as Phi-4-mini), LongRoPE with long factors past 32 tokens", dict(
        n_layers=2, dim=256, n_heads=2, n_kv_heads=2, rope_dims=96, ffn_dim=768, vocab_size=1024,
        context_length=4096, rope_original_context=32, norm_eps=1e-5, rope_base=10000.0,
        fused_qkv=True, longrope=True)),
    "tiny-mistral": Preset("llama", "llama3-bpe", "llama architecture as Mistral Nemo, SmolLM2 and Llama 3.2 files "
                           "use it: head_dim 128 with q narrower than the model, tied output, no rope_freqs", dict(
        n_layers=2, dim=512, n_heads=2, n_kv_heads=1, head_dim=128, ffn_dim=512, vocab_size=1024,
        context_length=8192, norm_eps=1e-5, rope_base=1e6, tied_output=True)),
    "llama3-8b": Preset("llama", "llama3-bpe", "Meta-Llama-3.1-8B's exact shapes", dict(
        n_layers=32, dim=4096, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab_size=128256,
        context_length=131072, norm_eps=1e-5, rope_base=500000.0, rope_freqs=True)),
    "gemma3-270m": Preset("gemma3", "gemma3", "Gemma 3 270M's exact shapes", dict(
        n_layers=18, dim=640, n_heads=4, n_kv_heads=1, head_dim=256, ffn_dim=2048, vocab_size=262144,
        context_length=32768, norm_eps=1e-6, rope_base=1e6, swa_window=512)),
    "llama3.2-1b": Preset("llama", "llama3-bpe", "Llama-3.2-1B's exact shapes (tied output)", dict(
        n_layers=16, dim=2048, n_heads=32, n_kv_heads=8, ffn_dim=8192, vocab_size=128256,
        context_length=131072, norm_eps=1e-5, rope_base=500000.0, rope_freqs=True, tied_output=True)),
    "smollm2-135m": Preset("llama", "llama3-bpe", "SmolLM2-135M's exact shapes (tied output)", dict(
        n_layers=30, dim=576, n_heads=9, n_kv_heads=3, ffn_dim=1536, vocab_size=49152,
        context_length=8192, norm_eps=1e-5, rope_base=100000.0, tied_output=True)),
    "mistral-nemo": Preset("llama", "llama3-bpe", "Mistral-Nemo-Base-2407's exact shapes (head_dim 128, q 4096 of "
                           "5120)", dict(
        n_layers=40, dim=5120, n_heads=32, n_kv_heads=8, head_dim=128, ffn_dim=14336, vocab_size=131072,
        context_length=1024000, norm_eps=1e-5, rope_base=1e6)),
    "qwen2.5-0.5b": Preset("qwen2", "llama3-bpe", "Qwen2.5-0.5B's exact shapes (q/k/v biases, tied output)", dict(
        n_layers=24, dim=896, n_heads=14, n_kv_heads=2, ffn_dim=4864, vocab_size=151936,
        context_length=32768, norm_eps=1e-6, rope_base=1e6, qkv_bias=True, tied_output=True)),
    "qwen2.5-7b": Preset("qwen2", "llama3-bpe", "Qwen2.5-7B's exact shapes (q/k/v biases)", dict(
        n_layers=28, dim=3584, n_heads=28, n_kv_heads=4, ffn_dim=18944, vocab_size=152064,
        context_length=131072, norm_eps=1e-6, rope_base=1e6, qkv_bias=True)),
    "qwen3-0.6b": Preset("qwen3", "llama3-bpe", "Qwen3-0.6B's exact shapes (q/k norms, q 2048 of 1024, tied output)",
                         dict(n_layers=28, dim=1024, n_heads=16, n_kv_heads=8, head_dim=128, ffn_dim=3072,
                              vocab_size=151936, context_length=40960, norm_eps=1e-6, rope_base=1e6,
                              tied_output=True)),
    "qwen3-8b": Preset("qwen3", "llama3-bpe", "Qwen3-8B's exact shapes (q/k norms)", dict(
        n_layers=36, dim=4096, n_heads=32, n_kv_heads=8, head_dim=128, ffn_dim=12288, vocab_size=151936,
        context_length=40960, norm_eps=1e-6, rope_base=1e6)),
    "phi3-mini": Preset("phi3", "phi3-spm", "Phi-3.5-mini's exact shapes (fused attn_qkv and gate|up, LongRoPE "
                        "from 4096 to 131072)", dict(
        n_layers=32, dim=3072, n_heads=32, n_kv_heads=32, ffn_dim=8192, vocab_size=32064,
        context_length=131072, rope_original_context=4096, norm_eps=1e-5, rope_base=10000.0,
        fused_qkv=True, longrope=True)),
    "tiny-qwen3moe": Preset("qwen3moe", "llama3-bpe", "Qwen3-MoE structure: 16 experts of FFN width 256, 4 routed "
                            "per token, per-head q/k norms, head_dim 128", dict(
        n_layers=2, dim=256, n_heads=4, n_kv_heads=2, head_dim=128, ffn_dim=768, vocab_size=1024,
        context_length=40960, norm_eps=1e-6, rope_base=1e6, n_experts=16, n_experts_used=4, expert_ffn_dim=256)),
    "tiny-mixtral": Preset("llama", "llama-spm", "Mixtral structure (a llama file with experts): 8 experts, 2 "
                           "routed per token, GQA 2, SentencePiece vocabulary", dict(
        n_layers=2, dim=256, n_heads=4, n_kv_heads=2, ffn_dim=512, vocab_size=1024,
        context_length=4096, norm_eps=1e-5, rope_base=1e6, n_experts=8, n_experts_used=2)),
    "qwen3-30b-a3b": Preset("qwen3moe", "llama3-bpe", "Qwen3-30B-A3B's exact shapes: 128 experts of FFN width 768, "
                            "8 routed per token (about 3.3B of 30.5B parameters active)", dict(
        n_layers=48, dim=2048, n_heads=32, n_kv_heads=4, head_dim=128, ffn_dim=6144, vocab_size=151936,
        context_length=40960, norm_eps=1e-6, rope_base=1e6, n_experts=128, n_experts_used=8, expert_ffn_dim=768)),
    "mixtral-8x7b": Preset("llama", "llama-spm", "Mixtral-8x7B's exact shapes: 8 experts of FFN width 14336, 2 "
                           "routed per token", dict(
        n_layers=32, dim=4096, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab_size=32000,
        context_length=32768, norm_eps=1e-5, rope_base=1e6, n_experts=8, n_experts_used=2)),
}

# fields that follow from the architecture or the other fields and cannot be set
_NOT_SETTABLE = {"arch", "name", "attn_scale", "embed_scale", "swa_layers", "activation", "qk_norm", "sandwich_norms",
                 "rope_mode", "fused_gate_up", "expert_weights_norm"}


def longrope_attn_factor(context: int, original: int) -> float:
    """rope.scaling.attn_factor as llama.cpp's converter derives it for LongRoPE (conversion/phi.py)."""
    scale = context / original
    return math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0


def make_config(arch: str, name: str, **shape: Any) -> ModelConfig:
    """A full ModelConfig from the primary shape fields, deriving the rest as the architecture does."""
    s = dict(shape)
    # metadata floats are float32: round now so a preset equals the config read back from its file
    for k in ("norm_eps", "rope_base"):
        if k in s:
            s[k] = float32_decimal(s[k])
    s.setdefault("head_dim", s["dim"] // s["n_heads"] if s["n_heads"] else 0)
    s.setdefault("rope_dims", s["head_dim"])
    s.setdefault("attn_scale", 1.0 / math.sqrt(s["head_dim"]) if s["head_dim"] else 0.0)
    s.setdefault("rope_original_context", s["context_length"])
    if s.get("longrope"):
        s.setdefault("rope_attn_factor", longrope_attn_factor(s["context_length"], s["rope_original_context"]))
    if "rope_attn_factor" in s:
        s["rope_attn_factor"] = float32_decimal(s["rope_attn_factor"])
    if s.get("n_experts"):  # as config.py reads them back: llama's experts are feed_forward_length wide
        if arch == "llama":
            s["expert_ffn_dim"] = s["ffn_dim"]
        s.setdefault("expert_ffn_dim", s["ffn_dim"] // s["n_experts_used"])
        s["expert_weights_norm"] = True
    if arch == "gemma3":
        s.setdefault("tied_output", True)
        s.setdefault("embed_scale", math.sqrt(s["dim"]))
        if s.get("swa_window"):
            s.setdefault("swa_layers", gemma3_swa_layers(s["n_layers"]))
    c = ModelConfig(arch=arch, name=name, **{**s, **ARCHITECTURES[arch].traits})
    validate_config(c, f"model {name}")
    return c


def preset_config(name: str, overrides: dict[str, str] | None = None) -> ModelConfig:
    """The preset's config with `field=value` overrides applied (values parsed to the field's type)."""
    if name not in PRESETS:
        raise InputError(f"unknown preset {name!r} (choose from {', '.join(PRESETS)})")
    p = PRESETS[name]
    shape = dict(p.shape)
    types = {f.name: f.type for f in dataclasses.fields(ModelConfig)}
    for key, text in (overrides or {}).items():
        if key not in types or key in _NOT_SETTABLE:
            settable = sorted(set(types) - _NOT_SETTABLE)
            raise InputError(f"cannot set {key!r} (settable: {', '.join(settable)})")
        shape[key] = _parse(key, text, types[key])
    return make_config(p.arch, name, **shape)


def _parse(key: str, text: str, typ: Any) -> Any:
    try:
        if typ in ("int", int):
            return int(text)
        if typ in ("float", float):
            return float(text)
        if typ in ("bool", bool):
            if text.lower() in ("1", "true", "yes"):
                return True
            if text.lower() in ("0", "false", "no"):
                return False
            raise ValueError(text)
    except ValueError:
        raise InputError(f"--set {key}={text}: expected a {typ}") from None
    raise InputError(f"cannot set {key!r}")
