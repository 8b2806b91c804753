"""How fast the emulated GPU runs a GPU plan: the host build of the plan's kernels (cold, into a fresh
cache), then seconds per prefill chunk and per decode step, with the host threads given.

    python scripts/bench_emu.py MODEL.gguf --target sm_90 [--threads 1 2] [--header OTHER.h] [--json]

`--header` builds the same plan against another host vendor header (an older codegen/kernels/emu.h,
say) to compare emulators on identical kernels. Prints a table; --json prints the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from llmplan.codegen import emu
from llmplan.codegen.build import with_vendor
from llmplan.core.devices import OFFLINE_TARGETS
from llmplan.models.model import open_model
from llmplan.plans.compile import compile_model
from llmplan.runtime.engine import Engine
from llmplan.runtime.requests import Request

PROMPT = "Once upon a time, in a land far away, there lived an old clockmaker who built a clock that ran backwards. " * 8


def measure(plan: str, threads: int, rows: int, steps: int, header: Path | None) -> dict:
    if header is not None:  # the plan's kernels against another host header
        real = emu.EmuLibrary.from_plan
        emu.EmuLibrary.from_plan = classmethod(lambda cls, source, kernels, wave, mode:
                                               cls(with_vendor(source, header), kernels, wave, mode))
    t0 = time.perf_counter()
    engine = Engine.load(plan, device="emu", replay=False)
    load_s = time.perf_counter() - t0
    if header is not None:
        emu.EmuLibrary.from_plan = real
    lib = engine.executor.driver.lib
    lib.set_threads(threads)
    ids = engine.tokenizer.encode(PROMPT)[:rows]
    engine.run([Request(ids, steps + 1)])
    recs = list(engine.records)
    prefill = [r["kernel_s"] for r in recs if r["prefill_rows"]]
    decode = [r["kernel_s"] for r in recs if r["decode_rows"] and not r["prefill_rows"]]
    return {"threads": threads, "build_s": lib.build.seconds, "cached": lib.build.cached, "load_s": round(load_s, 3),
            "prefill_rows": rows, "prefill_s": round(sum(prefill), 3),
            "decode_s_per_step": round(sum(decode) / len(decode), 4), "decode_steps": len(decode)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--target", default="sm_90", choices=sorted(OFFLINE_TARGETS))
    ap.add_argument("--rows", type=int, default=64, help="prompt rows: one prefill chunk (default 64)")
    ap.add_argument("--steps", type=int, default=8, help="decode steps timed (default 8)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, len(os.sched_getaffinity(0))])
    ap.add_argument("--header", type=Path, help="another host vendor header for the same kernels")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["LLMPLAN_CACHE"] = tmp  # a cold build: nothing cached
        plan = str(Path(tmp) / "g.plan")
        compile_model(open_model(args.model), OFFLINE_TARGETS[args.target], plan, ctx=512, chunk=args.rows)
        rows = [measure(plan, n, args.rows, args.steps, args.header) for n in dict.fromkeys(args.threads)]
    out = {"model": args.model, "target": args.target, "header": str(args.header or emu.HEADER), "runs": rows}
    if args.json:
        json.dump(out, sys.stdout, indent=1)
        print()
        return 0
    print(f"{args.model} on {args.target} (emulator header {out['header']})")
    for r in rows:
        built = "cached" if r["cached"] else f"built in {r['build_s']:.1f} s"
        print(f"  {r['threads']} threads: kernels {built}; prefill of {r['prefill_rows']} rows {r['prefill_s']:.2f} s, "
              f"decode {r['decode_s_per_step']:.3f} s a step ({r['decode_steps']} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
