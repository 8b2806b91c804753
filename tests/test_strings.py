"""The compact string list and its lookup (models/strings.py) against the list and dict they replace:
every token of the fixture vocabularies and of Gemma 3's, repeated texts, texts that are not there."""

from __future__ import annotations

import pytest
from gguf import GGUFReader

from llmplan.models.gguf import GGUFFile
from llmplan.models.strings import StringArray, StringIndex

from conftest import TINY_BPE, TINY_SPM


def _check_against_list_and_dict(strings: StringArray, reference: list[str]) -> None:
    assert len(strings) == len(reference) and list(strings) == reference and strings == reference
    assert [strings[i] for i in (0, len(reference) - 1, -1)] == [reference[0], reference[-1], reference[-1]]
    assert strings.lengths.tolist() == [len(s.encode()) for s in reference]
    index, as_dict = StringIndex(strings), dict(zip(reference, range(len(reference))))
    assert all(index[text] == i for text, i in as_dict.items())
    assert index.shadowed() == sorted(i for i, text in enumerate(reference) if as_dict[text] != i)
    for missing in ("", "\u2581no such token \u00e9", "<0x100>", "\ud800"):
        if missing not in as_dict:
            assert index.get(missing) is None and missing not in index
            with pytest.raises(KeyError):
                index[missing]


@pytest.mark.parametrize("path", [TINY_SPM, TINY_BPE], ids=lambda p: p.name)
def test_vocabularies_as_list_and_dict(path):
    f, ref = GGUFFile(path), GGUFReader(path)  # gguf-py's own reading: one str per item
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        if key in f:
            _check_against_list_and_dict(f.get(key), ref.fields[key].contents())


def test_gemma_vocabulary_as_list_and_dict(gemma3_path):
    tokens = GGUFFile(gemma3_path).get("tokenizer.ggml.tokens")
    _check_against_list_and_dict(tokens, list(tokens))
    assert len(tokens) == 262144 and len(tokens.blob) < 2.5 * 2**20  # the texts, nothing per token


def test_repeated_and_empty_texts():
    reference = ["a", "b", "a", "", "\u00e9", "", "a"]
    strings = StringArray.of(reference)
    _check_against_list_and_dict(strings, reference)
    assert StringIndex(strings)["a"] == 6 and StringIndex(strings).shadowed() == [0, 2, 3]
    assert StringArray.of([]) == [] and len(StringArray.of([])) == 0
    with pytest.raises(IndexError):
        strings[7]
    assert strings != StringArray.of(reference[:-1]) and strings != reference[:-1]
