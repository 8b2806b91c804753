"""The base file of `plan eval --save-logits` / `--against`: what a later KL comparison needs.

A zip of .npy members, as np.savez_compressed writes (np.load reads it): the text's tokens, the
windowing (ctx, stride), a fingerprint of the vocabulary, a description of what computed it, and per
scored token eval_stats.Rows: `nll`, `top`, and `logp` [tokens, vocabulary] at f16. `logp` is
streamed in and out one step of rows at a time, so neither side holds it whole (Gemma 3's is 512 KiB
a token). Opening checks every member's type and shape, so a damaged or foreign file is one clear
error, and `check` refuses a base computed on other tokens, windows or vocabulary.
"""

from __future__ import annotations

import hashlib
import zipfile
import zlib
from dataclasses import dataclass
from typing import IO

import numpy as np

from llmplan.core.errors import InputError

from .eval_stats import Rows

FORMAT = "llmplan eval base 2"
_F16 = np.dtype("<f2")
_SMALL = {"format": ("U", 0), "ctx": ("i", 0), "stride": ("i", 0), "vocab": ("U", 0), "model": ("U", 0),
          "tokens": ("i", 1), "nll": ("f", 1), "top": ("i", 1)}


def vocab_fingerprint(tokenizer) -> str:
    """A hash of the vocabulary: distributions over two different vocabularies do not compare."""
    v = tokenizer.vocab
    return hashlib.sha256("\0".join([v.kind, *v.tokens]).encode("utf-8", "surrogatepass")).hexdigest()


class Writer:
    """Writes a base: the rows of `rows` tokens over a vocabulary of `n_vocab`, added in order."""

    def __init__(self, path: str, tokens: list[int], ctx: int, stride: int, vocab: str, model: str, rows: int,
                 n_vocab: int):
        self._zip = zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1)
        for name, value in (("format", FORMAT), ("ctx", ctx), ("stride", stride), ("vocab", vocab), ("model", model),
                            ("tokens", np.asarray(tokens, np.int32))):
            self._put(name, np.asarray(value))
        self._logp = self._zip.open("logp.npy", "w", force_zip64=True)
        np.lib.format.write_array_header_2_0(self._logp, {"descr": np.lib.format.dtype_to_descr(_F16),
                                                          "fortran_order": False, "shape": (rows, n_vocab)})
        self._rows, self._nll, self._top = rows, [], []

    def _put(self, name: str, a: np.ndarray) -> None:
        with self._zip.open(f"{name}.npy", "w") as f:
            np.lib.format.write_array(f, a, allow_pickle=False)

    def add(self, rows: Rows) -> None:
        self._logp.write(np.ascontiguousarray(rows.logp, _F16).tobytes())
        self._nll.append(rows.nll)
        self._top.append(rows.top)

    def close(self) -> None:
        self._logp.close()
        nll = np.concatenate(self._nll) if self._nll else np.zeros(0)
        if len(nll) != self._rows:
            raise AssertionError(f"a base of {self._rows} rows was given {len(nll)}")
        self._put("nll", nll)
        self._put("top", np.concatenate(self._top).astype(np.int32))
        self._zip.close()


@dataclass
class Base:
    """An opened base: its small members, and `take` for the next rows of `logp`."""

    path: str
    tokens: np.ndarray
    ctx: int
    stride: int
    vocab: str
    model: str
    nll: np.ndarray
    top: np.ndarray
    n_vocab: int
    _logp: IO[bytes]
    _at: int = 0

    def take(self, index: np.ndarray, targets: np.ndarray) -> Rows:
        """The rows of the scored tokens `index`, which continue the ones taken before."""
        n = len(index)
        if n and int(index[0]) != self._at:
            raise AssertionError(f"rows are read in order: asked for {int(index[0])}, next is {self._at}")
        try:
            data = self._logp.read(n * self.n_vocab * _F16.itemsize)
        except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as e:
            raise InputError(f"{self.path}: damaged base file ({e})") from None
        if len(data) != n * self.n_vocab * _F16.itemsize:
            raise InputError(f"{self.path}: damaged base file (its log-probabilities end early)")
        at, self._at = self._at, self._at + n
        return Rows(self.nll[at:at + n], self.top[at:at + n], np.frombuffer(data, _F16).reshape(n, self.n_vocab))


def open_base(path: str) -> Base:
    bad = f"{path}: not a base file of plan eval --save-logits"
    member = "zip directory"
    try:
        z = zipfile.ZipFile(path)
        small = {}
        for member, (kind, ndim) in _SMALL.items():
            with z.open(f"{member}.npy") as f:
                a = np.lib.format.read_array(f, allow_pickle=False)
            if a.ndim != ndim or a.dtype.kind != kind:
                raise InputError(f"{bad} ({member} has the wrong type)")
            small[member] = a
        member = "logp"
        logp = z.open("logp.npy")
        version = np.lib.format.read_magic(logp)
        shape, fortran, dtype = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                                 else np.lib.format.read_array_header_2_0)(logp)
    except InputError:
        raise
    except KeyError:
        raise InputError(f"{bad} (no {member})") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise InputError(f"{bad} ({e})") from None
    if str(small["format"]) != FORMAT:
        raise InputError(f"{path}: base format {str(small['format'])!r}, this llmplan reads {FORMAT!r}")
    n = len(small["nll"])
    if dtype != _F16 or fortran or len(shape) != 2 or shape[0] != n or len(small["top"]) != n or shape[1] < 1:
        raise InputError(f"{path}: damaged base file (its per-token members disagree)")
    if not np.isfinite(small["nll"]).all():
        raise InputError(f"{path}: damaged base file (non-finite log-likelihoods)")
    return Base(path, small["tokens"].astype(np.int32), int(small["ctx"]), int(small["stride"]), str(small["vocab"]),
                str(small["model"]), small["nll"].astype(np.float64), small["top"].astype(np.int32), int(shape[1]),
                logp)


def check(base: Base, tokens: list[int], ctx: int, stride: int, vocab: str, n_vocab: int, scored: int) -> None:
    """Refuse a base that does not describe the same tokens, windows and vocabulary."""
    if base.vocab != vocab or base.n_vocab != n_vocab:
        raise InputError(f"{base.path}: the base was computed with another vocabulary ({base.model}): KL divergence "
                         "compares models that share a tokenizer")
    if len(base.tokens) != len(tokens) or not np.array_equal(base.tokens, tokens):
        raise InputError(f"{base.path}: the base was computed on other tokens ({len(base.tokens)} tokens, this text "
                         f"has {len(tokens)}): pass the same -f TEXT")
    if (base.ctx, base.stride) != (ctx, stride):
        raise InputError(f"{base.path}: the base has windows of {base.ctx} (stride {base.stride or 'none'}), asked "
                         f"for {ctx} (stride {stride or 'none'}): pass the same --ctx and --stride")
    if len(base.nll) != scored or int(base.top.min(initial=0)) < 0 or int(base.top.max(initial=0)) >= n_vocab:
        raise InputError(f"{base.path}: damaged base file (its scored tokens do not fit these windows or vocabulary)")
