"""Cutting the special tokens out of a text before tokenization (llama.cpp's tokenizer_st_partition).

Every special token, longest text first, is cut out of every piece of raw text still left, leftmost
occurrence first; what remains between cuts is tokenized normally, less the whitespace that follows a
token the vocabulary marks so (Vocab.rstrip). User-defined tokens are always cut; control and unknown
tokens only when special tokens are parsed. Vocabularies carry thousands of special
tokens (Gemma 3: 6414), so only those that occur in the text take part; since the text's pieces are
substrings of it, the others could not match anywhere and skipping them changes nothing.
"""

from __future__ import annotations

from .vocab import Attr, Vocab

_C_SPACE = " \t\n\v\f\r"  # C's isspace, which llama.cpp strips by


class SpecialTokenSplitter:
    def __init__(self, vocab: Vocab):
        self._always = [(vocab.tokens[i], i) for i in vocab.special_ids
                        if not vocab.attrs[i] & (Attr.CONTROL | Attr.UNKNOWN)]
        self._all = [(vocab.tokens[i], i) for i in vocab.special_ids]
        self._rstrip = vocab.rstrip

    def split(self, text: str, parse_special: bool) -> list[str | int]:
        """`text` as raw-text pieces (str) and special token ids (int), in order."""
        if not text:
            return []
        chars = set(text)
        present = [(t, i) for t, i in (self._all if parse_special else self._always) if t[0] in chars and t in text]
        pieces: list[str | int] = [text]
        for token, tid in present:
            out: list[str | int] = []
            for piece in pieces:
                if isinstance(piece, int) or token not in piece:
                    out.append(piece)
                    continue
                parts = piece.split(token)
                for k, part in enumerate(parts):
                    if k:
                        out.append(tid)
                        if tid in self._rstrip:
                            part = part.lstrip(_C_SPACE)
                    if part:
                        out.append(part)
            pieces = out
        return pieces
