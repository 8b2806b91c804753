"""fuse-tail: final norm, output head and argmax in one op, so greedy decoding brings one int32 per
sequence back from the device instead of a row of logits.

    %p = rmsnorm_pack[eps, format] %x, @output_norm.weight
    %l = matmul %p, @output.weight        (-> the graph's logits, possibly through softcap)
 => also %t = tail_argmax[eps, format] %x, @output_norm.weight, @output.weight, %mask   (output next_token)

The argmax is over the tokens a new graph input, `mask` (i32 [rows, ceil(vocab / 32)], one bit per
token), allows: a constrained request (a JSON schema, a grammar) gets its next token from the device
like a greedy one, and a free row's mask allows everything. The logits path stays: sampling needs
the whole row. Softcapping is monotonic, so it does not change the argmax and is left out of the
fused op.
"""

from __future__ import annotations

from llmplan.core.numerics import mask_words
from llmplan.ir.graph import Graph
from llmplan.ir.types import Type

from .rewrite import Rewriter

NAME = "fuse-tail"


def run(g: Graph) -> tuple[Graph, list[str]]:
    rw = Rewriter(g, NAME)
    logits = rw.producer(g.output("logits"))
    if logits.op == "softcap":
        logits = rw.producer(logits.operands[0])
    norm = rw.producer(logits.operands[0]) if logits.op == "matmul" else None
    if norm is None or norm.op != "rmsnorm_pack":
        rw.decline("the tail", "the logits do not come from a packed final norm and a projection")
        return rw.finish(), rw.declines
    rows, vocab = rw.type_of(logits.out).shape
    mask = rw.input("mask", Type("i32", (rows, mask_words(vocab))), logits)
    tail = rw.emit("tail_argmax", [*norm.operands, logits.operands[1], mask.out], logits, **norm.attr)
    rw.add_output("next_token", tail.out)
    return rw.finish(), rw.declines
