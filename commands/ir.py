"""`plan ir MODEL.gguf`: the traced IR of one phase as text (or the IR after a fusion pass, --after);
with --eval, run it in the reference interpreter (prompt tokenized with BOS and special tokens parsed,
then N greedy tokens)."""

from __future__ import annotations

import argparse
import functools
import sys
import time

import numpy as np

from llmplan.core.console import print_json
from llmplan.core.errors import InputError
from llmplan.ir.printer import print_graph
from llmplan.ir.reference import ReferenceDecoder
from llmplan.ir.trace import PHASES, trace_model
from llmplan.ir.verify import verify
from llmplan.models.model import open_model
from llmplan.models.tokenizer import load_tokenizer
from llmplan.passes.manager import check_pass_name, run_passes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ir", help="print the traced IR, or run it in the reference interpreter", description=__doc__)
    p.add_argument("model", help="GGUF file")
    p.add_argument("--phase", default="decode", choices=PHASES, help="which phase graph (default decode)")
    p.add_argument("--after", metavar="PASS", help="the graph after this fusion pass (see plan passes); with "
                   "--eval, run that graph")
    p.add_argument("--eval", metavar="TEXT", help="run the reference interpreter on this prompt")
    p.add_argument("-n", type=int, default=16, help="greedy tokens to generate with --eval (default 16)")
    p.add_argument("--dump-logits", metavar="FILE.npz", help="with --eval: save the logits after the prompt "
                   "as the float32 array prompt_last")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    model = open_model(args.model)
    if args.eval is None:
        if args.dump_logits:
            raise InputError("--dump-logits needs --eval TEXT")
        g = _graph(model, args.phase, args.after)
        text = print_graph(g)
        if args.json:
            print_json({"graph": g.name, "phase": args.phase, "node_count": len(g.order) - len(g.inputs)
                        - len(g.weights), "op_counts": g.op_counts(), "text": text})
        else:
            sys.stdout.write(text)
        return 0
    return _evaluate(model, args)


def _graph(model, phase: str, after: str | None):
    """The traced graph of a phase, or the graph after pass `after`."""
    g = verify(trace_model(model.definition, model.config, model.weight_table(), phase))
    if after:
        check_pass_name(after)
        g = next(s.graph for s in run_passes(g) if s.name == after)
    return g


def _evaluate(model, args: argparse.Namespace) -> int:
    if args.n < 0:
        raise InputError(f"-n must be >= 0, got {args.n}")
    tok = load_tokenizer(model.file)
    prompt = tok.encode(args.eval, add_special=True, parse_special=True)
    if not prompt:
        raise InputError("the prompt tokenizes to nothing; give some text")
    ctx = len(prompt) + args.n
    if ctx > model.config.context_length:
        raise InputError(f"{len(prompt)} prompt tokens + {args.n} new ones exceed the model's context of "
                         f"{model.config.context_length}")
    dec = ReferenceDecoder(_graph(model, "prefill", args.after), _graph(model, "decode", args.after),
                           functools.lru_cache(maxsize=None)(model.dequantize), ctx)
    t0 = time.perf_counter()
    logits = dec.prefill(prompt)
    t1 = time.perf_counter()
    if args.dump_logits:
        np.savez(args.dump_logits, prompt_last=logits.astype(np.float32))
    ids: list[int] = []
    stream = tok.stream()
    while len(ids) < args.n:
        ids.append(int(np.argmax(logits)))
        if not args.json:
            sys.stdout.write(stream.push(ids[-1]))
            sys.stdout.flush()
        if tok.is_eog(ids[-1]) or len(ids) == args.n:
            break
        logits = dec.step(ids[-1])
    t2 = time.perf_counter()
    timings = {"prefill_seconds": round(t1 - t0, 4), "decode_seconds": round(t2 - t1, 4),
               "seconds_per_token": round((t2 - t1) / max(1, len(ids)), 4)}
    if args.json:
        print_json({"prompt_ids": prompt, "ids": ids, "text": tok.decode(ids), "timings": timings})
    else:
        sys.stdout.write(stream.flush() + "\n")
        print(f"[{len(prompt)} prompt tokens in {timings['prefill_seconds']:.2f} s, {len(ids)} tokens at "
              f"{timings['seconds_per_token']:.3f} s/token, reference interpreter]", file=sys.stderr)
    return 0
