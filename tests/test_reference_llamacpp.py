"""The reference interpreter against llama.cpp, the outside oracle.

Two kinds of check:

1. Op by op (exact). tests/data holds llama.cpp's own layer-0 tensors for one prompt of gemma3-270m and
   tiny-llama3-bpe (scripts/dump_llamacpp_tensors.py, llama-cpp-python 0.3.36, the fixtures' settings).
   Each node of our traced layer 0 is fed llama.cpp's values for its operands and must reproduce
   llama.cpp's value for its result to float32 rounding (NMSE < 1e-9), except where TOLERANCE says
   why our rounding differs.

2. Whole model (statistical). Logits after each prompt of ../shared/fixtures/prompts.json against the
   recorded rows, and greedy continuations. With 8-bit activation packing, a float32 rounding
   difference anywhere flips some packed value somewhere, and gemma3-270m amplifies that: llama.cpp
   itself (the fixtures' build, reproducing the recorded rows bit for bit) lands at NMSE up to 2.1e-3
   from its own rows with flash attention on and up to 4.7e-3 with the prompt fed one token at a time
   (scripts/llamacpp_spread.py, tests/data/llamacpp_spread.json). So the bound is 1e-3, or the
   farthest of llama.cpp's own other settings where that is farther (conftest.llama_cpp_bound), and
   greedy ids must be equal up to the first step whose recorded margin is under 1.0 (twice the largest
   deviation we see among the top 50 logits of a prompt row).
"""

import functools
import json
from pathlib import Path

import numpy as np
import pytest

from llmplan.ir.interpret import IMPLS
from llmplan.ir.reference import ReferenceDecoder
from llmplan.ir.trace import trace_model
from llmplan.models.model import open_model
from llmplan.models.tokenizer import load_tokenizer

from conftest import REFERENCE, TINY_BPE, TINY_SPM, llama_cpp_bound
from tokenizer_refs import model_path

DATA = Path(__file__).parent / "data"


def nmse(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return ((a - b) ** 2).sum() / (b**2).sum()


# --- 1. op by op -----------------------------------------------------------------------------

# Where our arithmetic rounds differently on purpose. GELU: llama.cpp's CPU backend reads an f16
# table, we compute the formula. Attention: llama.cpp's default CPU path rounds the normalized softmax
# weights to f16; we round the unnormalized exp weights, as flash-attention kernels (llama.cpp's
# own included) do, so that split-context attention matches unsplit attention bit for bit.
TOLERANCE = {"ffn_geglu-0": 1e-6, "kqv_out-0": 1e-7}

def _layer0_names(g, arch):
    """Our layer-0 nodes -> the names llama.cpp gives their results."""
    by_weight = {"attn_norm": "attn_norm-0", "attn_q": "Qcur-0", "attn_k": "Kcur-0", "attn_v": "Vcur-0",
                 "attn_q_norm": "Qcur_normed-0", "attn_k_norm": "Kcur_normed-0",
                 "post_attention_norm": "attn_post_norm-0", "ffn_norm": "ffn_norm-0", "ffn_gate": "ffn_gate-0",
                 "ffn_up": "ffn_up-0", "ffn_down": "ffn_out-0", "post_ffw_norm": "ffn_post_norm-0"}
    if arch == "llama":
        by_weight["attn_output"] = "attn_out-0"
    names = {}
    adds = []
    for n in g.order:
        weights = [g.node(o.node).name for o in n.operands if g.node(o.node).op == "weight"]
        layer0 = [w[len("blk.0."):-len(".weight")] for w in weights if w.startswith("blk.0.")]
        if n.op in ("rmsnorm", "matmul") and layer0 and layer0[0] in by_weight:
            names[n.id] = by_weight[layer0[0]]
        elif n.op == "rope" and n.operands[0].node in names:
            names[n.id] = names[n.operands[0].node].split("_")[0].replace("-0", "") + "-0#1"
        elif n.op == "attention" and n.attr["layer"] == 0:
            names[n.id] = "kqv_out-0"
        elif n.op == "mul" and any(g.node(o.node).op in ("silu", "gelu_tanh") for o in n.operands) and not adds[2:]:
            names[n.id] = "ffn_geglu-0" if arch == "gemma3" else "ffn_swiglu-0"
        elif n.op == "add":
            adds.append(n.id)
            if len(adds) <= 2:
                names[n.id] = ("sa_out-0" if arch == "gemma3" else "ffn_inp-0") if len(adds) == 1 else "l_out-0"
        elif n.op == "scale":
            names[n.id] = "inp_scaled"
        elif n.op == "embed":
            names[n.id] = "embd"
    return names


@pytest.mark.parametrize("model", ["gemma3-270m", "tiny-llama3-bpe"])
def test_layer0_ops_reproduce_llama_cpp(request, model):
    path = request.getfixturevalue("gemma3_path") if model == "gemma3-270m" else TINY_BPE
    m = open_model(path)
    dump = np.load(DATA / f"llamacpp_{model}_layer0.npz")
    ids = dump["ids"]
    g = trace_model(m.definition, m.config, m.weight_table(), "prefill")
    names = _layer0_names(g, m.config.arch)
    weight = functools.lru_cache(None)(m.dequantize)
    n = len(ids)
    env = {}
    inputs = {"tokens": ids.astype(np.int32), "pos": np.arange(n, dtype=np.int32), "seq": np.zeros(n, np.int32),
              "pages": np.array([[0]], np.int32), "last": np.array([n - 1], np.int32),
              "cache": np.zeros((m.config.n_layers, 2, 1, 16, m.config.kv_dim), np.float16)}
    checked = set()
    for node in g.order:
        if node.op == "input":
            env[node.out] = inputs[node.name]
            continue
        if node.op == "weight":
            continue
        if "l_out-0" in checked:
            break
        args = [env[o] if g.node(o.node).op != "weight" else weight(g.node(o.node).name) for o in node.operands]
        env[node.out] = IMPLS[node.op](node.attr, *args)
        name = names.get(node.id)
        if name is None:
            continue
        theirs = dump[name].reshape(env[node.out].shape)
        assert nmse(env[node.out], theirs) < TOLERANCE.get(name, 1e-9), f"{name} ({node.op})"
        env[node.out] = theirs  # continue from llama.cpp's value, so each op is judged alone
        checked.add(name)
    assert checked == set(dump.files) - {"ids"}, set(dump.files) - {"ids"} - checked


# --- 2. whole model ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["tiny-llama-spm-Q4_K_M", "tiny-llama3-bpe-Q4_K_M", "gemma3-270m"])
def test_prompts_tokenize_as_llama_cpp(request, name):
    tok = load_tokenizer(model_path(request, name))
    cases = json.loads((REFERENCE / f"ref_{name}.json").read_text())["generate"]
    assert cases
    for case in cases:
        assert tok.encode(case["prompt"], add_special=True, parse_special=True) == case["prompt_ids"]


MODELS = {"tiny-llama-spm-Q4_K_M": lambda r: TINY_SPM, "tiny-llama3-bpe-Q4_K_M": lambda r: TINY_BPE,
          "gemma3-270m": lambda r: r.getfixturevalue("gemma3_path")}
MARGIN = 1.0


@functools.lru_cache(maxsize=None)
def _model(path):
    m = open_model(path)
    table = m.weight_table()
    return (m, trace_model(m.definition, m.config, table, "prefill"), trace_model(m.definition, m.config, table, "decode"),
            functools.lru_cache(None)(m.dequantize))


@pytest.mark.parametrize("name", list(MODELS))
def test_logits_and_greedy_ids_against_llama_cpp(request, name):
    get_path, bound = MODELS[name], llama_cpp_bound(name)
    m, prefill, decode, weight = _model(get_path(request))
    ref = json.loads((REFERENCE / f"ref_{name}.json").read_text())["generate"]
    rows = np.load(REFERENCE / f"ref_{name}.npz")
    for k, case in enumerate(ref):
        dec = ReferenceDecoder(prefill, decode, weight, len(case["prompt_ids"]) + len(case["greedy_ids"]))
        logits, ids = dec.greedy(case["prompt_ids"], len(case["greedy_ids"]))
        theirs = rows[f"p{k}_last_prompt"]
        assert nmse(logits, theirs) < bound, f"prompt {k}: NMSE {nmse(logits, theirs):.2e}"
        assert np.argmax(logits) == np.argmax(theirs) or case["top1_margin"][0] < MARGIN
        sure = next((i for i, mg in enumerate(case["top1_margin"]) if mg < MARGIN), len(case["greedy_ids"]))
        assert ids[:sure] == case["greedy_ids"][:sure], f"prompt {k}"


def test_gemma3_capital_of_france(gemma3_path):
    """The real-model sanity check: reads as llama.cpp's continuation does."""
    m, prefill, decode, weight = _model(gemma3_path)
    case = json.loads((REFERENCE / "ref_gemma3-270m.json").read_text())["generate"][0]
    assert case["prompt"] == "The capital of France is"
    _, ids = ReferenceDecoder(prefill, decode, weight, 32).greedy(case["prompt_ids"], 16)
    # llama.cpp: " the capital of the country of France. It is the largest city in France."; ours: "... It is
    # the capital of the country of". Step 11 is a near tie (llama.cpp's margin 0.035) that rounding takes
    # either way; the 11 tokens before it agree (step 4, margin 0.031, happens to go llama.cpp's way).
    # Pinned: re-pin with care, and only for a change in rounding.
    assert ids[:11] == case["greedy_ids"][:11] and case["top1_margin"][11] < 0.04  # against llama.cpp
    assert ids == [506, 5279, 529, 506, 2891, 529, 7001, 236761, 1030, 563, 506, 5279, 529, 506, 2891, 529]  # the pin
    assert ids[:11] == case["greedy_ids"][:11]
