"""Load on `plan serve`: 32 concurrent streaming clients x 4 requests each, prompts of different
lengths, every answer equal to the same request run alone (greedy) and no K/V block leaked; then a
second wave where half the clients disconnect mid-stream, their blocks come back and the other half
are served in full. Prints time to first token (p50/p99) and tokens/s as the clients saw them."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import numpy as np
import pytest

from llmplan.runtime.engine import Engine
from llmplan.runtime.requests import Request

from serve_harness import Served

CLIENTS, PER_CLIENT = 32, 4
LENGTHS = [4, 9, 17, 30, 45, 62, 80, 100]  # prompt tokens: one K/V block to seven, one prefill chunk to four
STORY = ("Once upon a time, in a land far away, there lived an old clockmaker who built a clock that ran "
         "backwards. Every morning the children of the village gathered to watch its hands, and every evening "
         "their parents argued about what it meant. ") * 4


def _specs(engine: Engine) -> list[tuple[list[int], int]]:
    """16 requests: (prompt ids, max_tokens), each prompt its own from the first block on."""
    return [(engine.tokenizer.encode(f"{i}. {STORY}")[:LENGTHS[i % 8]], (8, 16)[i // 8]) for i in range(16)]


async def _stream(client: httpx.AsyncClient, prompt: list[int], max_tokens: int, leave_after: int | None = None):
    """One streamed greedy completion: (ids, text, finish_reason, seconds to the first token)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True, "return_token_ids": True}
    ids, text, finish, first, t0 = [], "", None, None, time.perf_counter()
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            if choice["token_ids"] and first is None:
                first = time.perf_counter() - t0
            ids += choice["token_ids"]
            text += choice["text"]
            finish = choice["finish_reason"] or finish
            if leave_after is not None and len(ids) >= leave_after:
                return ids, text, None, first  # leaving the block closes the connection mid-stream
    return ids, text, finish, first


async def _wave(url: str, jobs: list[list[tuple[list[int], int, int | None]]]):
    """Each client runs its jobs one after another; all clients at once."""
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=2 * CLIENTS)) as c:
        async def client(mine):
            return [await _stream(c, *job) for job in mine]
        return await asyncio.gather(*(client(mine) for mine in jobs))


@pytest.mark.slow
def test_32_streaming_clients_get_what_they_would_alone(serve_plan, tmp_path):
    plan = serve_plan("bpe")
    alone_engine = Engine.load(plan, max_seqs=1)
    specs = _specs(alone_engine)
    alone = [alone_engine.run([Request(p, n)])[0] for p, n in specs]
    assert all(r.finish_reason == "length" for r in alone)  # no early end: every answer has its full length
    server = Served(plan, tmp_path / "load.log")
    try:
        total = server.metrics()["llmplan_kv_blocks_free"]
        which = [[(c * PER_CLIENT + r) % len(specs) for r in range(PER_CLIENT)] for c in range(CLIENTS)]
        t0 = time.perf_counter()
        got = asyncio.run(_wave(server.url, [[(*specs[k], None) for k in mine] for mine in which]))
        wall = time.perf_counter() - t0
        for mine, answers in zip(which, got):
            for k, (ids, text, finish, _) in zip(mine, answers):
                assert (ids, text, finish) == (alone[k].ids, alone[k].text, "length"), k
        m = server.wait_idle()
        assert m["llmplan_kv_blocks_free"] == total and m["llmplan_kv_blocks_used"] == 0  # nothing leaked
        ttft = np.array([a[3] for answers in got for a in answers])
        tokens = sum(len(a[0]) for answers in got for a in answers)
        print(f"\nload: {CLIENTS} clients x {PER_CLIENT} streamed requests, {tokens} tokens in {wall:.1f} s: "
              f"{tokens / wall:.1f} tok/s; time to first token p50 {np.percentile(ttft, 50):.3f} s, "
              f"p99 {np.percentile(ttft, 99):.3f} s; {int(m['llmplan_preemptions_total'])} preemptions")

        # the second wave: even clients leave after 3 tokens of a long answer, odd ones read theirs to the end
        cancelled = 'llmplan_requests_finished_total{finish_reason="cancelled"}'
        before = m.get(cancelled, 0)
        jobs = [[(specs[c % len(specs)][0], 200, 3)] if c % 2 == 0 else [(*specs[c % len(specs)], None)]
                for c in range(CLIENTS)]
        got = asyncio.run(_wave(server.url, jobs))
        for c, [(ids, text, finish, _)] in enumerate(got):
            if c % 2:
                k = c % len(specs)
                assert (ids, text, finish) == (alone[k].ids, alone[k].text, "length"), c
            else:
                assert len(ids) >= 3 and finish is None
        m = server.wait_for(lambda m: m.get(cancelled, 0) == before + CLIENTS // 2)
        m = server.wait_idle()
        assert m["llmplan_kv_blocks_free"] == total
    finally:
        assert server.stop() == 0, server.output()
