"""SentencePiece vocabularies (tokenizer.ggml.model = llama) against llama.cpp: the recorded strings in
both modes, the prompts, llama.cpp's own Llama 2 cases, and its merge loop on random text."""

import dataclasses
import random

import pytest

from llmplan.models.errors import TokenizerError
from llmplan.models.gguf import GGUFFile
from llmplan.models.strings import StringArray, StringIndex
from llmplan.models.tokenizer import Tokenizer, load_tokenizer
from llmplan.models.vocab import read_vocab

from conftest import TINY_SPM, VOCAB_SPM
from llamacpp_port import spm_tokenize
from tokenizer_refs import SPM_FILES, model_path, reference, vocab_cases


@pytest.fixture(params=list(SPM_FILES))
def spm(request):
    return request.param, load_tokenizer(model_path(request, request.param))


def test_reference_strings_both_modes(spm):
    name, tok = spm
    cases = reference(name)["tokenize"]
    assert len(cases) == 36
    for case in cases:
        ids = tok.encode(case["text"], add_special=case["add_bos"], parse_special=case.get("parse_special", False))
        assert ids == case["ids"], (name, case)


def test_llama2_vocab_cases():
    tok = load_tokenizer(VOCAB_SPM)
    for text, ids in vocab_cases(VOCAB_SPM):
        assert tok.encode(text, add_special=False) == ids, text


_ALPHABET = (list("aAzZ09 '.,!?-_()<>|\t\r\n  ") + list("éжΩ日本語ß²٣①\u00a0\u3000\x00\x1f\u0301\u200b😀∑")
             + ["the", "ing", " of", "<s>", "</s>", "<unk>", "<0x41>", "<mask>", "<start_of_turn>", "\u2581\u2581"])


def test_sentencepiece_merges_like_llama_cpp(spm):
    """The sentencepiece library, as we set it up, runs llama.cpp's SPM loop: same ids on random text."""
    _, tok = spm
    v = tok.vocab
    rng = random.Random(1)
    for _ in range(1500):
        text = "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(1, 20))).replace(" ", "\u2581")
        assert tok._model.encode(text) == spm_tokenize(text, v.token_to_id, v.scores), text


def test_vocab_only_file_loads():
    g = GGUFFile(VOCAB_SPM)
    assert not g.tensors
    tok = load_tokenizer(g)
    assert tok.n_tokens == 32000 and tok.encode("Hello world") == [1, 15043, 3186]


def test_space_prefix_and_special_flags():
    tok = load_tokenizer(TINY_SPM)
    v = tok.vocab
    assert v.add_space_prefix and v.add_bos and not v.add_eos
    # the prefix goes before the text and again after every special token cut out of it
    assert v.tokens[tok.encode("user", add_special=False)[0]] == "\u2581user"
    ids = tok.encode("<start_of_turn>user", add_special=False)
    assert ids[0] == v.token_to_id["<start_of_turn>"] and v.tokens[ids[1]] == "\u2581user"
    no_prefix = Tokenizer(dataclasses.replace(v, add_space_prefix=False))
    assert v.tokens[no_prefix.encode("<start_of_turn>user", add_special=False)[1]] != "\u2581user"
    with_eos = Tokenizer(dataclasses.replace(v, add_eos=True))
    assert with_eos.encode("hi") == [v.bos, *tok.encode("hi", add_special=False), v.eos]
    assert with_eos.encode("hi", add_special=False) == tok.encode("hi", add_special=False)


def test_user_defined_always_control_only_when_parsed():
    tok = load_tokenizer(TINY_SPM)
    start, end = tok.vocab.token_to_id["<start_of_turn>"], tok.vocab.token_to_id["<end_of_turn>"]
    # <start_of_turn> is user-defined: cut out in both modes; <end_of_turn> ends a turn, which makes
    # it a control token for llama.cpp: a single id only when special tokens are parsed
    plain = tok.encode("<start_of_turn>x<end_of_turn>", add_special=False)
    parsed = tok.encode("<start_of_turn>x<end_of_turn>", add_special=False, parse_special=True)
    assert plain[0] == start and end not in plain
    assert parsed[0] == start and parsed[-1] == end
    assert tok.encode("<s>", add_special=False, parse_special=True) == [tok.bos]
    assert tok.bos not in tok.encode("<s>", add_special=False)


def test_end_of_generation_sets(request):
    gemma = load_tokenizer(model_path(request, "gemma3-270m"))
    names = lambda tok: {tok.vocab.tokens[i] for i in tok.eog}  # noqa: E731
    assert names(gemma) == {"<eos>", "<end_of_turn>", "</s>"}
    assert names(load_tokenizer(TINY_SPM)) == {"</s>", "<end_of_turn>"}
    assert names(load_tokenizer(VOCAB_SPM)) == {"</s>"}
    assert gemma.is_eog(gemma.vocab.token_to_id["<end_of_turn>"]) and not gemma.is_eog(gemma.bos)


def test_gemma_vocabulary(request):
    v = read_vocab(GGUFFile(model_path(request, "gemma3-270m")))
    assert (v.kind, v.n_tokens, len(v.special_ids), v.bos, v.eos, v.unk) == ("spm", 262144, 6414, 2, 1, 3)
    assert v.add_bos and not v.add_space_prefix
    # special tokens are cut out longest first
    lengths = [len(v.tokens[i].encode()) for i in v.special_ids]
    assert lengths == sorted(lengths, reverse=True)


def _with_tokens(v, tokens):
    tokens = StringArray.of(tokens)
    return dataclasses.replace(v, tokens=tokens, token_to_id=StringIndex(tokens))


def test_unknown_token_without_byte_tokens():
    # Without all 256 byte tokens a character the vocabulary lacks becomes the unknown token (llama.cpp
    # would abort); with no unknown token either, it is an error.
    v = read_vocab(GGUFFile(TINY_SPM))
    lacking = "\u16a0"  # a runic letter: not in this small vocabulary
    assert lacking not in v.token_to_id
    with_bytes = Tokenizer(v).encode(lacking, add_special=False)
    assert [v.tokens[i] for i in with_bytes[1:]] == ["<0xE1>", "<0x9A>", "<0xA0>"]
    tokens = list(v.tokens)
    tokens[v.token_to_id["<0x41>"]] = "no-longer-a-byte"
    v = _with_tokens(v, tokens)
    assert Tokenizer(v).encode(lacking, add_special=False)[1:] == [v.unk]
    with pytest.raises(TokenizerError, match="no token for"):
        Tokenizer(dataclasses.replace(v, unk=None)).encode(lacking, add_special=False)
    assert Tokenizer(dataclasses.replace(v, unk=None)).encode("hello", add_special=False) \
        == Tokenizer(v).encode("hello", add_special=False)


def test_repeated_token_text_maps_to_last_id():
    # llama.cpp's text -> id map keeps the last of repeated texts; sentencepiece refuses repeats, so the
    # earlier one must be kept out of its model
    v = read_vocab(GGUFFile(TINY_SPM))
    word = v.tokens[996]
    before = Tokenizer(v).encode("Hello", add_special=False)
    assert 996 in before
    tokens = list(v.tokens)
    tokens[2999] = word
    v = _with_tokens(v, tokens)
    assert Tokenizer(v).encode("Hello", add_special=False) == [2999 if i == 996 else i for i in before]
