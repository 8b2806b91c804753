"""IR core: types, the op registry, tracing, printing/parsing, and the verifier's rejections of
hand-made broken graphs, each naming the node."""

import pytest

from llmplan.ir.errors import IRTypeError, ParseError, VerifyError
from llmplan.ir.graph import Graph, Value, make_node
from llmplan.ir.ops import REGISTRY
from llmplan.ir.parser import parse_graph
from llmplan.ir.printer import print_graph
from llmplan.ir.trace import Tracer
from llmplan.ir.types import Type, parse_type
from llmplan.ir.verify import verify

F32_ROW = Type("f32", ("rows", 64))
CACHE = Type("f16", (1, 2, "blocks", 16, 32))
W = {"w.q": Type("q8_0", (64, 64)), "w.n": Type("f32", (64,)), "w.k": Type("q4_k", (32, 256))}


def small_graph() -> Graph:
    nn = Tracer("t", "prefill", W, CACHE, 64)
    x = nn.embed(nn.weight("w.q"), nn.tokens)
    h = nn.rmsnorm(x, nn.weight("w.n"), eps=1e-5)
    y = nn.add(nn.matmul(h, nn.weight("w.q")), x)
    return nn.finish(out=nn.last_rows(y), cache=nn.cache)


TEXT = """graph t.prefill(%tokens: i32[rows], %pos: i32[rows], %seq: i32[rows], %pages: i32[seqs, pages], %last: i32[seqs], %cache: f16[1, 2, blocks, 16, 32]) {
  @w.q : q8_0[64, 64]
  %0 = embed @w.q, %tokens : f32[rows, 64]
  @w.n : f32[64]
  %1 = rmsnorm[eps=1e-05] %0, @w.n : f32[rows, 64]
  %2 = pack[format=q8_0] %1 : q8_0[rows, 64]
  %3 = matmul %2, @w.q : f32[rows, 64]
  %4 = add %3, %0 : f32[rows, 64]
  %5 = take_rows %4, %last : f32[seqs, 64]
  return out=%5, cache=%cache
}
"""


def test_printed_form():
    assert print_graph(verify(small_graph())) == TEXT


def test_round_trip():
    g = parse_graph(TEXT)
    assert print_graph(verify(g)) == TEXT


def test_types():
    assert str(parse_type("f16[1, 2, blocks, 16, 32]")) == "f16[1, 2, blocks, 16, 32]"
    assert parse_type("i32[rows]").shape == ("rows",)
    with pytest.raises(ValueError):
        parse_type("f32")


def test_tracer_rejects_bad_ops_at_the_call():
    nn = Tracer("t", "decode", W, CACHE, 64)
    x = nn.embed(nn.weight("w.q"), nn.tokens)
    with pytest.raises(IRTypeError, match="q8_k blocks of 256 do not divide the rows of f32\\[1, 64\\]"):
        nn.matmul(x, nn.weight("w.k"))
    with pytest.raises(IRTypeError, match="rmsnorm attributes: missing \\['eps'\\]"):
        nn.rmsnorm(x, nn.weight("w.n"))
    with pytest.raises(IRTypeError, match="eps=1 must be float"):
        nn.rmsnorm(x, nn.weight("w.n"), eps=1)
    with pytest.raises(KeyError, match="no tensor nope"):
        nn.weight("nope")
    other = Tracer("u", "decode", W, CACHE, 64)
    with pytest.raises(TypeError, match="not a value of this trace"):
        nn.add(x, other.embed(other.weight("w.q"), other.tokens))


def test_pack_is_shared_per_value_and_format():
    nn = Tracer("t", "decode", W, CACHE, 64)
    x = nn.embed(nn.weight("w.q"), nn.tokens)
    nn.matmul(x, nn.weight("w.q"))
    nn.matmul(x, nn.weight("w.q"))
    g = nn.finish(cache=nn.cache)
    assert g.op_counts() == {"embed": 1, "matmul": 2, "pack": 1}


def _nodes(g: Graph):
    return list(g.order)


def test_verifier_dangling_use():
    g = parse_graph(TEXT)
    nodes = _nodes(g)
    add = next(n for n in nodes if n.op == "add")
    broken = [make_node(n.id, n.op, [Value(99)] + list(n.operands[1:]), n.attr, n.types) if n is add else n
              for n in nodes]
    with pytest.raises(VerifyError, match=r"node \d+ \(add\) uses value of node 99, which is not in the graph"):
        verify(Graph("t", broken, g.outputs))


def test_verifier_type_mismatch_names_the_node():
    bad = TEXT.replace("%4 = add %3, %0 : f32[rows, 64]", "%4 = add %3, %0 : f32[rows, 32]")
    with pytest.raises(VerifyError, match=r"%4 = add %3, %0 : f32\[rows, 32\]: result type should be f32\[rows, 64\]"):
        verify(parse_graph(bad))
    bad = TEXT.replace("%3 = matmul %2, @w.q", "%3 = matmul %1, @w.q")
    with pytest.raises(VerifyError, match=r"%3 = matmul %1, @w.q .*must be q8_0"):
        verify(parse_graph(bad))


def test_verifier_cycle():
    g = parse_graph(TEXT)
    nodes = _nodes(g)
    norm = next(n for n in nodes if n.op == "rmsnorm")
    add = next(n for n in nodes if n.op == "add")
    broken = [make_node(n.id, n.op, [add.out, n.operands[1]], n.attr, n.types) if n is norm else n for n in nodes]
    with pytest.raises(VerifyError, match="cycle add#12 -> rmsnorm#9 -> pack#10 -> matmul#11"):
        verify(Graph("t", broken, g.outputs))


def test_verifier_duplicate_weight_and_missing_output():
    g = parse_graph(TEXT)
    nodes = _nodes(g)
    dup = make_node(100, "weight", [], {"name": "w.n"}, [Type("f32", (64,))])
    with pytest.raises(VerifyError, match="weight 'w.n' is declared twice"):
        verify(Graph("t", nodes + [dup], g.outputs))
    with pytest.raises(VerifyError, match="output out is not a value"):
        verify(Graph("t", nodes, [("out", Value(5, 3))]))


@pytest.mark.parametrize("text,message", [
    ("nonsense", "line 1: expected 'graph"),
    (TEXT.replace("%2 = pack", "%2 = frobnicate"), "line 6: unknown op 'frobnicate'"),
    (TEXT.replace("add %3, %0", "add %3, %9"), "line 8: %9 is not defined"),
    (TEXT.replace("  return out=%5, cache=%cache\n", ""), "no return line"),
])
def test_parse_errors(text, message):
    with pytest.raises(ParseError, match=message):
        parse_graph(text)


def test_every_op_has_a_docstring():
    for name, op in REGISTRY.items():
        assert op.doc, name
