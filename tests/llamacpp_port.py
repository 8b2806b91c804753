"""Literal, slow Python ports of llama.cpp's tokenizer loops (llama-cpp-python 0.3.36's vendored
src/llama-vocab.cpp and src/unicode.cpp), kept only as oracles: the fast implementations (the
sentencepiece library, the compiled pre-tokenizer regexes) must agree with them on random text.
"""

from __future__ import annotations

import bisect
import heapq

from llmplan.models.unicode_ranges import ACCENT_MARK, LETTER, NUMBER, WHITESPACE

OUT_OF_RANGE = -1


def _member(ranges):
    starts = [a for a, _ in ranges]

    def contains(cpt: int) -> bool:
        k = bisect.bisect_right(starts, cpt) - 1
        return k >= 0 and ranges[k][0] <= cpt <= ranges[k][1]

    return contains


_is_letter = _member(LETTER)
_is_number = _member(NUMBER)
_is_accent_mark = _member(ACCENT_MARK)
_WS = frozenset(WHITESPACE)
# unicode_cpt_is_han
_is_han = _member(sorted(((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
                          (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0x2CEB0, 0x2EBEF), (0xF900, 0xFAFF),
                          (0x2F800, 0x2FA1F))))


class _Flags:
    """unicode_cpt_flags of one position; everything false (as_uint() == 0) past the end."""

    def __init__(self, cpt: int):
        self.defined = cpt != OUT_OF_RANGE
        self.is_letter = self.defined and _is_letter(cpt)
        self.is_number = self.defined and _is_number(cpt)
        self.is_accent_mark = self.defined and _is_accent_mark(cpt)
        self.is_whitespace = self.defined and cpt in _WS


def _lower(cpt: int) -> int:
    low = chr(cpt).lower() if cpt >= 0 else ""
    return ord(low) if len(low) == 1 else cpt


def _words(text: str, lengths: list[int]) -> list[str]:
    out, pos = [], 0
    for n in lengths:
        out.append(text[pos : pos + n])
        pos += n
    return out


def split_llama3(text: str, max_digits: int = 3, marks: bool = False) -> list[str]:
    """unicode_regex_split_custom_llama3 over one fragment; with `max_digits` 1, ..._qwen2; with `marks`
    too, ..._qwen35 (letter runs take accent marks, which the punctuation run then leaves out)."""
    cpts = [ord(c) for c in text]
    end = len(cpts)
    get = lambda p: cpts[p] if 0 <= p < end else OUT_OF_RANGE  # noqa: E731
    flags = lambda p: _Flags(get(p))  # noqa: E731
    lengths: list[int] = []
    prev_end = 0

    def add(e: int) -> int:
        nonlocal prev_end
        n = e - prev_end
        if n > 0:
            lengths.append(n)
        prev_end = e
        return n

    pos = 0
    while pos < end:
        cpt, f = get(pos), flags(pos)
        if cpt == ord("'") and pos + 1 < end:
            nx = _lower(get(pos + 1))
            if nx in map(ord, "stmd"):
                pos += add(pos + 2)
                continue
            if pos + 2 < end:
                nn = _lower(get(pos + 2))
                if (nx, nn) in ((ord("r"), ord("e")), (ord("v"), ord("e")), (ord("l"), ord("l"))):
                    pos += add(pos + 3)
                    continue
        word = (lambda g: g.is_letter or g.is_accent_mark) if marks else (lambda g: g.is_letter)  # noqa: E731
        if not (cpt in (13, 10) or f.is_number):
            if word(f) or word(flags(pos + 1)):
                pos += 1
                while word(flags(pos)):
                    pos += 1
                add(pos)
                continue
        if f.is_number:
            ini = pos
            while flags(pos).is_number:
                pos += 1
                if pos - ini >= max_digits:
                    add(pos)
                    ini = pos
            add(pos)
            continue
        f2 = flags(pos + 1) if cpt == 32 else f
        if not (f2.is_whitespace or word(f2) or f2.is_number) and f.defined:
            pos += cpt == 32
            while not (f2.is_whitespace or word(f2) or f2.is_number) and f2.defined:
                pos += 1
                f2 = flags(pos)
            while get(pos) in (13, 10):
                pos += 1
            add(pos)
            continue
        n_ws, last_rn = 0, 0
        while flags(pos + n_ws).is_whitespace:
            if get(pos + n_ws) in (13, 10):
                last_rn = pos + n_ws + 1
            n_ws += 1
        if last_rn > 0:
            pos = last_rn
            add(pos)
            continue
        if n_ws > 1 and get(pos + n_ws) != OUT_OF_RANGE:
            pos += n_ws - 1
            add(pos)
            continue
        if n_ws > 0:
            pos += n_ws
            add(pos)
            continue
        pos += 1
        add(pos)
    return _words(text, lengths)


def split_gpt2(text: str) -> list[str]:
    """unicode_regex_split_custom_gpt2 over one fragment."""
    cpts = [ord(c) for c in text]
    end = len(cpts)
    get = lambda p: cpts[p] if 0 <= p < end else OUT_OF_RANGE  # noqa: E731
    flags = lambda p: _Flags(get(p))  # noqa: E731
    lengths: list[int] = []
    prev_end = 0

    def add(e: int) -> int:
        nonlocal prev_end
        n = e - prev_end
        if n > 0:
            lengths.append(n)
        prev_end = e
        return n

    pos = 0
    while pos < end:
        cpt, f = get(pos), flags(pos)
        if cpt == ord("'") and pos + 1 < end:
            nx = get(pos + 1)
            if nx in map(ord, "stmd"):
                pos += add(pos + 2)
                continue
            if pos + 2 < end:
                nn = get(pos + 2)
                if (nx, nn) in ((ord("r"), ord("e")), (ord("v"), ord("e")), (ord("l"), ord("l"))):
                    pos += add(pos + 3)
                    continue
        f2 = flags(pos + 1) if cpt == 32 else f
        matched = False
        for test in (lambda g: g.is_letter, lambda g: g.is_number,
                     lambda g: not (g.is_whitespace or g.is_letter or g.is_number) and g.defined):
            if test(f2):
                pos += cpt == 32
                while test(f2):
                    pos += 1
                    f2 = flags(pos)
                add(pos)
                matched = True
                break
        if matched:
            continue
        n_ws = 0
        while flags(pos + n_ws).is_whitespace:
            n_ws += 1
        if n_ws > 1 and get(pos + n_ws) != OUT_OF_RANGE:
            pos += n_ws - 1
            add(pos)
            continue
        if n_ws > 0:
            pos += n_ws
            add(pos)
            continue
        pos += 1
        add(pos)
    return _words(text, lengths)


def split_kimi_k2(text: str) -> list[str]:
    """unicode_regex_split_custom_kimi_k2 over one fragment."""
    cpts = [ord(c) for c in text]
    end = len(cpts)
    get = lambda p: cpts[p] if 0 <= p < end else OUT_OF_RANGE  # noqa: E731
    flags = lambda p: _Flags(get(p))  # noqa: E731
    han = lambda p: get(p) != OUT_OF_RANGE and _is_han(get(p))  # noqa: E731
    lengths: list[int] = []
    prev_end = 0

    def add(e: int) -> int:
        nonlocal prev_end
        n = e - prev_end
        if n > 0:
            lengths.append(n)
        prev_end = e
        return n

    def contraction(pos: int) -> int:
        if get(pos) == ord("'") and pos + 1 < end:
            nx = _lower(get(pos + 1))
            if nx in map(ord, "stmd"):
                return pos + 2
            if pos + 2 < end:
                nn = _lower(get(pos + 2))
                if (nx, nn) in ((ord("r"), ord("e")), (ord("v"), ord("e")), (ord("l"), ord("l"))):
                    return pos + 3
        return pos

    pos = 0
    while pos < end:
        cpt, f = get(pos), flags(pos)
        if han(pos):
            while han(pos):
                pos += 1
            add(pos)
            continue
        leading = not (cpt in (13, 10) or f.is_letter or f.is_number)
        if (f.is_letter and not han(pos)) or (leading and flags(pos + 1).is_letter and not han(pos + 1)):
            pos += leading
            while flags(pos).is_letter and not han(pos):
                pos += 1
            add(contraction(pos))
            pos = prev_end
            continue
        if f.is_number:
            ini = pos
            while flags(pos).is_number:
                pos += 1
                if pos - ini >= 3:
                    add(pos)
                    ini = pos
            add(pos)
            continue
        f2 = flags(pos + 1) if cpt == 32 else f
        if not (f2.is_whitespace or f2.is_letter or f2.is_number) and f2.defined:
            pos += cpt == 32
            while not (f2.is_whitespace or f2.is_letter or f2.is_number) and f2.defined:
                pos += 1
                f2 = flags(pos)
            while get(pos) in (13, 10):
                pos += 1
            add(pos)
            continue
        n_ws, last_rn = 0, 0
        while flags(pos + n_ws).is_whitespace:
            if get(pos + n_ws) in (13, 10):
                last_rn = pos + n_ws + 1
            n_ws += 1
        if last_rn > 0:
            pos = last_rn
        elif n_ws > 1 and get(pos + n_ws) != OUT_OF_RANGE:
            pos += n_ws - 1
        else:
            pos += max(n_ws, 1)
        add(pos)
    return _words(text, lengths)


def split_digit_groups(text: str) -> list[str]:
    """unicode_regex_split_custom_afmoe over one fragment."""
    end = len(text)
    lengths: list[int] = []
    prev_end = 0

    def add(e: int) -> None:
        nonlocal prev_end
        if e - prev_end > 0:
            lengths.append(e - prev_end)
        prev_end = e

    pos = 0
    while pos < end:
        if _is_number(ord(text[pos])):
            start = pos
            while pos < end and _is_number(ord(text[pos])):
                pos += 1
            count = pos - start
            current = start
            if count % 3:
                add(current + count % 3)
                current += count % 3
            while current < start + count:
                add(current + 3)
                current += 3
            continue
        pos += 1
    if prev_end < end:
        add(end)
    return _words(text, lengths)


def spm_tokenize(text: str, token_to_id: dict[str, int], scores) -> list[int]:
    """llm_tokenizer_spm_session::tokenize on whitespace-escaped text."""
    syms = list(text)
    n = len(syms)
    nxt = [*range(1, n), -1]
    prev = list(range(-1, n - 1))
    size = [len(s) for s in syms]
    heap: list = []

    def try_add(left: int, right: int) -> None:
        if left == -1 or right == -1:
            return
        t = text[_start[left] : _start[left] + size[left] + size[right]]
        tid = token_to_id.get(t)
        if tid is None:
            return
        heapq.heappush(heap, (-float(scores[tid]), left, right, len(t)))

    _start = list(range(n))
    for i in range(1, n):
        try_add(i - 1, i)
    while heap:
        _, left, right, total = heapq.heappop(heap)
        if size[left] == 0 or size[right] == 0 or size[left] + size[right] != total:
            continue
        size[left] += size[right]
        size[right] = 0
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prev[nxt[right]] = left
        try_add(prev[left], left)
        try_add(left, nxt[left])
    out = []
    i = 0 if n else -1
    while i != -1:
        piece = text[_start[i] : _start[i] + size[i]]
        tid = token_to_id.get(piece)
        if tid is not None:
            out.append(tid)
        else:
            for b in piece.encode():
                tid = token_to_id.get(f"<0x{b:02X}>")
                if tid is None:
                    tid = token_to_id[chr(b)]  # llama.cpp's last resort; a KeyError here is its abort
                out.append(tid)
        i = nxt[i]
    return out
