"""BPE pre-tokenizers: the regex splits llama.cpp applies before the merges, named by tokenizer.ggml.pre.

llama.cpp runs hand-written matchers for the Llama 3 and GPT-2 expressions and std::regex for the
others, all over its own Unicode tables. We compile the same expressions for Python's `re` with the
classes spelled out from those tables (models/unicode_ranges.py): `re`'s own \\s, \\w and the `regex`
module's \\p{L} follow other Unicode versions and other whitespace sets, which would split some text
differently from llama.cpp.
"""

from __future__ import annotations

import re
from typing import Callable

from .errors import TokenizerError
from .unicode_ranges import LETTER, NUMBER, PUNCTUATION, WHITESPACE


def _cls(ranges: tuple[tuple[int, int], ...]) -> str:
    """The inside of a character class for `ranges`."""
    return "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges)


_L = _cls(LETTER)
_N = _cls(NUMBER)
_P = _cls(PUNCTUATION)
_S = _cls(tuple((c, c) for c in WHITESPACE))

# Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
_LLAMA3 = re.compile(
    rf"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n{_L}{_N}]?[{_L}]+|[{_N}]{{1,3}}"
    rf"| ?[^{_S}{_L}{_N}]+[\r\n]*|[{_S}]*[\r\n]+|[{_S}]+(?![^{_S}])|[{_S}]+"
)
# GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
_GPT2 = re.compile(
    rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{_L}]+| ?[{_N}]+| ?[^{_S}{_L}{_N}]+|[{_S}]+(?![^{_S}])|[{_S}]+"
)
# llama.cpp's 'default' runs four expressions in turn, each splitting the pieces of the one before
_DEFAULT = (
    re.compile(rf"[{_P}$+<=>^~|]+"),
    _GPT2,
    re.compile(rf"[{_N}]+"),
    re.compile(r"[0-9][0-9][0-9]"),
)


def _split_keep(pieces: list[str], pattern: re.Pattern[str]) -> list[str]:
    """Split every piece into its matches and the text between them (std::regex_iterator, as llama.cpp)."""
    out = []
    for piece in pieces:
        end = 0
        for m in pattern.finditer(piece):
            if m.start() > end:
                out.append(piece[end : m.start()])
            out.append(m.group())
            end = m.end()
        if end < len(piece):
            out.append(piece[end:])
    return out


def _default(text: str) -> list[str]:
    pieces = [text]
    for pattern in _DEFAULT:
        pieces = _split_keep(pieces, pattern)
    return pieces


# The Llama 3 and GPT-2 expressions match every character (the last alternatives take any whitespace,
# the one before them anything else), so findall already returns the whole text in pieces.
_SPLITTERS: dict[str, Callable[[str], list[str]]] = {
    "llama3": _LLAMA3.findall,
    "gpt2": _GPT2.findall,
    "default": _default,
}


def pre_tokenizer(family: str) -> Callable[[str], list[str]]:
    """The function that splits text into pre-tokens for a regex family (see vocab.PRE_TOKENIZERS)."""
    try:
        return _SPLITTERS[family]
    except KeyError:
        raise TokenizerError(f"no pre-tokenizer {family!r} (known: {', '.join(sorted(_SPLITTERS))})") from None
