"""Choosing the next token from a row of logits: greedy, or temperature with top-k and top-p."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llmplan.models.errors import InputError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: no limit
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0 or not np.isfinite(self.temperature):
            raise InputError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise InputError(f"top-k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise InputError(f"top-p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


class Sampler:
    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray) -> int:
        p = self.params
        if p.greedy:
            return int(np.argmax(logits))
        z = logits.astype(np.float64) / p.temperature
        order = np.argsort(-z, kind="stable")
        if p.top_k:
            order = order[:p.top_k]
        probs = np.exp(z[order] - z[order[0]])
        probs /= probs.sum()
        if p.top_p < 1:
            keep = np.searchsorted(np.cumsum(probs), p.top_p) + 1  # the smallest head reaching top_p
            order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
        return int(order[self.rng.choice(len(order), p=probs)])
