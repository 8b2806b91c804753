"""The GPU benchmark, in one run on one device: device-to-device copy bandwidth; for a model (the
llama3-8b Q4_K_M preset on the H200): tg128 at one sequence, aggregate decode at 4 sequences, pp512 x 4
sequences; kernel launches and host microseconds per decode step; the roofline fraction = bytes one
decoded token reads (`plan info`) x tokens/s / the measured bandwidth. Prints the figures and the
ratios against the issue's targets; --json prints them as JSON.

    python scripts/bench_gpu.py --model llama3-8b.gguf [--device cuda] [--tg 128] [--pp 512] [--seqs 4]
    python scripts/bench_gpu.py --model tiny.gguf --device emu --tg 8 --pp 32 --seqs 2   # the emulated GPU
    python scripts/bench_gpu.py --model qwen3-30b-a3b.gguf --tg-only   # tg128 alone (device-check's MoE row)

On emu everything runs on the host (plans for sm_90, the host's memory bandwidth): small numbers,
there to prove the script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np

TARGETS = {"tg_roofline": 0.75, "aggregate_ratio": 3.5, "pp_tok_s": 20000, "launches_per_step": 330}
STORY = ("Once upon a time, in a land far away, there lived an old clockmaker who built a clock that ran "
         "backwards. Every morning the children of the village gathered to watch its hands. ")


def copy_bandwidth(device: str, nbytes: int) -> float:
    """Bytes read plus written per second by a device-to-device copy, median of 10 after a warm-up."""
    times = []
    if device == "cuda":
        import cupy as cp

        a, b = cp.random.randint(0, 255, nbytes, dtype=cp.uint8), cp.empty(nbytes, cp.uint8)
        start, end = cp.cuda.Event(), cp.cuda.Event()
        b[...] = a
        for _ in range(10):
            start.record()
            b[...] = a
            end.record()
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) / 1000)
    else:  # the emulated GPU's memory is the host's
        a = np.random.default_rng(0).integers(0, 255, nbytes, np.uint8)
        b = np.empty_like(a)
        np.copyto(b, a)
        for _ in range(10):
            t0 = time.perf_counter()
            np.copyto(b, a)
            times.append(time.perf_counter() - t0)
    return 2 * nbytes / statistics.median(times)


def prompts(tokenizer, n: int, length: int) -> list[list[int]]:
    """n prompts of `length` tokens that share no K/V block (they differ from their second token)."""
    text = STORY
    while len(tokenizer.encode(text)) < length + 4:
        text += text
    return [tokenizer.encode(f"{chr(65 + i)}. " + text)[:length] for i in range(n)]


def rates(engine, requests, trace=None) -> dict:
    """Run the requests; prefill rows/s over steps that prefilled, decode rows/s over steps that only
    decoded all running sequences (engine.records)."""
    first = len(engine.records)
    engine.run(requests)
    recs = list(engine.records)[first:]
    pre = [r for r in recs if r["prefill_rows"]]
    dec = [r for r in recs if r["decode_rows"] == len(requests) and not r["prefill_rows"]]

    def rate(steps, rows):
        s = sum(r["host_s"] + r["kernel_s"] for r in steps)
        return round(sum(rows(r) for r in steps) / s, 2) if s else 0.0
    return {"prefill_tok_s": rate(pre, lambda r: r["prefill_rows"]),
            "decode_tok_s": rate(dec, lambda r: r["decode_rows"] * r["decode_steps"]),
            "decode_steps": sum(r["decode_steps"] for r in dec)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="GGUF (the llama3-8b Q4_K_M preset on the H200)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "hip", "emu"])
    ap.add_argument("--plan", help="a plan compiled for the device with --max-seqs >= --seqs (default: compiled now)")
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--copy-mib", type=int, default=1024)
    ap.add_argument("--tg-only", action="store_true", help="tg at one sequence alone: no batched decode, no prefill")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from llmplan.core.devices import OFFLINE_TARGETS, resolve_device
    from llmplan.models.info import describe
    from llmplan.models.model import open_model
    from llmplan.plans.compile import compile_model
    from llmplan.runtime.engine import Engine
    from llmplan.runtime.requests import Request
    from llmplan.runtime.trace import Trace

    out: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": args.device,
                 "model": os.path.basename(args.model), "tg": args.tg, "pp": args.pp, "seqs": args.seqs}
    facts = OFFLINE_TARGETS["sm_90"] if args.device == "emu" else resolve_device(args.device)
    out["gpu"] = facts.name if args.device != "emu" else "emulated sm_90 on the host"
    out["copy_gbs"] = round(copy_bandwidth(args.device, args.copy_mib << 20) / 1e9, 1)
    out["bytes_per_token"] = describe(args.model)["decode_bytes_per_token"]
    plan = args.plan
    if plan is None:
        plan = os.path.join(tempfile.mkdtemp(), "bench.plan")
        t0 = time.perf_counter()
        compile_model(open_model(args.model), facts, plan, ctx=args.pp + args.tg + 32, chunk=args.pp,
                      max_seqs=args.seqs)
        out["compile_s"] = round(time.perf_counter() - t0, 2)
    trace = Trace()
    engine = Engine.load(plan, device=args.device, trace=trace)
    engine.tokenizer.is_eog = lambda token: False  # every run decodes its full count, as llama-bench does
    out["load"] = engine.executor.load.as_dict() | {"seconds": round(engine.load_seconds, 2)}
    engine.run([Request(prompts(engine.tokenizer, 1, 8)[0], 4)])  # warm-up: buckets recorded, caches touched

    first = len(trace.events)
    one = rates(engine, [Request(prompts(engine.tokenizer, 1, 8)[0], args.tg)])
    decode_spans = [e["dur"] for e in trace.events[first:] if e["name"] == "decode"]
    dims = engine.executor.step_dims("decode", 1, 1)
    out["tg"] = one["decode_tok_s"]
    out["launches_per_step"] = len(engine.executor.calls("decode", dims, {"cache", "next_token"}))
    out["graphs"] = engine.executor.driver.graphs and engine.executor.replay
    out["pipelined"] = engine.pipelined
    out["host_us_per_step"] = round(statistics.median(decode_spans), 1)  # queuing a step: the "decode" span
    out["roofline"] = round(out["bytes_per_token"] * out["tg"] / (out["copy_gbs"] * 1e9), 3)
    if args.tg_only:
        out["met"] = {"tg_roofline": out["roofline"] >= TARGETS["tg_roofline"]}
        print(json.dumps(out, indent=1) if args.json else
              f"{out['gpu']}, {out['model']}: tg{args.tg} x1 {out['tg']} tok/s, {out['bytes_per_token'] / 1e6:.1f} MB "
              f"per token: {out['roofline']:.1%} of the copy bandwidth's roofline")
        return
    many = rates(engine, [Request(p, args.tg) for p in prompts(engine.tokenizer, args.seqs, 8)])
    out["aggregate_tok_s"] = many["decode_tok_s"]
    out["aggregate_ratio"] = round(many["decode_tok_s"] / one["decode_tok_s"], 2)
    pp = rates(engine, [Request(p, 1) for p in prompts(engine.tokenizer, args.seqs, args.pp)])
    out["pp_tok_s"] = pp["prefill_tok_s"]
    out["notes"] = engine.executor.notes
    out["met"] = {"tg_roofline": out["roofline"] >= TARGETS["tg_roofline"],
                  "aggregate_ratio": out["aggregate_ratio"] >= TARGETS["aggregate_ratio"],
                  "pp_tok_s": out["pp_tok_s"] >= TARGETS["pp_tok_s"],
                  "launches_per_step": out["launches_per_step"] <= TARGETS["launches_per_step"]}
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{out['gpu']}, {out['model']}: copy {out['copy_gbs']} GB/s, {out['bytes_per_token'] / 1e6:.1f} MB per token")
    print(f"tg{args.tg} x1: {out['tg']} tok/s = {out['roofline']:.1%} of the roofline (target {TARGETS['tg_roofline']:.0%})")
    print(f"decode x{args.seqs}: {out['aggregate_tok_s']} tok/s = {out['aggregate_ratio']}x one sequence "
          f"(target {TARGETS['aggregate_ratio']}x)")
    print(f"pp{args.pp} x{args.seqs}: {out['pp_tok_s']} tok/s (target {TARGETS['pp_tok_s']})")
    print(f"decode step: {out['launches_per_step']} launches (target <= {TARGETS['launches_per_step']}), "
          f"{out['host_us_per_step']} us of host time to queue it (graphs {out['graphs']}, pipelined {out['pipelined']})")


if __name__ == "__main__":
    main()
