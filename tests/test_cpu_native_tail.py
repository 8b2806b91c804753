"""The CPU target's fused tail (codegen/cpu_families/tail.py, codegen/cpu/tail.h) against the NumPy twin
runtime/numpy_kernels.py tail_argmax, on every SIMD path this machine has: the next token of each row
among those its mask allows (kernel_inputs.random_mask: all, one, none, a tenth of the vocabulary).

The twin takes the argmax of float32 BLAS logits on the packed values, the kernel of integer dot
products: the logits agree to rounding, so the tokens agree but where two logits are within rounding of
each other. The test asserts the kernel's token is the twin's, or an allowed one whose twin logit is
within 1e-5 of the best allowed.
"""

from __future__ import annotations

import numpy as np
import pytest

from llmplan.codegen.cpu_families import tail
from llmplan.core import numerics as num
from llmplan.core.formats import ACTIVATION_FORMAT
from llmplan.runtime import numpy_kernels as ck

from cpu_native import ISAS, context, cxx, each_compiler, library, needs_compiler, rng, run, weight  # noqa: F401 (rng: a fixture)
from kernel_inputs import random_mask
from launch_records import lowered, wire

HEADS = ["Q8_0", "Q6_K", "Q4_K", "Q5_0", "F16", "IQ4_NL", "IQ4_XS"]


def catalog():
    return [tail.kernel(f, 512) for f in HEADS]


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", HEADS)
def test_tail_argmax_matches_the_twin(fmt, isa, rng):
    rows, k, vocab = 5, 512, 203  # tasks of 16 head rows, the last partial (rows16 heads: a partial record)
    x = (rng.standard_normal((rows, k)) * 3).astype(np.float32)
    norm = rng.uniform(0.5, 1.5, k).astype(np.float32)
    raw, dense = weight(rng, fmt, vocab, k)
    attrs = {"eps": 1e-6, "format": ACTIVATION_FORMAT[fmt.lower()]}
    ctx = context([{"dtype": "f32", "shape": ["rows", k]}, {"dtype": "i32", "shape": ["rows"]}],
                  {"norm": ("F32", (k,)), "head": (fmt, (vocab, k))})
    launches = tail.launches(lowered({"op": "tail_argmax", "attrs": attrs, "args": [{"buf": 0}, {"weight": "norm"},
                              {"weight": "head"}, {"state": "mask"}], "outs": [{"buf": 1}]}), ctx)
    mask = random_mask(rng, rows, vocab)
    out = np.full(rows, -1, np.int32)
    run(library(catalog, isa), launches, {"buf:0": x, "weight:norm": norm, "weight:head": raw, "state:mask": mask,
                                          "buf:1": out}, {"rows": rows}, ctx.weights)
    want = np.empty(rows, np.int32)
    ck.tail_argmax("tail_argmax", attrs, [want], x, norm, dense, mask)
    assert out[2] == want[2] == num.NO_TOKEN  # random_mask's row 2 allows nothing
    logits = num.matmul(num.packed_values(num.rmsnorm(x, norm, 1e-6), attrs["format"]), dense)
    logits = np.where(num.allowed(mask, vocab), logits, -np.inf)
    live = np.array([r for r in range(rows) if r != 2])
    best = logits[live].max(axis=1)
    got = out[live]
    assert (got >= 0).all() and (got < vocab).all()
    got_logit = logits[live, got]
    assert np.all((got == want[live]) | (got_logit >= best - 1e-5 * np.abs(best))), (out, want)
    # each row alone picks the same token
    for r in range(rows):
        one = np.full(1, -1, np.int32)
        run(library(catalog, isa), launches, {"buf:0": np.ascontiguousarray(x[r:r + 1]), "weight:norm": norm,
                                              "weight:head": raw, "state:mask": np.ascontiguousarray(mask[r:r + 1]),
                                              "buf:1": one}, {"rows": 1}, ctx.weights)
        assert one[0] == out[r]


def test_launch_record():
    ctx = context([{"dtype": "f32", "shape": ["seqs", 640]}, {"dtype": "i32", "shape": ["seqs"]}],
                  {"output_norm.weight": ("F32", (640,)), "token_embd.weight": ("Q8_0", (262144, 640))})
    (ln,) = tail.launches(lowered({"op": "tail_argmax", "attrs": {"eps": 1e-6, "format": "q8_0"}, "member": "t64a1",
                                   "args": [{"buf": 0}, {"weight": "output_norm.weight"},
                                            {"weight": "token_embd.weight"}, {"state": "mask"}],
                                   "outs": [{"buf": 1}]}), ctx)
    assert ln.kernel.name == "lp_cpu_tail_argmax_q8_0_r16"
    assert wire(ln.args) == [{"buf": 0}, {"weight": "output_norm.weight"},
                             {"weight": "token_embd.weight", "layout": "rows16"}, {"state": "mask"}, {"buf": 1},
                             {"i32": "seqs"}, {"i32": 640}, {"i32": 262144}, {"f32": 1e-6}, {"i32": 64}, {"i32": 1},
                             {"i32": 0}]
    with pytest.raises(ValueError, match="takes q8_0 activations"):
        tail.launches(lowered({"op": "tail_argmax", "attrs": {"eps": 1e-6, "format": "q8_k"},
                               "args": [{"buf": 0}, {"weight": "output_norm.weight"},
                                        {"weight": "token_embd.weight"}, {"state": "mask"}],
                               "outs": [{"buf": 1}]}), ctx)
