"""The memory `plan run` holds on the CPU backend, per layer, and projected to a deeper model.

    python scripts/bench_memory.py MODEL.gguf [--threads 2] [--ctx 4096] [--layers 32 --file-bytes N] [--json]

Compiles MODEL for this machine's CPU, runs `plan run` on the plan in a child process (peak resident
memory: the mapped file's pages it touched, plus what it holds), and splits what `plan inspect` says the
plan holds beyond the mapped file into a part per layer (the K/V cache, norm vectors, relayouts) and a fixed
part (arena, rope tables, step state, the final norm and head). A weight relaid out at load counts
its copy less the file pages the runtime releases for it. With --layers and --file-bytes (the deeper
model's file size: `plan make-model ... --dry-run` prints it) it projects the bytes beyond the file and
the total to that depth, e.g. the llama3-8b preset compiled with --set n_layers=4, projected to 32.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE]

from bench_run import compile_plan, plan_run_rss  # noqa: E402  (scripts/)

from llmplan.commands.inspect import summarize  # noqa: E402
from llmplan.core.layouts import weight_bytes_beyond_file  # noqa: E402
from llmplan.core.planfile import read_body, read_header  # noqa: E402


def per_layer(plan: str) -> dict:
    """Bytes held beyond the mapped file: per layer, and fixed."""
    header, offset = read_header(plan)
    body = read_body(plan, offset)
    held = summarize(header, body)["held_beyond_file"]
    layers = body.config["n_layers"]
    layer_weights = sum(weight_bytes_beyond_file(w) for n, w in body.weights.items() if n.startswith("blk."))
    layer = (held["kv_cache"] + layer_weights) / layers
    return {"layers": layers, "held_beyond_file": held, "per_layer_bytes": round(layer),
            "fixed_bytes": round(held["total"] - layer * layers), "file_bytes": header.model.fingerprint["file_size"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--layers", type=int, help="project to this many layers")
    ap.add_argument("--file-bytes", type=int, help="the file size of the model at --layers")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    plan, _, _ = compile_plan(args.model, args.ctx)
    result = {"model": os.path.basename(args.model), "ctx": args.ctx, **per_layer(plan),
              "plan_run": plan_run_rss(plan, args.threads, args.decode)}
    if args.layers and args.file_bytes:
        beyond = result["fixed_bytes"] + args.layers * result["per_layer_bytes"]
        result["projected"] = {"layers": args.layers, "file_bytes": args.file_bytes, "beyond_file_bytes": beyond,
                               "total_gib": round((args.file_bytes + beyond) / 2**30, 2)}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    mib = lambda b: f"{b / 2**20:.1f} MiB"  # noqa: E731
    r = result["plan_run"]
    print(f"{result['model']} ({result['layers']} layers, ctx {args.ctx}): file {mib(result['file_bytes'])}; held beyond "
          f"it {mib(result['held_beyond_file']['total'])}: {mib(result['per_layer_bytes'])} a layer (K/V, norms, relayouts) + "
          f"{mib(result['fixed_bytes'])} fixed (arena, rope tables, step state)")
    print(f"  {r['command']}: peak RSS {r['peak_rss_mib']} MiB ({r['over_file_mib']:+} MiB over the file)")
    if "projected" in result:
        p = result["projected"]
        print(f"  projected to {p['layers']} layers: {mib(p['beyond_file_bytes'])} beyond a {mib(p['file_bytes'])} file, "
              f"{p['total_gib']} GiB in all")


if __name__ == "__main__":
    main()
