"""Model shapes the synthetic-model builder knows by name: the real models' exact shapes, and tiny
ones with the same structure for fast tests. Any field can be overridden (`plan make-model --set`)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from .config import ModelConfig, float32_decimal, gemma3_swa_layers, validate_config
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
    "llama3-8b": Preset("llama", "llama3-bpe", "Meta-Llama-3.1-8B's exact shapes", dict(
        n_layers=32, dim=4096, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab_size=128256,
        context_length=131072, norm_eps=1e-5, rope_base=500000.0, rope_freqs=True)),
    "gemma3-270m": Preset("gemma3", "gemma3", "Gemma 3 270M's exact shapes", dict(
        n_layers=18, dim=640, n_heads=4, n_kv_heads=1, head_dim=256, ffn_dim=2048, vocab_size=262144,
        context_length=32768, norm_eps=1e-6, rope_base=1e6, swa_window=512)),
}

# fields that follow from the others unless given explicitly
_DERIVED = {"arch", "name", "head_dim", "rope_dims", "attn_scale", "embed_scale", "swa_layers", "activation",
            "qk_norm", "sandwich_norms", "tied_output"}


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
    if arch == "gemma3":
        s.setdefault("activation", "gelu_tanh")
        s.setdefault("qk_norm", True)
        s.setdefault("sandwich_norms", True)
        s.setdefault("tied_output", True)
        s.setdefault("embed_scale", math.sqrt(s["dim"]))
        if s.get("swa_window"):
            s.setdefault("swa_layers", gemma3_swa_layers(s["n_layers"]))
    c = ModelConfig(arch=arch, name=name, **s)
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
        if key not in types or key in _DERIVED - {"head_dim", "rope_dims", "tied_output"}:
            settable = sorted((set(types) - _DERIVED) | {"head_dim", "rope_dims", "tied_output"})
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
