"""The base file of `plan eval --save-logits` / `--against`: what a later KL comparison needs.

One compressed .npz: the text's tokens, the windowing (ctx, stride), a fingerprint of the vocabulary,
a description of the model, and per scored token the compressed distribution of eval_stats.Rows.
Loading checks every array's type and shape, so a damaged or foreign file is one clear error, and
`check` refuses a base computed on other tokens, windows or vocabulary.
"""

from __future__ import annotations

import hashlib
import zipfile
import zlib
from dataclasses import dataclass

import numpy as np

from llmplan.core.errors import InputError

from .eval_stats import Rows

FORMAT = "llmplan eval base 1"


@dataclass
class Base:
    tokens: np.ndarray  # int32: the text's tokens, as tokenized
    ctx: int
    stride: int  # 0: llama-perplexity's non-overlapping windows, second halves scored
    vocab: str  # vocab_fingerprint of the tokenizer
    model: str  # what computed it, for people
    rows: Rows


def vocab_fingerprint(tokenizer) -> str:
    """A hash of the vocabulary: distributions over two different vocabularies do not compare."""
    v = tokenizer.vocab
    return hashlib.sha256("\0".join([v.kind, *v.tokens]).encode("utf-8", "surrogatepass")).hexdigest()


def save(path: str, base: Base) -> None:
    r = base.rows
    with open(path, "wb") as f:  # np.savez would add .npz to a name without it
        np.savez_compressed(f, format=np.array(FORMAT), tokens=base.tokens.astype(np.int32),
                            ctx=np.array(base.ctx), stride=np.array(base.stride), vocab=np.array(base.vocab),
                            model=np.array(base.model), nll=r.nll, top_ids=r.top_ids, top_logp=r.top_logp,
                            rest_logp=r.rest_logp)


_ARRAYS = {"tokens": ("i", 1), "nll": ("f", 1), "top_ids": ("i", 2), "top_logp": ("f", 2), "rest_logp": ("f", 1)}
_SCALARS = {"format": "U", "ctx": "i", "stride": "i", "vocab": "U", "model": "U"}


def load(path: str) -> Base:
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
        raise InputError(f"{path}: not a base file of plan eval --save-logits ({e})") from None
    for name, kind in _SCALARS.items():
        a = data.get(name)
        if a is None or a.ndim != 0 or a.dtype.kind != kind:
            raise InputError(f"{path}: not a base file of plan eval --save-logits (no {name})")
    if str(data["format"]) != FORMAT:
        raise InputError(f"{path}: base format {str(data['format'])!r}, this llmplan reads {FORMAT!r}")
    for name, (kind, ndim) in _ARRAYS.items():
        a = data.get(name)
        if a is None or a.ndim != ndim or a.dtype.kind != kind:
            raise InputError(f"{path}: damaged base file ({name} is missing or has the wrong type)")
    n, k = data["top_ids"].shape
    if any(len(data[f]) != n for f in ("nll", "top_logp", "rest_logp")) or data["top_logp"].shape[1] != k or k < 1:
        raise InputError(f"{path}: damaged base file (its per-token arrays disagree in length)")
    rows = Rows(data["nll"].astype(np.float64), data["top_ids"].astype(np.int32),
                data["top_logp"].astype(np.float32), data["rest_logp"].astype(np.float64))
    if not all(np.isfinite(a).all() for a in (rows.nll, rows.top_logp, rows.rest_logp)):
        raise InputError(f"{path}: damaged base file (non-finite log-probabilities)")
    return Base(data["tokens"].astype(np.int32), int(data["ctx"]), int(data["stride"]), str(data["vocab"]),
                str(data["model"]), rows)


def check(base: Base, path: str, tokens: list[int], ctx: int, stride: int, vocab: str, n_vocab: int,
          scored: int) -> None:
    """Refuse a base that does not describe the same tokens, windows and vocabulary."""
    if base.vocab != vocab:
        raise InputError(f"{path}: the base was computed with another vocabulary ({base.model}): KL divergence "
                         "compares models that share a tokenizer")
    if len(base.tokens) != len(tokens) or not np.array_equal(base.tokens, tokens):
        raise InputError(f"{path}: the base was computed on other tokens ({len(base.tokens)} tokens, this text "
                         f"has {len(tokens)}): pass the same -f TEXT")
    if (base.ctx, base.stride) != (ctx, stride):
        raise InputError(f"{path}: the base has windows of {base.ctx} (stride {base.stride or 'none'}), asked for "
                         f"{ctx} (stride {stride or 'none'}): pass the same --ctx and --stride")
    if len(base.rows) != scored or int(base.rows.top_ids.min(initial=0)) < 0 or \
            int(base.rows.top_ids.max(initial=0)) >= n_vocab:
        raise InputError(f"{path}: damaged base file (its scored tokens do not fit these windows or this vocabulary)")
