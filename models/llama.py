"""The Llama 2 / 3 / 3.1 decoder (also Mistral-style GQA), written against the tracer: `nn` provides
the ops and the phase's inputs (see ir/trace.py); this module imports nothing from ir/."""

from __future__ import annotations

from .config import ModelConfig


def decoder(nn, c: ModelConfig):
    x = nn.embed(nn.weight("token_embd.weight"), nn.tokens)
    cache = nn.cache
    # Llama 3.1 divides each rotary frequency by a per-frequency factor (rope_freqs.weight)
    factors = (nn.weight("rope_freqs.weight"),) if c.rope_freqs else ()
    rope = dict(dims=c.rope_dims, base=c.rope_base, scale=c.rope_scale, mode="norm")
    for i in range(c.n_layers):
        def w(name: str):
            return nn.weight(f"blk.{i}.{name}.weight")

        h = nn.rmsnorm(x, w("attn_norm"), eps=c.norm_eps)
        q = nn.rope(nn.matmul(h, w("attn_q")), nn.pos, *factors, heads=c.n_heads, **rope)
        k = nn.rope(nn.matmul(h, w("attn_k")), nn.pos, *factors, heads=c.n_kv_heads, **rope)
        v = nn.matmul(h, w("attn_v"))
        cache = nn.kv_store(cache, k, v, nn.seq, nn.pages, nn.pos, layer=i)
        o = nn.attention(q, cache, nn.seq, nn.pages, nn.pos, layer=i, heads=c.n_heads, kv_heads=c.n_kv_heads,
                         scale=c.attn_scale, window=0)
        x = nn.add(x, nn.matmul(o, w("attn_output")))

        h = nn.rmsnorm(x, w("ffn_norm"), eps=c.norm_eps)
        g = nn.mul(nn.silu(nn.matmul(h, w("ffn_gate"))), nn.matmul(h, w("ffn_up")))
        x = nn.add(x, nn.matmul(g, w("ffn_down")))

    x = nn.rmsnorm(nn.last_rows(x), nn.weight("output_norm.weight"), eps=c.norm_eps)
    head = nn.weight("token_embd.weight" if c.tied_output else "output.weight")
    return nn.matmul(x, head), cache
