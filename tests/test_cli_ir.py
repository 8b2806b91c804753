"""`plan ir`: printing graphs, running the reference interpreter, and refusing what it cannot run."""

import json

import numpy as np
from gguf import GGUFValueType as V

from llmplan.models.config import SUPPORTED_ARCHITECTURES
from llmplan.models.gguf import MetaValue

from conftest import GOLDENS, REFERENCE, TINY_SPM
from model_files import rewrite


def test_prints_the_golden_graph(cli):
    code, out, _ = cli("ir", TINY_SPM, "--phase", "prefill")
    assert code == 0 and out == (GOLDENS / "ir" / "tiny-llama-spm.prefill.ir").read_text()
    code, out, _ = cli("ir", TINY_SPM, "--json")
    d = json.loads(out)
    assert d["graph"] == "llama.decode" and d["op_counts"]["attention"] == 4 and d["text"].startswith("graph ")


def test_eval_matches_llama_cpp(cli, tmp_path):
    ref = json.loads((REFERENCE / "ref_tiny-llama-spm-Q4_K_M.json").read_text())["generate"][0]
    dump = tmp_path / "logits.npz"
    code, out, _ = cli("ir", TINY_SPM, "--eval", ref["prompt"], "-n", "8", "--json", "--dump-logits", dump)
    d = json.loads(out)
    assert code == 0 and d["prompt_ids"] == ref["prompt_ids"]
    assert d["ids"] == ref["greedy_ids"][:8]  # the first low-margin step of this prompt is 24
    assert set(d) == {"prompt_ids", "ids", "text", "timings"}
    ours = np.load(dump)["prompt_last"]
    theirs = np.load(REFERENCE / "ref_tiny-llama-spm-Q4_K_M.npz")["p0_last_prompt"]
    assert ours.dtype == np.float32 and ((ours - theirs) ** 2).sum() / (theirs**2).sum() < 1e-3


def test_eval_text_output(cli):
    """The text streamed is the generated tokens' text, as --json gives it."""
    code, out, err = cli("ir", TINY_SPM, "--eval", "Once upon a time", "-n", "3")
    assert code == 0 and "3 tokens at" in err
    code, js, _ = cli("ir", TINY_SPM, "--eval", "Once upon a time", "-n", "3", "--json")
    d = json.loads(js)
    assert len(d["ids"]) == 3 and d["text"] and out == d["text"] + "\n"


def test_unsupported_architecture(cli, tmp_path):
    bert = rewrite(TINY_SPM, tmp_path / "bert.gguf", set_meta={"general.architecture": MetaValue(V.STRING, "bert")})
    code, out, err = cli("ir", bert)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"architecture 'bert' is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})" in err


def test_bad_arguments(cli):
    code, _, err = cli("ir", TINY_SPM, "--dump-logits", "x.npz")
    assert code == 2 and "--dump-logits needs --eval" in err
    code, _, err = cli("ir", TINY_SPM, "--eval", "hi", "-n", "100000")
    assert code == 2 and "exceed the model's context of 4096" in err
