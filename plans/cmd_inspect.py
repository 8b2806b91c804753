"""`plan inspect OUT.plan`: what a plan holds: header, kernels, launches per phase, arena, decisions,
and which weights the CPU backend unpacks at load and why."""

from __future__ import annotations

import argparse
import math
from collections import Counter
from typing import Any

from .console import format_table, human_bytes, print_json
from .planfile import read_body, read_header

_RESIDENT_BYTES = {"f32": 4}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="describe a plan file", description=__doc__)
    p.add_argument("plan", help="plan file")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def summarize(header: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    unpacked: dict[str, int] = Counter()
    for w in body["weights"].values():
        if "matmul" in w["residency"] or "vector" in w["residency"]:
            unpacked["f32"] += math.prod(w["shape"]) * 4
    phases = {}
    for name, p in body["phases"].items():
        phases[name] = {
            "launches": len(p["launches"]),
            "kernels": dict(Counter(f"{l['family']}/{l['member']}" for l in p["launches"])),
            "arena_bytes": p["arena_bytes"],
            "activation_bytes_unshared": p["activation_bytes"],
            "dims": p["dims"],
        }
    decisions = Counter(l["provenance"] for p in body["phases"].values() for l in p["launches"])
    return {
        "format": header["format"], "llmplan": header["llmplan"], "device": header["device"],
        "toolchain": header["toolchain"], "model": header["model"], "limits": header["limits"],
        "arena_bytes": body["arena_bytes"], "kernels": [f"{f}/{m}" for f, m in body["kernels"]],
        "phases": phases, "decisions": dict(decisions),
        "weights": {"count": len(body["weights"]), "unpacked_at_load_bytes": unpacked["f32"],
                    "residency": {k: sorted(n for n, w in body["weights"].items() if k in w["residency"])
                                  for k in body["residency_notes"]},
                    "why": body["residency_notes"]},
        "declines": {ph: d for ph, d in body["declines"].items()},
    }


def run(args: argparse.Namespace) -> int:
    header, offset = read_header(args.plan)
    s = summarize(header, read_body(args.plan, offset))
    if args.json:
        print_json(s)
        return 0
    m, d = s["model"], s["device"]
    print(f"{args.plan}: plan format {s['format']} (llmplan {s['llmplan']})")
    print(f"  device   {d['name']} [{d['key']}]")
    print(f"  model    {m['path']} ({m['arch']} \"{m['name']}\", {m['fingerprint']['file_size']} bytes, "
          f"metadata {m['fingerprint']['metadata_sha256'][:16]}, tensors {m['fingerprint']['tensors_sha256'][:16]})")
    lim = s["limits"]
    print(f"  limits   context {lim['ctx']}, prefill chunk {lim['chunk']}, sequences {lim['max_seqs']}")
    print(f"  arena    {s['arena_bytes']} bytes ({human_bytes(s['arena_bytes'])}), activations of one layer at a time")
    rows = [(ph, p["launches"], p["arena_bytes"], p["activation_bytes_unshared"]) for ph, p in s["phases"].items()]
    print("  " + format_table(["phase", "launches", "arena bytes", "unshared bytes"], rows).replace("\n", "\n  "))
    print("  kernels  " + ", ".join(s["kernels"]))
    for why, n in s["decisions"].items():
        print(f"  decision {n} launches: {why}")
    w = s["weights"]
    print(f"  weights  {w['count']} tensors; the CPU backend unpacks {human_bytes(w['unpacked_at_load_bytes'])} at load")
    for how, names in w["residency"].items():
        if names:
            print(f"    {how}: {len(names)} tensors: {w['why'][how]}")
    n_declines = sum(len(v) for v in s["declines"].values())
    print(f"  declines {n_declines} (plan passes MODEL.gguf shows them)")
    return 0
