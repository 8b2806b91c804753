"""Whole plans on the CPU target's kernels (tests/cpu_native_plan.py, a stand-in for the coming cpu driver),
on the tiny fixture models, on every SIMD path this machine has:
- the greedy tokens are the NumPy backend's (runtime/engine.py's executor on the same step states), and
  the logits agree within llama.cpp's own spread (conftest.llama_cpp_bound; measured about 1e-4: the
  integer dot products and the float sums' order differ, and an ulp that moves an 8-bit rounding in one
  layer grows through the next);
- chunking never changes a result: a prompt prefilled in one chunk, in chunks of 7 rows, or one token at
  a time gives the same logits, bit for bit, and so the same tokens.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import TINY_BPE, TINY_SPM, llama_cpp_bound
from cpu_native import ISAS, needs_compiler
from cpu_native_plan import NativeModel
from kernel_inputs import nmse
from llmplan.core.numerics import pages_for
from llmplan.plans.compile import plan_for
from llmplan.runtime.engine import Engine

PROMPT = "Once upon a time, in a land far away, there lived"
STEPS = 8


@pytest.fixture(scope="module")
def engines():
    return {m: Engine.load(plan_for(str(m), 256)) for m in (TINY_BPE, TINY_SPM)}


def _numpy_greedy(engine, ids: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    """The NumPy backend's executor on the step states NativeModel.greedy makes: logits rows, greedy ids."""
    pages = np.arange(pages_for(256), dtype=np.int32)[None, :]
    state = {"tokens": np.asarray(ids, np.int32), "pos": np.arange(len(ids), dtype=np.int32),
             "seq": np.zeros(len(ids), np.int32), "pages": pages, "last": np.array([len(ids) - 1], np.int32)}
    rows = [engine.executor.run("prefill", state, {"cache", "logits"})["logits"][0].copy()]
    out = []
    for step in range(n):
        tok = int(np.argmax(rows[-1]))
        out.append(tok)
        if step == n - 1:
            break
        state = {"tokens": np.array([tok], np.int32), "pos": np.array([len(ids) + step], np.int32),
                 "seq": np.zeros(1, np.int32), "pages": pages}
        rows.append(engine.executor.run("decode", state, {"cache", "logits"})["logits"][0].copy())
    return out, rows


@needs_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("model", [TINY_BPE, TINY_SPM], ids=["tiny-llama3-bpe", "tiny-llama-spm"])
def test_greedy_tokens_and_logits_match_the_numpy_backend(model, isa, engines):
    engine = engines[model]
    ids = engine.tokenizer.encode(PROMPT, add_special=True, parse_special=True)
    want_ids, want_rows = _numpy_greedy(engine, ids, STEPS)
    native = NativeModel(str(model), ctx=256, isa=isa)
    got_ids, got_rows, _ = native.greedy(ids, STEPS, head="logits")
    assert got_ids == want_ids
    bound = llama_cpp_bound(model.stem.replace("-Q4_K_M", "") + "-Q4_K_M")
    for g, w in zip(got_rows, want_rows):
        assert nmse(g, w) < bound
    fused, _, _ = native.greedy(ids, STEPS)  # the fused tail's argmax: the same tokens
    assert fused == got_ids


@needs_compiler
@pytest.mark.parametrize("isa", ISAS)
def test_chunking_never_changes_a_bit(isa, engines):
    ids = engines[TINY_BPE].tokenizer.encode(PROMPT, add_special=True, parse_special=True)
    runs = {}
    for chunk in (256, 7, 1):
        native = NativeModel(str(TINY_BPE), ctx=256, chunk=chunk, isa=isa)
        runs[chunk] = native.greedy(ids, 4, head="logits")
    for chunk in (7, 1):
        assert runs[chunk][0] == runs[256][0]
        for a, b in zip(runs[chunk][1], runs[256][1]):
            assert np.array_equal(a, b), f"chunks of {chunk} changed the logits"
