"""`plan serve M.plan`: an OpenAI-compatible HTTP server over the engine (runtime/server.py), on
127.0.0.1:8000 unless told otherwise. A GGUF instead of a plan is compiled for this machine once and
cached, as `plan run` does. Needs the serve extra: pip install 'llmplan[serve]'."""

from __future__ import annotations

import argparse
import os

from llmplan.core.console import add_threads
from llmplan.core.errors import InputError
from llmplan.models.gguf import is_gguf

from . import numpy_fallback


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a plan (or a GGUF) over an OpenAI-compatible HTTP API",
                       description=__doc__)
    p.add_argument("plan", help="plan file, or a GGUF to compile on the fly")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free port, printed)")
    p.add_argument("--device", help="the device the engine runs on: cpu, or emu for a GPU plan on the emulated GPU "
                   "(default: the plan's own backend)")
    p.add_argument("--max-seqs", type=int, help="sequences per batched step (default: the plan's; with a GGUF, 8)")
    p.add_argument("--kv-blocks", type=int, help="K/V cache blocks of 16 positions (default: the plan's)")
    p.add_argument("--ctx", type=int, help="with a GGUF: the context to compile for")
    p.add_argument("--model", help="the GGUF the plan was compiled from, if it has moved")
    add_threads(p)
    p.add_argument("--name", help="the model's name in the API (default: the GGUF's file name)")
    p.add_argument("--api-key", default=os.environ.get("LLMPLAN_API_KEY"),
                   help="require Authorization: Bearer KEY (default: $LLMPLAN_API_KEY; none: open)")
    p.add_argument("--queue", type=int, default=64,
                   help="requests that may wait beyond the running ones; more are answered 429 (default 64)")
    p.add_argument("--max-body", type=int, default=4 << 20, help="largest request body in bytes (default 4 MiB)")
    p.add_argument("--grace", type=float, default=30.0,
                   help="on SIGINT/SIGTERM, seconds running requests may take to finish before they are "
                        "cancelled (default 30)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (default info)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        from llmplan.runtime.server import serve
    except ImportError as e:
        raise InputError(f"plan serve needs the serve extra ({e.name} is missing): pip install 'llmplan[serve]'") \
            from None
    for flag, value, least in (("--queue", args.queue, 0), ("--max-body", args.max_body, 1)):
        if value < least:
            raise InputError(f"{flag} must be at least {least}, got {value}")
    if not 0 <= args.port <= 65535:
        raise InputError(f"--port must be in 0..65535, got {args.port}")
    if args.grace < 0:
        raise InputError(f"--grace must be >= 0, got {args.grace}")
    if not os.path.isfile(args.plan):
        raise InputError(f"{args.plan}: no such file")

    def load():
        from llmplan.runtime.engine import Engine

        plan, max_seqs = args.plan, args.max_seqs
        if is_gguf(plan):
            from llmplan.plans.compile import plan_for

            max_seqs = max_seqs or 8
            plan = plan_for(plan, args.ctx, max_seqs)
        engine = Engine.load(plan, device=args.device, model_path=args.model, max_seqs=max_seqs,
                             kv_blocks=args.kv_blocks, threads=args.threads)
        numpy_fallback.announce("serve", engine.header, engine.body, plan, is_gguf(args.plan))
        return engine

    serve(load, host=args.host, port=args.port, name=args.name, api_key=args.api_key or None, queue=args.queue,
          max_body=args.max_body, grace=args.grace, log_level=args.log_level)
    return 0

