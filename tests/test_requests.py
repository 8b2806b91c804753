"""Requests, stops and sampling: validation names the field; stop strings never leak into the text;
min-p and the repetition penalty act as documented."""

from __future__ import annotations

import numpy as np
import pytest

from llmplan.runtime.requests import Request, RequestError, SamplingParams, StopText
from llmplan.runtime.sampler import Sampler


@pytest.mark.parametrize("kw,field", [({"temperature": -1}, "temperature"), ({"top_k": -2}, "top_k"),
                                      ({"top_p": 0.0}, "top_p"), ({"min_p": 1.0}, "min_p"),
                                      ({"repetition_penalty": 0}, "repetition_penalty"), ({"seed": -5}, "seed")])
def test_sampling_params_are_checked(kw, field):
    with pytest.raises(RequestError, match=field):
        SamplingParams(**kw)


@pytest.mark.parametrize("req,field", [(Request([1], -1), "max_tokens"), (Request([1], 2, stop="x"), "stop"),
                                       (Request([1], 2, stop=("",)), "stop"), (Request([1, 50], 2), "vocabulary"),
                                       (Request([1.5], 2), "prompt")])
def test_requests_are_checked(req, field):
    with pytest.raises(RequestError, match=field):
        req.validate(n_vocab=40)


def test_stop_text_holds_back_only_what_could_become_a_stop():
    s = StopText(("STOP", "\n\n"))
    sent = [s.push(p) for p in ["Hello ", "wor", "ld S", "TO", "P and more"]]
    assert "".join(t for t, _ in sent) == "Hello world "
    assert [stop for _, stop in sent] == [False, False, False, False, True]
    free = StopText(())
    assert free.push("abc") == ("abc", False) and free.flush() == ""
    tail = StopText(("END",))
    assert tail.push("the EN") == ("the ", False) and tail.flush() == "EN"


def test_min_p_and_repetition_penalty():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    draws = {Sampler(SamplingParams(temperature=1.0, min_p=0.2, seed=s))(logits) for s in range(200)}
    assert draws == {0, 1, 2}  # 0.05 < 0.2 * 0.5
    greedy = SamplingParams(repetition_penalty=2.0)
    assert greedy.needs_logits and not SamplingParams().needs_logits
    assert Sampler(greedy)(np.array([2.0, 1.5, -1.0]), seen=[0]) == 1  # 2.0 / 2 < 1.5
    assert Sampler(greedy)(np.array([-1.0, -1.5, -3.5]), seen=[0, 1]) == 0  # -2.0 vs -3.0: still first


def test_token_logprobs_are_the_rows_log_softmax_with_the_top_in_order():
    from llmplan.runtime.sampler import token_logprobs

    row = np.array([1.0, 3.0, 3.0, 2.0, 3.0, -1.0], np.float32)
    lse = np.log(np.exp(row.astype(np.float64)).sum())
    got = token_logprobs(row, 3, 4)
    assert got.logprob == pytest.approx(2.0 - lse, abs=1e-12)
    assert [t for t, _ in got.top] == [1, 2, 4, 3]  # most likely first, ties by id (all three 3.0s kept)
    assert [v for _, v in got.top] == pytest.approx([3.0 - lse] * 3 + [2.0 - lse], abs=1e-12)
    assert token_logprobs(row, 0, 0).top == [] and len(token_logprobs(row, 0, 20).top) == 6


@pytest.mark.parametrize("bad", [-1, 21, 2.0, True])
def test_logprobs_requests_are_checked(bad):
    with pytest.raises(RequestError, match="logprobs"):
        Request([1], 2, logprobs=bad).validate(n_vocab=40)
    assert Request([1], 2, logprobs=5).needs_logits and not Request([1], 2).needs_logits
