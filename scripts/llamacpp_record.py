"""llama.cpp's outputs on a model, recorded as ../shared/fixtures/reference holds them (its README):
`tokenize` on every string both ways, `generate` on every prompt (greedy ids with each step's top-1
margin and top five), and the logits row after each prompt. scripts/arch_fixtures.py records the
references with it; scripts/llamacpp_spread.py runs it again under other settings.

Needs llama-cpp-python 0.3.36 (not a dependency).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from llmplan.commands import llama_cpp

# LLMPLAN_FIXTURES, as the tests take it, else the shared/ folder beside the checkout
FIXTURES = Path(os.environ.get("LLMPLAN_FIXTURES", Path(__file__).resolve().parents[2] / "shared" / "fixtures"))
CTX, THREADS = 256, 2  # the fixtures' settings beside llama_cpp.load's (f16 K/V, batch 512, flash attention off)
GREEDY_TOKENS = 24


def load(path: Path, **settings):
    return llama_cpp.load(str(path), CTX, threads=THREADS, **settings)


def tokenize(llm, texts: list[str]) -> list[dict]:
    """Per text: the ids with BOS added as the vocabulary says and special tokens not parsed, then the ids
    without BOS with special tokens parsed."""
    out = []
    for text in texts:
        raw = text.encode("utf-8")
        out.append({"text": text, "add_bos": True, "ids": llm.tokenize(raw, add_bos=True, special=False)})
        out.append({"text": text, "add_bos": False, "parse_special": True,
                    "ids": llm.tokenize(raw, add_bos=False, special=True)})
    return out


def generate(llm, prompt_ids: list[int], n: int = GREEDY_TOKENS) -> tuple[dict, np.ndarray]:
    """Greedy decoding of up to n tokens after the prompt, stopping after an end-of-generation token: the
    record (ids, text, per step the gap between the two best logits and the top five) and the logits row
    after the prompt."""
    import llama_cpp as binding

    vocab = binding.llama_model_get_vocab(llm.model)
    llm.reset()
    llm.eval(prompt_ids)
    row = llama_cpp.last_logits(llm)
    ids, margins, top5 = [], [], []
    logits = row
    while len(ids) < n:
        order = np.argsort(-logits, kind="stable")[:5]
        ids.append(int(order[0]))
        margins.append(round(float(logits[order[0]] - logits[order[1]]), 4))
        top5.append([[int(i), round(float(logits[i]), 4)] for i in order])
        if binding.llama_vocab_is_eog(vocab, ids[-1]):
            break
        llm.eval([ids[-1]])
        logits = llama_cpp.last_logits(llm)
    text = llm.detokenize(ids).decode("utf-8", errors="replace")
    return {"prompt_ids": list(prompt_ids), "greedy_ids": ids, "greedy_text": text, "top1_margin": margins,
            "top5": top5}, row


def record(path: Path, out_dir: Path, extra_strings: list[str]) -> tuple[Path, Path]:
    """Write ref_<model>.json and ref_<model>.npz for a model file, on the fixtures' strings (and
    `extra_strings`) and prompts; returns their paths."""
    strings = json.loads((FIXTURES / "strings.json").read_text()) + extra_strings
    prompts = json.loads((FIXTURES / "prompts.json").read_text())
    llm = load(path)
    cases, rows = [], {}
    for k, prompt in enumerate(prompts):
        ids = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
        case, rows[f"p{k}_last_prompt"] = generate(llm, ids)
        cases.append({"prompt": prompt, **case})
    name = path.stem
    ref = {"model": path.name, "engine": f"llama.cpp (llama-cpp-python {llama_cpp.version()}, CPU)",
           "tokenize": tokenize(llm, strings), "generate": cases}
    json_path, npz_path = out_dir / f"ref_{name}.json", out_dir / f"ref_{name}.npz"
    json_path.write_text(json.dumps(ref, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    np.savez_compressed(npz_path, **rows)
    return json_path, npz_path
