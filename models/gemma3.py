"""The Gemma 3 decoder, written against the tracer (see ir/trace.py): scaled embeddings, per-head
query/key norms, sandwich norms around attention and FFN, GELU-tanh gating, sliding-window layers with
their own rope base, and the output head tied to the embedding. Norm weights in GGUF already include
Gemma's +1, so every norm is a plain RMSNorm."""

from __future__ import annotations

from .config import ModelConfig


def decoder(nn, c: ModelConfig):
    x = nn.scale(nn.embed(nn.weight("token_embd.weight"), nn.tokens), factor=c.embed_scale)
    cache = nn.cache
    for i in range(c.n_layers):
        def w(name: str):
            return nn.weight(f"blk.{i}.{name}.weight")

        base, pos_scale = c.layer_rope(i)
        rope = dict(dims=c.rope_dims, base=base, scale=pos_scale, mode="neox")
        h = nn.rmsnorm(x, w("attn_norm"), eps=c.norm_eps)
        q = nn.rmsnorm(nn.matmul(h, w("attn_q")), w("attn_q_norm"), eps=c.norm_eps)
        k = nn.rmsnorm(nn.matmul(h, w("attn_k")), w("attn_k_norm"), eps=c.norm_eps)
        q = nn.rope(q, nn.pos, heads=c.n_heads, **rope)
        k = nn.rope(k, nn.pos, heads=c.n_kv_heads, **rope)
        v = nn.matmul(h, w("attn_v"))
        cache = nn.kv_store(cache, k, v, nn.seq, nn.pages, nn.pos, layer=i)
        o = nn.attention(q, cache, nn.seq, nn.pages, nn.pos, layer=i, heads=c.n_heads, kv_heads=c.n_kv_heads,
                         scale=c.attn_scale, window=c.swa_window if c.is_swa(i) else 0)
        o = nn.rmsnorm(nn.matmul(o, w("attn_output")), w("post_attention_norm"), eps=c.norm_eps)
        x = nn.add(x, o)

        h = nn.rmsnorm(x, w("ffn_norm"), eps=c.norm_eps)
        g = nn.mul(nn.gelu_tanh(nn.matmul(h, w("ffn_gate"))), nn.matmul(h, w("ffn_up")))
        f = nn.rmsnorm(nn.matmul(g, w("ffn_down")), w("post_ffw_norm"), eps=c.norm_eps)
        x = nn.add(x, f)

    x = nn.rmsnorm(nn.last_rows(x), nn.weight("output_norm.weight"), eps=c.norm_eps)
    logits = nn.matmul(x, nn.weight("output.weight" if not c.tied_output else "token_embd.weight"))
    if c.logit_softcap:
        logits = nn.softcap(logits, cap=c.logit_softcap)
    return logits, cache
