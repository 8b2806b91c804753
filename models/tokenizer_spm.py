"""SentencePiece-style tokenization (`tokenizer.ggml.model = llama`) through the sentencepiece library.

llama.cpp's SPM tokenizer is SentencePiece's BPE encoder: symbols are UTF-8 characters, the adjacent
pair whose concatenation is a token with the highest score merges first (ties: leftmost), and a symbol
left that is not a token becomes its bytes' `<0xNN>` tokens. The sentencepiece library runs that same
loop in C++, so we hand it a model built from the GGUF vocabulary, set up so that it does nothing else:
identity normalization, no dummy prefix, no whitespace escaping (the caller escapes, as llama.cpp does),
and every token a merge candidate as in llama.cpp (sentencepiece would otherwise keep control,
user-defined and unused tokens out of the merges). Only the unknown token and the 256 byte tokens keep
their roles, which is what sentencepiece needs to fall back to bytes.
"""

from __future__ import annotations

import numpy as np
import sentencepiece

from .errors import TokenizerError
from .vocab import Vocab

_NORMAL, _UNKNOWN, _BYTE = 1, 2, 6
_BPE = 2
_SMALL = [bytes([n]) for n in range(0x80)]
BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))


def _varint(n: int) -> bytes:
    if 0 <= n < 0x80:
        return _SMALL[n]
    n &= (1 << 64) - 1  # negative int32 fields are encoded as 64-bit two's complement
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _int_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _piece(raw: bytes, score: bytes, kind: int) -> bytes:
    """One ModelProto.pieces entry: {1: text, 2: score (float), 3: type}."""
    body = b"".join((b"\n", _varint(len(raw)), raw, b"\x15", score, b"\x18", _SMALL[kind]))
    return b"\n" + _varint(len(body)) + body


def _model_proto(vocab: Vocab) -> bytes:
    """A serialized sentencepiece ModelProto (wire format written directly; see sentencepiece_model.proto)."""
    # A repeated text: llama.cpp only ever produces its last id, sentencepiece refuses duplicates.
    renamed = {i: f"\ue000dup\ue000{i}".encode() for i in vocab.token_to_id.shadowed()}
    has_bytes = all(b in vocab.token_to_id for b in BYTE_TOKENS)
    byte_ids = {vocab.token_to_id[b] for b in BYTE_TOKENS} if has_bytes else set()
    n = vocab.n_tokens
    # sentencepiece needs an unknown piece; without one, a piece one past the vocabulary marks "no token"
    unk = n if vocab.unk is None else vocab.unk

    # Written piece by piece into one buffer, from the tokens' bytes: a 262144-token vocabulary must
    # load in well under a second, and leave no Python object per token behind.
    kinds = bytearray([_NORMAL]) * (n + 1)
    kinds[unk] = _UNKNOWN
    for i in byte_ids:
        kinds[i] = _BYTE
    scores = np.asarray(vocab.scores, "<f4").tobytes()
    out = bytearray()
    for i, raw in enumerate(vocab.tokens.iter_raw()):
        out += _piece(renamed.get(i, raw), scores[4 * i : 4 * i + 4], kinds[i])
    if unk == n:
        out += _piece("\ue000unk\ue000".encode(), bytes(4), _UNKNOWN)
    trainer = (_int_field(3, _BPE) + _int_field(4, n + (unk == n)) + _int_field(35, int(has_bytes))
               + _int_field(40, unk) + _int_field(41, -1) + _int_field(42, -1) + _int_field(43, -1))
    normalizer = _field(1, b"identity") + _int_field(3, 0) + _int_field(4, 0) + _int_field(5, 0)
    out += _field(2, trainer) + _field(3, normalizer)
    return bytes(out)


class SpmModel:
    """Encodes whitespace-escaped text (spaces already U+2581) into token ids, as llama.cpp's SPM session."""

    def __init__(self, vocab: Vocab):
        self._n_tokens = vocab.n_tokens
        self._sp = sentencepiece.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(_model_proto(vocab))
        except RuntimeError as e:
            raise TokenizerError(f"cannot build the SentencePiece model from this vocabulary: {e}") from None

    def encode(self, text: str) -> list[int]:
        ids = self._sp.EncodeAsIds(text)
        if ids and max(ids) >= self._n_tokens:
            # llama.cpp aborts here: a character with neither a token nor byte tokens to spell it
            raise TokenizerError("the text holds a character that this vocabulary has no token for "
                                 "(and no unknown token or byte tokens to stand in)")
        return ids
