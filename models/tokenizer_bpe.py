"""BPE (`tokenizer.ggml.model = gpt2`, or `gemma4`): pre-tokenize, map bytes to GPT-2's printable
characters (or keep the UTF-8 text, for the few pre-tokenizers that do), merge by rank.

The merge loop is llama.cpp's: within one pre-token, the adjacent pair with the lowest rank in
tokenizer.ggml.merges merges first (ties: leftmost), one pair at a time, until no pair has a rank; a
symbol left that is not a token is spelled with its single-byte tokens (GPT-2's byte characters, or
`<0xNN>` tokens for UTF-8 text). Pre-tokens repeat a lot in real text, so their ids are cached.
"""

from __future__ import annotations

import heapq

from .pre_tokenizers import NAMES, TYPES
from .pretokenize import pre_tokenizer
from .vocab import Vocab

_CACHE_WORDS = 1 << 16
_CACHE_WORD_CHARS = 64


def byte_to_char() -> list[str]:
    """GPT-2's byte -> printable character map: printable Latin-1 bytes stand for themselves, the rest
    take the code points from U+0100 on, in byte order."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out = [""] * 256
    for b in keep:
        out[b] = chr(b)
    extra = 0x100
    for b in range(256):
        if not out[b]:
            out[b] = chr(extra)
            extra += 1
    return out


class BpeModel:
    """Encodes raw text (no special tokens in it) into token ids, as llama.cpp's BPE session."""

    def __init__(self, vocab: Vocab):
        pre_type = TYPES[NAMES[vocab.pre].type]
        self._token_to_id = vocab.token_to_id
        self._ignore_merges = vocab.ignore_merges
        self._newline_words = pre_type.newline_words
        self._escape_whitespaces = vocab.escape_whitespaces
        self._split = pre_tokenizer(pre_type.expressions)
        self._byte_map = {b: c for b, c in enumerate(byte_to_char())} if pre_type.byte_encode else None
        ranks: dict[tuple[str, str], int] = {}
        for rank, merge in enumerate(vocab.merges):
            cut = merge.find(" ", 1)  # the first space after the first character, as llama.cpp
            ranks.setdefault((merge[:cut], merge[cut + 1 :]) if cut > 0 else ("", ""), rank)
        self._ranks = ranks
        self._cache: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        if self._escape_whitespaces:
            text = text.replace(" ", "\u2581")
        out: list[int] = []
        cache = self._cache
        for word in self._split(text):
            ids = cache.get(word)
            if ids is None:
                ids = self._merge(word if self._byte_map is None else
                                  word.encode().decode("latin-1").translate(self._byte_map))
                if len(word) <= _CACHE_WORD_CHARS:  # long pre-tokens (whitespace runs) rarely repeat
                    if len(cache) >= _CACHE_WORDS:
                        cache.clear()
                    cache[word] = ids
            out.extend(ids)
        return out

    def _merge(self, word: str) -> list[int]:
        token_to_id = self._token_to_id
        if self._ignore_merges or (self._newline_words and not word.strip("\n")):
            tid = token_to_id.get(word)
            if tid is not None:
                return [tid]
        ranks = self._ranks
        # symbols as a linked list over the characters; a merged-away symbol keeps an empty text
        text = list(word)
        n = len(text)
        prev = list(range(-1, n - 1))
        nxt = [*range(1, n), -1]
        heap = []
        for i in range(n - 1):
            rank = ranks.get((text[i], text[i + 1]))
            if rank is not None:
                heap.append((rank, i, i + 1, text[i] + text[i + 1]))
        heapq.heapify(heap)
        while heap:
            _, left, right, merged = heapq.heappop(heap)
            if not text[left] or not text[right] or text[left] + text[right] != merged:
                continue  # one side changed since this pair was queued
            text[left], text[right] = merged, ""
            nxt[left] = after = nxt[right]
            if after >= 0:
                prev[after] = left
            for a, b in ((prev[left], left), (left, after)):
                if a >= 0 and b >= 0:
                    rank = ranks.get((text[a], text[b]))
                    if rank is not None:
                        heapq.heappush(heap, (rank, a, b, text[a] + text[b]))
        ids = []
        for symbol in text:
            if not symbol:
                continue
            tid = token_to_id.get(symbol)
            if tid is not None:
                ids.append(tid)
            else:  # llama.cpp spells it with single-byte tokens and drops bytes that have none
                single = symbol if self._byte_map is not None else (f"<0x{b:02X}>" for b in symbol.encode())
                ids.extend(token_to_id[c] for c in single if c in token_to_id)
        return ids
