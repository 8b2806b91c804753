"""`plan passes` and `plan ir --after`."""

import json

from llmplan.passes.manager import PASS_NAMES

from conftest import GOLDENS, TINY_BPE


def test_table(cli):
    code, out, err = cli("passes", TINY_BPE)
    assert code == 0 and err == ""
    assert out.splitlines()[0] == "llama.decode: 46 traced nodes -> 24 after all passes"
    assert "fuse-qkv                         43           39         0" in out


def test_json_and_declines(cli, gemma3_path):
    code, out, _ = cli("passes", gemma3_path, "--json", "--phase", "prefill")
    d = json.loads(out)
    assert code == 0 and [p["name"] for p in d["passes"]] == PASS_NAMES
    res = next(p for p in d["passes"] if p["name"] == "fuse-residual")
    assert len(res["declines"]) == 36 and res["declines"][0] == (
        "fuse-residual declined at blk.0: a norm (blk.0.post_attention_norm.weight) stands between the projection "
        "and the residual add")
    assert d["final_op_counts"]["norm_rope_kv"] == 18


def test_diff_only_and_dump(cli, tmp_path):
    code, out, _ = cli("passes", TINY_BPE, "--diff", "--only", "fuse-glu-pack")
    assert code == 0 and out.startswith("--- 06_fuse-attn-reduce-pack.ir\n+++ 07_fuse-glu-pack.ir\n")
    assert "+  %14 = glu_pack[act=silu, format=q8_k] %12, %13 : q8_k[1, 2816]" in out
    code, out, _ = cli("passes", TINY_BPE, "--dump", tmp_path / "ir")
    names = sorted(p.name for p in (tmp_path / "ir").iterdir())
    assert code == 0 and names[0] == "00_traced.ir" and names[-1] == "10_dce.ir" and len(names) == 11
    golden = GOLDENS / "passes" / "tiny-llama3-bpe.decode" / "05_fuse-rope-kv.ir"
    assert (tmp_path / "ir" / "05_fuse-rope-kv.ir").read_text() == golden.read_text()


def test_unknown_pass_lists_the_passes(cli):
    code, out, err = cli("passes", TINY_BPE, "--only", "nonexistent")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "unknown pass 'nonexistent' (passes: split-attention, fuse-norm-pack," in err and "dce)" in err


def test_ir_after(cli):
    code, out, _ = cli("ir", TINY_BPE, "--after", "fuse-qkv")
    assert code == 0 and out == (GOLDENS / "passes" / "tiny-llama3-bpe.decode" / "03_fuse-qkv.ir").read_text()
    code, _, err = cli("ir", TINY_BPE, "--after", "fuse-everything")
    assert code == 2 and "unknown pass 'fuse-everything'" in err
