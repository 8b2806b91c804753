"""ModelConfig: a decoder's hyperparameters, read from GGUF metadata and checked before anything runs.

`config_from_gguf` reads the keys llama.cpp reads for each architecture (with llama.cpp's defaults);
`config_to_metadata` writes them back the way llama.cpp's converter names them, so the synthetic-model
builder and the reader cannot drift apart. Which optional tensors a file has (tied output, biases, fused
q|k|v, rope factors) is part of the config too: it is read from the tensor table.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from gguf import GGUFValueType as V

from llmplan.core.numerics import MAX_EXPERTS

from .errors import ConfigError
from .gguf import GGUFFile, MetaValue

GEMMA3_SWA_PATTERN = 6  # llama.cpp's default: every sixth layer attends globally
ROPE_BASE_SWA_DEFAULT = 10000.0
MAX_LAYERS = 512  # llama.cpp's LLAMA_MAX_LAYERS

_INT_TYPES = {V.UINT8, V.INT8, V.UINT16, V.INT16, V.UINT32, V.INT32, V.UINT64, V.INT64}
_FLOAT_TYPES = {V.FLOAT32, V.FLOAT64}


def float32_decimal(x: float) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-05, not
    9.999999747378752e-06): what the file's writer meant and the IR prints; every kernel takes it as
    float32 again, the same bits."""
    return float(str(np.float32(x)))


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    name: str
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    context_length: int
    rope_original_context: int  # rope.scaling.original_context_length (llama.cpp's n_ctx_orig_yarn)
    norm_eps: float
    rope_base: float
    rope_dims: int
    rope_scale: float = 1.0  # linear position scaling: positions are multiplied by this (1/factor)
    rope_freqs: bool = False  # Llama 3.1: per-frequency divisors stored in rope_freqs.weight
    activation: str = "silu"  # gate activation of the GLU: "silu" or "gelu_tanh"
    qk_norm: bool = False  # per-head RMSNorm of queries and keys (Gemma 3)
    sandwich_norms: bool = False  # RMSNorm after attention and after the FFN as well (Gemma 2/3)
    embed_scale: float = 1.0  # token embeddings are multiplied by this (Gemma: sqrt(dim))
    attn_scale: float = 0.0  # attention logits are multiplied by this
    swa_window: int = 0  # sliding-window size; 0 means every layer attends to the whole context
    swa_layers: tuple[bool, ...] = ()  # per layer: does it use the sliding window?
    rope_base_swa: float = ROPE_BASE_SWA_DEFAULT
    tied_output: bool = False  # output head shares token_embd.weight
    logit_softcap: float = 0.0
    # rotary pairs: "norm" rotates (2i, 2i+1), "neox" (i, i + rope_dims/2); dims past rope_dims pass unrotated
    rope_mode: str = "norm"
    qkv_bias: bool = False  # q, k and v projections add a bias (Qwen2)
    fused_qkv: bool = False  # q|k|v stored as one attn_qkv matrix, rows in that order (Phi-3)
    fused_gate_up: bool = False  # gate|up stored as one ffn_up matrix of 2 * ffn_dim rows, gate first (Phi-3)
    longrope: bool = False  # LongRoPE: rope_factors_long/short.weight divide the frequencies (Phi-3)
    rope_attn_factor: float = 1.0  # rope.scaling.attn_factor: the rotated dims of q and k are multiplied by it
    # mixture of experts (Qwen3-MoE, Mixtral): 0 experts is a dense FFN
    n_experts: int = 0  # expert_count
    n_experts_used: int = 0  # expert_used_count: experts routed per token
    expert_ffn_dim: int = 0  # an expert's FFN width: expert_feed_forward_length, else llama.cpp's default
    # the routed weights divided by their sum: llama.cpp's build_moe_ffn takes true from qwen3moe and llama
    expert_weights_norm: bool = False

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def moe(self) -> bool:
        return self.n_experts > 0

    def is_swa(self, layer: int) -> bool:
        return bool(self.swa_layers) and self.swa_layers[layer]

    def rope_factors(self, ctx: int) -> str | None:
        """The tensor of per-frequency divisors the rotary embedding uses at a context of `ctx` tokens per
        sequence, as llama.cpp's get_rope_factors picks it: rope_freqs.weight where the file has it; with
        LongRoPE the long factors once the context, rounded up to a multiple of 256 as llama.cpp rounds
        it, exceeds the original one, else the short; else none."""
        if self.rope_freqs:
            return "rope_freqs.weight"
        if self.longrope:
            padded = -(-ctx // 256) * 256  # llama.cpp's context is a multiple of 256
            return "rope_factors_long.weight" if padded > self.rope_original_context else "rope_factors_short.weight"
        return None

    def layer_rope(self, layer: int) -> tuple[float, float]:
        """(base, position scale) of the rotary embedding in one layer."""
        if self.is_swa(layer):
            return self.rope_base_swa, 1.0
        return self.rope_base, self.rope_scale

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["swa_layers"] = [i for i, s in enumerate(self.swa_layers) if s]
        return d


@dataclass(frozen=True)
class Architecture:
    """What llama.cpp builds for one architecture (src/models/<arch>.cpp) that a config records."""

    traits: dict[str, Any]  # ModelConfig fields every file of it has (rope_mode: llama_model_rope_type)
    optional: tuple[str, ...] = ()  # the TENSOR_FLAGS it reads from the tensor table
    q_is_dim: bool = False  # create_tensor_qkv gets embedding_length as the query width
    rope_is_head: bool = False  # rope.dimension_count must equal the head size (a load error or graph assert)
    # mixture of experts: "required" (load_arch_tensors throws without experts), "optional" (llama: experts
    # when expert_count > 0, Mixtral), "" (none)
    experts: str = ""


ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture({"rope_mode": "norm"}, ("rope_freqs", "fused_qkv", "qkv_bias"), rope_is_head=True,
                          experts="optional"),
    "gemma3": Architecture({"rope_mode": "neox", "activation": "gelu_tanh", "qk_norm": True, "sandwich_norms": True},
                           ("rope_freqs",)),
    "qwen2": Architecture({"rope_mode": "neox"}, ("fused_qkv", "qkv_bias"), q_is_dim=True, rope_is_head=True),
    "qwen3": Architecture({"rope_mode": "neox", "qk_norm": True}, ("fused_qkv", "qkv_bias"), rope_is_head=True),
    "phi3": Architecture({"rope_mode": "neox", "fused_gate_up": True}, ("fused_qkv", "qkv_bias", "longrope"),
                         q_is_dim=True),
    "qwen3moe": Architecture({"rope_mode": "neox", "qk_norm": True}, ("fused_qkv", "qkv_bias"), rope_is_head=True,
                             experts="required"),
}
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURES)

# ModelConfig flags that say which optional tensors a file has, and how an error names them
TENSOR_FLAGS = {"rope_freqs": "rope_freqs.weight", "longrope": "rope_factors_long/short.weight",
                "fused_qkv": "attn_qkv.weight", "qkv_bias": "q/k/v biases"}


def gemma3_swa_layers(n_layers: int, pattern: int = GEMMA3_SWA_PATTERN) -> tuple[bool, ...]:
    # llama.cpp's set_swa_pattern: layer il is local unless il % pattern == pattern - 1
    return tuple(pattern == 0 or il % pattern < pattern - 1 for il in range(n_layers))


# --- reading ---------------------------------------------------------------------------------

class _Meta:
    """Typed access to `<arch>.*` keys with errors that name the key."""

    def __init__(self, f: GGUFFile, arch: str):
        self.f, self.arch = f, arch

    def key(self, k: str) -> str:
        return k.replace("{arch}", self.arch)

    def _get(self, k: str) -> MetaValue | None:
        return self.f.metadata.get(self.key(k))

    def int(self, k: str, default: int | None = None) -> int:
        v = self._get(k)
        if v is None:
            if default is None:
                raise ConfigError(f"{self.f.path}: missing metadata key {self.key(k)}")
            return default
        if v.type not in _INT_TYPES:
            kind = f"an array of {v.element_type.name}" if v.type == V.ARRAY else v.type.name
            raise ConfigError(f"{self.f.path}: {self.key(k)} must be an integer, is {kind}")
        if v.value < 0:
            raise ConfigError(f"{self.f.path}: {self.key(k)} is negative ({v.value})")
        return int(v.value)

    def float(self, k: str, default: float | None = None) -> float:
        v = self._get(k)
        if v is None:
            if default is None:
                raise ConfigError(f"{self.f.path}: missing metadata key {self.key(k)}")
            return default
        if v.type not in _FLOAT_TYPES | _INT_TYPES:
            raise ConfigError(f"{self.f.path}: {self.key(k)} must be a number, is {v.type.name}")
        x = float(v.value)
        if not math.isfinite(x):
            raise ConfigError(f"{self.f.path}: {self.key(k)} is {x}")
        return float32_decimal(x) if v.type == V.FLOAT32 else x

    def str(self, k: str, default: str | None = None) -> str | None:
        v = self._get(k)
        if v is None:
            return default
        if v.type != V.STRING:
            raise ConfigError(f"{self.f.path}: {self.key(k)} must be a string, is {v.type.name}")
        return v.value


def _layers_in_table(f: GGUFFile) -> set[int]:
    layers = set()
    for name in f.tensors:
        m = re.match(r"blk\.(\d+)\.", name)
        if m:
            layers.add(int(m.group(1)))
    return layers


def _tensor_flags(f: GGUFFile, spec: Architecture) -> dict[str, bool]:
    """The TENSOR_FLAGS the architecture reads, from layer 0 and the global tensors (bind_tensors checks
    every layer). Biases count in the weights' layout: a fused attn_qkv with separate q/k/v biases, which
    llama.cpp also loads, is left to fail binding."""
    fused = "blk.0.attn_qkv.weight" in f.tensors
    present = {"rope_freqs": "rope_freqs.weight" in f.tensors,
               "longrope": "rope_factors_long.weight" in f.tensors,
               "fused_qkv": fused,
               "qkv_bias": f"blk.0.{'attn_qkv' if fused else 'attn_q'}.bias" in f.tensors}
    return {k: present[k] for k in spec.optional}


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    """Read and check the hyperparameters; raises ConfigError naming the offending key or value."""
    arch = f.get("general.architecture")
    if not isinstance(arch, str):
        raise ConfigError(f"{f.path}: general.architecture is missing")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ConfigError(f"{f.path}: architecture '{arch}' is not supported "
                          f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    spec = ARCHITECTURES[arch]
    m = _Meta(f, arch)
    n_layers = m.int("{arch}.block_count")
    dim = m.int("{arch}.embedding_length")
    n_heads = m.int("{arch}.attention.head_count")
    # checked here already because the per-layer tables below are sized by them
    _check(f, 1 <= n_layers <= MAX_LAYERS, f"{arch}.block_count is {n_layers} (must be 1..{MAX_LAYERS})")
    _check(f, n_heads >= 1, f"{arch}.attention.head_count is {n_heads}")
    n_kv = m.int("{arch}.attention.head_count_kv", n_heads)
    has_key_len = m._get("{arch}.attention.key_length") is not None
    if not has_key_len:
        _check(f, dim % n_heads == 0, f"{arch}.attention.head_count {n_heads} does not divide "
                                      f"embedding_length {dim}")
    head_dim = m.int("{arch}.attention.key_length", dim // n_heads)
    value_len = m.int("{arch}.attention.value_length", head_dim)
    _check(f, value_len == head_dim, f"{arch}.attention.value_length {value_len} differs from key_length "
                                     f"{head_dim}; not supported")
    rope_dims = m.int("{arch}.rope.dimension_count", head_dim)
    scaling = m.str("{arch}.rope.scaling.type", "linear")
    if scaling not in ("none", "linear"):
        raise ConfigError(f"{f.path}: {arch}.rope.scaling.type '{scaling}' is not supported (none, linear)")
    factor = m.float("{arch}.rope.scaling.factor", 0.0)
    context = m.int("{arch}.context_length")
    tokens = f.get("tokenizer.ggml.tokens")
    embd = f.tensors.get("token_embd.weight")
    vocab_default = len(tokens) if tokens is not None else (embd.shape[1] if embd and len(embd.shape) > 1 else 0)
    common = dict(
        arch=arch,
        name=m.str("general.name", "") or "",
        n_layers=n_layers, dim=dim, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim,
        ffn_dim=m.int("{arch}.feed_forward_length"),
        vocab_size=m.int("{arch}.vocab_size", vocab_default),
        context_length=context,
        norm_eps=m.float("{arch}.attention.layer_norm_rms_epsilon"),
        rope_base=m.float("{arch}.rope.freq_base", 10000.0),
        rope_dims=rope_dims,
        # llama.cpp never scales positions when the scaling type is none
        rope_scale=1.0 if factor == 0.0 or scaling == "none" else 1.0 / factor,
        rope_attn_factor=m.float("{arch}.rope.scaling.attn_factor", 1.0),
        # llama.cpp takes a zero here as absent
        rope_original_context=m.int("{arch}.rope.scaling.original_context_length", context) or context,
        tied_output=bool(f.tensors) and "output.weight" not in f.tensors,
        attn_scale=_inv_sqrt(head_dim),
        **spec.traits,
        **_tensor_flags(f, spec),
    )
    if spec.experts:
        common |= _experts(f, m, common)
    cfg = _gemma3(f, m, common) if arch == "gemma3" else ModelConfig(**common)
    validate_config(cfg, f.path)
    if f.tensors:
        layers = _layers_in_table(f)
        top = max(layers) + 1 if layers else 0
        _check(f, top >= n_layers, f"{arch}.block_count is {n_layers} but the tensor table has "
                                   f"{'no layer tensors' if not layers else f'layers 0..{top - 1} only'}")
    return cfg


def _experts(f: GGUFFile, m: _Meta, common: dict[str, Any]) -> dict[str, Any]:
    """The experts' keys as llama.cpp's load_hparams reads them: expert_count, expert_used_count (one count
    for every layer), and an expert's FFN width (qwen3moe: expert_feed_forward_length, else
    feed_forward_length / expert_used_count; llama: feed_forward_length)."""
    n = m.int("{arch}.expert_count", 0)
    if n == 0:
        return {}
    used = m.int("{arch}.expert_used_count", 0)
    _check(f, 1 <= used <= n, f"{m.key('{arch}.expert_used_count')} is {used} (must be 1..{n} experts)")
    ffn = common["ffn_dim"]
    if common["arch"] == "qwen3moe":
        ffn = m.int("{arch}.expert_feed_forward_length", 0) or ffn // used
    return dict(n_experts=n, n_experts_used=used, expert_ffn_dim=ffn, expert_weights_norm=True)


def _gemma3(f: GGUFFile, m: _Meta, common: dict[str, Any]) -> ModelConfig:
    n_layers = common["n_layers"]
    window = m.int("{arch}.attention.sliding_window", 0)
    pattern_key = m.key("{arch}.attention.sliding_window_pattern")
    pv = f.metadata.get(pattern_key)
    if window == 0:
        swa: tuple[bool, ...] = ()
    elif pv is not None and pv.type == V.ARRAY:
        _check(f, pv.element_type == V.BOOL and len(pv.value) == n_layers,
               f"{pattern_key} must be {n_layers} bools")
        swa = tuple(bool(x) for x in pv.value)
    else:
        swa = gemma3_swa_layers(n_layers, m.int("{arch}.attention.sliding_window_pattern", GEMMA3_SWA_PATTERN))
    # llama.cpp (after gemma_pytorch): the 27B model scales attention by its model width per head
    scale = _inv_sqrt(common["dim"] // common["n_heads"] if n_layers == 62 else common["head_dim"])
    return ModelConfig(
        **{**common, "attn_scale": scale},
        embed_scale=math.sqrt(common["dim"]),
        swa_window=window, swa_layers=swa,
        rope_base_swa=m.float("{arch}.rope.freq_base_swa", ROPE_BASE_SWA_DEFAULT),
        logit_softcap=m.float("{arch}.final_logit_softcapping", 0.0),
    )


def _inv_sqrt(x: int) -> float:
    return 1.0 / math.sqrt(x) if x > 0 else 0.0  # a zero size is rejected by validate_config


def _check(f: GGUFFile, ok: bool, problem: str) -> None:
    if not ok:
        raise ConfigError(f"{f.path}: {problem}")


def validate_config(c: ModelConfig, where: str) -> None:
    """Reject hyperparameters that make no sense, naming the first bad one."""
    a = c.arch

    def check(ok: bool, problem: str) -> None:
        if not ok:
            raise ConfigError(f"{where}: {problem}")

    check(a in ARCHITECTURES, f"architecture '{a}' is not supported (supported: {', '.join(ARCHITECTURES)})")
    spec = ARCHITECTURES[a]
    check(1 <= c.n_layers <= MAX_LAYERS, f"{a}.block_count is {c.n_layers} (must be 1..{MAX_LAYERS})")
    check(c.dim >= 1, f"{a}.embedding_length is {c.dim}")
    check(c.n_heads >= 1, f"{a}.attention.head_count is {c.n_heads}")
    check(c.n_kv_heads >= 1 and c.n_heads % c.n_kv_heads == 0,
          f"{a}.attention.head_count_kv {c.n_kv_heads} does not divide head_count {c.n_heads}")
    check(c.head_dim >= 2 and c.head_dim % 2 == 0, f"head size {c.head_dim} must be even and >= 2")
    check(not spec.q_is_dim or c.q_dim == c.dim, f"{a}.attention.key_length {c.head_dim} times head_count "
                                                  f"{c.n_heads} must equal embedding_length {c.dim}")
    check(not spec.rope_is_head or c.rope_dims == c.head_dim,
          f"{a}.rope.dimension_count {c.rope_dims} must equal the head size {c.head_dim}")
    check(2 <= c.rope_dims <= c.head_dim and c.rope_dims % 2 == 0,
          f"{a}.rope.dimension_count {c.rope_dims} must be even and within the head size {c.head_dim}")
    check(c.ffn_dim >= 1, f"{a}.feed_forward_length is {c.ffn_dim}")
    check(c.vocab_size >= 1, f"vocabulary size is {c.vocab_size}")
    check(c.context_length >= 1, f"{a}.context_length is {c.context_length}")
    check(c.norm_eps > 0, f"{a}.attention.layer_norm_rms_epsilon is {c.norm_eps}")
    check(c.rope_base > 0 and c.rope_base_swa > 0, f"{a}.rope.freq_base is {c.rope_base}")
    check(c.rope_attn_factor > 0, f"{a}.rope.scaling.attn_factor is {c.rope_attn_factor}")
    check(c.rope_original_context >= 1, f"{a}.rope.scaling.original_context_length is {c.rope_original_context}")
    for flag, what in TENSOR_FLAGS.items():
        check(not getattr(c, flag) or flag in spec.optional, f"{a} models have no {what}")
    check(len(c.swa_layers) in (0, c.n_layers), f"sliding-window pattern covers {len(c.swa_layers)} of "
                                                f"{c.n_layers} layers")
    check(spec.experts != "required" or c.moe, f"{a}.expert_count must be > 0 for {a}")
    check(not c.moe or spec.experts, f"{a} models have no experts")
    if c.moe:
        check(c.n_experts <= MAX_EXPERTS, f"{a}.expert_count is {c.n_experts} (must be 1..{MAX_EXPERTS})")
        check(1 <= c.n_experts_used <= c.n_experts,
              f"{a}.expert_used_count is {c.n_experts_used} (must be 1..{c.n_experts} experts)")
        check(c.expert_ffn_dim >= 1, f"{a}.expert_feed_forward_length is {c.expert_ffn_dim}")


# --- writing ---------------------------------------------------------------------------------

def config_to_metadata(c: ModelConfig) -> list[tuple[str, MetaValue]]:
    """The hyperparameter keys as llama.cpp's converter writes them (tokenizer keys not included)."""
    u32 = lambda k, v: (k.format(arch=c.arch), MetaValue(V.UINT32, int(v)))  # noqa: E731
    f32 = lambda k, v: (k.format(arch=c.arch), MetaValue(V.FLOAT32, float(v)))  # noqa: E731
    out = [
        ("general.architecture", MetaValue(V.STRING, c.arch)),
        ("general.name", MetaValue(V.STRING, c.name)),
        u32("{arch}.block_count", c.n_layers),
        u32("{arch}.context_length", c.context_length),
        u32("{arch}.embedding_length", c.dim),
        u32("{arch}.feed_forward_length", c.ffn_dim),
        u32("{arch}.attention.head_count", c.n_heads),
        u32("{arch}.attention.head_count_kv", c.n_kv_heads),
        f32("{arch}.rope.freq_base", c.rope_base),
        f32("{arch}.attention.layer_norm_rms_epsilon", c.norm_eps),
    ]
    head_keys = [u32("{arch}.attention.key_length", c.head_dim), u32("{arch}.attention.value_length", c.head_dim)]
    if c.arch == "llama":
        out += [u32("{arch}.vocab_size", c.vocab_size), u32("{arch}.rope.dimension_count", c.rope_dims)]
        if c.q_dim != c.dim:  # Mistral Nemo: the head size is not embedding_length / head_count
            out += head_keys
    elif c.arch in ("qwen3", "qwen3moe"):
        out += head_keys
    elif c.arch == "phi3":
        out.append(u32("{arch}.rope.dimension_count", c.rope_dims))
    elif c.arch == "gemma3":
        out += head_keys
        if c.swa_window:
            out.append(u32("{arch}.attention.sliding_window", c.swa_window))
            if c.swa_layers != gemma3_swa_layers(c.n_layers):
                out.append((f"{c.arch}.attention.sliding_window_pattern",
                            MetaValue(V.ARRAY, np.array(c.swa_layers, bool), V.BOOL)))
        if c.rope_base_swa != ROPE_BASE_SWA_DEFAULT:
            out.append(f32("{arch}.rope.freq_base_swa", c.rope_base_swa))
        if c.logit_softcap:
            out.append(f32("{arch}.final_logit_softcapping", c.logit_softcap))
    if c.moe:
        out += [u32("{arch}.expert_count", c.n_experts), u32("{arch}.expert_used_count", c.n_experts_used)]
        if c.arch == "qwen3moe":
            out.append(u32("{arch}.expert_feed_forward_length", c.expert_ffn_dim))
    if c.rope_scale != 1.0:
        out += [(f"{c.arch}.rope.scaling.type", MetaValue(V.STRING, "linear")),
                f32("{arch}.rope.scaling.factor", 1.0 / c.rope_scale)]
    if c.rope_original_context != c.context_length:
        out.append(u32("{arch}.rope.scaling.original_context_length", c.rope_original_context))
    if c.rope_attn_factor != 1.0:
        out.append(f32("{arch}.rope.scaling.attn_factor", c.rope_attn_factor))
    return out
