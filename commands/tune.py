"""`plan tune MODEL.gguf --device cpu|cuda|hip`: measure every decision the plan for this model and device
would take from the tune store, record the verdicts there, and print them."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from tqdm import tqdm

from llmplan.core.console import Progress, format_table, print_json
from llmplan.core.devices import resolve_device
from llmplan.core.errors import InputError
from llmplan.core.tune_store import TuneStore
from llmplan.models.model import open_model
from llmplan.plans.compile import (
    DEFAULT_CHUNK,
    cache_descriptor,
    choose_cpu_kernels,
    compile_model,
    drop_cached_plans,
    limits_for,
    lower_phases,
)
from llmplan.runtime.driver import driver_for
from llmplan.tuning import cpu_isa, cpu_schedules, gpu_members
from llmplan.tuning.probes import ROUND_SECONDS

from .compile import add_tune_dir


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="measure the planner's decisions for a model into the tune store",
                       description=__doc__)
    p.add_argument("model", help="GGUF file")
    p.add_argument("--device", default="cpu", help="cpu (default), or cuda / hip: the local GPU's probes")
    p.add_argument("--ctx", type=int, help="context length, as for plan compile")
    p.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, help=f"prefill rows per step (default {DEFAULT_CHUNK})")
    p.add_argument("--max-seqs", type=int, default=1, help="sequences decoded in one batched step (default 1)")
    add_tune_dir(p)
    p.add_argument("--round-ms", type=float, default=ROUND_SECONDS * 1000,
                   help=f"time per candidate per round (default {ROUND_SECONDS * 1000:g} ms)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    if device.backend != "cpu" and args.device not in ("cuda", "hip"):
        raise InputError(f"plan tune --device {args.device}: GPU probes run on the device itself, through the "
                         f"{device.backend.upper()} runtime: run plan tune --device {device.backend} there")
    if not args.round_ms > 0:
        raise InputError(f"--round-ms must be positive, got {args.round_ms}")
    store = TuneStore.from_flag(args.tune_dir)
    model = open_model(args.model)
    t0 = time.perf_counter()
    progress = Progress("plan tune")
    with progress.phase("trace, fuse and lower"):
        phases, _, _, table = lower_phases(model, device, limits_for(model, args.ctx, args.chunk, args.max_seqs))
    with progress.phase("probe every decision"):
        if device.backend == "cpu":
            probes = cpu_schedules.probes(args.round_ms / 1000, _isa_probe(model, device, args), every=True)
            _, decisions, build = choose_cpu_kernels(model, phases, table, device, store, probes=probes)
            rows = [{"decision": d.key, "launches": d.phases, "chosen": d.strategy.name, "provenance": d.provenance,
                     "entry": d.entry, "replaced": d.replaced, **_verdict(d.entry_data)} for d in decisions]
        else:
            rows, build = _tune_gpu(model, phases, table, device, store, args.round_ms / 1000), "per decision"
    seconds = time.perf_counter() - t0
    if store.enabled and device.backend == "cpu":  # the plans plan run compiled on the fly for this CPU
        drop_cached_plans(model)
    if args.json:
        print_json({"device_key": device.tune_key, "store": store.describe(), "build_id": build,
                    "seconds": round(seconds, 2), "decisions": rows})
        return 0
    print(f"{len(rows)} decisions for {device.tune_key} measured in {seconds:.1f} s (store {store.describe()})")
    print(format_table(["decision", "launches", "chosen", "default", "lead", "verdict"],
                       [(r["decision"], ", ".join(f"{p} {n}" for p, n in r["launches"].items()), r["chosen"],
                         r.get("default", "-"), f"{r['lead']:+.0%}" if "lead" in r else "-",
                         r["provenance"].split(":")[0]) for r in rows]))
    for r in rows:
        if r["replaced"]:
            print(f"replaced entry {r['entry']} ({r['replaced']})")
    return 0


def _isa_probe(model, device, args: argparse.Namespace):
    """The SIMD-path probe: the plan as compiled without a store (the heuristic's task rows) for the
    default path, in a temporary file, a decode step of it timed on each path (tuning/cpu_isa.py)."""
    def probe(candidates: list[str], round_seconds: float):
        with tempfile.TemporaryDirectory() as tmp:
            plan = os.path.join(tmp, "isa.plan")
            compile_model(model, device, plan, args.ctx, args.chunk, args.max_seqs, isa=candidates[0])
            return cpu_isa.verdict(plan, candidates, round_seconds)
    return probe


def _tune_gpu(model, phases, table, device, store: TuneStore, round_seconds: float) -> list[dict]:
    """Probe every GPU decision on the local device (tuning/gpu_members.py) into the store."""
    found, built = gpu_members.decisions(phases, table, device)
    runner = gpu_members.ProbeRunner(driver_for(device.backend), device, model.file, table, built, found,
                                     cache_descriptor(model))
    rows = []
    for d in tqdm(found, desc="probing", unit="decision", disable=None, file=sys.stderr):
        v = runner.verdict(d, round_seconds)
        gpu_members.keep(d, v, device, store)
        rows.append({"decision": d.key, "launches": d.phases, "chosen": v.winner, "provenance": d.provenance,
                     "entry": d.entry, "replaced": "", "pruned": d.pruned, "default": v.default, "lead": v.lead,
                     "tie": v.tie, "medians": v.medians, "rejected": v.rejected})
    return rows


def _verdict(entry: dict | None) -> dict:
    if entry is None:  # a decision with one candidate: nothing to measure
        return {}
    return {k: entry[k] for k in ("default", "lead", "tie", "medians", "rejected")}
