"""`plan compile MODEL.gguf --device cpu`: trace, fuse, choose kernels, lay out buffers, write a plan."""

from __future__ import annotations

import argparse
import os
import time

from llmplan.codegen.cpu_build import ISAS
from llmplan.core.console import Progress, human_bytes, print_json
from llmplan.core.devices import resolve_device
from llmplan.core.errors import InputError
from llmplan.core.planfile import read_plan
from llmplan.core.tune_store import TuneStore
from llmplan.models.model import open_model
from llmplan.plans.compile import DEFAULT_CHUNK, compile_model
from llmplan.tuning import cpu_schedules

from . import numpy_fallback


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compile", help="compile a GGUF model into a plan file", description=__doc__)
    p.add_argument("model", help="GGUF file")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or hip (the local GPU), or an offline target "
                   "such as sm_90, gfx1151")
    p.add_argument("-o", "--output", help="plan file (default: MODEL with .plan for .gguf)")
    p.add_argument("--ctx", type=int, help="context length the plan holds (default: the model's, at most 4096)")
    p.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, help=f"prefill rows per step (default {DEFAULT_CHUNK})")
    p.add_argument("--max-seqs", type=int, default=1, help="sequences decoded in one batched step (default 1)")
    p.add_argument("--isa", choices=tuple(ISAS), help="--device cpu: the SIMD path of the compiled kernels "
                   "(default: the best this machine runs)")
    add_tune_dir(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def add_tune_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tune-dir", metavar="DIR", help="the tune store (default: $LLMPLAN_TUNE_DIR, else the user "
                   "cache directory; 'off' keeps none)")


def run(args: argparse.Namespace) -> int:
    out = args.output or os.path.splitext(args.model)[0] + ".plan"
    device = resolve_device(args.device)
    if args.isa and device.backend != "cpu":
        raise InputError(f"--isa picks the CPU kernels' SIMD path; {args.device} is a GPU target")
    t0 = time.perf_counter()
    store = TuneStore.from_flag(args.tune_dir)
    # a CPU plan's missing decisions are measured here and recorded (GPU ones only on the GPU: plan tune)
    summary = compile_model(open_model(args.model), device, out, args.ctx, args.chunk, args.max_seqs, tune=store,
                            isa=args.isa, progress=Progress("plan compile"),
                            probes=cpu_schedules.probes() if store.enabled else None)
    summary["seconds"] = round(time.perf_counter() - t0, 3)
    if summary.get("cpu", {}).get("kernels") == "numpy":
        numpy_fallback.announce("compile", *read_plan(out, None), out, from_gguf=False)
    if args.json:
        print_json(summary)
        return 0
    launches = ", ".join(f"{k} {v}" for k, v in summary["launches"].items())
    kernels = ""
    if "kernels" in summary:
        how = "from the kernel cache" if summary["build_cached"] else f"built in {summary['build_seconds']:.1f} s"
        kernels = f"; {summary['kernels']} kernels {how}"
    lim = summary["limits"]
    print(f"wrote {out}: {human_bytes(summary['bytes'])}, {summary['device']}, context {lim['ctx']}, "
          f"chunk {lim['chunk']}, batches of up to {lim['max_seqs']}, {lim['kv_blocks']} K/V blocks, "
          f"arena {human_bytes(summary['arena_bytes'])}; launches: {launches}"
          f"{kernels} ({summary['seconds']:.2f} s)")
    if "cpu" in summary:
        print(f"kernels: {summary['cpu']['kernels']}: {summary['cpu']['why']}")
    t = summary["tune"]
    probed = f", {t['probed']} probed now" if t["probed"] else ""
    print(f"tuning: {t['decisions']} decisions, {t['measured']} measured, {t['tie']} ties, {t['heuristic']} by "
          f"heuristic{probed} (store {t['store']})")
    return 0
