"""Probes: time the candidates of one decision and give the verdict the tune store keeps.

Every candidate is first run once and checked against the reference output, so a fast wrong candidate
never wins (it is recorded as rejected, with the reason). Then five interleaved rounds (or as many as
the caller asks), each timing every candidate once in an order rotated per round (none always goes
first, after the same neighbour, or into caches another left warm), each timing a fixed number of calls
on rotating inputs; the verdict compares medians over the rounds. The fastest wins when it leads the
documented default by at least 3%; closer than that is a tie and the default stands (a default that is
itself fastest is reported with its lead over the next best).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import numpy as np

from llmplan.core.errors import InputError
from llmplan.core.formats import ACTIVATION_FORMATS, planes, value_bytes
from llmplan.core.tune_store import TIE, Verdict

ROUNDS = 5
ROUND_SECONDS = 0.025  # the default's time per round; every candidate gets as many calls


class ProbeError(InputError):
    """The default candidate itself fails its check: the plan cannot be trusted (a kernel bug)."""


def measure(candidates: dict[str, Callable[[int], Any]], check: Callable[[Any], str], default: str,
            round_seconds: float = ROUND_SECONDS, rounds: int = ROUNDS) -> Verdict:
    """`candidates[name](i)` runs one call on input set i (callers rotate their inputs on i) and returns
    its output; `check(output)` says what is wrong with it, or "". `default` is the heuristic's choice."""
    rejected = {}
    for name, run in candidates.items():
        why = check(run(0))  # also the warm-up: pools, pages, first-call costs
        if why:
            rejected[name] = why
    if default in rejected:
        raise ProbeError(f"the default candidate {default} fails its check: {rejected[default]}")
    live = [n for n in candidates if n not in rejected]
    t0 = time.perf_counter()
    candidates[default](1)
    calls = max(1, math.ceil(round_seconds / max(time.perf_counter() - t0, 1e-9)))
    times: dict[str, list[float]] = {n: [] for n in live}
    i = 0
    for r in range(rounds):
        for name in live[r % len(live):] + live[:r % len(live)]:
            run = candidates[name]
            t0 = time.perf_counter()
            for _ in range(calls):
                i += 1
                run(i)
            times[name].append((time.perf_counter() - t0) / calls)
    medians = {n: sorted(ts)[rounds // 2] for n, ts in times.items()}
    winner, lead, tie = decide(medians, default)
    return Verdict(medians, rejected, default, winner, lead, tie, calls, rounds)


def decide(medians: dict[str, float], default: str) -> tuple[str, float, bool]:
    """(winner, lead, tie) from medians: the fastest if it leads the default by TIE or more."""
    fastest = min(medians, key=medians.__getitem__)
    if fastest == default:
        rest = [t for n, t in medians.items() if n != default]
        lead = min(rest) / medians[default] - 1 if rest else 0.0
        return default, lead, bool(rest) and lead < TIE
    lead = medians[default] / medians[fastest] - 1
    return (default, lead, True) if lead < TIE else (fastest, lead, False)


def disagreement(got: np.ndarray, want: np.ndarray, bound: float) -> str:
    """Why a candidate's output `got` does not agree with the default's `want` within NMSE `bound`
    (core/numerics.py; non-finite values must match exactly), or ""."""
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    fin = np.isfinite(w)
    if not (np.array_equal(g[~fin], w[~fin], equal_nan=True) and np.isfinite(g[fin]).all()):
        return "non-finite values where the default has none, or the reverse"
    err = float(((g[fin] - w[fin]) ** 2).sum() / max((w[fin] ** 2).sum(), 1e-30))
    return f"NMSE {err:.1e} against the default's output (bound {bound:g})" if err >= bound else ""


def random_operand(dtype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Finite random contents of a probe's buffer, as bytes: floats in [-1, 1); a packed activation's
    quantized fields and small scales (not each other's sums: every candidate reads the same bytes, which
    is all a comparison needs); integers small. The CPU and GPU probes' operands both come from here."""
    nbytes = value_bytes(dtype, shape)
    if dtype.upper() in ACTIVATION_FORMATS:
        out = np.zeros(nbytes, np.uint8)
        ps, _ = planes(ACTIVATION_FORMATS[dtype.upper()], math.prod(shape[:-1]), shape[-1])
        for p in ps:
            n = p.nbytes // np.dtype(p.dtype).itemsize
            vals = rng.uniform(0.001, 0.02, n) if np.dtype(p.dtype).kind == "f" else rng.integers(-100, 100, n)
            out[p.offset:p.offset + p.nbytes] = vals.astype(p.dtype).view(np.uint8)
        return out
    kinds = {"f32": np.float32, "f16": np.float16, "i32": np.int32}
    if dtype in kinds:
        vals = rng.uniform(-1, 1, math.prod(shape)) if dtype != "i32" else rng.integers(0, 4, math.prod(shape))
        return vals.astype(kinds[dtype]).view(np.uint8)
    return rng.integers(0, 256, nbytes, dtype=np.uint8)
