"""Synthetic tokenizer vocabularies for the synthetic-model builder.

Each vocabulary is laid out like the real one it stands in for (special tokens, 256 byte tokens,
then pieces built by merging earlier pieces, so every piece is reachable by the merge rules), and is
written with the metadata keys llama.cpp reads. Deterministic for a given seed.
"""

from __future__ import annotations

import numpy as np
from gguf import GGUFValueType as V, TokenType

from .gguf import MetaValue

SPM_SPACE = "\u2581"
BPE_SPACE = "\u0120"  # byte-level BPE's stand-in for the space byte
_ALPHABET = [SPM_SPACE] + [chr(c) for c in range(33, 127)]

# The chat templates of the vocabularies' families, reduced to what the synthetic models need.
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
TURN_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
# Phi-3.5-mini's template
PHI3_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}"
    "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
    "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)
PHI3_TOKENS = ("<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>", "<|user|>")


def gpt2_byte_chars() -> list[str]:
    """Byte-level BPE's printable stand-ins for the 256 byte values, in GPT-2's (and Llama 3's) order."""
    order = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    rest = [b for b in range(256) if b not in order]
    chars = [chr(b) for b in order] + [chr(256 + i) for i in range(len(rest))]
    return chars


def _by_frequency(chars: list[str], space: str) -> list[str]:
    """Characters in a rough order of how often text uses them: space, lowercase, uppercase, digits, rest."""
    rank = lambda c: (c != space, not c.islower(), not c.isupper(), not c.isdigit())  # noqa: E731
    return sorted(chars, key=rank)


def _merged_pieces(base: list[str], count: int, rng: np.random.Generator, max_len: int = 12) -> list[tuple[str, str]]:
    """`count` new (left, right) pairs whose concatenations are distinct and not in `base`; `base` is in
    order of preference."""
    pieces = list(base)
    seen = set(pieces)
    pairs: list[tuple[str, str]] = []
    while len(pairs) < count:
        # cubing a uniform draw favours early (short, frequent) pieces, as real merge lists do
        u = rng.random((2, 4 * (count - len(pairs)) + 64)) ** 3
        for ua, ub in zip(u[0], u[1]):
            a, b = pieces[int(ua * len(pieces))], pieces[int(ub * len(pieces))]
            s = a + b
            if len(s) > max_len or s in seen:
                continue
            seen.add(s)
            pieces.append(s)
            pairs.append((a, b))
            if len(pairs) == count:
                break
    return pairs


def _arr(values, etype: V) -> MetaValue:
    return MetaValue(V.ARRAY, values, etype)


def _spm(specials: list[tuple[str, TokenType]], vocab_size: int, rng: np.random.Generator):
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    n_pieces = vocab_size - len(specials) - 256
    if n_pieces < len(_ALPHABET):
        raise ValueError(f"vocabulary of {vocab_size} is too small for a SentencePiece layout")
    merged = [a + b for a, b in _merged_pieces(_by_frequency(_ALPHABET, SPM_SPACE), n_pieces - len(_ALPHABET), rng)]
    # like SentencePiece BPE exports: merged pieces by rank, single characters last
    pieces = merged + _ALPHABET
    tokens = [s for s, _ in specials] + bytes_ + pieces
    types = [int(t) for _, t in specials] + [int(TokenType.BYTE)] * 256 + [int(TokenType.NORMAL)] * len(pieces)
    scores = np.zeros(vocab_size, np.float32)
    scores[len(specials) + 256:] = -np.arange(len(pieces), dtype=np.float32)
    return tokens, scores, np.array(types, np.int32)


def tokenizer_metadata(style: str, vocab_size: int, seed: int) -> list[tuple[str, MetaValue]]:
    """tokenizer.* keys for a synthetic vocabulary: 'llama-spm', 'phi3-spm', 'gemma3' or 'llama3-bpe'."""
    rng = np.random.default_rng([seed, 0x70C])
    C, U = TokenType.CONTROL, TokenType.USER_DEFINED
    if style == "llama3-bpe":
        return _llama3_bpe(vocab_size, rng)
    if style == "llama-spm":
        specials = [("<unk>", TokenType.UNKNOWN), ("<s>", C), ("</s>", C), ("<start_of_turn>", U), ("<end_of_turn>", U)]
        ids = {"bos": 1, "eos": 2, "unknown": 0}
        extra = [("tokenizer.ggml.add_bos_token", MetaValue(V.BOOL, True)),
                 ("tokenizer.ggml.add_eos_token", MetaValue(V.BOOL, False))]
    elif style == "phi3-spm":
        # llama.cpp requires <|endoftext|> in a model whose general.name says phi3 (it sets the chat tokens' rstrip)
        specials = [("<unk>", TokenType.UNKNOWN), ("<s>", C), ("</s>", C)] + [(t, C) for t in PHI3_TOKENS]
        ids = {"bos": 1, "eos": 3, "unknown": 0}
        extra = [("tokenizer.ggml.add_bos_token", MetaValue(V.BOOL, False)),
                 ("tokenizer.ggml.add_eos_token", MetaValue(V.BOOL, False))]
    elif style == "gemma3":
        specials = [("<pad>", C), ("<eos>", C), ("<bos>", C), ("<unk>", C), ("<mask>", C),
                    ("<start_of_turn>", C), ("<end_of_turn>", C)]
        ids = {"bos": 2, "eos": 1, "unknown": 3, "padding": 0}
        extra = [("tokenizer.ggml.add_bos_token", MetaValue(V.BOOL, True)),
                 ("tokenizer.ggml.add_eos_token", MetaValue(V.BOOL, False)),
                 ("tokenizer.ggml.add_space_prefix", MetaValue(V.BOOL, False))]
    else:
        raise ValueError(f"unknown tokenizer style {style!r}")
    tokens, scores, types = _spm(specials, vocab_size, rng)
    out = [
        ("tokenizer.ggml.model", MetaValue(V.STRING, "llama")),
        ("tokenizer.ggml.pre", MetaValue(V.STRING, "default")),
        ("tokenizer.ggml.tokens", _arr(tokens, V.STRING)),
        ("tokenizer.ggml.scores", _arr(scores, V.FLOAT32)),
        ("tokenizer.ggml.token_type", _arr(types, V.INT32)),
    ]
    out += [(f"tokenizer.ggml.{k}_token_id", MetaValue(V.UINT32, v)) for k, v in ids.items()]
    template = PHI3_TEMPLATE if style == "phi3-spm" else TURN_TEMPLATE
    return out + extra + [("tokenizer.chat_template", MetaValue(V.STRING, template))]


def _llama3_specials(vocab_size: int) -> list[str]:
    if vocab_size < 4096:  # a small vocabulary keeps only the tokens the chat format uses
        return ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    named = {0: "begin_of_text", 1: "end_of_text", 4: "finetune_right_pad_id", 6: "start_header_id",
             7: "end_header_id", 8: "eom_id", 9: "eot_id", 10: "python_tag"}
    out, reserved = [], 0
    for i in range(256):
        if i in named:
            out.append(f"<|{named[i]}|>")
        else:
            out.append(f"<|reserved_special_token_{reserved}|>")
            reserved += 1
    return out


def _llama3_bpe(vocab_size: int, rng: np.random.Generator) -> list[tuple[str, MetaValue]]:
    specials = _llama3_specials(vocab_size)
    base = gpt2_byte_chars()
    n_merges = vocab_size - len(specials) - len(base)
    if n_merges < 0:
        raise ValueError(f"vocabulary of {vocab_size} is too small for a byte-level BPE layout")
    pairs = _merged_pieces(_by_frequency(base, BPE_SPACE), n_merges, rng)
    tokens = base + [a + b for a, b in pairs] + specials
    types = np.full(vocab_size, int(TokenType.NORMAL), np.int32)
    types[-len(specials):] = int(TokenType.CONTROL)
    first = vocab_size - len(specials)
    return [
        ("tokenizer.ggml.model", MetaValue(V.STRING, "gpt2")),
        ("tokenizer.ggml.pre", MetaValue(V.STRING, "llama-bpe")),
        ("tokenizer.ggml.tokens", _arr(tokens, V.STRING)),
        ("tokenizer.ggml.token_type", _arr(types, V.INT32)),
        ("tokenizer.ggml.merges", _arr([f"{a} {b}" for a, b in pairs], V.STRING)),
        ("tokenizer.ggml.bos_token_id", MetaValue(V.UINT32, first + specials.index("<|begin_of_text|>"))),
        ("tokenizer.ggml.eos_token_id", MetaValue(V.UINT32, first + specials.index("<|eot_id|>"))),
        ("tokenizer.ggml.add_bos_token", MetaValue(V.BOOL, True)),
        ("tokenizer.chat_template", MetaValue(V.STRING, LLAMA3_TEMPLATE)),
    ]
