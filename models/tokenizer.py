"""The tokenizer of a GGUF model: text <-> token ids exactly as llama.cpp, plus its chat template.

    tok = load_tokenizer("model.gguf")
    ids = tok.encode("Hello", add_special=True, parse_special=False)
    text = tok.decode(ids)

`encode` follows llama.cpp's llama_tokenize: special tokens are cut out first (user-defined ones
always, control ones only with `parse_special`), the raw text between them goes through the model's
tokenizer, and BOS/EOS are added per the model's add_bos_token/add_eos_token when `add_special`.
SentencePiece vocabularies with add_space_prefix put a space before the text and after every special
token, so decoding gives those spaces back except the one at the very start, which `decode` drops
(llama.cpp's detokenizer does the same). Text must be valid UTF-8: str without lone surrogates, or
bytes that decode strictly.
"""

from __future__ import annotations

import os
from typing import Any, Iterable

from .detokenize import SPACE_MARKER, Pieces, StreamDecoder, detokenize
from .errors import TokenizerError
from .gguf import GGUFFile
from .special_tokens import SpecialTokenSplitter
from .tokenizer_bpe import BpeModel
from .tokenizer_spm import SpmModel
from .vocab import Vocab, read_vocab


def _as_text(text: str | bytes) -> str:
    if isinstance(text, (bytes, bytearray)):
        try:
            return bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise TokenizerError(f"text is not valid UTF-8 ({e.reason} at byte {e.start})") from None
    if not isinstance(text, str):
        raise TokenizerError(f"text must be str or bytes, not {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise TokenizerError(f"text is not valid UTF-8 (lone surrogate {text[e.start]!r} at character "
                             f"{e.start})") from None
    return text


class Tokenizer:
    """Tokenization, detokenization and chat formatting for one vocabulary."""

    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        self._model = SpmModel(vocab) if vocab.kind == "spm" else BpeModel(vocab)
        self._splitter = SpecialTokenSplitter(vocab)
        self._pieces = Pieces(vocab)

    @property
    def n_tokens(self) -> int:
        return self.vocab.n_tokens

    @property
    def bos(self) -> int | None:
        return self.vocab.bos

    @property
    def eos(self) -> int | None:
        return self.vocab.eos

    @property
    def eog(self) -> frozenset[int]:
        """The end-of-generation ids: EOS, EOT, <end_of_turn>, <|eot_id|> and the like (llama.cpp's set)."""
        return self.vocab.eog

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.vocab.eog

    def encode(self, text: str | bytes, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        v = self.vocab
        out = [v.bos] if add_special and v.add_bos else []
        spm = v.kind == "spm"
        after_special = True  # llama.cpp's SPM space prefix also goes before the first piece of text
        for piece in self._splitter.split(_as_text(text), parse_special):
            if isinstance(piece, int):
                out.append(piece)
                after_special = True
            elif spm:
                if v.add_space_prefix and after_special:
                    piece = " " + piece
                out.extend(self._model.encode(piece.replace(" ", SPACE_MARKER)))
                after_special = False
            else:
                out.extend(self._model.encode(piece))
        if add_special and v.add_eos:
            out.append(v.eos)
        return out

    def piece(self, token_id: int, *, special: bool = True) -> bytes:
        """The bytes token `token_id` stands for ('' for a control token unless `special`)."""
        (token_id,) = self._pieces.check([token_id])
        return self._pieces.piece(token_id, special)

    def decode_bytes(self, ids: Iterable[int], *, special: bool = False) -> bytes:
        return detokenize(self._pieces, self._pieces.check(ids), special, self.vocab.add_space_prefix)

    def decode(self, ids: Iterable[int], *, special: bool = False) -> str:
        """The text of `ids`; bytes that are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids, special=special).decode("utf-8", errors="replace")

    def stream(self, *, special: bool = False) -> StreamDecoder:
        """A decoder for generated ids, one at a time (no space is dropped: the text continues a prompt)."""
        return StreamDecoder(self._pieces, special)

    def render_chat(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
                    **extra: Any) -> str:
        """`messages` as prompt text through the model's chat template (or the plain fallback)."""
        from .chat_template import render_chat  # here: jinja2 adds 7-9 MiB to plan run's peak, only --chat needs it

        v = self.vocab
        return render_chat(v.chat_template, messages, add_generation_prompt=add_generation_prompt,
                           bos_token="" if v.bos is None else v.tokens[v.bos],
                           eos_token="" if v.eos is None else v.tokens[v.eos], **extra)

    def encode_chat(self, messages: list[dict[str, Any]], **extra: Any) -> list[int]:
        """Token ids of a conversation rendered by the chat template, ready for generation. Templates
        usually write the BOS text themselves; then no second BOS is added."""
        text = self.render_chat(messages, add_generation_prompt=True, **extra)
        bos_text = "" if self.vocab.bos is None else self.vocab.tokens[self.vocab.bos]
        has_bos = bool(bos_text) and text.startswith(bos_text)
        return self.encode(text, add_special=not has_bos, parse_special=True)


_CACHE: dict[tuple[str, int, int], Tokenizer] = {}
_CACHE_SIZE = 4


def load_tokenizer(source: GGUFFile | str | os.PathLike) -> Tokenizer:
    """The tokenizer of a GGUF file (a full model or a vocabulary-only file). Tokenizers are cached per
    file (path, size, modification time): building one for a 262144-token vocabulary takes ~0.5 s."""
    gguf = source if isinstance(source, GGUFFile) else None
    path = os.path.realpath(gguf.path if gguf is not None else os.fspath(source))
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    tok = _CACHE.get(key)
    if tok is None:
        tok = Tokenizer(read_vocab(gguf if gguf is not None else GGUFFile(path)))
        if len(_CACHE) >= _CACHE_SIZE:
            del _CACHE[next(iter(_CACHE))]
        _CACHE[key] = tok
    return tok
