"""Choosing a request's next token from a row of logits (SamplingParams says how, in which order)."""

from __future__ import annotations

import numpy as np

from .requests import SamplingParams, TokenLogprobs


class Sampler:
    """One per request: its own random generator, so its draws never depend on the other requests."""

    def __init__(self, params: SamplingParams):
        self.params = params
        # None when greedy: a greedy run never imports numpy.random (2 MiB of plan run's peak RSS)
        self.rng = None if params.greedy else np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray, seen: list[int] = ()) -> int:
        p = self.params
        z = logits.astype(np.float64)
        if p.repetition_penalty != 1.0 and len(seen):
            ids = np.unique(np.asarray(seen))
            z[ids] = np.where(z[ids] > 0, z[ids] / p.repetition_penalty, z[ids] * p.repetition_penalty)
        if p.greedy:
            return int(np.argmax(z))
        z /= p.temperature
        order = np.argsort(-z, kind="stable")
        if p.top_k:
            order = order[:p.top_k]
        probs = np.exp(z[order] - z[order[0]])
        probs /= probs.sum()
        if p.top_p < 1:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1  # the smallest head reaching top_p
            order, probs = order[:keep], probs[:keep]
        if p.min_p > 0:
            keep = int(np.count_nonzero(probs >= p.min_p * probs[0]))  # probs are sorted, the first is the max
            order, probs = order[:keep], probs[:keep]
        return int(order[self.rng.choice(len(order), p=probs / probs.sum())])


def token_logprobs(logits: np.ndarray, token: int, top: int) -> TokenLogprobs:
    """`token`'s log-probability in a logits row and the `top` most likely tokens' (ties: lower id first)."""
    z = logits.astype(np.float64)
    z -= z.max()
    lp = z - np.log(np.exp(z).sum())
    k = min(top, len(lp))
    near = np.flatnonzero(lp >= np.partition(lp, len(lp) - k)[len(lp) - k]) if k else np.arange(0)
    best = near[np.lexsort((near, -lp[near]))][:k]  # every candidate tied at the cut is sorted in
    return TokenLogprobs(float(lp[token]), [(int(t), float(lp[t])) for t in best])
