"""A file llmplan cannot run is one line on stderr, from `plan info`, `plan compile` and `plan run` alike:
what is unsupported, named, and what is supported; a tensor that disagrees with the architecture, named."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGMLQuantizationType
from gguf import GGUFValueType as V

from llmplan.models.gguf import GGUFFile, MetaValue

from conftest import TINY_BPE, TINY_SPM
from model_files import retype, rewrite

DOWN = "blk.0.ffn_down.weight"
NORM = ("blk.0.attn_norm.weight", (512,))  # a source of bytes for a tensor the file should not have


def _transposed(dst: Path) -> Path:
    rows, cols = GGUFFile(TINY_SPM).tensors[DOWN].shape
    return rewrite(TINY_SPM, dst, reshape={DOWN: (cols, rows)})


# name -> (maker of the bad file, what the one line must say)
CASES = {
    "architecture": (lambda p: rewrite(TINY_SPM, p, set_meta={"general.architecture": MetaValue(V.STRING, "bert")}),
                     ("architecture 'bert' is not supported (supported: llama, gemma3",)),
    "pre-tokenizer": (lambda p: rewrite(TINY_BPE, p, set_meta={"tokenizer.ggml.pre": MetaValue(V.STRING, "qwen-9")}),
                      ("unknown pre-tokenizer tokenizer.ggml.pre = 'qwen-9' (supported: ", "qwen2, ")),
    "tokenizer": (lambda p: rewrite(TINY_SPM, p, set_meta={"tokenizer.ggml.model": MetaValue(V.STRING, "bert")}),
                  ("unsupported tokenizer.ggml.model 'bert' (supported: 'llama'",)),
    "format": (lambda p: retype(rewrite(TINY_SPM, p), DOWN, GGMLQuantizationType.IQ2_XXS),
               (f"tensor {DOWN}: weight format IQ2_XXS is not supported (supported: F32, ", "Q4_K")),
    "missing tensor": (lambda p: rewrite(TINY_SPM, p, drop_tensors=("blk.1.attn_k.weight",)),
                       ("missing tensor blk.1.attn_k.weight (shape ",)),
    "tensor shape": (_transposed, (f"tensor {DOWN} has shape ", "the config implies")),
    "extra tensor": (lambda p: rewrite(TINY_SPM, p, add_tensors={"blk.0.ffn_gate_inp.weight": NORM}),
                     ("unexpected tensor blk.0.ffn_gate_inp.weight for architecture llama",)),
}

VERBS = {
    "info": ("info",),
    "compile": ("compile", "--device", "cpu", "-o", "{tmp}/x.plan"),
    "run": ("run", "-n", "1", "-p", "hi"),
}


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad")
    return {case: make(root / f"{case.replace(' ', '-')}.gguf") for case, (make, _) in CASES.items()}


@pytest.mark.parametrize("verb", list(VERBS))
@pytest.mark.parametrize("case", list(CASES))
def test_one_line_names_it(cli, bad_files, tmp_path, case, verb):
    path = bad_files[case]
    argv = [a.format(tmp=tmp_path) for a in VERBS[verb]]
    code, out, err = cli(*argv[:1], path, *argv[1:])
    assert code == 2 and out == "" and err.count("\n") == 1, (out, err)
    assert err.startswith(f"plan: error: {path}: "), err
    for words in CASES[case][1]:
        assert words in err, err
    assert not (tmp_path / "x.plan").exists()
