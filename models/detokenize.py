"""Token ids back to bytes and text, as llama.cpp's token_to_piece.

A token's piece is: its text for control, unknown and user-defined tokens (control and unknown ones
only when special tokens are shown); for SentencePiece normal tokens, and BPE ones where spaces were
escaped (Gemma 4), the text with the U+2581 space marker made a space; for other BPE normal tokens, the
bytes that GPT-2's printable characters stand for; for `<0xNN>` byte tokens, that byte; nothing for
unused or undefined tokens. Text is the pieces joined, as llama-cpp-python detokenizes: llama.cpp's
llama_detokenize would also drop spaces before punctuation for most BPE vocabularies ("clean_spaces"),
which breaks round trips, so we do not.
"""

from __future__ import annotations

import codecs
import operator
from typing import Iterable

from .errors import TokenizerError
from .tokenizer_bpe import byte_to_char
from .vocab import Attr, Vocab

SPACE_MARKER = "\u2581"
_SHOWN = Attr.CONTROL | Attr.UNKNOWN | Attr.USER_DEFINED
_HIDDEN_UNLESS_SPECIAL = Attr.CONTROL | Attr.UNKNOWN


class Pieces:
    """The piece of every token, computed on first use (a large vocabulary has 262144 of them, a text
    uses few)."""

    def __init__(self, vocab: Vocab):
        self._vocab = vocab
        self._cache: dict[int, bytes] = {}
        self._spaces_marked = vocab.kind == "spm" or vocab.escape_whitespaces
        self._char_to_byte = {} if self._spaces_marked else {c: b for b, c in enumerate(byte_to_char())}

    def check(self, ids: Iterable[int]) -> list[int]:
        """`ids` as a list, each checked to be a token of this vocabulary."""
        n = self._vocab.n_tokens
        out = []
        for t in ids:
            try:
                t = operator.index(t)  # ints and NumPy integers
            except TypeError:
                raise TokenizerError(f"token id {t!r} is not an integer") from None
            if not 0 <= t < n:
                raise TokenizerError(f"token id {t} is not in the vocabulary (ids 0..{n - 1})")
            out.append(t)
        return out

    def piece(self, token_id: int, special: bool) -> bytes:
        attr = int(self._vocab.attrs[token_id])
        if not special and attr & _HIDDEN_UNLESS_SPECIAL:
            return b""
        p = self._cache.get(token_id)
        if p is None:
            p = self._cache[token_id] = self._make(token_id, attr)
        return p

    def _make(self, token_id: int, attr: int) -> bytes:
        text = self._vocab.tokens[token_id]
        if attr & _SHOWN:
            return text.encode()
        if attr & Attr.NORMAL:
            if self._spaces_marked:
                return text.replace(SPACE_MARKER, " ").encode()
            return self._byte_level(text)
        if attr & Attr.BYTE:
            if len(text) != 6 or not text.startswith("<0x") or not text.endswith(">"):
                raise TokenizerError(f"byte token {token_id} is {text!r}, not <0xNN>")
            try:
                return bytes([int(text[3:5], 16)])
            except ValueError:
                raise TokenizerError(f"byte token {token_id} is {text!r}, not <0xNN>") from None
        return b""

    def _byte_level(self, text: str) -> bytes:
        out = bytearray()
        for c in text:
            b = self._char_to_byte.get(c)
            if b is not None:
                out.append(b)
            else:  # not a byte-level character: llama.cpp writes this marker instead
                out += b"[UNK_BYTE_0x" + c.encode().hex().encode() + text.encode() + b"]"
        return bytes(out)


def detokenize(pieces: Pieces, ids: list[int], special: bool, strip_space_prefix: bool) -> bytes:
    """The bytes of `ids`. With `strip_space_prefix` (vocabularies that add a space prefix when
    tokenizing), the one space that prefix put before the first word is dropped again."""
    out = b"".join(pieces.piece(t, special) for t in ids)
    if strip_space_prefix and out.startswith(b" "):
        out = out[1:]
    return out


class StreamDecoder:
    """Text of a token stream as it grows: push one id at a time and get the text it completes; bytes
    of an unfinished UTF-8 sequence wait for the next tokens, and `flush` ends the stream (what is still
    unfinished becomes U+FFFD). Invalid bytes become U+FFFD, as bytes.decode(errors="replace")."""

    def __init__(self, pieces: Pieces, special: bool = False):
        self._pieces = pieces
        self._special = special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        (token_id,) = self._pieces.check([token_id])
        return self._decoder.decode(self._pieces.piece(token_id, self._special))

    def flush(self) -> str:
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text
