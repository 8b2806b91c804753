"""`plan eval M.plan -f TEXT`: perplexity over a text in windows of the context, as llama-perplexity
computes it (non-overlapping windows of --ctx tokens, each starting with BOS, the second half of each
scored; or with --stride S, windows every S tokens, each scoring its last S), and with --save-logits /
--against / --against-llama-cpp the KL divergence of every scored token's distribution from a base's.

A base keeps per scored token its whole distribution as f16 log-probabilities (2 bytes per
vocabulary entry, as llama-perplexity's base file; deflate leaves about 3/4 of that: some 400 KB a
token for Gemma 3's 262144 entries). Measured on Gemma 3 270M, that gives the full-precision KL
divergence to 0.1%, where keeping the top k tokens and the rest's mass undercounts it by 24% at
k = 32, 6% at k = 256 and 0.5% at k = 4096 (docs/numerics.md)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np
from tqdm import tqdm

from llmplan.core.console import add_threads, print_json
from llmplan.core.errors import InputError
from llmplan.core.planfile import read_header
from llmplan.models.gguf import is_gguf
from llmplan.runtime.engine import Engine
from llmplan.runtime.scoring import Window, kv_blocks_needed, score, windows

from . import eval_base, eval_stats, llama_cpp, numpy_fallback

DEFAULT_CTX = 512  # llama-perplexity's


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="perplexity and KL divergence over a text", description=__doc__)
    p.add_argument("plan", help="plan file, or a GGUF to compile for this machine on the fly")
    p.add_argument("-f", "--file", required=True, metavar="TEXT", help="the text (UTF-8)")
    p.add_argument("--ctx", type=int, metavar="N",
                   help=f"tokens per window (default {DEFAULT_CTX}, at most the plan's context)")
    p.add_argument("--stride", type=int, metavar="S", help="windows every S tokens, each scoring its last S "
                   "predictions (llama-perplexity --ppl-stride; its window is -c plus S/2, rounded up to 256)")
    p.add_argument("--device", help="where the plan runs: cpu, emu (a GPU plan on the emulated GPU), cuda or hip "
                   "(default: the plan's own backend)")
    p.add_argument("--model", help="the GGUF the plan was compiled from, if it has moved")
    add_threads(p)
    p.add_argument("--save-logits", metavar="BASE.npz", help="save what a later --against needs: per scored token its "
                   "log-probabilities at f16, 2 bytes per vocabulary entry before deflate (about 400 KB a token for "
                   "Gemma 3: top-k with the rest's mass would be smaller but undercounts its KL divergence, 6%% at "
                   "k = 256)")
    p.add_argument("--against", metavar="BASE.npz", help="KL divergence against a base saved by --save-logits")
    p.add_argument("--against-llama-cpp", action="store_true",
                   help="KL divergence against llama.cpp's base on the same tokens and windows, computed in this "
                        "run (needs llama-cpp-python; skipped with a message without it)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def _text(path: str) -> str:
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text (byte {e.start})") from None
    if not text.strip():
        raise InputError(f"{path}: the text is empty")
    return text


def _engine(args: argparse.Namespace) -> tuple[Engine, int]:
    """The engine for the plan (a GGUF: compiled for this machine once, cached) and the window size."""
    plan = args.plan
    if is_gguf(plan):
        if args.device not in (None, "cpu"):
            raise InputError(f"--device {args.device} runs plan files: compile one first "
                             f"(plan compile {plan} --device TARGET)")
        from llmplan.plans.compile import DEFAULT_CHUNK, plan_for

        # a step's scored rows leave it through `last`, bounded by max_seqs: as many as its rows, so
        # they share one pass over the output head (Gemma 3, 64 rows: 2-3x faster than 64 one-row
        # steps, for an arena of 257 MiB instead of 5 MiB); the context holds a chunk at least
        # (plan_for's chunk is DEFAULT_CHUNK)
        plan = plan_for(plan, max(args.ctx or DEFAULT_CTX, DEFAULT_CHUNK), max_seqs=DEFAULT_CHUNK)
    limits = read_header(plan)[0].limits
    ctx = args.ctx or min(DEFAULT_CTX, limits.ctx)
    if ctx > limits.ctx:
        raise InputError(f"--ctx {ctx} is over the plan's context of {limits.ctx}: compile with --ctx {ctx}")
    if ctx < 4:
        raise InputError(f"--ctx {ctx}: a window needs at least 4 tokens")
    engine = Engine.load(plan, device=args.device, model_path=args.model,
                         kv_blocks=kv_blocks_needed(limits.chunk, ctx), threads=args.threads)
    numpy_fallback.announce("eval", engine.header, engine.body, plan, is_gguf(args.plan))
    return engine, ctx


def run(args: argparse.Namespace) -> int:
    text = _text(args.file)
    engine, ctx = _engine(args)
    tok = engine.tokenizer
    ids = tok.encode(text, add_special=True, parse_special=False)
    wins = windows(ids, ctx, args.stride, tok.bos if tok.vocab.add_bos else None)
    scored = sum(w.scored for w in wins)
    vocab = eval_base.vocab_fingerprint(tok)
    n_vocab = engine.body.config["vocab_size"]
    stride = args.stride or 0
    bases: dict[str, Any] = {}  # name -> a source of base rows: .take(index, targets), .model
    if args.against:
        bases[args.against] = eval_base.open_base(args.against)
        eval_base.check(bases[args.against], ids, ctx, stride, vocab, n_vocab, scored)
    if args.against_llama_cpp:
        if llama_cpp.available():
            bases["llama.cpp"] = _LlamaCppBase(engine.model.path, wins, ctx)
        else:
            print("llama.cpp: not compared (pip install llama-cpp-python to compare)", file=sys.stderr)
    saving = eval_base.Writer(args.save_logits, ids, ctx, stride, vocab, _describe(engine), scored, n_vocab) \
        if args.save_logits else None

    nlls: list[np.ndarray] = []
    compared: dict[str, list[eval_stats.Comparison]] = {name: [] for name in bases}
    evaluated = sum(w.rows for w in wins)
    t0 = time.perf_counter()
    with tqdm(total=scored, desc="scoring", unit="tok", disable=None, file=sys.stderr) as bar:
        for s in score(engine, wins):
            if saving:
                rows = eval_stats.summarize(s.logits, s.targets)
                saving.add(rows)
                nlls.append(rows.nll)
            else:
                nlls.append(eval_stats.nll(s.logits, s.targets))
            for name, base in bases.items():
                compared[name].append(eval_stats.compare(base.take(s.index, s.targets), s.logits, s.targets))
            bar.update(len(s.index))
    seconds = time.perf_counter() - t0
    if saving:
        saving.close()
    out: dict[str, Any] = {"text_tokens": len(ids), "windows": len(wins), "ctx": ctx, "stride": args.stride,
                           "scored": scored, "evaluated": evaluated, "seconds": round(seconds, 3),
                           "tok_s": round(evaluated / max(seconds, 1e-9), 1),
                           **eval_stats.perplexity(np.concatenate(nlls))}
    out["against"] = {name: {"model": bases[name].model} | eval_stats.divergence(eval_stats.Comparison.concat(parts))
                      for name, parts in compared.items()}
    if args.json:
        print_json(out)
    else:
        _print(out, wins, args)
    return 0


def _describe(engine: Engine) -> str:
    return f"llmplan {os.path.basename(engine.model.path)} on {engine.device}"


class _LlamaCppBase:
    """llama.cpp's base rows on the same windows, computed as they are asked for (the fixtures'
    settings, each window one batch of ctx tokens, as llama-perplexity -b ctx evaluates it)."""

    def __init__(self, model: str, wins: list[Window], ctx: int):
        self.model = f"llama.cpp {llama_cpp.version()}"
        self._llm = llama_cpp.load(model, ctx, logits_all=True, n_batch=ctx, n_ubatch=ctx)
        self._wins, self._starts = wins, np.cumsum([0] + [w.scored for w in wins])
        self._window, self._rows = -1, None

    def take(self, index: np.ndarray, targets: np.ndarray) -> eval_stats.Rows:
        parts = []
        for w in np.unique(np.searchsorted(self._starts, index, side="right") - 1):
            if w != self._window:
                self._window = w
                self._rows = llama_cpp.window_logits(self._llm, self._wins[w].tokens, self._wins[w].first)
            sel = (index >= self._starts[w]) & (index < self._starts[w + 1])
            parts.append(eval_stats.summarize(self._rows[index[sel] - self._starts[w]], targets[sel]))
        return eval_stats.Rows.concat(parts)


def _print(out: dict[str, Any], wins: list[Window], args: argparse.Namespace) -> None:
    how = f"stride {args.stride}" if args.stride else "second halves scored"
    print(f"perplexity: {out['ppl']:.4f} +/- {out['ppl_unc']:.5f} over {out['scored']} tokens ({len(wins)} windows "
          f"of {out['ctx']}, {how}); {out['evaluated']} tokens evaluated at {out['tok_s']:.1f} tok/s")
    for name, d in out["against"].items():
        print(f"against {name} ({d['model']}, perplexity {d['ppl_base']:.4f} +/- {d['ppl_base_unc']:.5f}):")
        print(f"  KL divergence: mean {d['kl_mean']:.6f} +/- {d['kl_unc']:.6f}, median {d['kl_median']:.6f}, "
              f"99% {d['kl_p99']:.6f}, 99.9% {d['kl_p99_9']:.6f}, max {d['kl_max']:.6f}")
        print(f"  same top token: {d['same_top_pct']:.3f} +/- {d['same_top_unc']:.3f} %; RMS of the target's "
              f"probability difference: {d['rms_dp_pct']:.3f} +/- {d['rms_dp_unc']:.3f} %")
