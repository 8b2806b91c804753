"""`plan run OUT.plan -p TEXT`: generate text from a compiled plan (or from a GGUF, compiled for this
machine on the fly and cached). `--prompts-file FILE` runs many prompts together, `--max-seqs` of them
per batched step: one prompt per line, or JSON lines {"prompt": ..., and optionally "max_tokens",
"temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed", "stop"} overriding the flags.
`--device emu` runs a GPU plan's own kernels on this machine's CPU (slow, exact to the kernels as
written): `plan run G.plan --device emu`, or `plan run MODEL.gguf --device emu --target sm_90`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields, replace
from typing import Any

import numpy as np

from llmplan.core.console import Progress, add_threads, print_json
from llmplan.core.devices import OFFLINE_TARGETS, local_cpu, resolve_device
from llmplan.core.errors import InputError
from llmplan.models.gguf import is_gguf
from llmplan.runtime.engine import Engine
from llmplan.runtime.requests import Request, Result, SamplingParams
from llmplan.runtime.trace import Trace, span

from . import llama_cpp, numpy_fallback

EMU_DEFAULT_TARGET = "sm_90"

_OVERRIDES = {f.name for f in fields(SamplingParams)}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="generate text from a plan (or a GGUF)", description=__doc__)
    p.add_argument("plan", help="plan file, or a GGUF to compile on the fly")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("-p", "--prompt", help="prompt text (BOS added, special tokens parsed)")
    what.add_argument("--prompts-file", metavar="FILE", help="many prompts: one per line, or JSON lines")
    p.add_argument("-n", type=int, default=64, help="tokens to generate at most (default 64)")
    p.add_argument("--temp", type=float, default=0.0, help="temperature; 0 is greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest tokens; 0 keeps all (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="sample among the likeliest tokens whose probabilities sum to p "
                   "(default 1: all)")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens less likely than p times the likeliest one "
                   "(default 0: none)")
    p.add_argument("--repeat-penalty", type=float, default=1.0, help="> 1 discourages repeating tokens")
    p.add_argument("--seed", type=int, help="seed of the sampler (default: a fresh one each run)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop at this text (repeatable)")
    p.add_argument("--truncate", action="store_true", help="a prompt longer than the plan's context keeps its "
                   "BOS and its last tokens instead of failing (\"truncate\": true in a prompts file)")
    p.add_argument("--chat", action="store_true", help="wrap each prompt as a user message in the chat template")
    p.add_argument("--max-seqs", type=int, help="sequences per batched step (default: the plan's; with a GGUF, 1)")
    p.add_argument("--kv-blocks", type=int, help="K/V cache blocks of 16 positions (default: the plan's)")
    p.add_argument("--device", help="cpu, cuda, hip, or emu (a GPU plan's kernels emulated on this CPU); default: "
                   "the plan's own backend")
    p.add_argument("--target", help=f"with a GGUF and --device emu: the GPU target to compile for (default "
                   f"{EMU_DEFAULT_TARGET}; {', '.join(OFFLINE_TARGETS)})")
    p.add_argument("--model", help="the GGUF the plan was compiled from, if it has moved")
    add_threads(p)
    p.add_argument("--ctx", type=int, help="with a GGUF: the context to compile for")
    p.add_argument("--dump-logits", metavar="FILE.npz", help="save the logits after the prompt as prompt_last")
    p.add_argument("--bench", action="store_true",
                   help="after a warm-up step, print prefill and decode speed on stderr, next to llama.cpp's on the "
                        "same tokens when llama-cpp-python is importable (with --prompts-file: the combined rate "
                        "and preemptions)")
    p.add_argument("--trace", metavar="OUT.json", help="write a Chrome trace-event file of the run (Perfetto opens "
                   "it): compile and load phases, steps, scheduling, prefill and decode, each launch, graph replays; "
                   "on cuda and hip the device times too")
    p.add_argument("--json", action="store_true", help="print JSON (a list with --prompts-file)")
    p.set_defaults(run=run)


def _request(engine: Engine, prompt: str, args: argparse.Namespace, overrides: dict[str, Any]) -> Request:
    params = SamplingParams(args.temp, args.top_k, args.top_p, args.min_p, args.repeat_penalty, args.seed)
    params = replace(params, **{k: v for k, v in overrides.items() if k in _OVERRIDES})
    text: str | list[int] = prompt
    if args.chat:
        text = engine.tokenizer.encode_chat([{"role": "user", "content": prompt}])
    stop = overrides.get("stop", args.stop)
    return Request(text, overrides.get("max_tokens", args.n), params, tuple([stop] if isinstance(stop, str) else stop),
                   keep_prompt_logits=bool(args.dump_logits), truncate=bool(overrides.get("truncate", args.truncate)))


def _prompts(path: str) -> list[tuple[str, dict[str, Any]]]:
    """(prompt, per-request overrides) for each non-empty line of a prompts file."""
    with open(path, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    if not lines:
        raise InputError(f"{path}: no prompts")
    if not lines[0].lstrip().startswith("{"):
        return [(line, {}) for line in lines]
    out = []
    for i, line in enumerate(lines, 1):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}:{i}: not a JSON object ({e.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            raise InputError(f"{path}:{i}: expected an object with a string \"prompt\"")
        unknown = set(obj) - _OVERRIDES - {"prompt", "max_tokens", "stop", "truncate"}
        if unknown:
            raise InputError(f"{path}:{i}: unknown keys {sorted(unknown)}")
        out.append((obj.pop("prompt"), obj))
    return out


def _as_json(r: Result, reason: str) -> dict[str, Any]:
    d = {"prompt_ids": r.prompt_ids, "ids": r.ids, "text": r.text, "finish_reason": reason, "timings": r.timings}
    return d | ({"error": r.error} if r.error else {})


def _reason(r: Result, max_tokens: int, ctx: int) -> str:
    """The engine's finish reason, or "context" where the plan's context ended a generation short of
    its max_tokens (the engine says "length", as OpenAI's API does)."""
    cut = r.finish_reason == "length" and len(r.ids) < max_tokens and len(r.prompt_ids) + len(r.ids) >= ctx
    return "context" if cut else r.finish_reason


def run(args: argparse.Namespace) -> int:
    trace = Trace() if args.trace else None
    try:
        return _run(args, trace)
    finally:
        if trace is not None:
            trace.write(args.trace)


def _run(args: argparse.Namespace, trace: Trace | None) -> int:
    if args.n < 0:
        raise InputError(f"-n must be >= 0, got {args.n}")
    with span(trace, "compile", "load"):  # a GGUF's plan, compiled (and probed) once, else found
        plan = _plan(args)
    engine = Engine.load(plan, device=args.device, model_path=args.model, max_seqs=args.max_seqs,
                         kv_blocks=args.kv_blocks, trace=trace, threads=args.threads)
    numpy_fallback.announce("run", engine.header, engine.body, plan, is_gguf(args.plan))
    if args.prompts_file:
        if args.dump_logits:
            raise InputError("--dump-logits takes a single prompt (-p)")
        return _many(engine, _prompts(args.prompts_file), args)
    request = _request(engine, args.prompt, args, {})
    if args.bench:  # first touches of the weights and BLAS's thread start would count against the prefill
        engine.run([Request(engine.tokenizer.encode(args.prompt, parse_special=True)[:1], 1)])
    result = None
    if not args.json and not args.chat:  # the prompt, then its continuation, as llama.cpp shows them
        sys.stdout.write(args.prompt)
    for ev in engine.generate([request]):
        if ev.finish_reason == "error":
            raise InputError(ev.result.error)
        if ev.text and not args.json:
            sys.stdout.write(ev.text)
            sys.stdout.flush()
        result = ev.result or result
    if args.dump_logits:
        np.savez(args.dump_logits, prompt_last=result.prompt_logits.astype(np.float32))
    if not args.json:
        sys.stdout.write("\n")
        sys.stdout.flush()
    reason = _reason(result, request.max_tokens, engine.limits.ctx)
    if reason == "context":
        print(f"plan: stopped at the plan's context of {engine.limits.ctx} tokens, after {len(result.ids)} of "
              f"{request.max_tokens} tokens (a larger --ctx holds more)", file=sys.stderr)
    theirs = _bench(engine, result, args.threads) if args.bench else None
    if args.json:
        print_json(_as_json(result, reason) | ({"llama_cpp": theirs} if args.bench else {}))
    return 0


def _plan(args: argparse.Namespace) -> str:
    """The plan to run: the one given, or a GGUF's, compiled once for the device and cached."""
    if args.target and not (args.device == "emu" and is_gguf(args.plan)):
        raise InputError("--target takes a GGUF run on the emulated GPU (--device emu)")
    if not is_gguf(args.plan):
        return args.plan
    from llmplan.plans.compile import (
        plan_for,  # here: the compiler's imports (networkx, the IR) add 15 MiB to a plan's run
    )

    if args.device in ("cuda", "hip"):  # for the local GPU, from its own facts
        return plan_for(args.plan, args.ctx, args.max_seqs or 1, resolve_device(args.device), Progress("plan run"))
    if args.device not in (None, "cpu", "emu"):
        raise InputError(f"--device {args.device}: compile the GGUF for it first "
                         f"(plan compile ... --device {args.device})")
    target = args.target or EMU_DEFAULT_TARGET
    if args.device == "emu" and target not in OFFLINE_TARGETS:
        raise InputError(f"--target {target}: not a GPU target ({', '.join(OFFLINE_TARGETS)})")
    device = OFFLINE_TARGETS[target] if args.device == "emu" else local_cpu()
    return plan_for(args.plan, args.ctx, args.max_seqs or 1, device, Progress("plan run"))


def _bench(engine: Engine, result: Result, threads: int | None) -> dict[str, Any] | None:
    """Print our speed, and llama.cpp's on the same prompt, number of tokens and threads when it is
    importable (returned, else None)."""
    t = result.timings
    print(f"llmplan:   prefill {t['prompt_tokens']} tokens at {t['prefill_tok_s']:.1f} tok/s, decode "
          f"{t['generated_tokens']} tokens at {t['decode_tok_s']:.1f} tok/s (load {t['load_s']:.2f} s)", file=sys.stderr)
    theirs = llama_cpp.rate(engine.model.path, result.prompt_ids, max(2, t["generated_tokens"]), threads)
    if theirs is None:
        print("llama.cpp: not measured (pip install llama-cpp-python to compare)", file=sys.stderr)
        return None
    ratio = {k: round(t[k] / theirs[k], 3) for k in ("prefill_tok_s", "decode_tok_s") if t.get(k) and theirs[k]}
    print(f"llama.cpp: prefill at {theirs['prefill_tok_s']:.1f} tok/s, decode at {theirs['decode_tok_s']:.1f} tok/s "
          f"({theirs['version']}, {theirs['threads']} threads); llmplan / llama.cpp: "
          + ", ".join(f"{k.split('_')[0]} {v:.3f}x" for k, v in ratio.items()), file=sys.stderr)
    return theirs | {"ratio": ratio}


def _many(engine: Engine, prompts: list[tuple[str, dict[str, Any]]], args: argparse.Namespace) -> int:
    """Every prompt of a prompts file together; results in the file's order."""
    results: list[Result | None] = [None] * len(prompts)
    reasons = ["error"] * len(prompts)
    requests, where = [], []
    for i, (prompt, overrides) in enumerate(prompts):
        try:
            requests.append(_request(engine, prompt, args, overrides))
            where.append(i)
        except InputError as e:
            results[i] = Result([], finish_reason="error", error=str(e))
    t0 = time.perf_counter()
    for i, request, r in zip(where, requests, engine.run(requests)):
        results[i], reasons[i] = r, _reason(r, request.max_tokens, engine.limits.ctx)
    wall = time.perf_counter() - t0
    if args.json:
        print_json([_as_json(r, why) for r, why in zip(results, reasons)])
    else:
        for i, ((prompt, _), r) in enumerate(zip(prompts, results)):
            what = r.error if r.error else f"{len(r.ids)} tokens, {reasons[i]}"
            print(f"=== {i + 1}/{len(results)} ({what}): {prompt[:60]}")
            print(r.text)
    if args.bench:
        n = sum(len(r.ids) for r in results)
        preempted = sum(len(rec["preempted"]) for rec in engine.records)
        print(f"{len(results)} prompts, {n} tokens in {wall:.2f} s ({n / max(wall, 1e-9):.1f} tok/s together, "
              f"{engine.scheduler.max_seqs} sequences per step), {preempted} preemptions", file=sys.stderr)
    return 0
