"""`plan env`: this machine as llmplan sees it, for a bug report: llmplan's version and build id, Python,
the packages and extras installed, the CPU's SIMD paths and features, the compilers found for each
target and the one each build uses, the GPUs CuPy and hip-python see, and the cache and tune-store
paths."""

from __future__ import annotations

import argparse
from typing import Any

from llmplan.core.console import format_table, print_json

from .environment import collect


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("env", help="describe this machine's compilers, SIMD paths and GPUs", description=__doc__)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def _indent(text: str, by: int) -> str:
    return text.replace("\n", "\n" + " " * by)


def _compilers(name: str, c: dict[str, Any]) -> list[str]:
    targets = ", ".join(c["targets"])
    if name == "cpu":
        uses = f"builds with {c['uses']}" if c["uses"] else f"no compiler builds here ({c['why_none']}): {c['install']}"
        header = ["compiler", "version", "probe"]
        rows = [(f["command"], f["identity"], "builds the kernels" if f["builds"] else f"fails: {f['why_not']}")
                for f in c["found"]]
    else:
        missing = [t for t, f in c["found"].items() if f is None]
        uses = (f"builds with {c['uses']}" if c["uses"] else
                f"cannot build here ({', '.join(missing)} missing): {c['install']}")
        header = ["tool", "path", "from", "version"]
        rows = [(tool, f["path"], f["from"], f["version"]) if f else (tool, "not found", "", "")
                for tool, f in c["found"].items()]
    lines = [f"  {name:<7}{targets}: {uses}"]
    if rows:
        lines.append(" " * 9 + _indent(format_table(header, rows), 9))
    return lines


def run(args: argparse.Namespace) -> int:
    env = collect()
    if args.json:
        print_json(env)
        return 0
    me, py, cpu = env["llmplan"], env["python"], env["cpu"]
    print(f"llmplan    {me['version'] or 'not installed as a package'}, build {me['build_id']}, from {me['path']}")
    print(f"python     {py['version']} ({py['executable']}) on {py['platform']}")
    if env["packages"] is not None:
        print("packages   " + ", ".join(f"{d} {v}" for d, v in env["packages"].items() if v))
    if env["extras"] is not None:
        have = [e for e, x in env["extras"].items() if x["installed"]]
        lack = [f"{e} (needs {', '.join(x['missing'])})" for e, x in env["extras"].items() if not x["installed"]]
        print(f"extras     installed: {', '.join(have) or 'none'}; not installed: {', '.join(lack) or 'none'}")
    amx = "AMX" if cpu["amx"] else "no AMX"
    print(f"cpu        {cpu['name']}, {cpu['machine']}, {cpu['cores']} cores, {cpu['memory_gib']} GiB; SIMD paths "
          f"{', '.join(cpu['simd_paths'])} (plans use {cpu['best']}); features {' '.join(cpu['features']) or 'none'}; "
          f"{amx}; NumPy's SIMD level {cpu['numpy_simd']}")
    print("compilers")
    for name, c in env["compilers"].items():
        print("\n".join(_compilers(name, c)))
    gpus = []
    for runtime, g in env["gpus"].items():
        seen = [f"{d['name']} ({d.get('key') or d['unsupported']})" for d in g["devices"]]
        gpus.append(f"{runtime}: {', '.join(seen) if seen else g['why_none']}")
    print("gpus       " + "; ".join(gpus))
    paths = env["paths"]
    cxx = f"; $CXX {paths['cxx_env']}" if paths["cxx_env"] else ""
    print(f"paths      cache {paths['cache']}; tune store {paths['tune_store']}{cxx}")
    return 0
