"""Constrained decoding's host side: a request's grammar (a JSON schema, any JSON object, a Lark or
llama.cpp GBNF grammar) becomes, step by step, a token mask (core/numerics.py's layout: one bit per
token) that the fused tail applies on the device, or the sampler on the host.

The grammars are llguidance's (the `llguidance` package: a Rust library with Python bindings and no
torch): it compiles JSON schemas and context-free grammars lazily, so a new schema costs about a
millisecond instead of a precompiled automaton's seconds, and it computes the mask of a 262144-token
vocabulary in tens of microseconds, far below a decode step. docs/serving.md says why this library.

    vocab = Vocabulary(tokenizer, words=8192)   # llguidance's view of the model's tokens (built once)
    m = vocab.matcher(json_schema({"type": "object"}))
    m.fill(mask_row); token = ...; m.consume(token)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from llmplan.models.tokenizer import Tokenizer
from llmplan.models.vocab import Attr

from .requests import RequestError

# Compact JSON (OpenAI's separators, no free whitespace): a model cannot spend its tokens on spaces,
# and a user's "x-guidance" in the schema overrides it.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


class GrammarError(RequestError):
    """A grammar that is invalid or unsupported; `param` names the request field it came from."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param


@dataclass(frozen=True)
class Grammar:
    """A grammar in llguidance's form (`text`), and the request field it came from (for messages)."""

    text: str
    param: str


def _reason(error: str) -> str:
    """llguidance's error without the parser state it dumps after it."""
    lines = error.splitlines()
    return next((line[len("Error: "):] for line in lines if line.startswith("Error: ")), lines[0] if lines else error)


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError:  # an install without the serve extra
        raise RequestError("constrained decoding needs llguidance: pip install -e '.[serve]'") from None
    return llguidance


def json_schema(schema: Any, param: str = "response_format.json_schema.schema") -> Grammar:
    """Output that is JSON valid against `schema` (a JSON Schema object)."""
    if not isinstance(schema, dict):
        raise GrammarError(param, f"must be a JSON Schema object, got {type(schema).__name__}")
    llg = _llguidance()
    try:
        text = llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    except (ValueError, TypeError) as e:
        raise GrammarError(param, str(e)) from None
    return _checked(text, param)


def json_object(param: str = "response_format") -> Grammar:
    """Output that is one JSON object."""
    return json_schema({"type": "object"}, param)


def lark_or_gbnf(text: Any, param: str = "grammar") -> Grammar:
    """Output in the language of a grammar written in Lark (llguidance's dialect) or in llama.cpp's GBNF."""
    if not isinstance(text, str) or not text.strip():
        raise GrammarError(param, "must be a non-empty Lark or GBNF grammar")
    llg = _llguidance()
    try:
        converted = llg.gbnf_to_lark.any_to_lark(text)
    except Exception as e:  # noqa: BLE001 (the converter raises whatever its parser meets)
        raise GrammarError(param, f"not a valid Lark or GBNF grammar: {e}") from None
    return lark(converted, param)


def lark(text: str, param: str) -> Grammar:
    """A Lark grammar (llguidance's dialect: %json {schema} embeds a JSON schema)."""
    return _checked(_llguidance().LLMatcher.grammar_from_lark(text), param)


def _checked(text: str, param: str) -> Grammar:
    llg = _llguidance()
    error, messages = llg.LLMatcher.validate_grammar_with_warnings(text)
    if error:
        raise GrammarError(param, messages[0])
    return Grammar(text, param)


class Vocabulary:
    """llguidance's view of a model's vocabulary: every token's bytes (special tokens marked, as
    llguidance wants, by a leading 0xFF), the end-of-generation tokens a finished grammar allows, and
    mask rows of `words` int32 (the plan's: ceil(head rows / 32)). Building it walks the whole vocabulary
    (seconds for 262144 tokens), so it is built once, on first use or ahead by prepare()."""

    def __init__(self, tokenizer: Tokenizer, words: int):
        self.tokenizer = tokenizer
        self.words = words
        self._lltok: Any = None
        self._failed = ""  # why it could not be built
        self._lock = threading.Lock()

    def prepare(self) -> None:
        """Build it in a background thread (a server does when its model is ready)."""
        threading.Thread(target=self._load_quietly, name="grammar-vocabulary", daemon=True).start()

    def _load_quietly(self) -> None:
        try:
            self.load()
        except RequestError:  # said again to each constrained request
            pass

    def load(self) -> Any:
        """llguidance's tokenizer, built once (waiting for a build under way); RequestError if it cannot be."""
        with self._lock:
            if self._lltok is None and not self._failed:
                try:
                    self._lltok = self._build()
                except Exception as e:  # noqa: BLE001 (whatever llguidance makes of this vocabulary)
                    self._failed = f"{type(e).__name__}: {e}"
            if self._failed:
                raise RequestError(f"constrained decoding is not available for this model's vocabulary: {self._failed}")
            return self._lltok

    def _build(self) -> Any:
        llg = _llguidance()
        tok, v = self.tokenizer, self.tokenizer.vocab

        def piece(i: int) -> bytes:  # llama.cpp's rule (llguidance/llamacpp.py): user-defined tokens are text
            p, attr = tok.piece(i), int(v.attrs[i])  # unless they look like <control> tokens
            special = attr & (Attr.CONTROL | Attr.UNKNOWN) or (attr & Attr.USER_DEFINED and p[:1] == b"<"
                                                                 and p[-1:] == b">")
            return b"\xff" + p if special else p

        pieces = [piece(i) for i in range(tok.n_tokens)]
        pieces += [b""] * (self.words * 32 - len(pieces))  # the head's padding rows and the last word's bits

        class Source:  # what llguidance.TokenizerWrapper reads
            eos_token_id = v.eos
            bos_token_id = v.bos
            tokens = pieces
            special_token_ids: list[int] = []

            def __call__(self, text: bytes) -> list[int]:
                return tok.encode(text, add_special=False)

        return llg.LLTokenizer(llg.TokenizerWrapper(Source()), n_vocab=len(pieces), eos_token=sorted(tok.eog))

    def matcher(self, grammar: Grammar) -> Matcher:
        llg = _llguidance()
        m = llg.LLMatcher(self.load(), grammar.text, log_level=0)
        if m.is_error():
            raise GrammarError(grammar.param, _reason(m.get_error()))
        return Matcher(m, self.words, grammar.param)


class Matcher:
    """One request's place in its grammar."""

    def __init__(self, m: Any, words: int, param: str):
        self._m, self.words, self.param = m, words, param

    def fill(self, row: np.ndarray) -> None:
        """Write the mask of the tokens the grammar allows next into `row` (int32 [words], contiguous)."""
        if row.dtype != np.int32 or row.shape != (self.words,) or not row.flags["C_CONTIGUOUS"]:
            raise ValueError(f"a mask row is a contiguous int32 [{self.words}]")
        self._m.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)

    def consume(self, token: int) -> None:
        """Advance past a generated token; GrammarError if the grammar cannot go on (it does not allow
        the token, or it hit one of llguidance's limits)."""
        if not self._m.consume_token(token):
            raise GrammarError(self.param, f"cannot continue after token {token}: {_reason(self._m.get_error())}")

    @property
    def finished(self) -> bool:
        """Whether the grammar is complete and allows nothing but the end."""
        return self._m.is_stopped()

