"""`plan inspect OUT.plan`: what a plan holds: header, kernels, launches per phase, arena, decisions,
how each weight is held at load and why, and the tuned decisions with their provenance; `--kernels` and
`--source NAME` for the compiled kernels."""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections import Counter
from typing import Any

from llmplan.core.console import format_table, human_bytes, plural, print_json
from llmplan.core.devices import DeviceFacts
from llmplan.core.errors import InputError
from llmplan.core.layouts import LAYOUTS, weight_bytes_beyond_file
from llmplan.core.numerics import PAGE, pages_for
from llmplan.core.plan_records import PlanBody, PlanHeader, RopeTable, to_wire
from llmplan.core.planfile import read_body, read_header


def runs_on(device: DeviceFacts, body: PlanBody) -> str:
    """Which runtime driver runs a plan for this device, on which kernels."""
    if device.backend == "cpu":
        cpu = body.cpu
        kernels = f"compiled kernels, SIMD path {cpu.isa}" if cpu.kernels == "native" else "NumPy kernels"
        return f"the cpu driver on {device.arch} ({kernels})"
    return (f"the {device.backend} driver on a {device.arch} GPU, or the emulated GPU on any CPU "
            "(plan run --device emu)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="describe a plan file", description=__doc__)
    p.add_argument("plan", help="plan file")
    p.add_argument("--kernels", action="store_true", help="the manifest of every compiled kernel (GPU plans; on a "
                   "CPU plan its compiled kernels' parameters)")
    p.add_argument("--source", metavar="NAME", help="print the source of kernel NAME (GPU plans, CPU plans on "
                   "compiled kernels)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def _layouts(body: PlanBody) -> dict[str, dict[str, Any]]:
    """Per layout: the tensors held in it, their bytes, whether they are copies, and why."""
    out: dict[str, dict[str, Any]] = {}
    for name, w in body.weights.items():
        for layout, info in w.layouts.items():
            d = out.setdefault(layout, {"tensors": [], "bytes": 0, "copies": LAYOUTS[layout].copies,
                                        "why": LAYOUTS[layout].why})
            d["tensors"].append(name)
            d["bytes"] += info.bytes
    return out


def held_beyond_file(header: PlanHeader, body: PlanBody, layouts: dict[str, dict[str, Any]],
                     kv_bytes: int) -> dict[str, int]:
    """The memory a run holds besides the mapped GGUF, by what it is: arena, K/V cache, rope tables,
    weight copies (norm vectors as float32, relayouts) less the file pages they release, step-state
    slots."""
    tables = {}
    for p in body.phases.values():
        for launch in p.launches:
            for k in launch.kernels:
                for t in k.args:
                    if isinstance(t, RopeTable):
                        positions = t.positions if isinstance(t.positions, int) else p.dims[t.positions]
                        tables[t] = positions * t.dims * 4  # [positions, dims / 2, 2] f32
    state = sum(4 * math.prod(d if isinstance(d, int) else p.dims[d] for d in s.shape)
                for p in body.phases.values() for s in p.state.values())
    out = {"arena": body.arena_bytes, "kv_cache": kv_bytes, "rope_tables": sum(tables.values()),
           "weight_copies": sum(weight_bytes_beyond_file(w) for w in body.weights.values()), "step_state": state}
    return out | {"total": sum(out.values())}


def summarize(header: PlanHeader, body: PlanBody) -> dict[str, Any]:
    layouts = _layouts(body)
    phases = {}
    for name, p in body.phases.items():
        phases[name] = {
            "launches": len(p.launches),
            "kernels": dict(Counter(f"{l.family}/{l.member}" for l in p.launches)),
            "arena_bytes": p.arena_bytes,
            "activation_bytes_unshared": p.activation_bytes,
            "dims": p.dims,
        }
    decisions = Counter(l.provenance for p in body.phases.values() for l in p.launches if not l.decision)
    pruned = Counter(f"{m}: {why}" for p in body.phases.values() for l in p.launches for m, why in l.pruned.items())
    cfg, lim = body.config, header.limits
    block_bytes = cfg["n_layers"] * 2 * PAGE * cfg["n_kv_heads"] * cfg["head_dim"] * 2  # f16 K and V of every layer
    cpu = {k: v for k, v in to_wire(body.cpu).items() if k != "source"} if body.cpu else None
    native = body.gpu is not None or body.cpu.kernels == "native"
    return {
        "format": header.format, "llmplan": header.llmplan, "device": to_wire(header.device),
        "runs_on": runs_on(header.device, body), "cpu": cpu,
        "toolchain": header.toolchain, "model": to_wire(header.model), "limits": to_wire(lim),
        "arena_bytes": body.arena_bytes,
        "kv_cache": {"blocks": lim.kv_blocks, "block_tokens": PAGE, "block_bytes": block_bytes,
                     "bytes": lim.kv_blocks * block_bytes,
                     "full_context_sequences": lim.kv_blocks // pages_for(lim.ctx)},
        "kernels": sorted(body.kernels) if native else
        sorted({f"{l.family}/{l.member}" for p in body.phases.values() for l in p.launches}),
        "cache": to_wire(body.cache),
        "phases": phases, "decisions": dict(decisions), "tuning": to_wire(body.tune), "pruned": dict(pruned),
        "weights": {"count": len(body.weights), "layouts": layouts,
                    "held_bytes": sum(d["bytes"] for d in layouts.values()),
                    "copied_bytes": sum(d["bytes"] for d in layouts.values() if d["copies"])},
        "declines": dict(body.declines),
        "held_beyond_file": None if body.gpu else held_beyond_file(header, body, layouts, lim.kv_blocks * block_bytes),
        "device_memory": body.device_memory if body.gpu else None,
        "decode_bytes_per_token": body.decode_bytes_per_token,
    }


def _kernel_source(source: str, name: str) -> str:
    """The family source file a kernel instantiates (as inlined in the plan's translation unit, its
    includes left out), then its entry point."""
    entry = next((ln for ln in source.splitlines() if re.search(rf"\b{name}\(", ln) and "LP_KERNEL" in ln), None)
    if entry is None:
        raise InputError(f"no kernel named {name!r} in this plan (plan inspect --kernels lists them)")
    files: dict[str, list[str]] = {}
    for section in re.split(r"\n(?=// ---- \S+ ----\n)", source):
        if m := re.match(r"// ---- (\S+) ----\n", section):
            files.setdefault(m.group(1), []).append(section[m.end():])
    called = re.search(r"\{\s*(?:\w+::)*(\w+)", entry.split(")", 1)[1])  # a CPU entry calls lp_cpu::family
    defines = re.compile(rf"^[^;\n]*\b(?:void|int|float)\s+{called.group(1) if called else '$^'}\s*\(", re.M)
    own = [f"// ---- {f} ----\n" + "".join(parts) for f, parts in files.items()
           if f != "entry-points" and any(defines.search(p) for p in parts)]
    return "\n".join(own[:1] + ["// ---- entry point ----", entry]) + "\n"


def _manifest_table(manifests: dict[str, dict[str, Any]]) -> str:
    amd = any(m["sgprs"] for m in manifests.values())  # scalar registers: AMD's second register file
    rows = [(n, m["threads"], m["registers"], m["spill_bytes"], m["shared_bytes"], m["stack_bytes"],
             *([m["sgprs"]] if amd else []), " ".join(f"{c}:{k}" for c, k in sorted(m["instructions"].items()) if k) or "-")
            for n, m in sorted(manifests.items())]
    return format_table(["kernel", "threads", "registers", "spills", "shared", "stack", *(["sgprs"] if amd else []),
                         "instructions"], rows)


def run(args: argparse.Namespace) -> int:
    header, offset = read_header(args.plan)
    body = read_body(args.plan, offset, header)
    gpu, cpu = body.gpu, body.cpu
    if (args.kernels or args.source) and gpu is None and cpu.kernels != "native":
        raise InputError(f"{args.plan} is a CPU plan on the NumPy twins (runtime/numpy_kernels.py): {cpu.why}")
    if args.source:
        sys.stdout.write(_kernel_source((gpu or cpu).source, args.source))
        return 0
    if args.kernels and gpu is None:
        rows = [(name, ", ".join(k.params)) for name, k in sorted(body.kernels.items())]
        if args.json:
            print_json({"isa": cpu.isa, "compiler": cpu.compiler, "kernels": to_wire(body.kernels)})
        else:
            print(f"{len(rows)} kernels for the CPU, SIMD path {cpu.isa} ({cpu.compiler})")
            print(format_table(["kernel", "parameters"], rows))
        return 0
    if args.kernels:
        if args.json:
            print_json({"target": gpu.target, "compiler": gpu.compiler, "manifests": gpu.manifests})
        else:
            print(f"{len(gpu.manifests)} kernels for {gpu.target} ({gpu.compiler})")
            print(_manifest_table(gpu.manifests))
        return 0
    s = summarize(header, body)
    if args.json:
        print_json(s)
        return 0
    m, d = s["model"], s["device"]
    print(f"{args.plan}: plan format {s['format']} (llmplan {s['llmplan']})")
    print(f"  device   {d['name']} [{d['key']}]")
    print(f"  runs on  {s['runs_on']}")
    if s["cpu"]:
        print(f"  kernels  {s['cpu']['kernels']}: {s['cpu']['why']}")
    print(f"  model    {m['path']} ({m['arch']} \"{m['name']}\", {m['fingerprint']['file_size']} bytes, "
          f"metadata {m['fingerprint']['metadata_sha256'][:16]}, tensors {m['fingerprint']['tensors_sha256'][:16]})")
    lim = s["limits"]
    print(f"  limits   context {lim['ctx']}, prefill chunk {lim['chunk']}, sequences per step {lim['max_seqs']}")
    kv = s["kv_cache"]
    print(f"  kv cache {kv['blocks']} blocks of {kv['block_tokens']} positions, {human_bytes(kv['bytes'])} "
          f"({human_bytes(kv['block_bytes'])} a block): {plural(kv['full_context_sequences'], 'sequence')} of the full "
          f"context (plan run --kv-blocks resizes it)")
    print(f"  arena    {s['arena_bytes']} bytes ({human_bytes(s['arena_bytes'])}), activations of one layer at a time")
    rows = [(ph, p["launches"], p["arena_bytes"], p["activation_bytes_unshared"]) for ph, p in s["phases"].items()]
    print("  " + format_table(["phase", "launches", "arena bytes", "unshared bytes"], rows).replace("\n", "\n  "))
    print("  kernels  " + ", ".join(s["kernels"]))
    for why, n in s["decisions"].items():
        print(f"  decision {plural(n, 'launch', 'launches')}: {why}")
    if s["tuning"]:
        t = s["tuning"]
        print(f"  tuning   {len(t['decisions'])} decisions from the tune store {t['store']} "
              f"(tune key {t['device_key']})")
        rows = [(key, d["member"], ", ".join(f"{ph} {n}" for ph, n in d["launches"].items()), d["provenance"])
                for key, d in t["decisions"].items()]
        if rows:
            print("    " + format_table(["decision", "member", "launches", "provenance"], rows).replace("\n", "\n    "))
    for why, n in s["pruned"].items():
        print(f"  pruned   {plural(n, 'launch', 'launches')}: {why}")
    w = s["weights"]
    where = ("held on the device" if body.gpu else
             f"{human_bytes(s['held_beyond_file']['weight_copies'])} beyond the mapped file, whose pages of the tensors "
             "held only in copies are released")
    print(f"  weights  {plural(w['count'], 'tensor')}, by the layout their kernels read; {human_bytes(w['copied_bytes'])} "
          f"made at load, {where}")
    for how, d in w["layouts"].items():
        print(f"    {how} (version {LAYOUTS[how].version}): {plural(len(d['tensors']), 'tensor')}, {human_bytes(d['bytes'])}: "
              f"{d['why']}")
    if s["held_beyond_file"]:
        h = s["held_beyond_file"]
        print(f"  memory   {human_bytes(h['total'])} held beyond the mapped file: "
              + ", ".join(f"{k.replace('_', ' ')} {human_bytes(v)}" for k, v in h.items() if k != "total"))
    dev = s["device"]
    if s["device_memory"]:
        dm = s["device_memory"]
        print(f"  memory   {human_bytes(dm['total'])} on the device, of its {dev['memory_gib']} GiB: "
              + ", ".join(f"{k.replace('_', ' ')} {human_bytes(v)}" for k, v in dm.items() if k != "total"))
    if dev["bandwidth_gbs"]:
        n = s["decode_bytes_per_token"]
        print(f"  roofline a decode step reads {human_bytes(n)} of weights: at the device's peak {dev['bandwidth_gbs']:g} "
              f"GB/s, {n / dev['bandwidth_gbs'] / 1e6:.3f} ms a step at least, {dev['bandwidth_gbs'] * 1e9 / n:.0f} "
              f"tokens/s at most for one sequence")
    n_declines = sum(len(v) for v in s["declines"].values())
    print(f"  declines {n_declines} (plan passes MODEL.gguf shows them)")
    return 0
