"""Byte-level BPE vocabularies (tokenizer.ggml.model = gpt2) against llama.cpp: the recorded strings in
both modes, the prompts, llama.cpp's own Llama 3 cases, and its pre-tokenizer matchers on random text;
plus what a vocabulary must be to load."""

import dataclasses
import random

import numpy as np
import pytest
from gguf import GGUFValueType

from conftest import TINY_BPE, TINY_SPM, VOCAB_BPE
from llamacpp_port import split_digit_groups, split_gpt2, split_kimi_k2, split_llama3
from llmplan.models.errors import TokenizerError
from llmplan.models.gguf import GGUFFile, MetaValue
from llmplan.models.pre_tokenizers import AFMOE_DIGITS, GPT2, KIMI_K2, LLAMA3, QWEN2, QWEN35, TYPES
from llmplan.models.pretokenize import pre_tokenizer
from llmplan.models.strings import StringArray, StringIndex
from llmplan.models.tokenizer import Tokenizer, load_tokenizer
from llmplan.models.tokenizer_bpe import byte_to_char
from llmplan.models.vocab import read_vocab
from tokenizer_refs import BPE_FILES, reference, vocab_cases


@pytest.fixture(params=list(BPE_FILES))
def bpe(request):
    return request.param, load_tokenizer(BPE_FILES[request.param])


def test_reference_strings_both_modes(bpe):
    name, tok = bpe
    cases = reference(name)["tokenize"]
    assert len(cases) == 36
    for case in cases:
        ids = tok.encode(case["text"], add_special=case["add_bos"], parse_special=case.get("parse_special", False))
        assert ids == case["ids"], (name, case)


def test_llama3_vocab_cases():
    tok = load_tokenizer(VOCAB_BPE)
    for text, ids in vocab_cases(VOCAB_BPE):
        assert tok.encode(text, add_special=False) == ids, text


# letters, numbers, whitespace and the rest, from several scripts and Unicode versions: U+11F02 is a
# letter for llama.cpp (Unicode 15.1) but unassigned in Python 3.11's tables; U+0378 is unassigned;
# U+0915 U+093F is a letter and its combining mark, U+F900 a Han compatibility ideograph
_ALPHABET = (list("aAzZ09 '''sStTmMdDrReEvVlL.,!?-_()<>|$+^~=`@#%&*/\\\"\t\r\n  ")
             + list("éжΩ日本ß²³٣Ⅻ①\u00a0\u3000\u2028\u0085\x0b\x0c\x00\x1c\x1f\u0301\u200b\ufeff😀∑\ue000")
             + ["\U00011F02", "\U0002EBF0", "\u0378", "\u2581", "\u0130", "\u212a", "\u0915\u093f", "\uf900"])


@pytest.mark.parametrize("expression, port", [
    (LLAMA3, split_llama3), (GPT2, split_gpt2), (QWEN2, lambda t: split_llama3(t, max_digits=1)),
    (QWEN35, lambda t: split_llama3(t, max_digits=1, marks=True)), (KIMI_K2, split_kimi_k2),
    (AFMOE_DIGITS, split_digit_groups),
], ids=["llama3", "gpt2", "qwen2", "qwen35", "kimi-k2", "digit-groups"])
def test_pre_tokenizer_matches_llama_cpp(expression, port):
    """llama.cpp's hand-written matchers, ported literally, against our expressions for them."""
    split = pre_tokenizer((expression,))
    rng = random.Random(2)
    for _ in range(4000):
        text = "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 24)))
        assert split(text) == port(text), text


def test_default_pre_tokenizer():
    split = pre_tokenizer(TYPES["default"].expressions)
    text = "Hello, world!! 12345 it's <x> x+=1 ٣٤٥٦"
    words = split(text)
    assert "".join(words) == text
    # punctuation runs split first (so "'s" is no contraction here), then GPT-2's rule, then numbers,
    # then groups of three ASCII digits
    assert words == ["Hello", ",", " world", "!!", " ", "123", "45", " it", "'", "s", " ", "<", "x", ">", " x",
                     "+=", "1", " ", "٣٤٥٦"]


def _with(path, **changes):
    g = GGUFFile(path)
    for key, value in changes.items():
        if value is None:
            g.metadata.pop(key, None)
        else:
            g.metadata[key] = value
    return g


def test_unknown_pre_tokenizer_is_an_error():
    g = _with(TINY_BPE, **{"tokenizer.ggml.pre": MetaValue(GGUFValueType.STRING, "qwen-9000")})
    with pytest.raises(TokenizerError, match="unknown pre-tokenizer tokenizer.ggml.pre = 'qwen-9000'"):
        read_vocab(g)
    # a missing name means 'default', as in llama.cpp
    assert read_vocab(_with(TINY_BPE, **{"tokenizer.ggml.pre": None})).pre == "default"


@pytest.mark.parametrize("key, value, match", [
    ("tokenizer.ggml.bos_token_id", MetaValue(GGUFValueType.UINT32, 3000), "bos_token_id = 3000 is outside"),
    ("tokenizer.ggml.eos_token_id", MetaValue(GGUFValueType.UINT32, 10**6), "eos_token_id = 1000000 is outside"),
    ("tokenizer.ggml.eos_token_id", MetaValue(GGUFValueType.STRING, "4"), "must be an integer"),
    ("tokenizer.ggml.model", MetaValue(GGUFValueType.STRING, "bert"), "unsupported tokenizer.ggml.model 'bert'"),
    ("tokenizer.ggml.merges", None, "needs tokenizer.ggml.merges"),
    ("tokenizer.ggml.model", MetaValue(GGUFValueType.ARRAY, np.ones(2, np.int32), GGUFValueType.INT32),
     "tokenizer.ggml.model must be a string"),
    ("tokenizer.ggml.pre", MetaValue(GGUFValueType.ARRAY, np.ones(2, np.int32), GGUFValueType.INT32),
     "unknown pre-tokenizer"),
    ("tokenizer.ggml.tokens", None, "tokenizer.ggml.tokens is missing"),
    ("tokenizer.ggml.token_type", MetaValue(GGUFValueType.ARRAY, np.ones(10, np.int32), GGUFValueType.INT32),
     "has 10 entries for 3000 tokens"),
    ("tokenizer.ggml.add_bos_token", MetaValue(GGUFValueType.UINT8, 1), "must be BOOL"),
])
def test_bad_vocabularies(key, value, match):
    with pytest.raises(TokenizerError, match=match):
        read_vocab(_with(TINY_BPE, **{key: value}))


def test_no_tokenizer():
    with pytest.raises(TokenizerError, match="no tokenizer.ggml.model"):
        read_vocab(_with(TINY_SPM, **{"tokenizer.ggml.model": None}))


def test_special_tokens_and_bos():
    tok = load_tokenizer(VOCAB_BPE)
    v = tok.vocab
    assert (v.bos, v.eos, v.add_bos, v.add_eos, v.ignore_merges) == (128000, 128001, True, False, True)
    text = "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
    parsed = tok.encode(text, parse_special=True)
    assert parsed[:2] == [128000, 128006] and parsed[-1] == 128009
    plain = tok.encode(text, add_special=False)
    assert not set(plain) & {128006, 128007, 128009}
    assert {v.tokens[i] for i in tok.eog} == {"<|end_of_text|>", "<|eot_id|>"}  # Llama 3.0: no <|eom_id|>
    assert v.eot == 128009


def test_bytes_without_tokens_are_dropped():
    # llama.cpp spells a symbol that is not a token with single-byte tokens and skips bytes that have
    # none; real vocabularies have all 256, so take one away here
    v = read_vocab(GGUFFile(TINY_BPE))
    assert len(Tokenizer(v).encode("😀", add_special=False)) == 4
    tokens = list(v.tokens)
    tokens[v.token_to_id[byte_to_char()[0x98]]] = "no-longer-a-byte"
    tokens = StringArray.of(tokens)
    v = dataclasses.replace(v, tokens=tokens, token_to_id=StringIndex(tokens))
    assert len(Tokenizer(v).encode("😀", add_special=False)) == 3
