"""Quantization recipes: which format each tensor gets, following llama.cpp's `llama_tensor_get_type`.

"Q4_K_M" names a recipe, not a format. These rules reproduce llama.cpp's choices for the recipes the
synthetic-model builder writes (source: src/llama-quant.cpp), including the layer schedule of
`use_more_bits` and the fallbacks for rows that are not a multiple of the block size.
"""

from __future__ import annotations

from gguf import LlamaFileType

from .config import ModelConfig
from llmplan.core.errors import InputError
from llmplan.core.formats import Format, format_of

# recipe -> (default format of 2-D weights, general.file_type written to the header)
RECIPES: dict[str, tuple[str, LlamaFileType]] = {
    "F32": ("F32", LlamaFileType.ALL_F32),
    "F16": ("F16", LlamaFileType.MOSTLY_F16),
    "Q8_0": ("Q8_0", LlamaFileType.MOSTLY_Q8_0),
    "Q6_K": ("Q6_K", LlamaFileType.MOSTLY_Q6_K),
    "Q4_K_M": ("Q4_K", LlamaFileType.MOSTLY_Q4_K_M),
    "IQ4_NL": ("IQ4_NL", LlamaFileType.MOSTLY_IQ4_NL),
    "IQ4_XS": ("IQ4_XS", LlamaFileType.MOSTLY_IQ4_XS),
}
# llama.cpp's tensor_type_fallback for rows whose length the block size does not divide
_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q2_K": "Q4_0", "Q3_K": "Q4_0", "IQ4_XS": "IQ4_NL"}
_IQ4 = ("IQ4_NL", "IQ4_XS")


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's schedule of the layers that get more bits: the first and last eighth, and every
    third layer in between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _is_attn_v(name: str) -> bool:
    # llama.cpp's category_is_attn_v: a fused attn_qkv takes attn_v's rules (its own ATTENTION_QKV branch
    # comes after that one and is never reached)
    return name.endswith(("attn_v.weight", "attn_qkv.weight"))


def _quantizable(name: str, shape: tuple[int, ...]) -> bool:
    # llama.cpp's tensor_allows_quantization, for the tensors our architectures have: not norms, not the
    # experts' router gate
    return len(shape) >= 2 and name.endswith("weight") and "_norm.weight" not in name and \
        "ffn_gate_inp.weight" not in name


def _fits(fmt: str, ncols: int) -> bool:
    return ncols % format_of(fmt).block == 0


def tensor_formats(c: ModelConfig, recipe: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, Format]:
    """Format of every tensor (in `shapes`, GGUF order shapes in llama.cpp's file order)."""
    if recipe not in RECIPES:
        raise InputError(f"unknown recipe {recipe!r} (choose from {', '.join(RECIPES)})")
    default = RECIPES[recipe][0]
    quantized = default not in ("F32", "F16")
    n_attn_v = sum(1 for n in shapes if _is_attn_v(n))
    i_attn_v = 0
    out = {}
    for name, shape in shapes.items():
        ncols = shape[0]
        if not _quantizable(name, shape):
            out[name] = format_of("F32")
            continue
        if not quantized:
            out[name] = format_of(default)
            continue
        fmt = default
        if name == "output.weight" or (c.tied_output and name == "token_embd.weight"):
            # the output head (or the embedding that doubles as it) gets 6 bits unless rows do not fit
            fmt = "Q8_0" if not _fits(fmt, ncols) else ("Q6_K" if fmt != "Q8_0" else fmt)
        elif _is_attn_v(name):
            if recipe == "Q4_K_M" and use_more_bits(i_attn_v, n_attn_v):
                fmt = "Q6_K"
            elif recipe in _IQ4 and c.n_heads // c.n_kv_heads >= 4:  # llama.cpp's n_gqa()
                fmt = "Q5_K"
            if _is_type_70b(c) and fmt in ("Q3_K", "Q4_K"):
                fmt = "Q5_K"
            if c.n_experts == 8:  # llama.cpp: "for the 8-expert model, bumping this to Q8_0 trades just ~128MB"
                fmt = "Q8_0"
            i_attn_v += 1
        elif name.endswith("attn_k.weight") and c.n_experts == 8:
            fmt = "Q8_0"
        elif name.endswith("attn_output.weight") and c.n_experts == 8 and recipe == "Q4_K_M":
            fmt = "Q5_K"
        elif name.endswith(("ffn_down.weight", "ffn_down_exps.weight")):
            layer = int(name.split(".")[1])
            if recipe == "Q4_K_M" and use_more_bits(layer, c.n_layers):
                fmt = "Q6_K"
            elif recipe in _IQ4 and layer < c.n_layers // 8:  # without an importance matrix
                fmt = "Q5_K"
        if not _fits(fmt, ncols):
            fmt = _FALLBACK.get(fmt, fmt)
            if not _fits(fmt, ncols):
                fmt = "F16"
        out[name] = format_of(fmt)
    return out


def _is_type_70b(c: ModelConfig) -> bool:
    # llama.cpp's LLM_TYPE_70B: 80 llama layers with grouped-query attention, or 80 qwen2 layers
    return c.n_layers == 80 and (c.arch == "qwen2" or c.arch == "llama" and c.n_heads != c.n_kv_heads)


def file_type(recipe: str) -> int:
    return int(RECIPES[recipe][1])
