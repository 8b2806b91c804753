"""Perplexity and KL divergence from logits rows, with llama-perplexity's statistics.

A base keeps, per scored token, the negative log-likelihood of its target, its most likely token and
its whole distribution as log-probabilities rounded to f16: 2 bytes per vocabulary entry, the size of
llama-perplexity's own base rows. Measured on Gemma 3 270M (docs/numerics.md), that gives the
full-precision KL divergence to 0.1%, where keeping only the top k tokens and the rest's mass
undercounts it by 6% at k = 256 and 0.5% at k = 4096 (its vocabulary's tail carries the divergence).
Our log-probabilities are rounded to f16 the same way before they meet a base's, so a base against
its own rows gives 0.

Log-softmax follows llama.cpp's: the row's maximum subtracted, exponentials in float32, their sum in
float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_BLOCK = 16  # rows reduced at once: bounds the temporaries at _BLOCK rows of the vocabulary


@dataclass
class Rows:
    """Per scored token: the target's negative log-likelihood, the most likely token, and the
    distribution's log-probabilities at f16."""

    nll: np.ndarray  # float64 [n]
    top: np.ndarray  # int32 [n]: argmax of the logits (the lowest id among ties, as llama.cpp's)
    logp: np.ndarray  # float16 [n, vocab]

    def __len__(self) -> int:
        return len(self.nll)

    def __getitem__(self, i) -> Rows:
        return Rows(self.nll[i], self.top[i], self.logp[i])

    @staticmethod
    def concat(parts: list[Rows]) -> Rows:
        return Rows(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("nll", "top", "logp")))


def _log_softmax(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Log-probabilities (float64) and the log-sum-exp of each row."""
    m = logits.max(axis=1, keepdims=True)
    s = np.exp(logits - m).sum(axis=1, dtype=np.float64)
    lse = m[:, 0].astype(np.float64) + np.log(s)
    return logits - lse[:, None], lse


def _nll(logits: np.ndarray, lse: np.ndarray, targets: np.ndarray) -> np.ndarray:
    return lse - logits[np.arange(len(targets)), targets].astype(np.float64)


def nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The negative log-likelihood of each row's target."""
    return np.concatenate([_nll(logits[a:a + _BLOCK], _log_softmax(logits[a:a + _BLOCK])[1], targets[a:a + _BLOCK])
                           for a in range(0, len(logits), _BLOCK)] or [np.zeros(0)])


def summarize(logits: np.ndarray, targets: np.ndarray) -> Rows:
    """What a base keeps of each logits row [n, vocab] whose next token is `targets`."""
    parts = []
    for a in range(0, len(logits), _BLOCK):
        x, t = logits[a:a + _BLOCK], targets[a:a + _BLOCK]
        lp, lse = _log_softmax(x)
        parts.append(Rows(_nll(x, lse, t), x.argmax(axis=1).astype(np.int32), lp.astype(np.float16)))
    return Rows.concat(parts)


@dataclass
class Comparison:
    """Per scored token, ours against a base's."""

    kl: np.ndarray  # float64 [n]: KL(base || ours)
    same_top: np.ndarray  # bool [n]: our most likely token is the base's
    p_diff: np.ndarray  # float64 [n]: our probability of the target minus the base's
    nll: np.ndarray  # float64 [n]: ours
    nll_base: np.ndarray  # float64 [n]

    @staticmethod
    def concat(parts: list[Comparison]) -> Comparison:
        return Comparison(*(np.concatenate([getattr(p, f) for p in parts]) if parts else np.zeros(0)
                            for f in ("kl", "same_top", "p_diff", "nll", "nll_base")))


def compare(base: Rows, logits: np.ndarray, targets: np.ndarray) -> Comparison:
    """Each row of ours against the base's row of the same token."""
    parts = []
    for a in range(0, len(logits), _BLOCK):
        x, t, b = logits[a:a + _BLOCK], targets[a:a + _BLOCK], base[a:a + _BLOCK]
        lq, lse = _log_softmax(x)
        lq = lq.astype(np.float16).astype(np.float64)
        lp = b.logp.astype(np.float64)
        n = _nll(x, lse, t)
        parts.append(Comparison((np.exp(lp) * (lp - lq)).sum(axis=1), x.argmax(axis=1) == b.top,
                                np.exp(-n) - np.exp(-b.nll), n, b.nll))
    return Comparison.concat(parts)


def mean_and_uncertainty(x: np.ndarray) -> tuple[float, float]:
    """The mean and its standard error, as llama-perplexity computes them."""
    n = len(x)
    if n == 0:
        return 0.0, 0.0
    f = float(np.mean(x, dtype=np.float64))
    var = float(np.mean(np.square(x, dtype=np.float64))) - f * f
    return f, (float(np.sqrt(var / (n - 1))) if var > 0 and n > 1 else 0.0)


def perplexity(nll: np.ndarray) -> dict[str, float]:
    """exp(mean negative log-likelihood) and its uncertainty (llama-perplexity's "PPL = x +/- y")."""
    mean, unc = mean_and_uncertainty(nll)
    ppl = float(np.exp(mean))
    return {"ppl": ppl, "ppl_unc": ppl * unc}


def divergence(c: Comparison) -> dict[str, float]:
    """The figures llama-perplexity --kl-divergence prints: both perplexities, the mean KL divergence
    and its uncertainty, its median, 99th and 99.9th percentiles and maximum, the share of tokens
    whose most likely token agrees, and the RMS of the target probability's difference (as %)."""
    n = len(c.kl)
    kl, unc = mean_and_uncertainty(c.kl)
    same = float(np.mean(c.same_top)) if n else 0.0
    mse, mse_unc = mean_and_uncertainty(np.square(c.p_diff))
    rms = float(np.sqrt(mse))
    ours, theirs = perplexity(c.nll), perplexity(c.nll_base)
    return {"tokens": n, "ppl": ours["ppl"], "ppl_unc": ours["ppl_unc"], "ppl_base": theirs["ppl"],
            "ppl_base_unc": theirs["ppl_unc"], "kl_mean": kl, "kl_unc": unc,
            "kl_median": float(np.median(c.kl)) if n else 0.0,
            "kl_p99": float(np.percentile(c.kl, 99.0)) if n else 0.0,
            "kl_p99_9": float(np.percentile(c.kl, 99.9)) if n else 0.0, "kl_max": float(c.kl.max()) if n else 0.0,
            "same_top_pct": 100 * same,
            "same_top_unc": 100 * float(np.sqrt(same * (1 - same) / (n - 1))) if n > 1 else 0.0,
            "rms_dp_pct": 100 * rms, "rms_dp_unc": 100 * (0.5 / rms * mse_unc if rms > 0 else 0.0)}
