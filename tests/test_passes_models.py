"""The pass pipeline on real models: golden IR after every pass, results bit-identical to the unfused
graph, the launch count of a Llama-3.1-8B decode step, and `plan passes`."""

import functools
import json
from collections import Counter

import numpy as np
import pytest

from llmplan.ir.printer import print_graph
from llmplan.ir.reference import ReferenceDecoder
from llmplan.ir.trace import trace_model
from llmplan.models.architectures import definition
from llmplan.models.builder import plan_build
from llmplan.models.model import open_model
from llmplan.passes.manager import PASS_NAMES, compile_graph, run_passes

from conftest import REFERENCE, TINY_BPE, TINY_SPM


@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_every_pass_matches_golden_tiny_llama3(golden, phase):
    m = open_model(TINY_BPE)
    snaps = run_passes(trace_model(m.definition, m.config, m.weight_table(), phase))
    assert [s.name for s in snaps] == ["traced", *PASS_NAMES]
    for i, s in enumerate(snaps):
        golden(f"passes/tiny-llama3-bpe.{phase}/{i:02d}_{s.name}.ir", print_graph(s.graph))


@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_final_fused_gemma3_matches_golden(golden, gemma3_path, phase):
    m = open_model(gemma3_path)
    golden(f"passes/gemma3-270m.{phase}.fused.ir", print_graph(compile_graph(trace_model(m.definition, m.config, m.weight_table(), phase))))


MODELS = {"tiny-llama-spm-Q4_K_M": lambda r: TINY_SPM, "tiny-llama3-bpe-Q4_K_M": lambda r: TINY_BPE,
          "gemma3-270m": lambda r: r.getfixturevalue("gemma3_path")}


@pytest.mark.parametrize("name", list(MODELS))
def test_fused_graphs_give_the_unfused_results(request, name):
    """Bit for bit: every fused op does the arithmetic of what it replaced, and split-context attention
    over contexts within one slice does too. (Agreement with llama.cpp is therefore exactly the unfused
    graph's: tests/test_reference_llamacpp.py.)"""
    m = open_model(MODELS[name](request))
    table = m.weight_table()
    weight = functools.lru_cache(None)(m.dequantize)
    graphs = {ph: trace_model(m.definition, m.config, table, ph) for ph in ("prefill", "decode")}
    fused = {ph: compile_graph(g) for ph, g in graphs.items()}
    case = json.loads((REFERENCE / f"ref_{name}.json").read_text())["generate"][0]
    plain = ReferenceDecoder(graphs["prefill"], graphs["decode"], weight, 64)
    fast = ReferenceDecoder(fused["prefill"], fused["decode"], weight, 64)
    assert np.array_equal(plain.prefill(case["prompt_ids"]), fast.prefill(case["prompt_ids"]))
    for token in case["greedy_ids"][:6]:
        assert np.array_equal(plain.step(token), fast.step(token))
    assert np.array_equal(plain.cache, fast.cache)


def test_fused_tail_gives_the_greedy_token():
    m = open_model(TINY_BPE)
    weight = functools.lru_cache(None)(m.dequantize)
    g = compile_graph(trace_model(m.definition, m.config, m.weight_table(), "prefill"))
    dec = ReferenceDecoder(g, g, weight, 32)
    out = dec._prefill.run({"tokens": np.array([0, 5, 9, 100], np.int32), "pos": np.arange(4, dtype=np.int32),
                            "seq": np.zeros(4, np.int32), "pages": np.repeat(dec.pages, 2, axis=0),
                            "last": np.array([1, 3], np.int32), "cache": dec.cache})
    assert out["next_token"].tolist() == np.argmax(out["logits"], axis=-1).tolist()


def test_llama3_8b_decode_launches(tmp_path):
    b = plan_build(tmp_path / "x.gguf", "llama3-8b")
    table = {n: (b.formats[n].name, s[::-1]) for n, s in b.shapes.items()}
    g = compile_graph(trace_model(definition(b.config.arch), b.config, table, "decode"))
    ops = [n for n in g.order if n.op not in ("input", "weight")]
    part, launches = "head", Counter()
    for n in ops:
        reads = [g.node(o.node).name for o in n.operands if g.node(o.node).op == "weight"]
        if any(r.endswith("attn_norm.weight") for r in reads):
            part = reads[-1].split(".")[1]  # a layer starts at its attention norm
        elif "output_norm.weight" in reads:
            part = "tail"
        launches[part] += 1
    assert launches["head"] == 1  # the embedding gather
    assert all(launches[str(i)] == 10 for i in range(32)), launches
    assert launches["tail"] == 3  # final norm + head for the logits path; tail_argmax for greedy
    assert len(ops) == 1 + 32 * 10 + 3
    assert Counter(n.op for n in ops) == {
        "embed": 1, "rmsnorm_pack": 65, "matmul_segmented": 64, "rope_kv": 32, "attention_partial": 32,
        "attention_reduce_pack": 32, "matmul_residual": 64, "glu_pack": 32, "matmul": 1, "tail_argmax": 1}
