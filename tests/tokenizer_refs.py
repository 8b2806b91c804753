"""llama.cpp's recorded tokenizations: the reference JSON files and its own `.inp`/`.out` test cases."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import REFERENCE, TINY_BPE, TINY_SPM, VOCAB_BPE, VOCAB_SPM

# reference name -> file; "gemma3-270m" comes from the gemma3_path fixture
SPM_FILES = {"tiny-llama-spm-Q4_K_M": TINY_SPM, "vocab-llama-spm": VOCAB_SPM, "gemma3-270m": None}
BPE_FILES = {"tiny-llama3-bpe-Q4_K_M": TINY_BPE, "vocab-llama-bpe": VOCAB_BPE}


def model_path(request, name: str) -> Path:
    path = {**SPM_FILES, **BPE_FILES}[name]
    return request.getfixturevalue("gemma3_path") if path is None else path


def reference(name: str) -> dict:
    return json.loads((REFERENCE / f"ref_{name}.json").read_text(encoding="utf-8"))


def vocab_cases(vocab_file: Path) -> list[tuple[str, list[int]]]:
    """llama.cpp's test-tokenizer-0 cases beside a vocabulary file: (text, ids without BOS)."""
    raw = Path(f"{vocab_file}.inp").read_text(encoding="utf-8")
    texts = raw.split("\n__ggml_vocab_test__\n")
    if texts[-1] == "":
        texts.pop()
    outs = Path(f"{vocab_file}.out").read_text(encoding="utf-8").split("\n")[: len(texts)]
    assert len(texts) == len(outs) == 46
    return [(t, [int(x) for x in o.split()]) for t, o in zip(texts, outs)]
