"""`plan serve` over real HTTP, driven by the openai client and httpx: greedy answers are `plan run`'s
ids, streamed or not; stops, max_tokens and EOS give the right finish_reason and usage; logprobs,
sampling, tokenize, models and metrics; requests join a running batch; a client that goes away frees
its K/V blocks; auth, the queue bound, the body bound, signals and loading."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import openai
import pytest

from llmplan.core.devices import local_cpu
from llmplan.models.model import open_model
from llmplan.plans.compile import compile_model
from llmplan.runtime.engine import Engine
from llmplan.runtime.requests import Request, SamplingParams

from conftest import SERVE_CHUNK, TINY_BPE
from serve_harness import Served, sse, sse_events

PROMPTS = ["Once upon a time", "The capital of France is",
           "In a land far away, there lived an old clockmaker who built a clock that ran backwards. Every morning"]


def _reference(cli, tmp_path, plan: str, prompts: list[str], n: int, chat: bool = False) -> list[dict]:
    """`plan run`'s greedy results (JSON) for these prompts."""
    f = tmp_path / "prompts.jsonl"
    f.write_text("\n".join(json.dumps({"prompt": p, "max_tokens": n}) for p in prompts) + "\n")
    code, out, err = cli("run", plan, "--prompts-file", f, "--json", *(["--chat"] if chat else []))
    assert code == 0, err
    return json.loads(out)


def _client(server: Served, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=kw.pop("api_key", "unused"), max_retries=0, **kw)


def _extra(obj, name):
    return obj.model_extra[name]


def _stream_ids(chunks) -> tuple[str, list[int], list[str | None]]:
    """Text, token ids and finish reasons of a completions stream from the openai client."""
    text, ids, finish = "", [], []
    for c in chunks:
        for ch in c.choices:
            text += ch.text
            ids += _extra(ch, "token_ids")
            finish.append(ch.finish_reason)
    return text, ids, finish


def test_completions_are_plan_runs_greedy_ids(served, serve_plan, cli, tmp_path):
    want = _reference(cli, tmp_path, serve_plan("bpe"), PROMPTS, 12)
    client = _client(served)
    for prompt, ref in zip(PROMPTS, want):
        got = client.completions.create(model="any", prompt=prompt, max_tokens=12, temperature=0,
                                        extra_body={"return_token_ids": True})
        choice = got.choices[0]
        assert _extra(choice, "token_ids") == ref["ids"] and _extra(choice, "prompt_token_ids") == ref["prompt_ids"]
        assert choice.text == ref["text"] and choice.finish_reason == "length" == ref["finish_reason"]
        assert (got.usage.prompt_tokens, got.usage.completion_tokens, got.usage.total_tokens) == \
               (len(ref["prompt_ids"]), 12, len(ref["prompt_ids"]) + 12)
        assert got.object == "text_completion" and got.model == "tiny-llama3-bpe-Q4_K_M"
        chunks = list(client.completions.create(model="any", prompt=prompt, max_tokens=12, temperature=0, stream=True,
                                                stream_options={"include_usage": True},
                                                extra_body={"return_token_ids": True}))
        text, ids, finish = _stream_ids(chunks)
        assert (text, ids) == (ref["text"], ref["ids"])
        assert [f for f in finish if f] == ["length"] and finish[-1] == "length"
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
        assert all(c.usage is None for c in chunks[:-1])


def test_the_stream_is_openais_sse_ending_in_done(served):
    with served.http.stream("POST", "/v1/completions",
                            json={"prompt": PROMPTS[0], "max_tokens": 5, "temperature": 0, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse(r.iter_lines())
    assert events[-1] == "[DONE]" and all(isinstance(e, dict) for e in events[:-1])
    assert all(e["object"] == "text_completion" and e["id"] == events[0]["id"] for e in events[:-1])
    assert "usage" not in events[0]  # only with stream_options.include_usage


def test_chat_is_plan_run_chats_greedy_ids(served, serve_plan, cli, tmp_path):
    ref = _reference(cli, tmp_path, serve_plan("bpe"), ["Tell me a story"], 10, chat=True)[0]
    client = _client(served)
    msgs = [{"role": "user", "content": "Tell me a story"}]
    got = client.chat.completions.create(model="any", messages=msgs, max_tokens=10, temperature=0,
                                         extra_body={"return_token_ids": True})
    choice = got.choices[0]
    assert _extra(choice, "token_ids") == ref["ids"] and choice.message.content == ref["text"]
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    assert got.usage.prompt_tokens == len(ref["prompt_ids"]) and got.usage.completion_tokens == 10
    # content parts are joined text; max_completion_tokens is max_tokens' newer name
    parts = [{"role": "user", "content": [{"type": "text", "text": "Tell me a story"}]}]
    again = client.chat.completions.create(model="any", messages=parts, max_completion_tokens=10, temperature=0)
    assert again.choices[0].message.content == ref["text"]
    chunks = list(client.chat.completions.create(model="any", messages=msgs, max_tokens=10, temperature=0,
                                                 stream=True, extra_body={"return_token_ids": True}))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].object == "chat.completion.chunk"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ref["text"]
    assert [i for c in chunks[1:] for i in _extra(c.choices[0], "token_ids")] == ref["ids"]
    assert chunks[-1].choices[0].finish_reason == "length"


def test_the_spm_model_serves_plan_runs_ids(serve_plan, cli, tmp_path):
    plan = serve_plan("spm")
    ref = _reference(cli, tmp_path, plan, PROMPTS[:2], 10)
    ref_chat = _reference(cli, tmp_path, plan, ["hi"], 6, chat=True)[0]
    server = Served(plan, tmp_path / "spm.log")
    try:
        client = _client(server)
        for prompt, want in zip(PROMPTS, ref):
            got = client.completions.create(model="m", prompt=prompt, max_tokens=10, temperature=0,
                                            extra_body={"return_token_ids": True})
            assert _extra(got.choices[0], "token_ids") == want["ids"] and got.choices[0].text == want["text"]
        chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                                              temperature=0, stream=True, extra_body={"return_token_ids": True})
        assert [i for c in chat for i in _extra(c.choices[0], "token_ids") if c.choices] == ref_chat["ids"]
    finally:
        assert server.stop() == 0, server.output()


def test_a_gpu_plan_serves_through_the_same_engine_path(serve_plan, cli, tmp_path):
    """plan serve on a GPU plan, on the emulated GPU (--device emu): nothing in the server knows the
    backend, and the greedy ids are the CPU plan's."""
    from llmplan.codegen.targets import target_for
    from llmplan.core.devices import OFFLINE_TARGETS
    from llmplan.models.model import open_model
    from llmplan.plans.compile import compile_model

    from conftest import SERVE_CHUNK, SERVE_CTX, TINY_BPE, require_compiler
    from kernel_emu import have_compiler

    if not have_compiler() and not os.environ.get("CI"):
        pytest.skip("the emulated GPU needs clang++-19")
    require_compiler(target_for("gfx1100"))
    gpu = tmp_path / "gfx1100.plan"
    compile_model(open_model(TINY_BPE), OFFLINE_TARGETS["gfx1100"], gpu, ctx=SERVE_CTX, chunk=SERVE_CHUNK,
                  max_seqs=2)
    (want,) = _reference(cli, tmp_path, serve_plan("bpe"), PROMPTS[:1], 4)
    server = Served(str(gpu), tmp_path / "gpu.log", "--device", "emu")
    try:
        got = _client(server).completions.create(model="m", prompt=PROMPTS[0], max_tokens=4, temperature=0,
                                                 extra_body={"return_token_ids": True})
        assert _extra(got.choices[0], "token_ids") == want["ids"]
    finally:
        assert server.stop() == 0, server.output()


def test_a_gguf_is_compiled_once_and_served(tmp_path):
    from conftest import TINY_SPM

    server = Served(str(TINY_SPM), tmp_path / "gguf.log", "--ctx", "256", "--max-seqs", "2",
                    env={"LLMPLAN_CACHE": str(tmp_path / "cache")})
    try:
        assert len(list((tmp_path / "cache" / "plans").glob("*.plan"))) == 1
        got = server.post("/v1/completions", {"prompt": "hi", "max_tokens": 3}).json()
        assert got["usage"]["completion_tokens"] == 3 and got["model"] == "tiny-llama-spm-Q4_K_M"
        assert server.post("/tokenize", {"prompt": "hi"}).json()["max_model_len"] == 256
        assert "2 sequences per step" in server.output()
    finally:
        assert server.stop() == 0, server.output()


def test_stop_strings_end_the_text_before_them(served, serve_plan, cli, tmp_path):
    ref = _reference(cli, tmp_path, serve_plan("bpe"), [PROMPTS[2]], 24)[0]
    text = ref["text"]
    stop = text[10:13]  # text from the middle of the greedy answer, cut at its first appearance
    want = text[:text.find(stop)]
    client = _client(served)
    for stops in (stop, ["never in this text", stop]):
        got = client.completions.create(model="m", prompt=PROMPTS[2], max_tokens=24, temperature=0, stop=stops)
        assert got.choices[0].text == want and got.choices[0].finish_reason == "stop"
        assert got.usage.completion_tokens < 24
        streamed = list(client.completions.create(model="m", prompt=PROMPTS[2], max_tokens=24, temperature=0,
                                                  stop=stops, stream=True))
        assert "".join(c.choices[0].text for c in streamed) == want
        assert streamed[-1].choices[0].finish_reason == "stop"


def test_an_end_of_generation_token_ends_with_stop(served, serve_plan):
    # the BPE fixture's greedy token after [BOS, 1499] is an end-of-generation token (checked here first)
    engine = Engine.load(serve_plan("bpe"), max_seqs=1)
    prompt = [engine.tokenizer.bos, 1499]
    alone = engine.run([Request(prompt, 8)])[0]
    assert alone.finish_reason == "stop" and engine.tokenizer.is_eog(alone.ids[-1]), "the fixture changed"
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "return_token_ids": True}
    got = served.post("/v1/completions", body).json()
    assert got["choices"][0]["finish_reason"] == "stop" and got["choices"][0]["token_ids"] == alone.ids
    assert got["choices"][0]["text"] == alone.text and got["usage"]["completion_tokens"] == len(alone.ids)
    with served.http.stream("POST", "/v1/completions", json=body | {"stream": True}) as r:
        events = sse(r.iter_lines())
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert [i for e in events[:-1] for i in e["choices"][0]["token_ids"]] == alone.ids


def test_max_tokens_defaults_to_16_for_completions(served):
    got = served.post("/v1/completions", {"prompt": PROMPTS[0], "temperature": 0}).json()
    assert got["usage"]["completion_tokens"] == 16 and got["choices"][0]["finish_reason"] == "length"


def test_logprobs_are_the_models_and_change_no_token(served, serve_plan):
    client = _client(served)
    plain = client.completions.create(model="m", prompt=PROMPTS[1], max_tokens=8, temperature=0,
                                      extra_body={"return_token_ids": True})
    got = client.completions.create(model="m", prompt=PROMPTS[1], max_tokens=8, temperature=0, logprobs=3,
                                    extra_body={"return_token_ids": True})
    ids = _extra(got.choices[0], "token_ids")
    assert ids == _extra(plain.choices[0], "token_ids")  # the logits path picks the same greedy tokens
    lp = got.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(ids) == 8
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        values = list(top.values())
        assert len(top) <= 3 and values == sorted(values, reverse=True) and chosen == values[0] <= 0
    # the first token's logprob is the log-softmax of the engine's logits row after the prompt
    engine = Engine.load(serve_plan("bpe"), max_seqs=1)
    row = engine.run([Request(PROMPTS[1], 1, keep_prompt_logits=True)])[0].prompt_logits.astype(np.float64)
    want = row[ids[0]] - row.max() - np.log(np.exp(row - row.max()).sum())
    assert lp.token_logprobs[0] == pytest.approx(want, rel=1e-9, abs=1e-12)
    streamed = list(client.completions.create(model="m", prompt=PROMPTS[1], max_tokens=8, temperature=0, logprobs=3,
                                              stream=True))
    assert [v for c in streamed for v in c.choices[0].logprobs.token_logprobs] == lp.token_logprobs
    chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                          temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(c.top_logprobs) == 2 and c.logprob == c.top_logprobs[0].logprob
                                     for c in content)
    assert all(c.token == bytes(c.bytes).decode("utf-8", "replace") for c in content)


def test_sampling_parameters_reach_the_engine(served, serve_plan):
    params = dict(temperature=2.5, top_p=0.9, top_k=50, min_p=0.02, seed=3)
    body = {"prompt": PROMPTS[0], "max_tokens": 12, "return_token_ids": True, "repetition_penalty": 1.1} | params
    first = served.post("/v1/completions", body).json()["choices"][0]["token_ids"]
    again = served.post("/v1/completions", body).json()["choices"][0]["token_ids"]
    engine = Engine.load(serve_plan("bpe"), max_seqs=1)
    alone = engine.run([Request(PROMPTS[0], 12, SamplingParams(repetition_penalty=1.1, **params))])[0]
    assert first == again == alone.ids
    greedy = engine.run([Request(PROMPTS[0], 12)])[0].ids
    assert first != greedy  # the parameters did something


def test_models_tokenize_and_detokenize(served, serve_plan, cli, tmp_path):
    models = _client(served).models.list()
    assert [m.id for m in models.data] == ["tiny-llama3-bpe-Q4_K_M"]
    assert _extra(models.data[0], "max_model_len") == 256
    ref = _reference(cli, tmp_path, serve_plan("bpe"), [PROMPTS[2]], 1)[0]
    got = served.post("/tokenize", {"prompt": PROMPTS[2]}).json()
    assert got == {"tokens": ref["prompt_ids"], "count": len(ref["prompt_ids"]), "max_model_len": 256}
    bare = served.post("/tokenize", {"prompt": PROMPTS[2], "add_special_tokens": False}).json()["tokens"]
    assert bare == ref["prompt_ids"][1:]  # no BOS
    chat = _reference(cli, tmp_path, serve_plan("bpe"), ["hi"], 1, chat=True)[0]
    msgs = served.post("/tokenize", {"messages": [{"role": "user", "content": "hi"}]}).json()
    assert msgs["tokens"] == chat["prompt_ids"]
    assert served.post("/detokenize", {"tokens": bare}).json() == {"prompt": PROMPTS[2]}


def _counts(m: dict[str, float]) -> dict[str, float]:
    keys = ["llmplan_prompt_tokens_total", "llmplan_generation_tokens_total", "llmplan_time_to_first_token_seconds_count",
            "llmplan_time_per_output_token_seconds_count", 'llmplan_requests_finished_total{finish_reason="length"}']
    return {k: m.get(k, 0.0) for k in keys}


def test_metrics_count_what_was_served(served):
    text = served.http.get("/metrics")
    assert text.headers["content-type"].startswith("text/plain")
    for name, kind in [("llmplan_requests_running", "gauge"), ("llmplan_requests_waiting", "gauge"),
                       ("llmplan_kv_blocks_used", "gauge"), ("llmplan_kv_blocks_free", "gauge"),
                       ("llmplan_prompt_tokens_total", "counter"),
                       ("llmplan_generation_tokens_total", "counter"), ("llmplan_preemptions_total", "counter"), ("llmplan_time_to_first_token_seconds", "histogram"),
                       ("llmplan_time_per_output_token_seconds", "histogram")]:
        assert f"# TYPE {name} {kind}" in text.text
    before = _counts(served.wait_idle())
    got = served.post("/v1/completions", {"prompt": PROMPTS[2], "max_tokens": 7, "temperature": 0}).json()
    after = served.wait_idle()
    delta = {k: v - before[k] for k, v in _counts(after).items()}
    assert delta == {"llmplan_prompt_tokens_total": got["usage"]["prompt_tokens"],
                     "llmplan_generation_tokens_total": 7, "llmplan_time_to_first_token_seconds_count": 1,
                     "llmplan_time_per_output_token_seconds_count": 6,
                     'llmplan_requests_finished_total{finish_reason="length"}': 1}
    assert after["llmplan_kv_blocks_free"] == 8 * 16  # the plan's pool: 8 sequences of 16 blocks


def test_a_request_joins_a_running_batch(served, serve_plan, cli, tmp_path):
    """B arrives while A streams, and finishes long before A does: it joined A's steps (served after A, it
    would finish after A's last token). A is long so that the margin does not depend on decode speed: at
    about 3000 tokens/s, B's round trip took A's 3rd to 42nd tokens."""
    ref_a, ref_b = _reference(cli, tmp_path, serve_plan("bpe"), [PROMPTS[0], PROMPTS[1]], 240)
    b_done = threading.Event()
    got_b: dict = {}

    def send_b():
        got_b.update(served.post("/v1/completions", {"prompt": PROMPTS[1], "max_tokens": 4, "temperature": 0,
                                                     "return_token_ids": True}).json())
        b_done.set()

    ids_a, b, a_when_b_done = [], threading.Thread(target=send_b), None
    with served.http.stream("POST", "/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 240, "temperature": 0,
                                                             "stream": True, "return_token_ids": True}) as r:
        for e in sse_events(r.iter_lines()):
            if e == "[DONE]":
                break
            ids_a += e["choices"][0]["token_ids"]
            if len(ids_a) >= 3 and b.ident is None:
                b.start()
            if b_done.is_set() and a_when_b_done is None:
                a_when_b_done = len(ids_a)
    b.join()
    assert ids_a == ref_a["ids"] and got_b["choices"][0]["token_ids"] == ref_b["ids"][:4]
    assert a_when_b_done is not None and a_when_b_done < 200  # B (4 tokens) was done well before A (240)


def test_a_client_that_goes_away_frees_its_blocks(served):
    before = served.wait_idle()
    cancelled = 'llmplan_requests_finished_total{finish_reason="cancelled"}'
    with served.http.stream("POST", "/v1/completions", json={"prompt": PROMPTS[2], "max_tokens": 200,
                                                             "temperature": 0, "stream": True}) as r:
        lines = r.iter_lines()
        for _ in range(3):
            while not next(lines).startswith("data: "):
                pass
        assert served.metrics()["llmplan_kv_blocks_used"] > 0
    t0 = time.monotonic()
    after = served.wait_idle(timeout=5)
    assert time.monotonic() - t0 < 2 and after["llmplan_kv_blocks_free"] == before["llmplan_kv_blocks_free"]
    assert after.get(cancelled, 0) == before.get(cancelled, 0) + 1
    # without streaming: a client that stops waiting long before the answer (200 tokens take about 0.06 s
    # on the compiled kernels at 3500 tok/s, on this test's 2-core machine)
    with pytest.raises(httpx.ReadTimeout):
        served.post("/v1/completions", {"prompt": PROMPTS[2], "max_tokens": 200, "temperature": 0}, timeout=0.01)
    served.wait_for(lambda m: m[cancelled] == before.get(cancelled, 0) + 2)
    assert served.wait_idle()["llmplan_kv_blocks_free"] == before["llmplan_kv_blocks_free"]


@pytest.fixture(scope="module")
def tight(serve_plan, tmp_path_factory):
    """A server with one sequence per step, one waiting place, an API key, a 16 KiB body bound and a
    K/V pool of 8 blocks."""
    server = Served(serve_plan("bpe"), tmp_path_factory.mktemp("tight") / "tight.log", "--max-seqs", "1",
                    "--queue", "1", "--api-key", "sekrit", "--max-body", "16384", "--kv-blocks", "8")
    yield server
    assert server.stop() == 0, server.output()


def test_the_api_key_is_required(tight):
    body = {"prompt": "hi", "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic sekrit"}):
        r = httpx.post(tight.url + "/v1/completions", json=body, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", r.text
        assert r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(tight.url + "/v1/models").status_code == 401
    assert httpx.get(tight.url + "/health").status_code == 200  # probes and scrapers need no key
    with pytest.raises(openai.AuthenticationError):
        _client(tight, api_key="wrong").completions.create(model="m", prompt="hi", max_tokens=2)
    got = _client(tight, api_key="sekrit").completions.create(model="m", prompt="hi", max_tokens=2)
    assert got.usage.completion_tokens == 2


def test_a_full_queue_answers_429(tight):
    long = {"prompt": PROMPTS[0], "max_tokens": 200, "temperature": 0, "stream": True}
    with tight.http.stream("POST", "/v1/completions", json=long) as running, \
            tight.http.stream("POST", "/v1/completions", json=long) as waiting:
        assert running.status_code == waiting.status_code == 200
        lines = running.iter_lines()  # kept: dropping a half-read iterator closes its connection
        next(lines)
        r = tight.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "rate_limit_error" and r.json()["error"]["code"] == "queue_full"
        tight.wait_for(lambda m: m["llmplan_requests_waiting"] == 1 and m["llmplan_requests_running"] == 1)
    m = tight.wait_idle()
    assert m["llmplan_requests_rejected_total"] == 1 and m["llmplan_kv_blocks_free"] == 8
    assert tight.post("/v1/completions", {"prompt": "hi", "max_tokens": 2}).status_code == 200


def test_bounds_of_the_body_and_the_pool(tight):
    r = tight.http.post("/v1/completions", content=b'{"prompt": "' + b"a" * 20000 + b'"}')
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    # 150 tokens fit the context (256) but need 10 of the pool's 8 blocks (with one of headroom)
    prompt = list(range(10, 160))
    r = tight.post("/v1/completions", {"prompt": prompt, "max_tokens": 2})
    assert r.status_code == 400 and "K/V blocks" in r.json()["error"]["message"], r.text
    with tight.http.stream("POST", "/v1/completions", json={"prompt": prompt, "max_tokens": 2, "stream": True}) as s:
        events = sse(s.iter_lines())
    assert "K/V blocks" in events[0]["error"]["message"] and events[-1] == "[DONE]"
    tight.wait_idle()


def test_sigterm_lets_running_requests_finish(serve_plan, tmp_path):
    server = Served(serve_plan("bpe"), tmp_path / "term.log")
    with server.http.stream("POST", "/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 40, "temperature": 0,
                                                             "stream": True}) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        server.proc.send_signal(signal.SIGTERM)
        events = sse(lines)
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
    assert server.stop() == 0, server.output()
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/health")


def test_sigint_cancels_what_outlasts_the_grace(tmp_path):
    # uvicorn notices a signal within 0.1 s, then waits the grace: the request must outlast both by far, so
    # a plan with room for 2000 tokens (about 1 s at 2400 tok/s on this test's 2-core machine)
    plan = tmp_path / "long.plan"
    compile_model(open_model(TINY_BPE), local_cpu(), plan, ctx=2048, chunk=SERVE_CHUNK, max_seqs=1)
    server = Served(plan, tmp_path / "int.log", "--grace", "0.05")
    events = []
    with pytest.raises(httpx.RemoteProtocolError):  # the stream is cut off, not finished
        with server.http.stream("POST", "/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 2000,
                                                                 "temperature": 0, "stream": True}) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            server.proc.send_signal(signal.SIGINT)
            events = sse(lines)
    assert "[DONE]" not in events
    assert server.proc.wait(30) == 0, server.output()
    assert "Cancel 1 running task(s)" in server.output()
    server.stop()


def _plan_serve(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmplan.commands.cli", "serve", *map(str, argv)], capture_output=True,
                          text=True, timeout=60)


def test_bad_starts_are_one_line_and_exit_2(served, tmp_path):
    junk = tmp_path / "junk.plan"
    junk.write_text("not a plan")
    port = served.url.rsplit(":", 1)[1]
    for argv, says in [((junk, "--port", "0"), "junk.plan"), ((tmp_path / "missing.plan",), "no such file"),
                       ((junk, "--port", port), "cannot listen"), ((junk, "--queue", "-1"), "--queue")]:
        r = _plan_serve(*argv)
        errors = [line for line in r.stderr.splitlines() if line.startswith("plan: error:")]
        assert r.returncode == 2 and len(errors) == 1 and says in errors[0], r.stderr
        assert "Traceback" not in r.stderr


@contextlib.contextmanager
def _in_thread(load, **kw):
    """create_app(load) served by uvicorn on a thread of this process; yields (its URL, the on_failure calls)."""
    import uvicorn

    from llmplan.runtime.server import create_app, listen

    failures: list[BaseException] = []
    server = uvicorn.Server(uvicorn.Config(create_app(load, on_failure=failures.append, **kw), log_level="critical"))
    sock = listen("127.0.0.1", 0)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    try:
        while not server.started:
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", failures
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def test_a_failing_engine_answers_500_and_says_so(serve_plan):
    engine = Engine.load(serve_plan("bpe"))
    engine.step = lambda: 1 / 0  # a bug in the engine, as the engine thread meets it
    with _in_thread(lambda: engine) as (url, failures):
        r = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=30)
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error", r.text
        assert "ZeroDivisionError" in r.json()["error"]["message"]
        assert httpx.get(url + "/health").json() == {"status": "error"}
        r = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_ready"
        assert [type(e) for e in failures] == [ZeroDivisionError]


def test_health_is_503_while_loading(serve_plan):
    gate = threading.Event()

    def load():
        assert gate.wait(30)
        return Engine.load(serve_plan("bpe"))

    with _in_thread(load) as (url, _):
        r = httpx.get(url + "/health")
        assert r.status_code == 503 and r.json() == {"status": "loading"}
        r = httpx.post(url + "/v1/completions", json={"prompt": "hi"})
        assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"
        gate.set()
        deadline = time.monotonic() + 30
        while httpx.get(url + "/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        r = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_the_engine_thread_answers_what_comes_after_it_stops(serve_plan):
    import asyncio

    from llmplan.runtime.engine_thread import SHUTTING_DOWN, Accepted, EngineThread, Stream
    from llmplan.runtime.serve_metrics import Metrics

    async def go():
        thread = EngineThread(lambda: Engine.load(serve_plan("bpe")), Metrics())
        thread.start()
        while not thread.ready:
            await asyncio.sleep(0.01)
        running = Stream(Request([1, 2, 3], 200))
        thread.submit(running)
        assert isinstance(await running.get(), Accepted)
        await asyncio.to_thread(thread.stop, 30)  # what runs is cancelled
        items = [await running.get()]
        while not getattr(items[-1], "finish_reason", None):
            items.append(await running.get())
        assert items[-1].finish_reason == "cancelled" and thread.engine.pool.free_blocks == thread.engine.pool.total
        late = Stream(Request([1, 2, 3], 2))
        thread.submit(late)
        assert await late.get() == SHUTTING_DOWN

    asyncio.run(go())
