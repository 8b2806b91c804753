"""Every pass on small hand-written graphs: the printed graph before, the printed graph after, the
declines; and the interpreter gives bit-identical results on both (each fused op means exactly the
composition it replaces)."""

import numpy as np
import pytest

from llmplan.ir.interpret import Interpreter
from llmplan.ir.parser import parse_graph
from llmplan.ir.printer import print_graph
from llmplan.ir.verify import verify
from llmplan.passes.manager import PASSES

BY_NAME = {p.NAME: p for p in PASSES}

CASES = [
    ('split-attention', 'split_attention',
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.w.weight : q8_0[64, 64]
  %1 = pack[format=q8_0] %0 : q8_0[1, 64]
  %2 = matmul %1, @blk.0.w.weight : f32[1, 64]
  %3 = attention[heads=2, kv_heads=1, layer=0, scale=0.25, window=0] %2, %cache, %seq, %pages, %pos : f32[1, 64]
  return o=%3, cache=%cache
}
""",
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.w.weight : q8_0[64, 64]
  %1 = pack[format=q8_0] %0 : q8_0[1, 64]
  %2 = matmul %1, @blk.0.w.weight : f32[1, 64]
  %3 = attention_partial[chunk=256, heads=2, kv_heads=1, layer=0, scale=0.25, window=0] %2, %cache, %seq, %pages, %pos : f32[1, 2, splits, 34]
  %4 = attention_reduce %3 : f32[1, 64]
  return o=%4, cache=%cache
}
""",
     []),
    ('split-attention', 'split_attention_prefill',
     """graph t.prefill(%tokens: i32[rows], %pos: i32[rows], %seq: i32[rows], %pages: i32[seqs, pages], %last: i32[seqs], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[rows, 64]
  @blk.0.w.weight : q8_0[64, 64]
  %1 = pack[format=q8_0] %0 : q8_0[rows, 64]
  %2 = matmul %1, @blk.0.w.weight : f32[rows, 64]
  %3 = attention[heads=2, kv_heads=1, layer=0, scale=0.25, window=0] %2, %cache, %seq, %pages, %pos : f32[rows, 64]
  return o=%3, cache=%cache
}
""",
     """graph t.prefill(%tokens: i32[rows], %pos: i32[rows], %seq: i32[rows], %pages: i32[seqs, pages], %last: i32[seqs], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[rows, 64]
  @blk.0.w.weight : q8_0[64, 64]
  %1 = pack[format=q8_0] %0 : q8_0[rows, 64]
  %2 = matmul %1, @blk.0.w.weight : f32[rows, 64]
  %3 = attention[heads=2, kv_heads=1, layer=0, scale=0.25, window=0] %2, %cache, %seq, %pages, %pos : f32[rows, 64]
  return o=%3, cache=%cache
}
""",
     []),
    ('fuse-norm-pack', 'norm_pack',
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.n.weight : f32[64]
  %1 = rmsnorm[eps=1e-05] %0, @blk.0.n.weight : f32[1, 64]
  @blk.0.w.weight : q8_0[64, 64]
  %2 = pack[format=q8_0] %1 : q8_0[1, 64]
  %3 = matmul %2, @blk.0.w.weight : f32[1, 64]
  return y=%3, cache=%cache
}
""",
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.n.weight : f32[64]
  %1 = rmsnorm_pack[eps=1e-05, format=q8_0] %0, @blk.0.n.weight : q8_0[1, 64]
  @blk.0.w.weight : q8_0[64, 64]
  %2 = matmul %1, @blk.0.w.weight : f32[1, 64]
  return y=%2, cache=%cache
}
""",
     []),
    ('fuse-norm-pack', 'norm_pack_declined',
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.n.weight : f32[64]
  %1 = rmsnorm[eps=1e-05] %0, @blk.0.n.weight : f32[1, 64]
  @blk.0.w.weight : q8_0[64, 64]
  %2 = pack[format=q8_0] %1 : q8_0[1, 64]
  %3 = matmul %2, @blk.0.w.weight : f32[1, 64]
  %4 = add %3, %1 : f32[1, 64]
  return y=%4, cache=%cache
}
""",
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.n.weight : f32[64]
  %1 = rmsnorm[eps=1e-05] %0, @blk.0.n.weight : f32[1, 64]
  @blk.0.w.weight : q8_0[64, 64]
  %2 = pack[format=q8_0] %1 : q8_0[1, 64]
  %3 = matmul %2, @blk.0.w.weight : f32[1, 64]
  %4 = add %3, %1 : f32[1, 64]
  return y=%4, cache=%cache
}
""",
     ['fuse-norm-pack declined at blk.0: the normed row is also read by add, pack']),
    ('fuse-qkv', 'qkv',
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @x4 : q8_0[16, 256]
  %0 = embed @x4, %tokens : f32[1, 256]
  @blk.0.attn_q.weight : q4_k[64, 256]
  %1 = pack[format=q8_k] %0 : q8_k[1, 256]
  %2 = matmul %1, @blk.0.attn_q.weight : f32[1, 64]
  @blk.0.attn_k.weight : q4_k[32, 256]
  %3 = matmul %1, @blk.0.attn_k.weight : f32[1, 32]
  @blk.0.attn_v.weight : q6_k[32, 256]
  %4 = matmul %1, @blk.0.attn_v.weight : f32[1, 32]
  return q=%2, k=%3, v=%4, cache=%cache
}
""",
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @x4 : q8_0[16, 256]
  %0 = embed @x4, %tokens : f32[1, 256]
  @blk.0.attn_q.weight : q4_k[64, 256]
  %1 = pack[format=q8_k] %0 : q8_k[1, 256]
  @blk.0.attn_k.weight : q4_k[32, 256]
  @blk.0.attn_v.weight : q6_k[32, 256]
  %2, %3, %4 = matmul_segmented %1, @blk.0.attn_q.weight, @blk.0.attn_k.weight, @blk.0.attn_v.weight : f32[1, 64], f32[1, 32], f32[1, 32]
  return q=%2, k=%3, v=%4, cache=%cache
}
""",
     []),
    ('fuse-qkv', 'qkv_declined',
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @x4 : q8_0[16, 256]
  %0 = embed @x4, %tokens : f32[1, 256]
  @blk.0.attn_q.weight : q4_k[64, 256]
  %1 = pack[format=q8_k] %0 : q8_k[1, 256]
  %2 = matmul %1, @blk.0.attn_q.weight : f32[1, 64]
  @blk.0.attn_k.weight : q4_k[32, 256]
  %3 = matmul %1, @blk.0.attn_k.weight : f32[1, 32]
  @blk.0.attn_v.weight : q8_0[32, 256]
  %4 = pack[format=q8_0] %0 : q8_0[1, 256]
  %5 = matmul %4, @blk.0.attn_v.weight : f32[1, 32]
  return q=%2, k=%3, v=%5, cache=%cache
}
""",
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @x4 : q8_0[16, 256]
  %0 = embed @x4, %tokens : f32[1, 256]
  @blk.0.attn_q.weight : q4_k[64, 256]
  %1 = pack[format=q8_k] %0 : q8_k[1, 256]
  %2 = matmul %1, @blk.0.attn_q.weight : f32[1, 64]
  @blk.0.attn_k.weight : q4_k[32, 256]
  %3 = matmul %1, @blk.0.attn_k.weight : f32[1, 32]
  @blk.0.attn_v.weight : q8_0[32, 256]
  %4 = pack[format=q8_0] %0 : q8_0[1, 256]
  %5 = matmul %4, @blk.0.attn_v.weight : f32[1, 32]
  return q=%2, k=%3, v=%5, cache=%cache
}
""",
     ['fuse-qkv declined at blk.0: the projections read activations packed differently (q8_k/q8_k/q8_0): their weight formats take different dot products']),
    ('fuse-gate-up', 'gate_up',
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.ffn_gate.weight : q8_0[96, 64]
  %1 = pack[format=q8_0] %0 : q8_0[1, 64]
  %2 = matmul %1, @blk.0.ffn_gate.weight : f32[1, 96]
  %3 = silu %2 : f32[1, 96]
  @blk.0.ffn_up.weight : q4_0[96, 64]
  %4 = matmul %1, @blk.0.ffn_up.weight : f32[1, 96]
  %5 = mul %3, %4 : f32[1, 96]
  return y=%5, cache=%cache
}
""",
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.ffn_gate.weight : q8_0[96, 64]
  %1 = pack[format=q8_0] %0 : q8_0[1, 64]
  @blk.0.ffn_up.weight : q4_0[96, 64]
  %2, %3 = matmul_segmented %1, @blk.0.ffn_gate.weight, @blk.0.ffn_up.weight : f32[1, 96], f32[1, 96]
  %4 = silu %2 : f32[1, 96]
  %5 = mul %4, %3 : f32[1, 96]
  return y=%5, cache=%cache
}
""",
     []),
    ('fuse-gate-up', 'gate_up_declined',
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.ffn_gate.weight : q8_0[96, 64]
  %1 = pack[format=q8_0] %0 : q8_0[1, 64]
  %2 = matmul %1, @blk.0.ffn_gate.weight : f32[1, 96]
  %3 = silu %2 : f32[1, 96]
  @blk.0.ffn_up.weight : q4_1[96, 64]
  %4 = pack[format=q8_1] %0 : q8_1[1, 64]
  %5 = matmul %4, @blk.0.ffn_up.weight : f32[1, 96]
  %6 = mul %3, %5 : f32[1, 96]
  return y=%6, cache=%cache
}
""",
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.ffn_gate.weight : q8_0[96, 64]
  %1 = pack[format=q8_0] %0 : q8_0[1, 64]
  %2 = matmul %1, @blk.0.ffn_gate.weight : f32[1, 96]
  %3 = silu %2 : f32[1, 96]
  @blk.0.ffn_up.weight : q4_1[96, 64]
  %4 = pack[format=q8_1] %0 : q8_1[1, 64]
  %5 = matmul %4, @blk.0.ffn_up.weight : f32[1, 96]
  %6 = mul %3, %5 : f32[1, 96]
  return y=%6, cache=%cache
}
""",
     ['fuse-gate-up declined at blk.0: the projections read activations packed differently (q8_0/q8_1): their weight formats take different dot products']),
    ('fuse-rope-kv', 'rope_kv',
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.w.weight : q8_0[64, 64]
  %1 = pack[format=q8_0] %0 : q8_0[1, 64]
  %2 = matmul %1, @blk.0.w.weight : f32[1, 64]
  @blk.0.wk.weight : q8_0[32, 64]
  %3 = matmul %1, @blk.0.wk.weight : f32[1, 32]
  @blk.0.wv.weight : q8_0[32, 64]
  %4 = matmul %1, @blk.0.wv.weight : f32[1, 32]
  %5 = rope[base=10000.0, dims=16, heads=4, mode=neox, scale=1.0] %2, %pos : f32[1, 64]
  %6 = rope[base=10000.0, dims=16, heads=2, mode=neox, scale=1.0] %3, %pos : f32[1, 32]
  %7 = kv_store[layer=0] %cache, %6, %4, %seq, %pages, %pos : f16[1, 2, blocks, 16, 32]
  %8 = attention[heads=4, kv_heads=2, layer=0, scale=0.25, window=0] %5, %7, %seq, %pages, %pos : f32[1, 64]
  return o=%8, cache=%7
}
""",
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.w.weight : q8_0[64, 64]
  %1 = pack[format=q8_0] %0 : q8_0[1, 64]
  %2 = matmul %1, @blk.0.w.weight : f32[1, 64]
  @blk.0.wk.weight : q8_0[32, 64]
  %3 = matmul %1, @blk.0.wk.weight : f32[1, 32]
  @blk.0.wv.weight : q8_0[32, 64]
  %4 = matmul %1, @blk.0.wv.weight : f32[1, 32]
  %5, %6 = rope_kv[base=10000.0, dims=16, heads=4, kv_heads=2, layer=0, mode=neox, scale=1.0] %2, %3, %4, %pos, %seq, %pages, %cache : f32[1, 64], f16[1, 2, blocks, 16, 32]
  %7 = attention[heads=4, kv_heads=2, layer=0, scale=0.25, window=0] %5, %6, %seq, %pages, %pos : f32[1, 64]
  return o=%7, cache=%6
}
""",
     []),
    ('fuse-rope-kv', 'norm_rope_kv',
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.w.weight : q8_0[64, 64]
  %1 = pack[format=q8_0] %0 : q8_0[1, 64]
  %2 = matmul %1, @blk.0.w.weight : f32[1, 64]
  @blk.0.wk.weight : q8_0[32, 64]
  %3 = matmul %1, @blk.0.wk.weight : f32[1, 32]
  @blk.0.wv.weight : q8_0[32, 64]
  %4 = matmul %1, @blk.0.wv.weight : f32[1, 32]
  @blk.0.qn.weight : f32[16]
  %5 = rmsnorm[eps=1e-06] %2, @blk.0.qn.weight : f32[1, 64]
  @blk.0.kn.weight : f32[16]
  %6 = rmsnorm[eps=1e-06] %3, @blk.0.kn.weight : f32[1, 32]
  %7 = rope[base=10000.0, dims=16, heads=4, mode=neox, scale=1.0] %5, %pos : f32[1, 64]
  %8 = rope[base=10000.0, dims=16, heads=2, mode=neox, scale=1.0] %6, %pos : f32[1, 32]
  %9 = kv_store[layer=0] %cache, %8, %4, %seq, %pages, %pos : f16[1, 2, blocks, 16, 32]
  %10 = attention[heads=4, kv_heads=2, layer=0, scale=0.25, window=0] %7, %9, %seq, %pages, %pos : f32[1, 64]
  return o=%10, cache=%9
}
""",
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.w.weight : q8_0[64, 64]
  %1 = pack[format=q8_0] %0 : q8_0[1, 64]
  %2 = matmul %1, @blk.0.w.weight : f32[1, 64]
  @blk.0.wk.weight : q8_0[32, 64]
  %3 = matmul %1, @blk.0.wk.weight : f32[1, 32]
  @blk.0.wv.weight : q8_0[32, 64]
  %4 = matmul %1, @blk.0.wv.weight : f32[1, 32]
  @blk.0.qn.weight : f32[16]
  @blk.0.kn.weight : f32[16]
  %5, %6 = norm_rope_kv[base=10000.0, dims=16, eps=1e-06, heads=4, kv_heads=2, layer=0, mode=neox, scale=1.0] %2, %3, %4, %pos, %seq, %pages, %cache, @blk.0.qn.weight, @blk.0.kn.weight : f32[1, 64], f16[1, 2, blocks, 16, 32]
  %7 = attention[heads=4, kv_heads=2, layer=0, scale=0.25, window=0] %5, %6, %seq, %pages, %pos : f32[1, 64]
  return o=%7, cache=%6
}
""",
     []),
    ('fuse-rope-kv', 'rope_kv_declined',
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.w.weight : q8_0[64, 64]
  %1 = pack[format=q8_0] %0 : q8_0[1, 64]
  %2 = matmul %1, @blk.0.w.weight : f32[1, 64]
  @blk.0.wk.weight : q8_0[32, 64]
  %3 = matmul %1, @blk.0.wk.weight : f32[1, 32]
  @blk.0.wv.weight : q8_0[32, 64]
  %4 = matmul %1, @blk.0.wv.weight : f32[1, 32]
  %5 = rope[base=10000.0, dims=16, heads=4, mode=neox, scale=1.0] %2, %pos : f32[1, 64]
  %6 = rope[base=20000.0, dims=16, heads=2, mode=neox, scale=1.0] %3, %pos : f32[1, 32]
  %7 = kv_store[layer=0] %cache, %6, %4, %seq, %pages, %pos : f16[1, 2, blocks, 16, 32]
  %8 = attention[heads=4, kv_heads=2, layer=0, scale=0.25, window=0] %5, %7, %seq, %pages, %pos : f32[1, 64]
  return o=%8, cache=%7
}
""",
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.w.weight : q8_0[64, 64]
  %1 = pack[format=q8_0] %0 : q8_0[1, 64]
  %2 = matmul %1, @blk.0.w.weight : f32[1, 64]
  @blk.0.wk.weight : q8_0[32, 64]
  %3 = matmul %1, @blk.0.wk.weight : f32[1, 32]
  @blk.0.wv.weight : q8_0[32, 64]
  %4 = matmul %1, @blk.0.wv.weight : f32[1, 32]
  %5 = rope[base=10000.0, dims=16, heads=4, mode=neox, scale=1.0] %2, %pos : f32[1, 64]
  %6 = rope[base=20000.0, dims=16, heads=2, mode=neox, scale=1.0] %3, %pos : f32[1, 32]
  %7 = kv_store[layer=0] %cache, %6, %4, %seq, %pages, %pos : f16[1, 2, blocks, 16, 32]
  %8 = attention[heads=4, kv_heads=2, layer=0, scale=0.25, window=0] %5, %7, %seq, %pages, %pos : f32[1, 64]
  return o=%8, cache=%7
}
""",
     ['fuse-rope-kv declined at blk.0: query and key ropes differ']),
    ('fuse-attn-reduce-pack', 'attn_reduce_pack',
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.w.weight : q8_0[64, 64]
  %1 = pack[format=q8_0] %0 : q8_0[1, 64]
  %2 = matmul %1, @blk.0.w.weight : f32[1, 64]
  %3 = attention_partial[chunk=256, heads=2, kv_heads=1, layer=0, scale=0.25, window=0] %2, %cache, %seq, %pages, %pos : f32[1, 2, splits, 34]
  %4 = attention_reduce %3 : f32[1, 64]
  %5 = pack[format=q8_0] %4 : q8_0[1, 64]
  %6 = matmul %5, @blk.0.w.weight : f32[1, 64]
  return y=%6, cache=%cache
}
""",
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.w.weight : q8_0[64, 64]
  %1 = pack[format=q8_0] %0 : q8_0[1, 64]
  %2 = matmul %1, @blk.0.w.weight : f32[1, 64]
  %3 = attention_partial[chunk=256, heads=2, kv_heads=1, layer=0, scale=0.25, window=0] %2, %cache, %seq, %pages, %pos : f32[1, 2, splits, 34]
  %4 = attention_reduce_pack[format=q8_0] %3 : q8_0[1, 64]
  %5 = matmul %4, @blk.0.w.weight : f32[1, 64]
  return y=%5, cache=%cache
}
""",
     []),
    ('fuse-attn-reduce-pack', 'attn_reduce_pack_declined',
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.w.weight : q8_0[64, 64]
  %1 = pack[format=q8_0] %0 : q8_0[1, 64]
  %2 = matmul %1, @blk.0.w.weight : f32[1, 64]
  %3 = attention_partial[chunk=256, heads=2, kv_heads=1, layer=0, scale=0.25, window=0] %2, %cache, %seq, %pages, %pos : f32[1, 2, splits, 34]
  %4 = attention_reduce %3 : f32[1, 64]
  %5 = pack[format=q8_0] %4 : q8_0[1, 64]
  %6 = matmul %5, @blk.0.w.weight : f32[1, 64]
  %7 = add %6, %4 : f32[1, 64]
  return y=%7, cache=%cache
}
""",
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.w.weight : q8_0[64, 64]
  %1 = pack[format=q8_0] %0 : q8_0[1, 64]
  %2 = matmul %1, @blk.0.w.weight : f32[1, 64]
  %3 = attention_partial[chunk=256, heads=2, kv_heads=1, layer=0, scale=0.25, window=0] %2, %cache, %seq, %pages, %pos : f32[1, 2, splits, 34]
  %4 = attention_reduce %3 : f32[1, 64]
  %5 = pack[format=q8_0] %4 : q8_0[1, 64]
  %6 = matmul %5, @blk.0.w.weight : f32[1, 64]
  %7 = add %6, %4 : f32[1, 64]
  return y=%7, cache=%cache
}
""",
     ['fuse-attn-reduce-pack declined at blk.0: the attention output is read unpacked']),
    ('fuse-glu-pack', 'glu_pack',
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.ffn_gate.weight : q8_0[96, 64]
  %1 = pack[format=q8_0] %0 : q8_0[1, 64]
  %2 = matmul %1, @blk.0.ffn_gate.weight : f32[1, 96]
  @blk.0.ffn_up.weight : q8_0[96, 64]
  %3 = matmul %1, @blk.0.ffn_up.weight : f32[1, 96]
  %4 = gelu_tanh %2 : f32[1, 96]
  %5 = mul %4, %3 : f32[1, 96]
  @blk.0.ffn_down.weight : q8_0[64, 96]
  %6 = pack[format=q8_0] %5 : q8_0[1, 96]
  %7 = matmul %6, @blk.0.ffn_down.weight : f32[1, 64]
  return y=%7, cache=%cache
}
""",
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.ffn_gate.weight : q8_0[96, 64]
  %1 = pack[format=q8_0] %0 : q8_0[1, 64]
  %2 = matmul %1, @blk.0.ffn_gate.weight : f32[1, 96]
  @blk.0.ffn_up.weight : q8_0[96, 64]
  %3 = matmul %1, @blk.0.ffn_up.weight : f32[1, 96]
  %4 = glu_pack[act=gelu_tanh, format=q8_0] %2, %3 : q8_0[1, 96]
  @blk.0.ffn_down.weight : q8_0[64, 96]
  %5 = matmul %4, @blk.0.ffn_down.weight : f32[1, 64]
  return y=%5, cache=%cache
}
""",
     []),
    ('fuse-glu-pack', 'glu_pack_declined',
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.ffn_gate.weight : q8_0[96, 64]
  %1 = pack[format=q8_0] %0 : q8_0[1, 64]
  %2 = matmul %1, @blk.0.ffn_gate.weight : f32[1, 96]
  @blk.0.ffn_up.weight : q8_0[96, 64]
  %3 = matmul %1, @blk.0.ffn_up.weight : f32[1, 96]
  %4 = gelu_tanh %2 : f32[1, 96]
  %5 = mul %4, %3 : f32[1, 96]
  @blk.0.ffn_down.weight : q8_0[64, 96]
  %6 = pack[format=q8_0] %5 : q8_0[1, 96]
  %7 = matmul %6, @blk.0.ffn_down.weight : f32[1, 64]
  return y=%7, m=%5, cache=%cache
}
""",
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.ffn_gate.weight : q8_0[96, 64]
  %1 = pack[format=q8_0] %0 : q8_0[1, 64]
  %2 = matmul %1, @blk.0.ffn_gate.weight : f32[1, 96]
  @blk.0.ffn_up.weight : q8_0[96, 64]
  %3 = matmul %1, @blk.0.ffn_up.weight : f32[1, 96]
  %4 = gelu_tanh %2 : f32[1, 96]
  %5 = mul %4, %3 : f32[1, 96]
  @blk.0.ffn_down.weight : q8_0[64, 96]
  %6 = pack[format=q8_0] %5 : q8_0[1, 96]
  %7 = matmul %6, @blk.0.ffn_down.weight : f32[1, 64]
  return y=%7, m=%5, cache=%cache
}
""",
     ['fuse-glu-pack declined at blk.0: the gelu_tanh product is read unpacked or twice']),
    ('fuse-residual', 'residual',
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.w.weight : q8_0[64, 64]
  %1 = pack[format=q8_0] %0 : q8_0[1, 64]
  %2 = matmul %1, @blk.0.w.weight : f32[1, 64]
  %3 = add %0, %2 : f32[1, 64]
  return x=%3, cache=%cache
}
""",
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.w.weight : q8_0[64, 64]
  %1 = pack[format=q8_0] %0 : q8_0[1, 64]
  %2 = matmul_residual %1, @blk.0.w.weight, %0 : f32[1, 64]
  return x=%2, cache=%cache
}
""",
     []),
    ('fuse-residual', 'residual_declined',
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.w.weight : q8_0[64, 64]
  %1 = pack[format=q8_0] %0 : q8_0[1, 64]
  %2 = matmul %1, @blk.0.w.weight : f32[1, 64]
  @blk.0.n.weight : f32[64]
  %3 = rmsnorm[eps=1e-06] %2, @blk.0.n.weight : f32[1, 64]
  %4 = add %0, %3 : f32[1, 64]
  return x=%4, cache=%cache
}
""",
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.w.weight : q8_0[64, 64]
  %1 = pack[format=q8_0] %0 : q8_0[1, 64]
  %2 = matmul %1, @blk.0.w.weight : f32[1, 64]
  @blk.0.n.weight : f32[64]
  %3 = rmsnorm[eps=1e-06] %2, @blk.0.n.weight : f32[1, 64]
  %4 = add %0, %3 : f32[1, 64]
  return x=%4, cache=%cache
}
""",
     ['fuse-residual declined at blk.0: a norm (blk.0.n.weight) stands between the projection and the residual add']),
    ('fuse-residual', 'residual_experts',
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.ffn_gate_inp.weight : f32[4, 64]
  %1, %2 = moe_router[k=2, norm=true] %0, @blk.0.ffn_gate_inp.weight : i32[1, 2], f32[1, 2]
  %3 = pack[format=q8_0] %0 : q8_0[1, 64]
  @blk.0.ffn_down_exps.weight : q8_0[4, 64, 64]
  %4 = matmul_experts %3, @blk.0.ffn_down_exps.weight, %1 : f32[1, 128]
  %5 = moe_sum %4, %2 : f32[1, 64]
  %6 = add %0, %5 : f32[1, 64]
  return x=%6, cache=%cache
}
""",
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.ffn_gate_inp.weight : f32[4, 64]
  %1, %2 = moe_router[k=2, norm=true] %0, @blk.0.ffn_gate_inp.weight : i32[1, 2], f32[1, 2]
  %3 = pack[format=q8_0] %0 : q8_0[1, 64]
  @blk.0.ffn_down_exps.weight : q8_0[4, 64, 64]
  %4 = matmul_experts_residual %3, @blk.0.ffn_down_exps.weight, %1, %2, %0 : f32[1, 64]
  return x=%4, cache=%cache
}
""",
     []),
    ('fuse-residual', 'residual_experts_declined',
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.ffn_gate_inp.weight : f32[4, 64]
  %1, %2 = moe_router[k=2, norm=true] %0, @blk.0.ffn_gate_inp.weight : i32[1, 2], f32[1, 2]
  %3 = pack[format=q8_0] %0 : q8_0[1, 64]
  @blk.0.ffn_down_exps.weight : q8_0[4, 64, 64]
  %4 = matmul_experts %3, @blk.0.ffn_down_exps.weight, %1 : f32[1, 128]
  %5 = moe_sum %4, %2 : f32[1, 64]
  %6 = add %0, %5 : f32[1, 64]
  return x=%6, s=%5, cache=%cache
}
""",
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.ffn_gate_inp.weight : f32[4, 64]
  %1, %2 = moe_router[k=2, norm=true] %0, @blk.0.ffn_gate_inp.weight : i32[1, 2], f32[1, 2]
  %3 = pack[format=q8_0] %0 : q8_0[1, 64]
  @blk.0.ffn_down_exps.weight : q8_0[4, 64, 64]
  %4 = matmul_experts %3, @blk.0.ffn_down_exps.weight, %1 : f32[1, 128]
  %5 = moe_sum %4, %2 : f32[1, 64]
  %6 = add %0, %5 : f32[1, 64]
  return x=%6, s=%5, cache=%cache
}
""",
     ["fuse-residual declined at blk.0: the experts' outputs or their sum have another reader"]),
    ('fuse-tail', 'tail',
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @output_norm.weight : f32[64]
  %1 = rmsnorm_pack[eps=1e-05, format=q8_0] %0, @output_norm.weight : q8_0[1, 64]
  @output.weight : q8_0[16, 64]
  %2 = matmul %1, @output.weight : f32[1, 16]
  return logits=%2, cache=%cache
}
""",
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32], %mask: i32[1, 1]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @output_norm.weight : f32[64]
  %1 = rmsnorm_pack[eps=1e-05, format=q8_0] %0, @output_norm.weight : q8_0[1, 64]
  @output.weight : q8_0[16, 64]
  %2 = matmul %1, @output.weight : f32[1, 16]
  %3 = tail_argmax[eps=1e-05, format=q8_0] %0, @output_norm.weight, @output.weight, %mask : i32[1]
  return logits=%2, cache=%cache, next_token=%3
}
""",
     []),
    ('fuse-tail', 'tail_declined',
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @output_norm.weight : f32[64]
  %1 = rmsnorm[eps=1e-05] %0, @output_norm.weight : f32[1, 64]
  @output.weight : q8_0[16, 64]
  %2 = pack[format=q8_0] %1 : q8_0[1, 64]
  %3 = matmul %2, @output.weight : f32[1, 16]
  return logits=%3, cache=%cache
}
""",
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @output_norm.weight : f32[64]
  %1 = rmsnorm[eps=1e-05] %0, @output_norm.weight : f32[1, 64]
  @output.weight : q8_0[16, 64]
  %2 = pack[format=q8_0] %1 : q8_0[1, 64]
  %3 = matmul %2, @output.weight : f32[1, 16]
  return logits=%3, cache=%cache
}
""",
     ['fuse-tail declined at the tail: the logits do not come from a packed final norm and a projection']),
    ('dce', 'dce',
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  @blk.0.w.weight : q8_0[64, 64]
  %1 = pack[format=q8_0] %0 : q8_0[1, 64]
  %2 = matmul %1, @blk.0.w.weight : f32[1, 64]
  %3 = scale[factor=2.0] %0 : f32[1, 64]
  return x=%3, cache=%cache
}
""",
     """graph t.decode(%tokens: i32[1], %pos: i32[1], %seq: i32[1], %pages: i32[1, pages], %cache: f16[1, 2, blocks, 16, 32]) {
  @emb : q8_0[16, 64]
  %0 = embed @emb, %tokens : f32[1, 64]
  %1 = scale[factor=2.0] %0 : f32[1, 64]
  return x=%1, cache=%cache
}
""",
     []),
]


@pytest.mark.parametrize("name,case,before,after,declines", [(c[0], *c[1:]) for c in CASES], ids=[c[1] for c in CASES])
def test_pass_rewrites_as_written(name, case, before, after, declines):
    g = verify(parse_graph(before))
    assert print_graph(g) == before
    new, got = BY_NAME[name].run(g)
    assert print_graph(verify(new)) == after
    assert got == declines


def _inputs(g, rng):
    out = {}
    for n in g.inputs:
        t = n.types[0]
        if n.name == "cache":
            cache = rng.standard_normal((t.shape[0], 2, 6, 16, t.shape[4])).astype(np.float16)
            out[n.name] = cache
        elif n.name == "pos":
            out[n.name] = np.array([37], np.int32)
        elif n.name == "pages":
            out[n.name] = np.array([[4, 0, 2]], np.int32)  # position 37 is at block 2, offset 5
        elif n.name == "seq":
            out[n.name] = np.array([0], np.int32)
        elif n.name == "last":
            out[n.name] = np.array([1], np.int32)
        elif n.name == "mask":  # every token allowed: the fused tail's argmax is the logits'
            out[n.name] = np.full(t.shape, -1, np.int32)
        else:
            out[n.name] = np.array([3], np.int32)
    return out


REWRITES = [c for c in CASES if c[2] != c[3]]  # a declined case leaves the graph as it was


@pytest.mark.parametrize("name,case,before,after,declines", REWRITES, ids=[c[1] for c in REWRITES])
def test_pass_preserves_results_bit_for_bit(name, case, before, after, declines):
    rng = np.random.default_rng(0)
    g = parse_graph(before)
    weights = {n.name: rng.standard_normal(n.types[0].shape).astype(np.float32) for n in g.weights}
    new = parse_graph(after)
    inputs = _inputs(new, rng)  # a pass may add inputs (fuse-tail's mask)
    a = Interpreter(g, weights.__getitem__).run({k: v.copy() for k, v in inputs.items()})
    b = Interpreter(new, weights.__getitem__).run({k: v.copy() for k, v in inputs.items()})
    for key, value in a.items():
        assert np.array_equal(value, b[key]), key
    if "next_token" in b:
        assert b["next_token"].tolist() == np.argmax(a["logits"], axis=-1).tolist()
