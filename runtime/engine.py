"""A minimal engine: one sequence through a compiled plan. The prompt is prefilled in chunks, then
tokens are decoded one at a time, greedy (the fused tail returns the token) or sampled (from the
logits), until an end-of-generation token or the token limit; text streams out as it decodes."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from llmplan.models.errors import InputError
from llmplan.models.gguf import GGUFFile
from llmplan.models.numerics import PAGE
from llmplan.models.tokenizer import Tokenizer, load_tokenizer
from llmplan.plans.devices import local_cpu
from llmplan.plans.planfile import read_header, read_plan

from .cpu_backend import CpuExecutor
from .cpu_weights import CpuWeights
from .sampler import Sampler, SamplingParams


@dataclass
class Generation:
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = ""
    prompt_logits: np.ndarray | None = None
    timings: dict[str, float] = field(default_factory=dict)


class Engine:
    def __init__(self, plan_path: str, header: dict, body: dict, model: GGUFFile, weights: CpuWeights,
                 load_seconds: float):
        self.plan_path, self.header, self.body, self.model = plan_path, header, body, model
        self.limits = header["limits"]
        self.weights = weights
        self.executor = CpuExecutor(body, self.limits["kv_blocks"], weights)
        self.pages = np.arange(-(-self.limits["ctx"] // PAGE), dtype=np.int32)[None, :]
        self.tokenizer: Tokenizer = load_tokenizer(model)
        self.load_seconds = load_seconds

    @classmethod
    def load(cls, plan_path: str | os.PathLike, model_path: str | None = None) -> Engine:
        """Load a plan for this machine; the GGUF is the one it was compiled from (or `model_path`)."""
        t0 = time.perf_counter()
        header, _ = read_header(plan_path)
        path = model_path or header.get("model", {}).get("path", "")
        if not os.path.exists(path):
            raise InputError(f"{plan_path}: the model it was compiled from, {path}, is not there: pass --model PATH")
        model = GGUFFile(path)
        header, body = read_plan(plan_path, local_cpu().key, model)
        weights = CpuWeights(model, {n: w["residency"] for n, w in body["weights"].items() if w["residency"]})
        return cls(os.fspath(plan_path), header, body, model, weights, time.perf_counter() - t0)

    def _check_length(self, n_prompt: int) -> None:
        if n_prompt == 0:
            raise InputError("the prompt tokenizes to nothing; give some text")
        if n_prompt >= self.limits["ctx"]:
            raise InputError(f"the prompt has {n_prompt} tokens; the plan's context holds {self.limits['ctx']}: "
                             "compile with a larger --ctx")

    def generate(self, prompt_ids: list[int], max_tokens: int, params: SamplingParams = SamplingParams(),
                 on_text: Callable[[str], None] | None = None, keep_prompt_logits: bool = False) -> Generation:
        self._check_length(len(prompt_ids))
        gen = Generation(list(prompt_ids))
        sampler = Sampler(params)
        head = "next_token" if params.greedy and not keep_prompt_logits else "logits"
        t0 = time.perf_counter()
        out = self._prefill(prompt_ids, head)
        t1 = time.perf_counter()
        if head == "logits":
            gen.prompt_logits = out["logits"][0].copy()
        budget = min(max_tokens, self.limits["ctx"] - len(prompt_ids))
        stream = self.tokenizer.stream()
        pos = len(prompt_ids)
        for token in self._tokens(out, sampler, head, budget, pos):
            gen.ids.append(token)
            piece = stream.push(token)
            gen.text += piece
            if on_text and piece:
                on_text(piece)
            if self.tokenizer.is_eog(token):
                gen.finish_reason = "stop"
                break
        else:
            gen.finish_reason = "length"
        rest = stream.flush()
        gen.text += rest
        if on_text and rest:
            on_text(rest)
        t2 = time.perf_counter()
        n = len(gen.ids)
        gen.timings = {"load_s": round(self.load_seconds, 4), "prefill_s": round(t1 - t0, 4),
                       "decode_s": round(t2 - t1, 4), "prompt_tokens": len(prompt_ids), "generated_tokens": n,
                       "prefill_tok_s": round(len(prompt_ids) / max(t1 - t0, 1e-9), 2),
                       "decode_tok_s": round(max(n - 1, 0) / max(t2 - t1, 1e-9), 2)}
        return gen

    def _prefill(self, ids: list[int], head: str) -> dict[str, np.ndarray]:
        chunk = self.limits["chunk"]
        for start in range(0, len(ids), chunk):
            part = np.asarray(ids[start:start + chunk], np.int32)
            last = start + chunk >= len(ids)
            state = {"tokens": part, "pos": np.arange(start, start + len(part), dtype=np.int32),
                     "seq": np.zeros(len(part), np.int32), "pages": self.pages,
                     "last": np.array([len(part) - 1], np.int32)}
            out = self.executor.run("prefill", state, {"cache", head} if last else {"cache"})
        return out

    def _tokens(self, out, sampler: Sampler, head: str, budget: int, pos: int) -> Iterator[int]:
        """The generated tokens, one decode step after each (but the last)."""
        for i in range(budget):
            token = int(out["next_token"][0]) if head == "next_token" else sampler(out["logits"][0])
            yield token
            if i + 1 == budget:
                return
            state = {"tokens": np.array([token], np.int32), "pos": np.array([pos + i], np.int32),
                     "seq": np.zeros(1, np.int32), "pages": self.pages}
            out = self.executor.run("decode", state, {"cache", head})
