"""BPE pre-tokenizers: text split into the pieces the merges work within, as llama.cpp's unicode_regex_split.

A pre-tokenizer is a list of expressions (models/pre_tokenizers.py), applied in turn: each splits every
piece the one before left into its matches and the text between them. llama.cpp runs an expression one
of two ways, and so do we:

- Those it recognises by their text (GPT-2's, Llama 3's, Qwen 2's and 3.5's, Kimi K2's, the digit
  groupers, newline runs) go to its hand-written matchers. We compile equivalent expressions for `re`
  with the classes spelled out from llama.cpp's own Unicode tables (models/unicode_ranges.py): `re`'s
  \\s and \\w and the `regex` module's \\p{L} follow other Unicode versions and other whitespace sets.
- Any other goes to std::regex, over a stand-in for the text. If the expression names a Unicode class
  (\\p{L}, \\p{N}, \\p{P}, \\p{M}, \\p{S}, or a letter subclass, which counts as \\p{L}), every non-ASCII
  character is replaced by one byte for its class (whitespace by \\v), and every class in the expression
  by that byte plus its ASCII members; otherwise only non-ASCII whitespace is replaced, by \\v. We make
  the same stand-ins and run the same rewritten expression with `re` in ASCII mode, whose \\s, \\d and \\w
  are std::regex's in the C locale. Quirks follow: \\p{Lu} matches any letter, [^a-z] any non-ASCII one.
"""

from __future__ import annotations

import functools
import re
from typing import Callable

import numpy as np

from .errors import TokenizerError
from .pre_tokenizers import AFMOE_DIGITS, GPT2, KIMI_K2, LLAMA3, NEWLINES, QWEN2, QWEN35, TINY_AYA_DIGITS
from .unicode_ranges import ACCENT_MARK, LETTER, NUMBER, PUNCTUATION, SYMBOL, WHITESPACE

Split = Callable[[str], list[str]]


def _cls(ranges: tuple[tuple[int, int], ...]) -> str:
    """The inside of a character class for `ranges`."""
    return "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges)


_L = _cls(LETTER)
_N = _cls(NUMBER)
_M = _cls(ACCENT_MARK)
_S = _cls(tuple((c, c) for c in WHITESPACE))
# unicode_cpt_is_han's ranges
_HAN = _cls(((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
             (0x2B820, 0x2CEAF), (0x2CEB0, 0x2EBEF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F)))
_L_NOT_HAN = f"(?:(?![{_HAN}])[{_L}])"
_CONTRACTION = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
# Each matches every character somewhere (the last alternatives take any whitespace, the one before them
# anything else), so its matches alone are the pieces.
_WS_TAIL = rf"[{_S}]*[\r\n]+|[{_S}]+(?![^{_S}])|[{_S}]+"
_TOTAL = {
    GPT2: rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{_L}]+| ?[{_N}]+| ?[^{_S}{_L}{_N}]+|[{_S}]+(?![^{_S}])|[{_S}]+",
    LLAMA3: rf"{_CONTRACTION}|[^\r\n{_L}{_N}]?[{_L}]+|[{_N}]{{1,3}}| ?[^{_S}{_L}{_N}]+[\r\n]*|{_WS_TAIL}",
    QWEN2: rf"{_CONTRACTION}|[^\r\n{_L}{_N}]?[{_L}]+|[{_N}]| ?[^{_S}{_L}{_N}]+[\r\n]*|{_WS_TAIL}",
    QWEN35: rf"{_CONTRACTION}|[^\r\n{_L}{_N}]?[{_L}{_M}]+|[{_N}]| ?[^{_S}{_L}{_M}{_N}]+[\r\n]*|{_WS_TAIL}",
    KIMI_K2: rf"[{_HAN}]+|[^\r\n{_L}{_N}]?{_L_NOT_HAN}+{_CONTRACTION}?|[{_N}]{{1,3}}| ?[^{_S}{_L}{_N}]+[\r\n]*"
             rf"|{_WS_TAIL}",
    NEWLINES: r"[^\n]+|\n+",
}
_DIGIT_GROUPERS = (AFMOE_DIGITS, TINY_AYA_DIGITS)

# std::regex's stand-ins: llama.cpp's byte per class, and the ASCII members it adds to each class
_CLASS_BYTE = {"N": 0xD1, "L": 0xD2, "P": 0xD3, "M": 0xD4, "S": 0xD5}
_OTHER_BYTE = 0xD0
_SPACE_BYTE = 0x0B
_ASCII_MEMBERS = {"N": "0-9", "L": "A-Za-z", "P": r"!-#%-*,-/:-;?-@\[-\]_\{\}", "M": "", "S": r"\$\+<->^`\|\~"}
_CLASS_NAMES = {r"\p{N}": "N", r"\p{L}": "L", r"\p{P}": "P", r"\p{M}": "M", r"\p{S}": "S",
                r"\p{Lu}": "L", r"\p{Ll}": "L", r"\p{Lt}": "L", r"\p{Lm}": "L", r"\p{Lo}": "L"}


@functools.cache
def _class_bytes() -> np.ndarray:
    """Code point -> its byte in the collapsed text (ASCII stands for itself)."""
    table = np.full(0x110000, _OTHER_BYTE, np.uint8)
    for ranges, name in ((NUMBER, "N"), (LETTER, "L"), (PUNCTUATION, "P"), (ACCENT_MARK, "M"), (SYMBOL, "S")):
        for a, b in ranges:
            table[a : b + 1] = _CLASS_BYTE[name]
    table[list(WHITESPACE)] = _SPACE_BYTE
    table[:128] = np.arange(128)
    return table


_WIDE = {c: chr(_SPACE_BYTE) for c in WHITESPACE if c >= 128}


class _Views:
    """The text and its two std::regex stand-ins, made once per text when an expression needs them."""

    def __init__(self, text: str):
        self.text = text
        self._ascii = text.isascii()

    @functools.cached_property
    def collapsed(self) -> str:
        if self._ascii:
            return self.text
        cpts = np.frombuffer(self.text.encode("utf-32-le"), np.uint32)
        return _class_bytes()[cpts].tobytes().decode("latin-1")

    @functools.cached_property
    def wide(self) -> str:
        return self.text if self._ascii else self.text.translate(_WIDE)


# A stage maps the piece boundaries [0, ..., len(text)] to finer ones.
Stage = Callable[[_Views, list[int]], list[int]]


def _regex_stage(pattern: re.Pattern[str], view: str) -> Stage:
    def stage(views: _Views, bounds: list[int]) -> list[int]:
        s = getattr(views, view)
        out = [0]
        for a, b in zip(bounds, bounds[1:]):
            for m in pattern.finditer(s, a, b):
                i, j = m.span()
                if i > out[-1]:
                    out.append(i)
                if j > out[-1]:
                    out.append(j)
            if b > out[-1]:
                out.append(b)
        return out

    return stage


_NUMBER_RUN = re.compile(f"[{_N}]+")


def _digit_groups(views: _Views, bounds: list[int]) -> list[int]:
    """unicode_regex_split_custom_afmoe: each run of digits in groups of three from the right, the first
    group holding what is left over. Like llama.cpp, no cut is made where a run begins, so the text
    before a run joins its first group."""
    out = [0]
    for a, b in zip(bounds, bounds[1:]):
        for m in _NUMBER_RUN.finditer(views.text, a, b):
            start, end = m.span()
            out.extend(range(start + ((end - start) % 3 or 3), end + 1, 3))
        if b > out[-1]:
            out.append(b)
    return out


_ASCII_DIGIT_RUN = re.compile("[0-9]+")


def _trailing_whitespace(views: _Views, bounds: list[int]) -> list[int]:
    r"""\s+$ (DeepSeek LLM): each piece's trailing whitespace. std::regex tries the expression at every
    position of a run of whitespace, which takes time quadratic in the run; this takes it in one step."""
    out = [0]
    for a, b in zip(bounds, bounds[1:]):
        end = a + len(views.wide[a:b].rstrip(" \t\n\v\f\r"))  # std::regex's \s in the C locale
        if a < end < b:
            out.append(end)
        if b > out[-1]:
            out.append(b)
    return out


def _digit_triples(views: _Views, bounds: list[int]) -> list[int]:
    r"""(?=(\d{3})+(?!\d)) (SuperBPE): an empty match, so a cut, wherever a multiple of three ASCII
    digits runs to the end of a run of them. The lookahead rescans the run from every position, which is
    quadratic in its length; this finds the cuts from the runs' ends."""
    out = [0]
    for a, b in zip(bounds, bounds[1:]):
        for m in _ASCII_DIGIT_RUN.finditer(views.text, a, b):
            start, end = m.span()
            out.extend(p for p in range(end - (end - start) // 3 * 3, end, 3) if p > a)
        if b > out[-1]:
            out.append(b)
    return out


# std::regex expressions run by linear functions that cut in the same places (tests/test_pre_tokenizers.py
# checks them against the expressions)
LINEAR = {r"\s+$": _trailing_whitespace, r"(?=(\d{3})+(?!\d))": _digit_triples}


def _collapse(expr: str) -> str:
    """llama.cpp's rewrite of an expression for the collapsed text (unicode_regex_split)."""
    if not expr.isascii():
        raise TokenizerError(f"pre-tokenizer expression {expr!r} mixes Unicode classes and non-ASCII text")
    out, inside, i = [], False, 0
    while i < len(expr):
        c = expr[i]
        if c == "[" and (i == 0 or expr[i - 1] != "\\"):
            inside = True
        elif inside and c == "]" and expr[i - 1] != "\\":
            inside = False
        elif expr.startswith("\\p{", i) and i + 3 < len(expr):
            close = expr.find("}", i + 3)
            name = _CLASS_NAMES.get(expr[i : close + 1]) if 0 <= close <= i + 10 else None
            if name is not None:
                members = chr(_CLASS_BYTE[name]) + _ASCII_MEMBERS[name]
                out.append(members if inside else f"[{members}]")
                i = close + 1
                continue
        out.append(c)
        i += 1
    return "".join(out)


def _python_syntax(expr: str) -> str:
    """An ECMAScript expression as `re` reads it alike: `$` is the end of the piece. Anchors and
    assertions that would look outside the piece, which `re` sees through, are refused."""
    out, inside, i = [], False, 0
    while i < len(expr):
        c = expr[i]
        if c == "\\":
            if not inside and expr[i + 1 : i + 2] in ("b", "B"):
                raise TokenizerError(f"pre-tokenizer expression {expr!r}: word boundaries are not supported")
            out.append(expr[i : i + 2])
            i += 2
            continue
        if c == "[":
            inside = True
        elif c == "]":
            inside = False
        elif not inside and (c in "^." or expr.startswith("(?<", i)):
            raise TokenizerError(f"pre-tokenizer expression {expr!r}: {c!r} is not supported")
        out.append("\\Z" if c == "$" and not inside else c)
        i += 1
    return "".join(out)


def std_regex_stage(expr: str) -> Stage:
    """`expr` run as llama.cpp runs it with std::regex, over the stand-in for the text it needs."""
    collapsed = any(name in expr for name in _CLASS_NAMES)
    source = _python_syntax(_collapse(expr) if collapsed else expr)
    return _regex_stage(re.compile(source, re.ASCII), "collapsed" if collapsed else "wide")


def _stage(expr: str) -> Stage:
    if expr in _TOTAL:
        return _regex_stage(re.compile(_TOTAL[expr]), "text")
    if expr in _DIGIT_GROUPERS:
        return _digit_groups
    return LINEAR.get(expr) or std_regex_stage(expr)


@functools.cache
def pre_tokenizer(expressions: tuple[str, ...]) -> Split:
    """The function that splits text into pre-tokens with llama.cpp's `expressions`, in order."""
    if len(expressions) == 1 and expressions[0] in _TOTAL:
        return re.compile(_TOTAL[expressions[0]]).findall  # its matches are the pieces
    return splitter([_stage(e) for e in expressions])


def splitter(stages: list[Stage]) -> Split:
    """The function that splits text with `stages`, in order."""

    def split(text: str) -> list[str]:
        views = _Views(text)
        bounds = [0, len(text)]
        for stage in stages:
            bounds = stage(views, bounds)
        return [text[a:b] for a, b in zip(bounds, bounds[1:])]

    return split
