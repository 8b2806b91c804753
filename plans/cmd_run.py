"""`plan run OUT.plan -p TEXT`: generate text from a compiled plan (or from a GGUF, compiled for this
machine on the fly and cached)."""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from llmplan.models.errors import InputError
from llmplan.models.model import open_model
from llmplan.runtime.engine import Engine
from llmplan.runtime.sampler import SamplingParams

from .compile import DEFAULT_CHUNK, cache_path, compile_model
from .console import print_json
from .devices import local_cpu
from .tune_store import TuneStore


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="generate text from a plan (or a GGUF)", description=__doc__)
    p.add_argument("plan", help="plan file, or a GGUF to compile on the fly")
    p.add_argument("-p", "--prompt", required=True, help="prompt text (BOS added, special tokens parsed)")
    p.add_argument("-n", type=int, default=64, help="tokens to generate at most (default 64)")
    p.add_argument("--temp", type=float, default=0.0, help="temperature; 0 is greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the chat template")
    p.add_argument("--model", help="the GGUF the plan was compiled from, if it has moved")
    p.add_argument("--ctx", type=int, help="with a GGUF: the context to compile for")
    p.add_argument("--dump-logits", metavar="FILE.npz", help="save the logits after the prompt as prompt_last")
    p.add_argument("--bench", action="store_true", help="print prefill and decode speed on stderr")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def _plan_for(path: str, ctx: int | None) -> str:
    """A plan file: `path` itself, or the cached plan compiled from the GGUF `path`."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            return path
    model = open_model(path)
    device = local_cpu()
    cached = cache_path(model, device, f"ctx{ctx or 'default'}")
    if not os.path.exists(cached):
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        compile_model(model, device, cached, ctx, DEFAULT_CHUNK, tune=TuneStore.from_flag(None))
    return cached


def run(args: argparse.Namespace) -> int:
    if args.n < 0:
        raise InputError(f"-n must be >= 0, got {args.n}")
    engine = Engine.load(_plan_for(args.plan, args.ctx), args.model)
    tok = engine.tokenizer
    if args.chat:
        prompt = tok.encode_chat([{"role": "user", "content": args.prompt}])
    else:
        prompt = tok.encode(args.prompt, add_special=True, parse_special=True)
    params = SamplingParams(args.temp, args.top_k, args.top_p, args.seed)
    stream = None if args.json else (lambda s: (sys.stdout.write(s), sys.stdout.flush()))
    gen = engine.generate(prompt, args.n, params, on_text=stream, keep_prompt_logits=bool(args.dump_logits))
    if args.dump_logits:
        np.savez(args.dump_logits, prompt_last=gen.prompt_logits.astype(np.float32))
    if args.json:
        print_json({"prompt_ids": gen.prompt_ids, "ids": gen.ids, "text": gen.text,
                    "finish_reason": gen.finish_reason, "timings": gen.timings})
    else:
        sys.stdout.write("\n")
    if args.bench:
        t = gen.timings
        print(f"prefill {t['prompt_tokens']} tokens at {t['prefill_tok_s']:.1f} tok/s, decode {t['generated_tokens']} "
              f"tokens at {t['decode_tok_s']:.1f} tok/s (load {t['load_s']:.2f} s)", file=sys.stderr)
    return 0
