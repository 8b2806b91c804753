"""The Llama-family decoder, written against the tracer (see ir/trace.py): Llama 2 / 3.x, Mistral, Qwen2
and Qwen2.5, Qwen3, Phi-3 / 3.5 / 4 and SmolLM2 are this one block with a few switches the config reads
from the file (models/config.py): q/k/v biases (Qwen2), per-head query/key norms (Qwen3), q|k|v and
gate|up stored fused (Phi-3, read as row ranges of the one tensor), rotary pairs and partial rotary,
per-frequency divisors (Llama 3.1's rope_freqs, Phi-3's LongRoPE factors with their attention factor),
a head tied to the embedding, and a mixture of experts in place of the FFN (Qwen3-MoE, Mixtral: `moe`).
This module imports nothing from ir/."""

from __future__ import annotations

from .config import ModelConfig


def decoder(nn, c: ModelConfig):
    x = nn.embed(nn.weight("token_embd.weight"), nn.tokens)
    cache = nn.cache
    factors = c.rope_factors(nn.ctx)
    rope = dict(dims=c.rope_dims, base=c.rope_base, scale=c.rope_scale, mode=c.rope_mode, mscale=c.rope_attn_factor)
    rope_factors = (nn.weight(factors),) if factors else ()
    qkv_rows = (0, c.q_dim), (c.q_dim, c.q_dim + c.kv_dim), (c.q_dim + c.kv_dim, c.q_dim + 2 * c.kv_dim)
    for i in range(c.n_layers):
        def w(name: str, rows: tuple[int, int] | None = None):
            return nn.weight(f"blk.{i}.{name}.weight", rows)

        h = nn.rmsnorm(x, w("attn_norm"), eps=c.norm_eps)

        def project(j: int, name: str, norm: str = ""):
            """q, k or v: its projection (rows j of a fused q|k|v), bias, per-head norm and rotation."""
            t = nn.matmul(h, w("attn_qkv", qkv_rows[j]) if c.fused_qkv else w(name))
            if c.qkv_bias:
                t = nn.bias_add(t, nn.weight(f"blk.{i}.{name}.bias"))
            if norm and c.qk_norm:
                t = nn.rmsnorm(t, w(norm), eps=c.norm_eps)
            heads = (c.n_heads, c.n_kv_heads, 0)[j]
            return nn.rope(t, nn.pos, *rope_factors, heads=heads, **rope) if heads else t

        q, k, v = project(0, "attn_q", "attn_q_norm"), project(1, "attn_k", "attn_k_norm"), project(2, "attn_v")
        cache = nn.kv_store(cache, k, v, nn.seq, nn.pages, nn.pos, layer=i)
        o = nn.attention(q, cache, nn.seq, nn.pages, nn.pos, layer=i, heads=c.n_heads, kv_heads=c.n_kv_heads,
                         scale=c.attn_scale, window=0)
        x = nn.add(x, nn.matmul(o, w("attn_output")))

        h = nn.rmsnorm(x, w("ffn_norm"), eps=c.norm_eps)
        x = nn.add(x, (moe if c.moe else ffn)(nn, c, h, w))

    x = nn.rmsnorm(nn.last_rows(x), nn.weight("output_norm.weight"), eps=c.norm_eps)
    head = nn.weight("token_embd.weight" if c.tied_output else "output.weight")
    return nn.matmul(x, head), cache


def ffn(nn, c: ModelConfig, h, w):
    """The gated FFN."""
    def proj(j: int, name: str):
        """gate (j 0) or up (1): its own tensor, or rows j of a fused gate|up ffn_up."""
        return w("ffn_up", (j * c.ffn_dim, (j + 1) * c.ffn_dim)) if c.fused_gate_up else w(name)

    g = nn.mul(nn.silu(nn.matmul(h, proj(0, "ffn_gate"))), nn.matmul(h, proj(1, "ffn_up")))
    return nn.matmul(g, w("ffn_down"))


def moe(nn, c: ModelConfig, h, w):
    """The mixture-of-experts FFN (llama.cpp's build_moe_ffn with SiLU gating, as qwen3moe and Mixtral call
    it): the router picks each row's experts and their weights from the normed row, each routed expert's
    gated FFN runs on it, and their outputs are summed with the weights."""
    ids, weights = nn.moe_router(h, w("ffn_gate_inp"), k=c.n_experts_used, norm=c.expert_weights_norm)
    g = nn.mul(nn.silu(nn.matmul_experts(h, w("ffn_gate_exps"), ids)), nn.matmul_experts(h, w("ffn_up_exps"), ids))
    return nn.moe_sum(nn.matmul_experts(g, w("ffn_down_exps"), ids), weights)
