"""fuse-rope-kv: rotary embedding of queries and keys and the K/V cache write become one op (with the
per-head query/key norms first, where the architecture has them).

    %qr = rope[...] %q, %pos [, %factors]
    %kr = rope[...] %k, %pos [, %factors]
    %c1 = kv_store[layer] %c0, %kr, %v, %seq, %pages, %pos
 => %qr, %c1 = rope_kv[...] %q, %k, %v, %pos, %seq, %pages, %c0 [, %factors]

and with %q = rmsnorm %q0, @q_norm and %k = rmsnorm %k0, @k_norm before the ropes (Gemma 3, Qwen3):
 => %qr, %c1 = norm_rope_kv[..., eps] %q0, %k0, %v, %pos, %seq, %pages, %c0, @q_norm, @k_norm

and where q, k and v each come from a bias_add of their projection's bias (Qwen2), the biases go in
too, added where the values are read:
 => %qr, %c1 = rope_kv[..., bias=true] %q0, %k0, %v0, %pos, %seq, %pages, %c0 [, %factors], @bq, @bk, @bv

Declined when the two ropes disagree on anything but their head count, an intermediate value has
another reader, or some of q, k and v carry a bias and others not.
"""

from __future__ import annotations

from llmplan.ir.graph import Graph, Node, Value

from .rewrite import Rewriter

NAME = "fuse-rope-kv"
_SHARED = ("dims", "base", "scale", "mode", "mscale")


def _q_rope(rw: Rewriter, store: Node) -> Node | None:
    """The query rope feeding the attention that reads this store's cache."""
    for u in rw.users(store.out):
        if u.op in ("attention", "attention_partial"):
            q = rw.producer(u.operands[0])
            return q if q.op == "rope" else None
    return None


def _bias(rw: Rewriter, v: Value, user: str) -> Node | None:
    """The bias_add that makes `v`, when `user` is its only reader."""
    add = rw.producer(v)
    return add if add.op == "bias_add" and rw.only_user(v, user) else None


def run(g: Graph) -> tuple[Graph, list[str]]:
    rw = Rewriter(g, NAME)
    for store in g.order:
        if store.op != "kv_store":
            continue
        cache, kr, v, seq, pages, pos = store.operands
        k_rope, q_rope = rw.producer(kr), _q_rope(rw, store)
        where = rw.layer(store)
        if k_rope.op != "rope" or q_rope is None:
            rw.decline(where, "keys or queries reach the cache without a rope")
            continue
        if any(k_rope.attr[a] != q_rope.attr[a] for a in _SHARED) or k_rope.operands[1:] != q_rope.operands[1:]:
            rw.decline(where, "query and key ropes differ")
            continue
        if rw.only_user(kr, "kv_store") is None or len(rw.users(q_rope.out)) != 1:
            rw.decline(where, "a roped query or key has another reader")
            continue
        if q_rope.operands[1] != pos:
            rw.decline(where, "the ropes and the cache write use different positions")
            continue
        attrs = {a: q_rope.attr[a] for a in _SHARED} | {"heads": q_rope.attr["heads"],
                                                          "kv_heads": k_rope.attr["heads"], "layer": store.attr["layer"]}
        q, k = q_rope.operands[0], k_rope.operands[0]
        qn, kn = rw.producer(q), rw.producer(k)
        pattern = [q_rope, k_rope, store]
        normed = (qn.op == kn.op == "rmsnorm" and qn.attr == kn.attr and rw.only_user(q, "rope")
                  and rw.only_user(k, "rope"))
        if normed:
            q, k = qn.operands[0], kn.operands[0]
            pattern += [qn, kn]
        adds = [_bias(rw, x, user) for x, user in ((q, "rmsnorm" if normed else "rope"),
                                                    (k, "rmsnorm" if normed else "rope"), (v, "kv_store"))]
        if any(adds) and not all(adds):
            rw.decline(where, "some of q, k and v add a bias and others not")
            continue
        biases = []
        if all(adds):
            (q, bq), (k, bk), (v, bv) = ((a.operands[0], a.operands[1]) for a in adds)
            pattern += adds
            biases = [bq, bk, bv]
            attrs["bias"] = True
        if normed:
            operands = [q, k, v, pos, seq, pages, cache, qn.operands[1], kn.operands[1], *biases]
            fused = rw.emit("norm_rope_kv", operands, qn, eps=qn.attr["eps"], **attrs)
        else:
            fused = rw.emit("rope_kv", [q, k, v, pos, seq, pages, cache, *q_rope.operands[2:], *biases], q_rope,
                            **attrs)
        rw.replace(q_rope.out, fused.out)
        rw.replace(store.out, Value(fused.id, 1))
        rw.drop(*pattern)
    return rw.finish(), rw.declines
