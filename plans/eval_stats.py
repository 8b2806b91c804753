"""Perplexity and KL divergence from logits rows, with llama-perplexity's statistics.

A base keeps, per scored token, the negative log-likelihood of its target and its distribution
compressed to the TOP_K most likely tokens' log-probabilities plus the log of the mass of all the
others. The KL divergence against such a base groups our distribution the same way: the sum over
the base's top tokens of p (log p - log q), plus the rest's mass times (log p_rest - log q_rest). That
is a lower bound of the full-row divergence (grouping never increases it); docs/numerics.md gives the
measured gap and why TOP_K is what it is.

Log-softmax follows llama.cpp's: the row's maximum subtracted, exponentials in float32, their sum in
float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TOP_K = 32
_BLOCK = 16  # rows reduced at once: bounds the float32 temporaries at _BLOCK rows of the vocabulary
_TINY = 1e-300


@dataclass
class Rows:
    """Per scored token: the target's negative log-likelihood and the compressed distribution."""

    nll: np.ndarray  # float64 [n]
    top_ids: np.ndarray  # int32 [n, k], most likely first (ties: the lower id first, as argmax)
    top_logp: np.ndarray  # float32 [n, k]
    rest_logp: np.ndarray  # float64 [n]: log of the mass outside top_ids

    def __len__(self) -> int:
        return len(self.nll)

    def __getitem__(self, i) -> Rows:
        return Rows(self.nll[i], self.top_ids[i], self.top_logp[i], self.rest_logp[i])

    @staticmethod
    def concat(parts: list[Rows], k: int = TOP_K) -> Rows:
        if not parts:
            return Rows(np.zeros(0), np.zeros((0, k), np.int32), np.zeros((0, k), np.float32), np.zeros(0))
        return Rows(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("nll", "top_ids", "top_logp",
                                                                                  "rest_logp")))


def _softmax_parts(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """exp(logits - max) in float32, their sums (float64) and the log-sum-exp per row."""
    m = logits.max(axis=1, keepdims=True)
    e = np.exp(logits - m)
    s = e.sum(axis=1, dtype=np.float64)
    return e, s, m[:, 0].astype(np.float64) + np.log(s)


def _gather(a: np.ndarray, ids: np.ndarray) -> np.ndarray:
    return np.take_along_axis(a, ids, axis=1)


def _nll(logits: np.ndarray, lse: np.ndarray, targets: np.ndarray) -> np.ndarray:
    return lse - logits[np.arange(len(targets)), targets].astype(np.float64)


def nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The negative log-likelihood of each row's target."""
    return np.concatenate([_nll(logits[a:a + _BLOCK], _softmax_parts(logits[a:a + _BLOCK])[2], targets[a:a + _BLOCK])
                           for a in range(0, len(logits), _BLOCK)] or [np.zeros(0)])


def summarize(logits: np.ndarray, targets: np.ndarray, k: int = TOP_K) -> Rows:
    """What a base keeps of each logits row [n, vocab] whose next token is `targets`."""
    parts = []
    for a in range(0, len(logits), _BLOCK):
        x, t = logits[a:a + _BLOCK], targets[a:a + _BLOCK]
        e, s, lse = _softmax_parts(x)
        top = np.argpartition(-x, k - 1, axis=1)[:, :k]
        vals = _gather(x, top)
        order = np.lexsort((top, -vals), axis=1)
        top = _gather(top, order).astype(np.int32)
        rest = s - _gather(e, top).sum(axis=1, dtype=np.float64)
        parts.append(Rows(_nll(x, lse, t), top, (_gather(x, top) - lse[:, None]).astype(np.float32),
                          np.log(np.maximum(rest, _TINY)) - np.log(s)))
    return Rows.concat(parts, k)


@dataclass
class Comparison:
    """Per scored token, ours against a base's."""

    kl: np.ndarray  # float64 [n]
    same_top: np.ndarray  # bool [n]: our most likely token is the base's
    p_diff: np.ndarray  # float64 [n]: our probability of the target minus the base's
    nll: np.ndarray  # float64 [n]: ours


def compare(base: Rows, logits: np.ndarray, targets: np.ndarray) -> Comparison:
    """KL(base || ours) per row, grouped over the base's top tokens and the rest."""
    parts = []
    for a in range(0, len(logits), _BLOCK):
        x, t, b = logits[a:a + _BLOCK], targets[a:a + _BLOCK], base[a:a + _BLOCK]
        e, s, lse = _softmax_parts(x)
        # rounded to float32 as a base's are, so a base against its own rows gives 0 exactly
        q_top = (_gather(x, b.top_ids) - lse[:, None]).astype(np.float32).astype(np.float64)
        q_rest = np.log(np.maximum(s - _gather(e, b.top_ids).sum(axis=1, dtype=np.float64), _TINY)) - np.log(s)
        p_top = b.top_logp.astype(np.float64)
        kl = (np.exp(p_top) * (p_top - q_top)).sum(axis=1) + np.exp(b.rest_logp) * (b.rest_logp - q_rest)
        nll = _nll(x, lse, t)
        parts.append(Comparison(kl, x.argmax(axis=1) == b.top_ids[:, 0], np.exp(-nll) - np.exp(-b.nll), nll))
    return Comparison(*(np.concatenate([getattr(p, f) for p in parts]) if parts else np.zeros(0)
                        for f in ("kl", "same_top", "p_diff", "nll")))


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


def divergence(c: Comparison, base_nll: np.ndarray) -> dict[str, float]:
    """The figures llama-perplexity --kl-divergence prints: both perplexities, the mean KL divergence
    and its uncertainty, its median, 99th and 99.9th percentiles and maximum, the share of tokens
    whose most likely token agrees, and the RMS of the target probability's difference (as %)."""
    kl, unc = mean_and_uncertainty(c.kl)
    same = float(np.mean(c.same_top)) if len(c.kl) else 0.0
    n = len(c.kl)
    mse, mse_unc = mean_and_uncertainty(np.square(c.p_diff))
    rms = float(np.sqrt(mse))
    ours, theirs = perplexity(c.nll), perplexity(base_nll)
    return {"tokens": n, "ppl": ours["ppl"], "ppl_unc": ours["ppl_unc"], "ppl_base": theirs["ppl"],
            "ppl_base_unc": theirs["ppl_unc"], "kl_mean": kl, "kl_unc": unc,
            "kl_median": float(np.median(c.kl)) if n else 0.0,
            "kl_p99": float(np.percentile(c.kl, 99.0)) if n else 0.0,
            "kl_p99_9": float(np.percentile(c.kl, 99.9)) if n else 0.0, "kl_max": float(c.kl.max()) if n else 0.0,
            "same_top_pct": 100 * same,
            "same_top_unc": 100 * float(np.sqrt(same * (1 - same) / (n - 1))) if n > 1 else 0.0,
            "rms_dp_pct": 100 * rms, "rms_dp_unc": 100 * (0.5 / rms * mse_unc if rms > 0 else 0.0)}
