"""Record llama.cpp's base for the tests' whole-model KL check (tests/test_eval.py), per tiny fixture.

    python scripts/llamacpp_bases.py

For each tiny fixture model: the first CHARS characters of tests/data/alice_ch1-3.txt in
llama-perplexity's windows of CTX tokens, scored by llama.cpp with the fixtures' settings (flash
attention off, each window one batch), saved as a `plan eval --save-logits` base
(tests/data/llamacpp_base_<model>.npz); and the KL divergence of llama.cpp's own flash-attention run
from that base, with the same grouped estimator `plan eval --against` uses, into
tests/data/llamacpp_kl.json: the scale of llama.cpp's disagreement with itself that the test's bound
is a multiple of. Needs llama-cpp-python 0.3.36 (not a dependency).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from llmplan.commands import eval_base, eval_stats, llama_cpp
from llmplan.models.gguf import GGUFFile
from llmplan.models.tokenizer import load_tokenizer
from llmplan.runtime.scoring import windows

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
FIXTURES = ROOT.parent / "shared" / "fixtures" / "models"
MODELS = {"tiny-llama-spm-Q4_K_M": FIXTURES / "tiny-llama-spm-Q4_K_M.gguf",
          "tiny-llama3-bpe-Q4_K_M": FIXTURES / "tiny-llama3-bpe-Q4_K_M.gguf"}
CTX, CHARS = 64, 1300


def main() -> None:
    text = (DATA / "alice_ch1-3.txt").read_text(encoding="utf-8")[:CHARS]
    record = {}
    for name, path in MODELS.items():
        tok = load_tokenizer(GGUFFile(path))
        ids = tok.encode(text, add_special=True, parse_special=False)
        wins = windows(ids, CTX, None, tok.bos if tok.vocab.add_bos else None)
        runs = {flash: llama_cpp.load(str(path), CTX, logits_all=True, n_batch=CTX, n_ubatch=CTX, flash_attn=flash)
                for flash in (False, True)}
        assert runs[False].tokenize(text.encode("utf-8"), add_bos=True, special=False) == ids, name
        writer = eval_base.Writer(str(DATA / f"llamacpp_base_{name}.npz"), ids, CTX, 0,
                                  eval_base.vocab_fingerprint(tok), f"llama.cpp {llama_cpp.version()} {path.name}",
                                  sum(w.scored for w in wins), runs[False].n_vocab())
        fa = []
        for w in wins:
            targets = np.asarray(w.targets, np.int32)
            rows = eval_stats.summarize(llama_cpp.window_logits(runs[False], w.tokens, w.first), targets)
            writer.add(rows)
            fa.append(eval_stats.compare(rows, llama_cpp.window_logits(runs[True], w.tokens, w.first), targets))
        writer.close()
        d = eval_stats.divergence(eval_stats.Comparison.concat(fa))
        record[name] = {"ctx": CTX, "chars": CHARS, "tokens": d["tokens"], "flash_attention_kl_mean": d["kl_mean"],
                        "flash_attention_kl_unc": d["kl_unc"], "flash_attention_same_top_pct": d["same_top_pct"]}
        print(name, json.dumps(record[name]))
    (DATA / "llamacpp_kl.json").write_text(json.dumps(
        {"about": "scripts/llamacpp_bases.py: llama.cpp 0.3.36 (CPU, f16 K/V, flash attention off vs on) on "
                  "tests/data/alice_ch1-3.txt[:chars] in llama-perplexity's windows of ctx",
         "llama_cpp": llama_cpp.version(), "models": record}, indent=2) + "\n")


if __name__ == "__main__":
    main()
