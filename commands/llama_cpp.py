"""llama.cpp on the same model and tokens, for benchmarks and comparisons: used only when
llama-cpp-python is importable (it is not a dependency of llmplan)."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from llmplan.core.errors import InputError


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def load(model: str, n_ctx: int, threads: int | None = None, **settings: Any):
    """A llama_cpp.Llama on `threads` threads (default this machine's cores) with the fixtures' settings
    (f16 K/V, batch 512, flash attention off), `settings` overriding them."""
    import llama_cpp

    threads = threads or _threads()
    opts = {"n_ctx": n_ctx, "n_batch": 512, "n_threads": threads, "n_threads_batch": threads, "flash_attn": False}
    return llama_cpp.Llama(model, verbose=False, **(opts | settings))


def quantize(src: str | Path, dst: str | Path, recipe: str, requantize: bool = False) -> None:
    """llama.cpp's own quantizer (llama_model_quantize, no importance matrix) writing `src` to `dst` with
    its recipe `recipe` (Q4_K_M, IQ4_XS, ...: its LLAMA_FTYPE_MOSTLY_ names); `requantize` lets it start
    from quantized tensors (dequantized to float32 first)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{recipe}")
    params.allow_requantize = requantize
    if llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) != 0:
        raise InputError(f"llama.cpp could not quantize {src} to {recipe}")


def version() -> str:
    import llama_cpp

    return llama_cpp.__version__


def _threads() -> int:
    return len(os.sched_getaffinity(0))


def last_logits(llm) -> np.ndarray:
    """The logits row of the last evaluated token (llama-cpp-python's `Llama.scores` holds zeros there
    unless the model was loaded with logits_all)."""
    import llama_cpp

    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),)).copy()


def window_logits(llm, tokens: list[int], first: int) -> np.ndarray:
    """The logits rows first .. len(tokens) - 2 of `tokens` evaluated from an empty cache (the model
    loaded with logits_all=True), as llama-perplexity reads one window's; a view, valid until llm evaluates again."""
    llm.reset()
    llm.eval(tokens)
    return np.asarray(llm.scores[first:len(tokens) - 1], np.float32)


def greedy(llm, ids: list[int], n: int) -> tuple[np.ndarray, list[int]]:
    """The logits row after the prompt and n greedy tokens."""
    llm.reset()
    llm.eval(ids)
    row, out = last_logits(llm), []
    while len(out) < n:
        out.append(int(np.argmax(last_logits(llm))))
        llm.eval([out[-1]])
    return row, out


class Rater:
    """llama.cpp's prefill and decode tokens/s, the model loaded once: each call is one run of prefilling
    `ids` from an empty cache and n_decode greedy tokens (a benchmark alternates them with its own runs,
    so a shared machine's slow spells fall on both)."""

    def __init__(self, model: str, n_ctx: int, threads: int | None = None):
        import llama_cpp

        self.threads = threads or _threads()
        self.version = llama_cpp.__version__
        self.llm = load(model, n_ctx, self.threads)

    def __call__(self, ids: list[int], n_decode: int) -> dict[str, Any]:
        llm = self.llm
        llm.reset()
        llm.eval(ids[:8])  # warm caches and threads before each run, as a benchmark warms its own side
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        prefill = time.perf_counter() - t0
        token = int(np.argmax(last_logits(llm)))
        t0 = time.perf_counter()
        for _ in range(n_decode - 1):
            llm.eval([token])
            token = int(np.argmax(last_logits(llm)))
        decode = time.perf_counter() - t0
        return {"version": self.version, "threads": self.threads,
                "prefill_tok_s": round(len(ids) / prefill, 1),
                "decode_tok_s": round((n_decode - 1) / decode, 1) if n_decode > 1 else None}


def rate(model: str, ids: list[int], n_decode: int, threads: int | None = None) -> dict[str, Any] | None:
    """llama.cpp's prefill and decode tokens/s on `ids` and n_decode greedy tokens, after a warm-up
    evaluation, on `threads` threads (default this machine's cores); None without llama-cpp-python."""
    if not available():
        return None
    return Rater(model, max(512, len(ids) + n_decode + 1), threads)(ids, n_decode)
