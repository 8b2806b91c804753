"""What a caller asks the engine for and what comes back: requests with their sampling parameters and
stops, the events a generation streams, and the result of a finished request. Bad requests fail here,
with a RequestError naming the field, before anything is scheduled."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from llmplan.core.errors import InputError

MAX_LOGPROBS = 20  # top alternatives a request may ask for per token (OpenAI's bound)


class RequestError(InputError):
    """A request the engine refuses (the others keep running)."""


@dataclass(frozen=True)
class SamplingParams:
    """Applied in this order: repetition penalty, temperature, top-k, top-p, min-p, then one draw from
    the request's own generator (seeded: the same tokens whatever is batched beside it)."""

    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: no limit
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # > 1 discourages tokens already in the prompt or the output
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
                and self.temperature >= 0):
            raise RequestError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise RequestError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not (isinstance(self.min_p, (int, float)) and 0 <= self.min_p < 1):
            raise RequestError(f"min_p must be in [0, 1), got {self.min_p!r}")
        if not (isinstance(self.repetition_penalty, (int, float)) and math.isfinite(self.repetition_penalty)
                and self.repetition_penalty > 0):
            raise RequestError(f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise RequestError(f"seed must be an integer >= 0, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def needs_logits(self) -> bool:
        """False when the fused tail's argmax is the answer (greedy, nothing reshaping the logits)."""
        return not (self.greedy and self.repetition_penalty == 1.0)


@dataclass(frozen=True)
class Request:
    prompt: str | list[int]  # text (BOS added, special tokens parsed) or token ids
    max_tokens: int = 64
    params: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()  # strings that end the generation (not part of the returned text)
    keep_prompt_logits: bool = False  # Result.prompt_logits: the logits row after the prompt
    truncate: bool = False  # a prompt longer than the context keeps its BOS and its end instead of failing
    logprobs: int | None = None  # Event.logprobs for each generated token, with this many top alternatives

    @property
    def needs_logits(self) -> bool:
        """Whether each generated token needs its whole logits row (to sample it, or for its logprobs)."""
        return self.params.needs_logits or self.logprobs is not None

    def validate(self, n_vocab: int) -> None:
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 0:
            raise RequestError(f"max_tokens must be an integer >= 0, got {self.max_tokens!r}")
        if not isinstance(self.params, SamplingParams):
            raise RequestError(f"params must be SamplingParams, got {type(self.params).__name__}")
        if isinstance(self.stop, (str, bytes)) or not all(isinstance(s, str) and s for s in self.stop):
            raise RequestError(f"stop must be a sequence of non-empty strings, got {self.stop!r}")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or isinstance(self.logprobs, bool)
                                          or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise RequestError(f"logprobs must be an integer in 0..{MAX_LOGPROBS} or None, got {self.logprobs!r}")
        if isinstance(self.prompt, str):
            return
        if not isinstance(self.prompt, (list, tuple)) or not all(isinstance(t, (int, np.integer)) for t in self.prompt):
            raise RequestError("prompt must be text or a list of token ids")
        bad = [t for t in self.prompt if not 0 <= t < n_vocab]
        if bad:
            raise RequestError(f"prompt token id {bad[0]} is outside the vocabulary (0..{n_vocab - 1})")


@dataclass
class Result:
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = ""  # stop, length, cancelled, error
    error: str = ""
    prompt_logits: np.ndarray | None = None
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class TokenLogprobs:
    """A generated token's log-probability under the model (the logits row's log-softmax, before any
    penalty or temperature) and the most likely tokens' with theirs, most likely first."""

    logprob: float
    top: list[tuple[int, float]]


@dataclass
class Event:
    """One request's progress: a new token and its text, or (finish_reason set) its end."""

    request: int  # the id submit() returned (-1 for a request submit() refused)
    index: int = -1  # generate(): the request's position in its list
    token: int | None = None
    text: str = ""
    finish_reason: str | None = None
    result: Result | None = None  # with the finish
    logprobs: TokenLogprobs | None = None  # with a token, when the request asked for them


class StopText:
    """Streams generated text, holding back what could still turn into a stop string."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""
        self.sent = 0

    def push(self, piece: str) -> tuple[str, bool]:
        """Add decoded text; returns (the text now safe to send, whether a stop string appeared)."""
        start = max(0, len(self.text) - self.hold)
        self.text += piece
        hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if hits:
            self.text = self.text[:min(hits)]
            return self.flush(), True
        safe = len(self.text) - self.hold
        if safe <= self.sent:
            return "", False
        out, self.sent = self.text[self.sent:safe], safe
        return out, False

    def flush(self) -> str:
        out, self.sent = self.text[self.sent:], len(self.text)
        return out
