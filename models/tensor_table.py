"""The tensors a model file holds for its config: names and shapes as llama.cpp's load_arch_tensors
creates them (src/models/<arch>.cpp, create_tensor_qkv in src/llama-model.cpp), in llama.cpp's file order."""

from __future__ import annotations

from .config import ModelConfig


def expected_tensors(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape (GGUF order, row length first), in llama.cpp's file order: tensors outside
    the layers sorted by name, then each layer's sorted by name."""
    top = {"token_embd.weight": (c.dim, c.vocab_size), "output_norm.weight": (c.dim,)}
    if not c.tied_output:
        top["output.weight"] = (c.dim, c.vocab_size)
    if c.rope_freqs:
        top["rope_freqs.weight"] = (c.rope_dims // 2,)
    if c.longrope:
        top |= {"rope_factors_long.weight": (c.rope_dims // 2,), "rope_factors_short.weight": (c.rope_dims // 2,)}
    projections = {"attn_qkv": c.q_dim + 2 * c.kv_dim} if c.fused_qkv else \
        {"attn_q": c.q_dim, "attn_k": c.kv_dim, "attn_v": c.kv_dim}
    layer = {f"{name}.weight": (c.dim, rows) for name, rows in projections.items()}
    if c.qkv_bias:
        layer |= {f"{name}.bias": (rows,) for name, rows in projections.items()}
    layer |= {
        "attn_norm.weight": (c.dim,),
        "attn_output.weight": (c.q_dim, c.dim),
        "ffn_norm.weight": (c.dim,),
    }
    if c.moe:  # the router's gate, then each projection of every expert in one tensor, expert last
        e, f = c.n_experts, c.expert_ffn_dim
        layer |= {"ffn_gate_inp.weight": (c.dim, e), "ffn_gate_exps.weight": (c.dim, f, e),
                  "ffn_up_exps.weight": (c.dim, f, e), "ffn_down_exps.weight": (f, c.dim, e)}
    elif c.fused_gate_up:
        layer["ffn_up.weight"] = (c.dim, 2 * c.ffn_dim)
    else:
        layer |= {"ffn_gate.weight": (c.dim, c.ffn_dim), "ffn_up.weight": (c.dim, c.ffn_dim)}
    if not c.moe:
        layer["ffn_down.weight"] = (c.ffn_dim, c.dim)
    if c.qk_norm:
        layer |= {"attn_q_norm.weight": (c.head_dim,), "attn_k_norm.weight": (c.head_dim,)}
    if c.sandwich_norms:
        layer |= {"post_attention_norm.weight": (c.dim,), "post_ffw_norm.weight": (c.dim,)}
    out = dict(sorted(top.items()))
    for i in range(c.n_layers):
        out |= {f"blk.{i}.{name}": shape for name, shape in sorted(layer.items())}
    return out
