"""Every BPE pre-tokenizer llama.cpp names, against llama.cpp's own ids on real vocabularies
(tests/data/llamacpp_pretokenizers.json, recorded by scripts/llamacpp_tokenizer_refs.py): a corpus of
hard strings, special tokens as text and parsed, with and without the tokens llama.cpp adds; its
end-of-generation tokens; and what loading a vocabulary takes from the pre-tokenizer's name."""

import json
import random
import re
import time
import warnings
from pathlib import Path

import pytest
from gguf import GGUFValueType

from llmplan.models.errors import TokenizerError
from llmplan.models.gguf import GGUFFile, MetaValue
from llmplan.models.pre_tokenizers import NAMES, TYPES
from llmplan.models.pretokenize import LINEAR, pre_tokenizer, splitter, std_regex_stage
from llmplan.models.tokenizer import Tokenizer
from llmplan.models.vocab import read_vocab

DATA = Path(__file__).parent / "data"
REFS = json.loads((DATA / "llamacpp_pretokenizers.json").read_text())


def _gguf(vocab: str, set_: dict[str, str] | None = None, drop: list[str] | None = None) -> GGUFFile:
    g = GGUFFile(DATA / vocab)
    for key in drop or []:
        g.metadata.pop(key, None)
    for key, value in (set_ or {}).items():
        g.metadata[key] = MetaValue(GGUFValueType.STRING, value)
    return g


def _tokenizer(entry: dict) -> Tokenizer:
    return Tokenizer(read_vocab(_gguf(entry["vocab"], entry["set"], entry["drop"])))


# (name, a vocabulary it was recorded on)
RECORDED = [(name, entry) for name in sorted(REFS["names"]) for entry in REFS["names"][name]]


def test_every_name_is_recorded():
    assert set(REFS["names"]) == set(NAMES)
    assert {NAMES[n].type for n in NAMES} == set(TYPES)


@pytest.mark.parametrize("name, entry", RECORDED, ids=[f"{n}-{e['vocab'][6:-5]}" for n, e in RECORDED])
def test_ids_match_llama_cpp(name, entry):
    run = REFS["runs"][entry["run"]]
    texts = REFS["texts"] + REFS["vocabs"][entry["vocab"]]["texts"]
    before, after = run["add_special"]["before"], run["add_special"]["after"]
    tok = _tokenizer(entry)
    assert tok.vocab.pre == name
    compared = 0
    for text, plain, parsed in zip(texts, run["plain"], run["parsed"], strict=True):
        if plain is None:  # a text llama.cpp aborts on (the script says which)
            continue
        parsed = plain if parsed is None else parsed
        assert tok.encode(text, add_special=False) == plain, text
        assert tok.encode(text, add_special=False, parse_special=True) == parsed, text
        assert tok.encode(text) == before + plain + after, text
        assert tok.encode(text, parse_special=True) == before + parsed + after, text
        compared += 1
    assert compared >= 40


@pytest.mark.parametrize("vocab", sorted(REFS["vocabs"]))
def test_end_of_generation_matches_llama_cpp(vocab):
    tok = Tokenizer(read_vocab(_gguf(vocab)))
    assert tok.eog == set(REFS["vocabs"][vocab]["eog"])


@pytest.mark.parametrize("vocab, texts", [
    ("vocab-qwen2.gguf", {"<|endoftext|>", "<|im_end|>", "</s>"}),
    ("vocab-phi-3.gguf", {"<|endoftext|>", "<|end|>", "</s>"}),
    ("vocab-gemma-4.gguf", {"<eos>", "<turn|>", "<|tool_response>"}),
])
def test_chat_end_tokens(vocab, texts):
    """The chat families' turn ends stop generation (their ids are in the recorded sets above)."""
    tok = Tokenizer(read_vocab(_gguf(vocab)))
    assert {tok.vocab.tokens[i] for i in tok.eog} == texts


@pytest.mark.parametrize("pre_type", sorted(TYPES))
def test_pieces_cover_the_text(pre_type):
    split = pre_tokenizer(TYPES[pre_type].expressions)
    for text in REFS["texts"]:
        pieces = split(text)
        assert "".join(pieces) == text and all(pieces)


def test_expressions_compile_without_warnings():
    pre_tokenizer.cache_clear()
    re.purge()  # a pattern compiled before would come from re's cache, without its warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # re warns where a class would mean something else in future
        for pre_type in TYPES.values():
            pre_tokenizer(pre_type.expressions)


@pytest.mark.parametrize("expression", [r"\ba", r"^a", r"a.b", r"(?<=a)b"])
def test_unsupported_expression_syntax(expression):
    with pytest.raises(TokenizerError, match="is not supported|are not supported"):
        pre_tokenizer((expression,))


def test_names_set_llama_cpp_defaults():
    qwen = "vocab-qwen2.gguf"
    no_bos_key = ["tokenizer.ggml.bos_token_id"]
    # the gpt2 model's default BOS is id 11, except for ChatGLM's names
    assert read_vocab(_gguf(qwen, drop=no_bos_key)).bos == 11
    assert read_vocab(_gguf(qwen, {"tokenizer.ggml.pre": "chatglm-bpe"}, no_bos_key)).bos is None
    # Gemma 4 adds BOS whatever the file says
    gemma = _gguf("vocab-gemma-4.gguf")
    gemma.metadata["tokenizer.ggml.add_bos_token"] = MetaValue(GGUFValueType.BOOL, False)
    assert read_vocab(gemma).add_bos
    # Kimi K2 files may carry no merges; other BPE files may not
    assert read_vocab(_gguf(qwen, {"tokenizer.ggml.pre": "kimi-k2"}, ["tokenizer.ggml.merges"])).merges == []
    with pytest.raises(TokenizerError, match="needs tokenizer.ggml.merges"):
        read_vocab(_gguf(qwen, drop=["tokenizer.ggml.merges"]))


@pytest.mark.parametrize("name", ["gemma4", "sarvam-moe", "granite-embed-multi-311m"])
def test_escaped_spaces_decode_back(name):
    (entry,) = REFS["names"][name]
    tok = _tokenizer(entry)
    for text in REFS["texts"]:
        assert tok.decode(tok.encode(text, add_special=False)) == text, text


@pytest.mark.parametrize("expression", sorted(LINEAR))
def test_linear_stages_cut_as_their_expressions(expression):
    """The expressions run by linear functions, against std::regex's way on random text and on long runs
    (where the expressions take quadratic time and the functions must not)."""
    alphabet = list("0123456789 \t\n\u3000a٣.") + ["\u00a0", "😀"]
    rng = random.Random(5)
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))) for _ in range(3000)]
    slow, fast = splitter([std_regex_stage(expression)]), pre_tokenizer((expression,))
    for text in texts:
        assert fast(text) == slow(text), text
    start = time.perf_counter()
    fast(" " * 200_000 + "1" * 200_000 + "x")
    assert time.perf_counter() - start < 5.0  # the expressions would take minutes
