"""What `plan info` reports about a model file: config, tokenizer, tensors by format, and the bytes a
decoded token must read (the figure the memory-bandwidth roofline uses)."""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

from .config import ModelConfig, config_from_gguf
from .gguf import GGUFFile, TensorInfo
from .model import bind_tensors
from .vocab import check_tokenizer

TOKENIZER_KINDS = {"llama": "SentencePiece", "gpt2": "byte-level BPE"}


def format_table(tensors: list[TensorInfo]) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = defaultdict(lambda: {"count": 0, "bytes": 0})
    for t in tensors:
        table[t.type.name]["count"] += 1
        table[t.type.name]["bytes"] += t.nbytes
    return dict(sorted(table.items(), key=lambda kv: -kv[1]["bytes"]))


def decode_bytes_per_token(weights: dict[str, TensorInfo], c: ModelConfig, every_expert: bool = False) -> int:
    """Every weight is read once per decoded token, except the embedding table, of which one row is
    gathered (when the output head is tied to the embedding, the whole table is read as the head), and a
    mixture of experts' ffn_*_exps tensors, of which a token reads its n_experts_used routed experts'
    rows (the active bytes), or every expert's with `every_expert` (what a dense read of the file costs)."""
    embd = weights["token_embd.weight"]
    rest = sum(t.nbytes if every_expert or not n.endswith("_exps.weight") else t.nbytes // c.n_experts * c.n_experts_used
               for n, t in weights.items() if n != "token_embd.weight")
    return rest + embd.row_bytes + (embd.nbytes if c.tied_output else 0)


def describe(path: str | os.PathLike) -> dict[str, Any]:
    f = GGUFFile(path)
    cfg = config_from_gguf(f)
    weights = bind_tensors(f, cfg) if f.tensors else {}
    check_tokenizer(f)
    tokens = f.get("tokenizer.ggml.tokens")
    model_kind = f.get("tokenizer.ggml.model")
    return {
        "path": f.path,
        "file_bytes": f.size,
        "gguf_version": f.version,
        "architecture": cfg.arch,
        "name": cfg.name,
        "file_type": f.get("general.file_type"),
        "config": cfg.to_dict(),
        "tokenizer": None if tokens is None else {
            "model": model_kind,
            "kind": TOKENIZER_KINDS.get(model_kind, model_kind),
            "pre": f.get("tokenizer.ggml.pre"),
            "tokens": len(tokens),
            "merges": len(f.get("tokenizer.ggml.merges", [])),
            "chat_template": "tokenizer.chat_template" in f,
        },
        "tensor_count": len(f.tensors),
        "formats": format_table(list(f.tensors.values())),
        "tensor_bytes": sum(t.nbytes for t in f.tensors.values()),
        "decode_bytes_per_token": decode_bytes_per_token(weights, cfg) if weights else None,
        "decode_bytes_per_token_every_expert": decode_bytes_per_token(weights, cfg, True) if weights and cfg.moe else None,
    }
