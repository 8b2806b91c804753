"""Make the reference fixtures of the architectures issues 26 and 27 add (issue 27: mixtures of experts,
a qwen3moe and a Mixtral-style llama file), as ../shared/fixtures' were made, and record llama.cpp's
outputs on them:

    python scripts/arch_fixtures.py [--only NAME,...]

For each fixture below: its tiny preset (models/presets.py) with random weights (seed 0, drawn at the
shared fixtures' scales: the builder's weights="fan-in") and a trained vocabulary (the shared fixtures'
byte-level BPE or SentencePiece one, given the family's chat tokens, pre-tokenizer and chat template),
written F32 by our builder and quantized to Q4_K_M by llama.cpp's own quantizer into
tests/data/<name>.gguf. Then, into tests/data, llama.cpp's references on it
(scripts/llamacpp_record.py: ref_<name>.json and .npz, the fixtures' strings plus CHAT_STRINGS) and
llama.cpp's own spread (scripts/llamacpp_spread.py, llama.cpp's settings only: llmplan has no
definition of these architectures yet; rerun that script for llmplan's rows once it has).

Needs llama-cpp-python 0.3.36 (not a dependency).
"""

from __future__ import annotations

import argparse
import ctypes
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from gguf import GGUFValueType as V, TokenType

import llamacpp_record
import llamacpp_spread
from llamacpp_record import FIXTURES
from llmplan.models.builder import plan_build
from llmplan.models.gguf import GGUFFile, MetaValue
from llmplan.models.gguf_write import GGUFWriter
from llmplan.models.synth_vocab import PHI3_TEMPLATE, PHI3_TOKENS

DATA = llamacpp_spread.DATA
SEED = 0
QWEN_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # in Qwen's order (151643..151645)
# Qwen2.5's template reduced to the turns (no default system message, no tools)
CHATML_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# tokenized beside the fixtures' strings: each family's chat turns
CHAT_STRINGS = ["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<|user|>\nhi <|end|>\n<|assistant|>\n"]

Keys = dict[str, MetaValue]


def _array(values, etype: V) -> MetaValue:
    return MetaValue(V.ARRAY, values, etype)


def qwen_vocab(bpe: Keys) -> Keys:
    """The BPE vocabulary with its Llama 3 control tokens replaced by Qwen's, appended after the others as
    Qwen's are; pre-tokenizer qwen2, no BOS added, <|im_end|> ends a turn (Qwen2.5-Instruct's file keys)."""
    types = np.asarray(bpe["tokenizer.ggml.token_type"].value)
    tokens = [t for t, ty in zip(bpe["tokenizer.ggml.tokens"].value, types) if ty != TokenType.CONTROL]
    first = len(tokens)
    types = np.array([TokenType.NORMAL] * first + [TokenType.CONTROL] * len(QWEN_TOKENS), np.int32)
    return {
        "tokenizer.ggml.model": MetaValue(V.STRING, "gpt2"),
        "tokenizer.ggml.pre": MetaValue(V.STRING, "qwen2"),
        "tokenizer.ggml.tokens": _array(tokens + list(QWEN_TOKENS), V.STRING),
        "tokenizer.ggml.token_type": _array(types, V.INT32),
        "tokenizer.ggml.merges": bpe["tokenizer.ggml.merges"],
        "tokenizer.ggml.eos_token_id": MetaValue(V.UINT32, first + QWEN_TOKENS.index("<|im_end|>")),
        "tokenizer.ggml.padding_token_id": MetaValue(V.UINT32, first + QWEN_TOKENS.index("<|endoftext|>")),
        "tokenizer.ggml.bos_token_id": MetaValue(V.UINT32, first + QWEN_TOKENS.index("<|endoftext|>")),
        "tokenizer.ggml.add_bos_token": MetaValue(V.BOOL, False),
        "tokenizer.chat_template": MetaValue(V.STRING, CHATML_TEMPLATE),
    }


def phi3_vocab(spm: Keys) -> Keys:
    """The SentencePiece vocabulary with its two user-defined Gemma chat tokens replaced by Phi-3's control
    tokens, appended after the others with the converter's score, as Phi-3's are; no BOS added,
    <|endoftext|> the end of text (Phi-3.5-mini's file keys)."""
    types = np.asarray(spm["tokenizer.ggml.token_type"].value)
    keep = types != TokenType.USER_DEFINED
    tokens = [t for t, k in zip(spm["tokenizer.ggml.tokens"].value, keep) if k] + list(PHI3_TOKENS)
    scores = np.concatenate([np.asarray(spm["tokenizer.ggml.scores"].value)[keep],
                             np.full(len(PHI3_TOKENS), -1000.0, np.float32)])
    types = np.concatenate([types[keep], np.full(len(PHI3_TOKENS), TokenType.CONTROL, np.int32)])
    endoftext = tokens.index("<|endoftext|>")
    return {
        "tokenizer.ggml.model": MetaValue(V.STRING, "llama"),
        "tokenizer.ggml.pre": MetaValue(V.STRING, "default"),
        "tokenizer.ggml.tokens": _array(tokens, V.STRING),
        "tokenizer.ggml.scores": _array(scores, V.FLOAT32),
        "tokenizer.ggml.token_type": _array(types, V.INT32),
        "tokenizer.ggml.bos_token_id": MetaValue(V.UINT32, tokens.index("<s>")),
        "tokenizer.ggml.eos_token_id": MetaValue(V.UINT32, endoftext),
        "tokenizer.ggml.unknown_token_id": MetaValue(V.UINT32, tokens.index("<unk>")),
        "tokenizer.ggml.padding_token_id": MetaValue(V.UINT32, endoftext),
        "tokenizer.ggml.add_bos_token": MetaValue(V.BOOL, False),
        "tokenizer.ggml.add_eos_token": MetaValue(V.BOOL, False),
        "tokenizer.chat_template": MetaValue(V.STRING, PHI3_TEMPLATE),
    }


def same_vocab(keys: Keys) -> Keys:
    return keys


@dataclass(frozen=True)
class Fixture:
    preset: str
    vocab_source: str  # the shared fixture whose vocabulary it starts from
    vocab: Callable[[Keys], Keys]


ARCH_FIXTURES = {
    "tiny-qwen2-bpe-Q4_K_M": Fixture("tiny-qwen2", "tiny-llama3-bpe-Q4_K_M", qwen_vocab),
    "tiny-qwen3-bpe-Q4_K_M": Fixture("tiny-qwen3", "tiny-llama3-bpe-Q4_K_M", qwen_vocab),
    "tiny-phi3-spm-Q4_K_M": Fixture("tiny-phi3", "tiny-llama-spm-Q4_K_M", phi3_vocab),
    "tiny-mistral-bpe-Q4_K_M": Fixture("tiny-mistral", "tiny-llama3-bpe-Q4_K_M", same_vocab),
    "tiny-qwen3moe-bpe-Q4_K_M": Fixture("tiny-qwen3moe", "tiny-llama3-bpe-Q4_K_M", qwen_vocab),
    "tiny-mixtral-spm-Q4_K_M": Fixture("tiny-mixtral", "tiny-llama-spm-Q4_K_M", same_vocab),
}


def write_vocab(path: Path, keys: Keys) -> None:
    """A vocabulary-only GGUF, what the builder's vocab_from reads."""
    w = GGUFWriter(path)
    for k, v in keys.items():
        w.add(k, v)
    w.write([])


def quantize_q4_k_m(src: Path, dst: Path) -> None:
    """llama.cpp's own quantizer with its Q4_K_M recipe."""
    import llama_cpp as binding

    params = binding.llama_model_quantize_default_params()
    params.ftype = binding.LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.nthread = llamacpp_record.THREADS
    if binding.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) != 0:
        raise SystemExit(f"llama.cpp could not quantize {src}")


def make(name: str, fixture: Fixture) -> Path:
    source = GGUFFile(FIXTURES / "models" / f"{fixture.vocab_source}.gguf")
    keys = fixture.vocab({k: v for k, v in source.metadata.items() if k.startswith("tokenizer.")})
    out = DATA / f"{name}.gguf"
    with tempfile.TemporaryDirectory() as tmp:
        write_vocab(Path(tmp) / "vocab.gguf", keys)
        plan_build(Path(tmp) / "f32.gguf", fixture.preset, "F32", SEED, vocab_from=str(Path(tmp) / "vocab.gguf"),
                   weights="fan-in").write(progress=False)
        quantize_q4_k_m(Path(tmp) / "f32.gguf", out)
    return out


def describe(path: Path) -> str:
    """The file's size, its global tensors and layer 0's, with format and shape."""
    f = GGUFFile(path)
    lines = [f"{path.name}: {path.stat().st_size} bytes, {len(f.tensors)} tensors"]
    for name, t in f.tensors.items():
        if not name.startswith("blk.") or name.startswith("blk.0."):
            lines.append(f"  {name:28s} {t.type.name:5s} {list(t.shape)}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help=f"comma-separated fixture names (default: all of {', '.join(ARCH_FIXTURES)})")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(ARCH_FIXTURES)
    for name in names:
        path = make(name, ARCH_FIXTURES[name])
        print(describe(path))
        for written in llamacpp_record.record(path, DATA, CHAT_STRINGS):
            print(f"  {written.name}: {written.stat().st_size} bytes")
    spread = {name: llamacpp_spread.measure(name, llmplan=False) for name in names}
    llamacpp_spread.write(spread, "python scripts/arch_fixtures.py")
    for name, table in spread.items():
        print(f"{name}: llama.cpp's largest NMSE against its recorded rows: " + ", ".join(
            f"{label} {max(r['nmse']):.2e}" for label, r in table.items() if "nmse" in r))


if __name__ == "__main__":
    main()
