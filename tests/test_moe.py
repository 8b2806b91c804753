"""Mixture of experts (issue 27) in the IR's arithmetic: the router's choice and order as llama.cpp's CPU
backend makes it, a (row, slot)'s projection independent of the rows sharing its expert, the weighted sum
in llama.cpp's order; and the reference interpreter on the two MoE fixtures (a qwen3moe and a Mixtral-style
llama file, tests/data) against llama.cpp's recorded rows, held as tests/test_reference_llamacpp.py holds
the dense fixtures."""

import functools
import json

import numpy as np
import pytest

from llmplan.core import numerics as num
from llmplan.ir.reference import ReferenceDecoder
from llmplan.ir.trace import trace_model
from llmplan.models.model import open_model

from conftest import llama_cpp_bound
from kernel_inputs import nmse
from test_arch_fixtures import DATA, MOE_NAMES

MARGIN = 1.0  # greedy ids must agree up to the first step whose recorded margin is under this


def test_sort_desc_without_ties_is_the_descending_order():
    v = np.random.default_rng(0).standard_normal(128).astype(np.float32)
    assert num.sort_desc(v).tolist() == np.argsort(-v).tolist()


def test_sort_desc_keeps_equal_values_in_place_up_to_16():
    """std::sort leaves up to 16 values to its insertion sort, which moves a value only past greater ones."""
    v = np.array([1, 3, 3, 2, 3, 1, 0, 2], np.float32)
    assert num.sort_desc(v).tolist() == [1, 2, 4, 3, 7, 0, 5, 6]


def test_sort_desc_past_16_is_introsorts_order():
    """Past 16 values introsort's partitions reorder equal values (what libstdc++'s std::sort gives for
    these, from its source: the compiled router kernel, which calls std::sort, is held to sort_desc on
    random ties in tests/test_cpu_native_moe.py); the values still come out descending."""
    v = np.array([2, 0, 2, 1, 2, 2, 0, 1, 2, 2, 1, 2, 0, 2, 2, 1, 2, 2, 0, 2], np.float32)
    order = num.sort_desc(v)
    assert sorted(order.tolist()) == list(range(20)) and (np.diff(v[order]) <= 0).all()
    assert order.tolist() != np.argsort(-v, kind="stable").tolist()


def test_route_weights_and_order():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((5, 16)).astype(np.float32)
    ids, w = num.route(logits, 4, norm=True)
    p = np.exp(logits.astype(np.float64))
    p /= p.sum(axis=1, keepdims=True)
    assert ids.dtype == np.int32 and w.dtype == np.float32
    assert ids.tolist() == np.argsort(-p, axis=1)[:, :4].tolist()
    chosen = np.take_along_axis(p, ids, axis=1)
    np.testing.assert_allclose(w, chosen / chosen.sum(axis=1, keepdims=True), rtol=1e-6)
    _, raw = num.route(logits, 4, norm=False)
    np.testing.assert_allclose(raw, chosen, rtol=1e-6)


def test_route_ties_go_as_llama_cpps_argsort():
    """Two equal logits: the lower expert first, and the weights split evenly."""
    logits = np.array([[0.5, 2.0, -1.0, 2.0, 1.0, 0.0, -3.0, 2.0]], np.float32)
    ids, w = num.route(logits, 2, norm=True)
    assert ids.tolist() == [[1, 3]] and w.tolist() == [[0.5, 0.5]]


def test_matmul_experts_rows_do_not_depend_on_their_company():
    """Every (row, slot) gets the bits it gets alone, whichever rows share its expert; the slot form reads
    each slot's own slice of x."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((6, 32, 64)).astype(np.float32)
    x = rng.standard_normal((7, 64)).astype(np.float32)
    ids = rng.integers(0, 6, (7, 3)).astype(np.int32)
    y = num.matmul_experts(x, w, ids)
    for r in range(7):
        alone = num.matmul_experts(x[r:r + 1], w, ids[r:r + 1])
        assert np.array_equal(y[r:r + 1], alone)
        for j in range(3):
            assert np.array_equal(y[r, 32 * j:32 * (j + 1)], num.matmul(x[r:r + 1], w[ids[r, j]])[0])
    xs = rng.standard_normal((7, 3 * 64)).astype(np.float32)
    ys = num.matmul_experts(xs, w, ids)
    assert np.array_equal(ys[2, 32:64], num.matmul(xs[2:3, 64:128], w[ids[2, 1]])[0])


def test_moe_sum_adds_slot_after_slot():
    rng = np.random.default_rng(3)
    y = rng.standard_normal((4, 3 * 8)).astype(np.float32)
    wt = rng.random((4, 3)).astype(np.float32)
    want = (y[:, :8] * wt[:, :1] + y[:, 8:16] * wt[:, 1:2]) + y[:, 16:] * wt[:, 2:]
    assert np.array_equal(num.moe_sum(y, wt), want)


@functools.lru_cache(maxsize=None)
def _model(name):
    m = open_model(DATA / f"{name}.gguf")
    table = m.weight_table()
    return (trace_model(m.definition, m.config, table, "prefill"), trace_model(m.definition, m.config, table, "decode"),
            functools.lru_cache(None)(m.dequantize))


@pytest.mark.parametrize("name", MOE_NAMES)
def test_reference_interpreter_against_llama_cpp(name):
    prefill, decode, weight = _model(name)
    cases = json.loads((DATA / f"ref_{name}.json").read_text())["generate"]
    rows = np.load(DATA / f"ref_{name}.npz")
    bound = llama_cpp_bound(name)
    errors = []
    for k, case in enumerate(cases):
        n = len(case["greedy_ids"])
        logits, ids = ReferenceDecoder(prefill, decode, weight, len(case["prompt_ids"]) + n).greedy(case["prompt_ids"], n)
        errors.append(nmse(logits, rows[f"p{k}_last_prompt"]))
        sure = next((i for i, mg in enumerate(case["top1_margin"]) if mg < MARGIN), n)
        assert ids[:sure] == case["greedy_ids"][:sure], f"prompt {k}"
    print(f"{name}: NMSE " + ", ".join(f"{e:.2e}" for e in errors) + f" (bound {bound:.2e})")
    assert max(errors) < bound
