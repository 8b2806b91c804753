"""Constrained decoding in the engine (runtime/grammar.py, the fused tail's token mask): on the tiny
BPE model, whose random weights would never write JSON unaided, every constrained answer matches its
grammar; the device's masked argmax picks what the host's masked argmax picks; batching, pipelining
and graph replay change no token of a mix of constrained and free requests; a grammar that cannot
finish ends at max_tokens; bad grammars are refused naming what is wrong."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from llmplan.core.devices import local_cpu
from llmplan.models.model import open_model
from llmplan.plans.compile import compile_model
from llmplan.runtime import grammar
from llmplan.runtime.engine import Engine
from llmplan.runtime.requests import Request, SamplingParams
from llmplan.runtime.trace import MASKS, Trace

from conftest import TINY_BPE

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "size": {"enum": ["small", "large"]},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["ok", "size", "n"], "additionalProperties": False}
PROMPTS = ["Once upon a time", "The answer is", "JSON please:", "In a land far away"]


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("constrained") / "bpe.plan")
    compile_model(open_model(TINY_BPE), local_cpu(), path, ctx=256, chunk=32, max_seqs=4)
    return path


@pytest.fixture(scope="module")
def engine(plan) -> Engine:
    return Engine.load(plan)


def _json(max_tokens: int = 40, params: SamplingParams = SamplingParams(), **kw) -> dict:
    return dict(max_tokens=max_tokens, params=params, grammar=grammar.json_schema(SCHEMA), **kw)


def test_json_schema_outputs_validate_greedy_and_sampled(engine):
    requests = [Request(p, **_json()) for p in PROMPTS[:2]]
    requests += [Request(p, **_json(params=SamplingParams(temperature=1.0, seed=s))) for s, p in enumerate(PROMPTS)]
    for r in engine.run(requests):
        assert r.finish_reason == "stop", r
        jsonschema.validate(json.loads(r.text), SCHEMA)
    records = list(engine.records)
    assert sum(r["masked_rows"] for r in records) > 0 and all(r["mask_s"] >= 0 for r in records)


def test_device_mask_picks_what_the_host_mask_picks(engine):
    """Greedy constrained tokens from the fused tail's masked argmax (next_token) and from the host's
    masked argmax over the logits row (asking for logprobs forces the logits path)."""
    device = engine.run([Request(p, **_json()) for p in PROMPTS])
    host = engine.run([Request(p, **_json(), logprobs=0) for p in PROMPTS])
    assert [r.ids for r in device] == [r.ids for r in host]
    assert all(r.finish_reason == "stop" for r in device)


def test_a_plan_whose_tail_takes_no_mask_picks_on_the_host(plan, engine):
    """As for a plan whose tail the passes could not fuse: every constrained token from the logits row."""
    unfused = Engine.load(plan)
    unfused._masked_tail = False
    got = unfused.run([Request(p, **_json()) for p in PROMPTS])
    assert [r.ids for r in got] == [r.ids for r in engine.run([Request(p, **_json()) for p in PROMPTS])]
    assert sum(r["masked_rows"] for r in unfused.records) == sum(len(r.ids) for r in got)


@pytest.mark.parametrize("pipelined", [False, True])
def test_a_mixed_batch_gives_each_request_what_it_gets_alone(plan, pipelined):
    def mixed():
        return [Request(p, **_json()) if i % 2 == 0 else Request(p, 24) for i, p in enumerate(PROMPTS)]

    alone = Engine.load(plan, max_seqs=1, pipelined=False)
    want = [alone.run([r])[0].ids for r in mixed()]
    batched = Engine.load(plan, pipelined=pipelined)
    got = batched.run(mixed())
    assert [r.ids for r in got] == want
    assert max(r["decode_rows"] for r in batched.records) == 4
    assert any(r["pipelined"] for r in batched.records) == pipelined
    # the decode buckets with masks replay as two recorded graphs: the layers, then the tail
    split = [b for key, b in batched.executor.buckets.items() if key[-1] == ("mask",) and b.graphs]
    assert split and all(len(b.graphs) == 2 and b.steps for b in split)


def test_a_grammar_that_cannot_finish_ends_at_max_tokens(engine):
    g = grammar.lark_or_gbnf('root ::= "a" root | "b"')
    (r,) = engine.run([Request("Once", 5, grammar=g, params=SamplingParams())])
    assert r.finish_reason in ("length", "stop") and set(r.text) <= {"a", "b"}
    long = grammar.json_schema({"type": "object", "properties": {"s": {"type": "string", "minLength": 50}},
                                "required": ["s"]})
    (r,) = engine.run([Request("Once", 6, grammar=long)])
    assert r.finish_reason == "length" and len(r.ids) == 6 and r.text.startswith('{"s":"')


def test_gbnf_and_lark_grammars(engine):
    gbnf = grammar.lark_or_gbnf('root ::= ("yes" | "no") "!"')
    lark = grammar.lark_or_gbnf('start: NUM "," NUM\nNUM: /[0-9]{1,3}/')
    a, b = engine.run([Request("Well", 10, grammar=gbnf), Request("Well", 12, grammar=lark)])
    assert a.finish_reason == "stop" and a.text in ("yes!", "no!")
    assert b.finish_reason in ("stop", "length")
    head, _, tail = b.text.partition(",")
    assert head.isdigit() and (tail.isdigit() or b.finish_reason == "length")


@pytest.mark.parametrize("make,what", [
    (lambda: grammar.json_schema({"type": "nonsense"}), "response_format.json_schema.schema: Invalid type"),
    (lambda: grammar.json_schema([1, 2]), "must be a JSON Schema object"),
    (lambda: grammar.json_schema({"$ref": "#/nowhere"}), "does not exist"),
    (lambda: grammar.lark_or_gbnf("root ::= missing"), "grammar: not a valid Lark or GBNF grammar: Rule 'missing'"),
    (lambda: grammar.lark_or_gbnf("start: ("), "grammar: "),
    (lambda: grammar.lark_or_gbnf(""), "must be a non-empty Lark or GBNF grammar"),
])
def test_bad_grammars_name_what_is_wrong(make, what):
    with pytest.raises(grammar.GrammarError, match=None) as e:
        make()
    assert what in str(e.value)


def test_late_state_is_made_after_the_launches_that_do_not_read_it(engine, monkeypatch):
    """The executor queues every launch before the tail, then calls make(), then the tail; a later step
    that gives no mask finds the default (every token) back in the slot."""
    ex = engine.executor
    monkeypatch.setattr(ex, "replay", False)  # launch by launch (the cpu driver records a bucket at once)
    ids = engine.tokenizer.encode("Once upon a time")
    pages = np.zeros((1, ex.phases["decode"].dims["pages"]), np.int32)
    state = {"tokens": np.array([ids[-1]], np.int32), "pos": np.array([len(ids) - 1], np.int32),
             "seq": np.zeros(1, np.int32), "pages": pages}
    free = int(ex.run("decode", state, {"next_token"})["next_token"][0])
    launched: list[str] = []
    real = ex.driver.launch
    ex.driver.launch = lambda call: (launched.append(call.op), real(call))[1]
    words = engine.grammars.words
    only = (free + 1) % engine.tokenizer.n_tokens
    mask = np.zeros((1, words), np.int32)
    mask[0, only // 32] = 1 << (only % 32)
    made_after: list[list[str]] = []
    try:
        out = ex.run("decode", state, {"next_token"},
                     late={"mask": lambda: (made_after.append(list(launched)), mask)[1]})
    finally:
        ex.driver.launch = real
    assert int(out["next_token"][0]) == only
    assert made_after == [launched[:launched.index("tail_argmax")]] and launched[-1] == "tail_argmax"
    assert int(ex.run("decode", state, {"next_token"})["next_token"][0]) == free  # the default is back


def test_a_trace_shows_each_steps_masks(plan, tmp_path):
    trace = Trace()
    engine = Engine.load(plan, trace=trace)
    (r,) = engine.run([Request("Once", **_json())])
    trace.write(str(tmp_path / "t.json"))
    masks = [e for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"]
             if e["tid"] == MASKS and e["ph"] == "X"]
    assert len(masks) == len(r.ids) and r.finish_reason == "stop"  # each token was chosen under its step's mask
    assert all(e["name"] == "masks" and e["args"]["rows"] == 1 for e in masks)
