"""The engine over the CPU backend: batching, chunked prefill across sequences, preemption and prefix
sharing change no token; cancellation loses no block; bad requests fail alone."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from llmplan.core.devices import local_cpu
from llmplan.models.model import open_model
from llmplan.plans.compile import compile_model
from llmplan.runtime.engine import Engine
from llmplan.runtime.requests import Request, RequestError, SamplingParams

from conftest import TINY_BPE, TINY_SPM
from test_arch_fixtures import DATA, MOE_NAMES, NAMES

CTX, CHUNK, SEQS = 256, 32, 4
# the architectures of issue 26 (tests/data): biases, query/key norms, fused-in-file projections, LongRoPE;
# and issue 27's qwen3moe (a row's experts' results whatever rows share them; the Mixtral-style fixture's
# longest prompt ends after 6 tokens, so its tight pool never preempts)
ARCHS = {name.split("-")[1]: DATA / f"{name}.gguf" for name in [*NAMES, MOE_NAMES[0]]}
LENGTHS = [3, 9, 17, 31, 40, 55, 70, 90]  # prompt tokens: one block or several, one prefill chunk or three
STORY = ("Once upon a time, in a land far away, there lived an old clockmaker who built a clock that ran "
         "backwards. Every morning the children of the village gathered to watch its hands, and every evening "
         "their parents argued about what it meant. ") * 6


@pytest.fixture(scope="module")
def plans(tmp_path_factory, request):
    """model name -> plan path, compiled once: small context and chunk, four sequences per step."""
    out = {}

    def get(name):
        if name not in out:
            path = ({"spm": TINY_SPM, "bpe": TINY_BPE} | ARCHS).get(name) or request.getfixturevalue("gemma3_path")
            out[name] = str(tmp_path_factory.mktemp("plans") / f"{name}.plan")
            compile_model(open_model(path), local_cpu(), out[name], ctx=CTX, chunk=CHUNK, max_seqs=SEQS)
        return out[name]

    return get


def _prompts(engine: Engine) -> list[list[int]]:
    """Eight prompts of different lengths whose first blocks differ (alone, none shares a block)."""
    return [engine.tokenizer.encode(f"{k}. {STORY}")[:n] for k, n in enumerate(LENGTHS)]


def _alone(plan: str, prompts, n: int, params=SamplingParams()) -> list[list[int]]:
    """Each prompt alone, a decode step at a time (the batched engines burst: their tokens must be these)."""
    engine = Engine.load(plan, max_seqs=1, bursts=False)
    return [engine.run([Request(p, n, params)])[0].ids for p in prompts]


@pytest.mark.parametrize("name", ["spm", "bpe", "gemma", *ARCHS])
def test_batching_and_preemption_are_invisible(plans, name):
    plan = plans(name)
    batched = Engine.load(plan)
    prompts = _prompts(batched)
    alone = _alone(plan, prompts, 20)
    got = batched.run([Request(p, 20) for p in prompts])
    assert [r.ids for r in got] == alone
    assert max(r["decode_rows"] for r in batched.records) == SEQS
    assert max(r["prefill_seqs"] for r in batched.records) > 1  # prefill chunks shared by sequences
    assert batched.pool.free_blocks == batched.pool.total
    # a pool too small for four of them at once: the newest is preempted and later recomputed
    tight = Engine.load(plan, kv_blocks=12)
    got = tight.run([Request(p, 20) for p in prompts])
    assert [r.ids for r in got] == alone
    assert sum(len(r["preempted"]) for r in tight.records) > 0
    assert sum(r.timings["preemptions"] for r in got) > 0
    assert tight.pool.free_blocks == tight.pool.total


def test_sampling_with_a_seed_is_the_same_in_any_batch(plans):
    plan = plans("spm")
    engine = Engine.load(plan)
    prompts = _prompts(engine)
    # the tiny models' random weights give peaked rows: a high temperature makes the draws matter
    params = SamplingParams(temperature=3.0, top_k=40, top_p=0.95, min_p=0.02, repetition_penalty=1.1, seed=11)
    alone = _alone(plan, prompts[:3], 16, params)
    mixed = [Request(prompts[0], 16, params), Request(prompts[5], 16), Request(prompts[1], 16, params),
             Request(prompts[6], 16, SamplingParams(temperature=1.0, seed=5)), Request(prompts[2], 16, params)]
    got = engine.run(mixed)
    assert [got[0].ids, got[2].ids, got[4].ids] == alone
    assert got[0].ids != _alone(plan, prompts[:1], 16, SamplingParams(temperature=3.0, top_k=40, seed=12))[0]


def test_prefix_sharing_prefills_only_the_suffix(plans):
    engine = Engine.load(plans("spm"))
    tok = engine.tokenizer
    prefix = tok.encode(STORY)[:200]
    a = prefix + tok.encode("The clock stopped.", add_special=False)
    b = prefix + tok.encode("Nobody came to the market that day.", add_special=False)
    engine.run([Request(a, 4)])
    before = len(engine.records)
    (rb,) = engine.run([Request(b, 4)])
    shared = 200 // 16 * 16
    assert rb.timings["cached_tokens"] == shared
    assert sum(r["prefill_rows"] + r["decode_rows"] * r["decode_steps"] for r in list(engine.records)[before:]) == len(b) - shared + 3
    assert rb.ids == Engine.load(plans("spm")).run([Request(b, 4)])[0].ids  # the shared blocks hold the same bits
    assert engine.pool.free_blocks == engine.pool.total and engine.pool.stats().cached > 0


def _active(engine):
    return [s.id for s in list(engine.scheduler.waiting) + engine.scheduler.running]


def test_cancel_in_every_phase_frees_every_block(plans):
    engine = Engine.load(plans("spm"), bursts=False)  # a burst could decode these 30 tokens in one step
    prompts = _prompts(engine)
    finished: dict[int, str] = {}

    def step():
        for e in engine.step():
            if e.finish_reason:
                finished[e.request] = e.finish_reason

    queued = [engine.submit(Request(p, 30)) for p in prompts[:6]]  # two of them wait for a slot
    engine.cancel(queued[5])
    step()
    assert finished == {queued[5]: "cancelled"}
    long = engine.submit(Request(prompts[7], 30))  # 90 tokens: three prefill chunks
    while not any(s.id == long and 0 < s.computed < len(s.tokens) for s in engine.scheduler.running):
        step()
    engine.cancel(long)  # mid-prefill
    for _ in range(3):
        step()
    decoding = next(s.id for s in engine.scheduler.running if s.state.result.ids)
    engine.cancel(decoding)  # mid-decode
    while not engine.idle:
        step()
    assert finished[long] == finished[decoding] == "cancelled"
    assert sorted(finished) == sorted(queued + [long])
    assert engine.pool.free_blocks == engine.pool.total


def test_soak_random_requests_and_cancellations(plans):
    """200 requests of random lengths and parameters, some cancelled at random moments, through a pool
    small enough to preempt: no exception, every request ends once, every block comes back."""
    rng = np.random.default_rng(1)
    engine = Engine.load(plans("spm"), kv_blocks=12)
    story = engine.tokenizer.encode(STORY)
    ended: dict[int, str] = {}
    submitted = []
    t0 = time.perf_counter()
    while len(submitted) < 200 or not engine.idle:
        assert time.perf_counter() - t0 < 240, "the soak test ran too long"
        for _ in range(int(rng.integers(0, 4)) if len(submitted) < 200 else 0):
            start, n = int(rng.integers(0, 100)), int(rng.integers(1, 60))
            params = SamplingParams(float(rng.choice([0.0, 0.8])), int(rng.integers(0, 50)), seed=len(submitted))
            submitted.append(engine.submit(Request(story[start:start + n], int(rng.integers(1, 24)), params)))
        active = _active(engine)
        if active and rng.random() < 0.15:
            engine.cancel(int(rng.choice(active)))
        for e in engine.step():
            if e.finish_reason:
                assert e.request not in ended
                ended[e.request] = e.finish_reason
    assert sorted(ended) == sorted(submitted)
    assert {"cancelled", "length"} <= set(ended.values())
    assert sum(len(r["preempted"]) for r in engine.records) > 0
    assert engine.pool.free_blocks == engine.pool.total


def test_limits_and_stops(plans):
    engine = Engine.load(plans("spm"))
    tok = engine.tokenizer
    story = tok.encode(STORY)
    with pytest.raises(RequestError, match=r"the prompt has 300 tokens; the plan's context holds 256"):
        engine.submit(Request(story[:300], 4))
    (r,) = engine.run([Request(story[:300], 4, truncate=True)])
    assert r.prompt_ids[0] == tok.bos and len(r.prompt_ids) == CTX - 1 and r.prompt_ids[-10:] == story[290:300]
    assert r.finish_reason == "length" and len(r.ids) == 1  # the context ends it, not max_tokens
    (full,) = engine.run([Request(story[:20], 40)])
    cut = full.text.find(" ", 10)
    stop = full.text[cut:cut + 3]
    (stopped,) = engine.run([Request(story[:20], 40, stop=(stop, "never appears"))])
    assert stopped.finish_reason == "stop" and stopped.text == full.text[:full.text.find(stop)]
    streamed = "".join(e.text for e in engine.generate([Request(story[:20], 40, stop=(stop,))]))
    assert streamed == stopped.text


def test_decode_bursts_change_no_token_and_drop_what_follows_a_stop(plans):
    """A burst runs several greedy decode steps in one call (Driver.replay_steps): tokens, texts and finish
    reasons are those of single steps; a stop inside a burst drops the rows after it; no block is lost."""
    plan = plans("spm")
    stepped, bursting = Engine.load(plan, bursts=False), Engine.load(plan)
    assert bursting.bursts and not stepped.bursts
    prompts = _prompts(bursting)[:3]
    text = stepped.run([Request(prompts[0], 60)])[0].text
    stop = text[len(text) // 2:len(text) // 2 + 4]

    def requests():
        return [Request(prompts[0], 60, stop=(stop,)), Request(prompts[1], 60), Request(prompts[2], 45)]

    want, got = stepped.run(requests()), bursting.run(requests())
    assert [(r.ids, r.text, r.finish_reason) for r in got] == [(r.ids, r.text, r.finish_reason) for r in want]
    assert got[0].finish_reason == "stop" and got[0].text == text[:text.find(stop)]
    assert max(r["decode_steps"] for r in bursting.records) > 1
    assert max(r["decode_steps"] for r in stepped.records) == 1
    assert bursting.pool.free_blocks == bursting.pool.total


def test_bad_requests_fail_alone(plans):
    engine = Engine.load(plans("spm"))
    good = _prompts(engine)[:2]
    want = [engine.run([Request(p, 8)])[0].ids for p in good]
    bad = {
        "max_tokens": lambda: Request(good[0], -1),
        "top_p": lambda: Request(good[0], 4, SamplingParams(temperature=1.0, top_p=1.5)),
        "stop": lambda: Request(good[0], 4, stop=(3,)),
        "vocabulary": lambda: Request([1, 5, 999999], 4),
    }
    for field, make in bad.items():
        with pytest.raises(RequestError, match=field):
            engine.submit(make())
    events = list(engine.generate([Request(good[0], 8), Request([1, 5, 999999], 4), Request(good[1], 8),
                                   Request(good[0], -3)]))
    results = {e.index: e.result for e in events if e.finish_reason}
    assert [results[0].ids, results[2].ids] == want
    assert results[1].finish_reason == results[3].finish_reason == "error" and "outside the vocabulary" in results[1].error
    assert engine.pool.free_blocks == engine.pool.total


def test_chat_and_kv_ceiling(plans):
    engine = Engine.load(plans("spm"))
    events = list(engine.chat([{"role": "user", "content": "hello"}], max_tokens=5))
    assert events[-1].finish_reason in ("stop", "length") and events[-1].result.prompt_ids[:2] == [1, 3]
    c = engine.kv_ceiling()
    assert c["blocks"] == SEQS * CTX // 16 and c["tokens"] == SEQS * CTX and c["sequences"][CTX] == SEQS


def test_cli_prompts_file(cli, plans, tmp_path):
    plan = plans("spm")
    plain = tmp_path / "p.txt"
    plain.write_text("Once upon a time\n\nThe clockmaker\nHello there\n")
    code, out, _ = cli("run", plan, "--prompts-file", plain, "-n", "6", "--max-seqs", "2", "--json")
    got = json.loads(out)
    assert code == 0 and len(got) == 3
    engine = Engine.load(plan, max_seqs=1)
    for text, r in zip(["Once upon a time", "The clockmaker", "Hello there"], got):
        assert set(r) == {"prompt_ids", "ids", "text", "finish_reason", "timings"}
        assert r["ids"] == engine.run([Request(text, 6)])[0].ids
    lines = tmp_path / "p.jsonl"
    lines.write_text('{"prompt": "Once upon a time", "max_tokens": 3}\n{"prompt": "Hi", "top_p": 2.0, "temperature": 1.0}\n')
    code, out, _ = cli("run", plan, "--prompts-file", lines, "--json")
    got = json.loads(out)
    assert code == 0 and len(got[0]["ids"]) == 3 and got[1]["finish_reason"] == "error" and "top_p" in got[1]["error"]
    code, _, err = cli("run", plan, "--prompts-file", plain, "--max-seqs", "9")
    assert code == 2 and "runs at most 4 sequences per step" in err
