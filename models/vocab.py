"""The vocabulary of a GGUF model: tokens, scores, token attributes, special ids and flags, validated.

What llama.cpp derives from the metadata beyond the raw arrays is derived the same way here, because
it changes token ids: its defaults for the special ids and flags per tokenizer model, the tokens it
promotes to control tokens by their text (end-of-turn, fill-in-the-middle markers), and the
end-of-generation set. Where llama.cpp would only warn about a special id outside the vocabulary,
we refuse the file: such an id would be a wrong token in every prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGUFValueType

from .errors import TokenizerError
from .gguf import GGUFFile
from .pre_tokenizers import NAMES, TYPES
from .strings import StringArray, StringIndex


class Attr:
    """Token attribute bits, as llama.cpp's llama_token_attr (plain ints: they are tested per token)."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5


# tokenizer.ggml.token_type values (gguf's TokenType: 1 normal ... 6 byte) -> attributes; others undefined
_TYPE_ATTR = np.array([Attr.UNDEFINED, Attr.NORMAL, Attr.UNKNOWN, Attr.CONTROL, Attr.USER_DEFINED, Attr.UNUSED,
                       Attr.BYTE], np.uint8)

# Token texts llama.cpp recognises when the metadata does not name the id (llama-vocab.cpp, load()).
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
              "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
_AUTO_IDS = {  # key suffix -> texts that name it; the matching token also becomes a control token
    "eot": _EOT_TEXTS,
    "eom": ("<|eom_id|>",),
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
})
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss


@dataclass(frozen=True)
class Vocab:
    """Everything the tokenizer needs from the metadata. `kind` is "spm" or "bpe"; ids are None when unset.
    The token texts are the file's one compact copy (models/strings.py), with their lookup by text."""

    kind: str
    tokens: StringArray
    scores: np.ndarray
    attrs: np.ndarray  # uint8 Attr bits per token
    token_to_id: StringIndex  # a repeated text maps to its last id, as in llama.cpp
    merges: StringArray
    pre: str  # BPE: the pre-tokenizer's name, a key of pre_tokenizers.NAMES; "" for SPM
    ignore_merges: bool  # BPE: a pre-token that is a whole token skips the merges
    escape_whitespaces: bool  # BPE: spaces are U+2581 in the tokens (Gemma 4's SentencePiece-style BPE)
    bos: int | None
    eos: int | None
    eot: int | None
    unk: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    eog: frozenset[int]
    special_ids: tuple[int, ...]  # control, user-defined and unknown tokens, longest text first
    chat_template: str | None = None
    rstrip: frozenset[int] = frozenset()  # special tokens that swallow the whitespace after them

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


def _array(gguf: GGUFFile, key: str, kinds: tuple[GGUFValueType, ...], n: int | None) -> object:
    mv = gguf.metadata.get(key)
    if mv is None:
        return None
    if mv.type != GGUFValueType.ARRAY or mv.element_type not in kinds:
        want = " or ".join(k.name for k in kinds)
        got = mv.element_type.name if mv.element_type is not None else mv.type.name
        raise TokenizerError(f"{gguf.path}: {key} must be an array of {want}, is {got}")
    if n is not None and len(mv.value) < n:
        raise TokenizerError(f"{gguf.path}: {key} has {len(mv.value)} entries for {n} tokens")
    return mv.value


def _flag(gguf: GGUFFile, key: str, default: bool) -> bool:
    mv = gguf.metadata.get(key)
    if mv is None:
        return default
    if mv.type != GGUFValueType.BOOL:
        raise TokenizerError(f"{gguf.path}: {key} must be BOOL, is {mv.type.name}")
    return bool(mv.value)


def _token_id(gguf: GGUFFile, key: str, default: int | None, n: int) -> int | None:
    if default is not None and default >= n:
        default = None  # llama.cpp disables a default id the vocabulary does not reach
    mv = gguf.metadata.get(key)
    if mv is None:
        return default
    if not isinstance(mv.value, (int, np.integer)) or isinstance(mv.value, bool):
        raise TokenizerError(f"{gguf.path}: {key} must be an integer, is {mv.type.name}")
    if not 0 <= mv.value < n:
        raise TokenizerError(f"{gguf.path}: {key} = {mv.value} is outside the vocabulary ({n} tokens)")
    return int(mv.value)


def read_vocab(gguf: GGUFFile) -> Vocab:
    """The validated vocabulary of `gguf`; raises TokenizerError for anything we cannot tokenize with."""
    path = gguf.path
    model = gguf.get("tokenizer.ggml.model")
    if model is None:
        raise TokenizerError(f"{path}: no tokenizer.ggml.model: the file carries no tokenizer")
    _check_model(gguf, model)
    kind = "spm" if model == "llama" else "bpe"

    tokens = _array(gguf, "tokenizer.ggml.tokens", (GGUFValueType.STRING,), None)
    if not tokens:
        raise TokenizerError(f"{path}: tokenizer.ggml.tokens is missing or empty")
    n = len(tokens)
    if n >= 2**31:
        raise TokenizerError(f"{path}: {n} tokens do not fit 32-bit token ids")
    if not tokens.lengths.all():  # llama.cpp names empty tokens so that none of them can match text
        tokens = StringArray.of(t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens))
    scores = _array(gguf, "tokenizer.ggml.scores", (GGUFValueType.FLOAT32, GGUFValueType.INT32), n)
    scores = np.zeros(n, np.float32) if scores is None else np.asarray(scores[:n], np.float32)
    types = _array(gguf, "tokenizer.ggml.token_type", (GGUFValueType.INT32,), n)
    if types is None:
        attrs = np.full(n, Attr.NORMAL, np.uint8)
    else:
        types = np.asarray(types[:n])
        attrs = _TYPE_ATTR[np.where((types >= 0) & (types < len(_TYPE_ATTR)), types, 0)]
    token_to_id = StringIndex(tokens)

    merges = StringArray.of([])
    pre_name, pre = "", None
    if kind == "spm":
        add_bos, add_space_prefix, defaults = True, True, {"bos": 1, "eos": 2, "unknown": 0}
    else:
        pre_name = _pre_tokenizer_name(gguf, model)
        pre = NAMES[pre_name]
        found = _array(gguf, "tokenizer.ggml.merges", (GGUFValueType.STRING,), None)
        if found is not None:
            merges = found
        elif pre_name != "kimi-k2":  # as llama.cpp: Kimi K2 files may carry no merges
            raise TokenizerError(f"{path}: a {model} (BPE) vocabulary needs tokenizer.ggml.merges")
        add_bos, add_space_prefix = pre.add_bos, False
        # llama.cpp's defaults: 11 for the gpt2 model (GPT-2's own ids), none for gemma4's
        bos = 11 if model == "gpt2" and pre.keeps_bos_id else None
        defaults = {"bos": bos, "eos": 11 if model == "gpt2" else None, "unknown": None}

    ids = {k: _token_id(gguf, f"tokenizer.ggml.{k}_token_id", defaults.get(k), n)
           for k in ("bos", "eos", "unknown", *_AUTO_IDS)}
    add_bos = _flag(gguf, "tokenizer.ggml.add_bos_token", add_bos)
    if pre is not None and TYPES[pre.type].force_bos:
        add_bos = True  # llama.cpp's Gemma 4 workaround, whatever the file says
    add_eos = _flag(gguf, "tokenizer.ggml.add_eos_token", False)
    add_space_prefix = _flag(gguf, "tokenizer.ggml.add_space_prefix", add_space_prefix)
    for name, what in (("bos", add_bos), ("eos", add_eos)):
        if what and ids[name] is None:
            raise TokenizerError(f"{path}: tokenizer.ggml.add_{name}_token is set but the vocabulary has no "
                                 f"{name.upper()} token")

    # Ids named only by their text. Where several texts match, llama.cpp takes the first in its hash
    # table's order; we take the first in the list's order (<|eot_id|> before <|end_of_text|>).
    for key, texts in _AUTO_IDS.items():
        if ids[key] is None:
            found = next((token_to_id[t] for t in texts if t in token_to_id), None)
            if found is not None:
                ids[key] = found
                attrs[found] |= Attr.CONTROL
    eog = _end_of_generation(tokens, attrs, token_to_id, ids)

    special = np.flatnonzero(attrs & (Attr.CONTROL | Attr.USER_DEFINED | Attr.UNKNOWN))
    special = special[np.argsort(-tokens.lengths[special], kind="stable")].tolist()
    template = gguf.get("tokenizer.chat_template")
    name = gguf.get("general.name")
    return Vocab(
        kind=kind, tokens=tokens, scores=scores, attrs=attrs, token_to_id=token_to_id, merges=merges,
        pre=pre_name, ignore_merges=pre is not None and pre.ignore_merges,
        escape_whitespaces=pre is not None and pre.escape_whitespaces,
        bos=ids["bos"], eos=ids["eos"], eot=ids["eot"], unk=ids["unknown"],
        add_bos=add_bos, add_eos=add_eos, add_space_prefix=add_space_prefix, eog=eog,
        special_ids=tuple(special), chat_template=template if isinstance(template, str) else None,
        rstrip=_rstrip(name if isinstance(name, str) else "", special, token_to_id),
    )


def _rstrip(model_name: str, special: list[int], token_to_id: StringIndex) -> frozenset[int]:
    """The special tokens after which llama.cpp drops whitespace (its RSTRIP attribute): for a model named
    Phi-3, every special token and </s> but <unk>, <s> and <|endoftext|> (llama-vocab.cpp, load())."""
    if not any(n in model_name.lower() for n in ("phi-3", "phi3")):
        return frozenset()
    ids = set(special) | {token_to_id[t] for t in ("</s>",) if t in token_to_id}
    return frozenset(ids - {token_to_id[t] for t in ("<unk>", "<s>", "<|endoftext|>") if t in token_to_id})


def check_tokenizer(gguf: GGUFFile) -> None:
    """Refuse a file whose tokenizer we cannot run (its tokenizer model or pre-tokenizer name) from the
    metadata alone, so that `plan info` and `plan compile` say so before a plan is made; a file with no
    tokenizer at all is left to the commands that need one."""
    model = gguf.get("tokenizer.ggml.model")
    if model is None:
        return
    _check_model(gguf, model)
    if model != "llama":
        _pre_tokenizer_name(gguf, model)


def _check_model(gguf: GGUFFile, model) -> None:
    if not isinstance(model, str):
        raise TokenizerError(f"{gguf.path}: tokenizer.ggml.model must be a string")
    if model in ("no_vocab", "none"):
        raise TokenizerError(f"{gguf.path}: the model has no vocabulary (tokenizer.ggml.model = {model!r})")
    if model not in ("llama", "gpt2", "gemma4"):
        raise TokenizerError(f"{gguf.path}: unsupported tokenizer.ggml.model {model!r} (supported: 'llama' for "
                             "SentencePiece, 'gpt2' for byte-level BPE, 'gemma4' for Gemma 4's BPE)")


def _pre_tokenizer_name(gguf: GGUFFile, model: str) -> str:
    """tokenizer.ggml.pre, as llama.cpp reads it: 'default' when missing or empty (llama.cpp warns), and
    always 'gemma4' for the gemma4 tokenizer model."""
    if model == "gemma4":
        return "gemma4"
    name = gguf.get("tokenizer.ggml.pre")
    if name is None or (isinstance(name, str) and not name):
        return "default"
    if not isinstance(name, str) or name not in NAMES:
        raise TokenizerError(f"{gguf.path}: unknown pre-tokenizer tokenizer.ggml.pre = {name!r} "
                             f"(supported: {', '.join(sorted(NAMES))})")
    return name


def _end_of_generation(tokens: StringArray, attrs: np.ndarray, token_to_id: StringIndex,
                       ids: dict[str, int | None]) -> frozenset[int]:
    """llama.cpp's special_eog_ids, with the attribute changes it makes on the way."""
    eog = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if ids[k] is not None}
    for text in _EOG_TEXTS:
        if text in token_to_id:
            eog.add(token_to_id[text])
            attrs[token_to_id[text]] |= Attr.CONTROL
    for text in _ALWAYS_RENDERED:
        if text in token_to_id:
            attrs[token_to_id[text]] = Attr.USER_DEFINED
    eog |= {ids[k] for k in ("eos", "eot", "eom") if ids[k] is not None}

    texts = {tokens[i]: i for i in eog}
    # harmony / solar-open: "<|end|>" ends a message, not the generation, when these markers exist
    has_call = "<|call|>" in texts or "<|calls|>" in texts
    if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
        eog.discard(texts["<|end|>"])
        attrs[texts["<|end|>"]] = Attr.USER_DEFINED
    # gemma4 / plamo2: "</s>" is an ordinary token there
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        eog.discard(texts["</s>"])
        attrs[texts["</s>"]] = Attr.NORMAL
    return frozenset(eog)
