"""Detokenization: round trips through all five vocabularies (the recorded strings and 2,000 random
strings), invalid UTF-8, special tokens shown or hidden, and streaming llama.cpp's greedy outputs."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmplan.models.errors import TokenizerError
from llmplan.models.tokenizer import load_tokenizer

from conftest import REFERENCE, TINY_BPE, TINY_SPM, VOCAB_BPE, VOCAB_SPM
from tokenizer_refs import model_path

ALL = ["tiny-llama-spm-Q4_K_M", "tiny-llama3-bpe-Q4_K_M", "gemma3-270m", "vocab-llama-bpe", "vocab-llama-spm"]
STRINGS = json.loads((REFERENCE.parent / "strings.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module", params=ALL)
def tok(request):
    return load_tokenizer(model_path(request, request.param))


def round_trip_text(tok, text, parse_special):
    """What decoding gives back: the text itself, except that SentencePiece vocabularies show their
    space marker U+2581 as a space, and those with a space prefix keep the space they put after every
    special token (the one they put at the start is dropped again)."""
    v = tok.vocab
    if v.kind != "spm":
        return text
    out, after_special = [], False
    for piece in tok._splitter.split(text, parse_special):
        if isinstance(piece, int):
            out.append(v.tokens[piece])
            after_special = True
        else:
            out.append((" " if after_special and v.add_space_prefix else "") + piece.replace("\u2581", " "))
            after_special = False
    return "".join(out)


def test_reference_strings_round_trip(tok):
    for text in STRINGS:
        assert tok.decode(tok.encode(text)) == round_trip_text(tok, text, False), text
        ids = tok.encode(text, add_special=False, parse_special=True)
        assert tok.decode(ids, special=True) == round_trip_text(tok, text, True), text


def test_spm_space_rule():
    tok = load_tokenizer(TINY_SPM)
    assert tok.decode(tok.encode(" Hello  world ")) == " Hello  world "
    assert tok.decode(tok.encode("<start_of_turn>user\nhi")) == "<start_of_turn> user\nhi"
    assert tok.decode(tok.encode("a\u2581b")) == "a b"


@settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=st.text(max_size=40))
def test_random_text_round_trips(tok, text):
    assert tok.decode(tok.encode(text)) == round_trip_text(tok, text, False)


@settings(max_examples=2000, deadline=None)
@given(data=st.binary(max_size=24))
def test_bytes_input_round_trips_or_is_rejected(data):
    tok = load_tokenizer(TINY_BPE)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        with pytest.raises(TokenizerError, match="text is not valid UTF-8"):
            tok.encode(data)
        return
    assert tok.encode(data) == tok.encode(text)
    assert tok.decode_bytes(tok.encode(data)) == data


def test_lone_surrogate_rejected():
    with pytest.raises(TokenizerError, match="lone surrogate"):
        load_tokenizer(TINY_SPM).encode("ab\udcffc")


def test_special_tokens_shown_by_flag():
    tok = load_tokenizer(VOCAB_BPE)
    ids = tok.encode("<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>", parse_special=True)
    assert tok.decode(ids) == "user\n\nhi"
    assert tok.decode(ids, special=True) == "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
    spm = load_tokenizer(VOCAB_SPM)
    assert spm.piece(1) == b"<s>" and spm.piece(1, special=False) == b""
    assert spm.piece(spm.vocab.token_to_id["<0x0A>"]) == b"\n"
    assert spm.piece(spm.vocab.token_to_id["\u2581Hello"]) == b" Hello"
    assert tok.piece(tok.vocab.token_to_id["\u0120world"]) == b" world"  # byte-level BPE's space


def test_bad_ids_rejected():
    tok = load_tokenizer(TINY_SPM)
    for bad in ([3000], [-1], ["7"], [1.5]):
        with pytest.raises(TokenizerError):
            tok.decode(bad)
    with pytest.raises(TokenizerError, match="not in the vocabulary"):
        tok.stream().push(10**9)


def test_streaming_greedy_outputs(request):
    for name in ("tiny-llama-spm-Q4_K_M", "tiny-llama3-bpe-Q4_K_M", "gemma3-270m"):
        tok = load_tokenizer(model_path(request, name))
        ref = json.loads((REFERENCE / f"ref_{name}.json").read_text(encoding="utf-8"))
        for gen in ref["generate"]:
            stream = tok.stream()
            chunks = [stream.push(t) for t in gen["greedy_ids"]]
            assert "".join(chunks) + stream.flush() == gen["greedy_text"], (name, gen["prompt"])


def test_streaming_holds_unfinished_utf8():
    tok = load_tokenizer(TINY_SPM)
    ids = tok.encode("日本", add_special=False)
    assert len(ids) > 2  # spelled with byte tokens in this small vocabulary
    stream = tok.stream()
    chunks = [stream.push(t) for t in ids]
    assert "".join(chunks) == " 日本" and all("\ufffd" not in c for c in chunks)
    assert chunks.count("") >= 2  # bytes of an unfinished character wait for the rest
    # an unfinished character at the end comes out as U+FFFD on flush
    stream = tok.stream()
    partial = [stream.push(t) for t in tok.encode("日", add_special=False)[:-1]]
    assert "\ufffd" not in "".join(partial) and stream.flush().endswith("\ufffd")
