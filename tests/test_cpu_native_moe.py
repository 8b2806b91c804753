"""The CPU target's mixture-of-experts kernels (codegen/cpu_families/router.py and experts.py,
codegen/cpu/router.h and experts.h) against their NumPy twins (runtime/numpy_kernels.py moe_router and
experts), on every SIMD path this machine has, ggml's way: fresh random inputs, outputs poisoned with NaN
and a guard row after them, checked fully written.

The router's expert order is llama.cpp's (std::sort with ggml's comparator, which the kernel calls):
with gate logits that are exact (small integers) and equal in many places, the kernel's order must be
core/numerics.py sort_desc's port of it, bit for bit. The experts' projections are the projections' own
engines (tests/test_cpu_native_matmul.py's bound, 1e-9, for the same reason), and a row's result must not
depend on which rows share its experts: checked bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from llmplan.codegen.build import BuildError
from llmplan.codegen.cpu_families import experts, router
from llmplan.core import numerics as num
from llmplan.core.formats import ACTIVATION_FORMAT, FORMATS
from llmplan.runtime import numpy_kernels as twins

from cpu_native import ISAS, context, cxx, each_compiler, library, rng, run, weight  # noqa: F401 (cxx, rng: fixtures)
from kernel_inputs import near_tie_routing, nmse, packed_buffer
from launch_records import lowered, wire
from test_cpu_native_matmul import TIGHT, activation, k_for

TESTED = ["Q4_K", "Q6_K", "Q8_0", "Q5_0", "Q4_1", "F16"]


def catalog():
    return [router.kernel()] + [experts.kernel(f, res) for f in TESTED for res in (False, True)]


def route(isa, x, gate, top, norm=True):
    """The kernel's (ids, weights) and the twin's."""
    rows, k = x.shape
    ctx = context([{"dtype": "f32", "shape": ["rows", k]}, {"dtype": "i32", "shape": ["rows", top]},
                   {"dtype": "f32", "shape": ["rows", top]}], {"gate": ("F32", gate.shape)})
    ids = np.full((rows + 1, top), -7, np.int32)
    weights = np.full((rows + 1, top), np.nan, np.float32)
    launch = lowered({"op": "moe_router", "attrs": {"k": top, "norm": norm}, "args": [{"buf": 0}, {"weight": "gate"}],
                      "outs": [{"buf": 1}, {"buf": 2}]})
    arrays = {"buf:0": x, "weight:gate": gate, "buf:1": ids, "buf:2": weights}
    run(library(catalog, isa), router.launches(launch, ctx), arrays, {"rows": rows}, ctx.weights)
    assert (ids[rows] == -7).all() and np.isnan(weights[rows]).all(), "wrote past the rows"
    want = [np.empty((rows, top), np.int32), np.empty((rows, top), np.float32)]
    twins.moe_router("moe_router", {"k": top, "norm": norm}, want, x, gate)
    return ids[:rows], weights[:rows], want


def test_router_launch_record():
    ctx = context([{"dtype": "f32", "shape": ["rows", 256]}, {"dtype": "i32", "shape": ["rows", 4]},
                   {"dtype": "f32", "shape": ["rows", 4]}], {"g": ("F32", (16, 256))})
    (ln,) = router.launches(lowered({"op": "moe_router", "attrs": {"k": 4, "norm": True},
                                     "args": [{"buf": 0}, {"weight": "g"}], "outs": [{"buf": 1}, {"buf": 2}]}), ctx)
    assert ln.kernel.name == "lp_cpu_moe_router" and ln.grid == (1,)
    assert wire(ln.args) == [{"buf": 0}, {"weight": "g"}, {"buf": 1}, {"buf": 2}, {"i32": "rows"}, {"i32": 256},
                             {"i32": 16}, {"i32": 4}, {"i32": 1}]


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("experts_n, top", [(8, 2), (16, 4), (128, 8)])
def test_router_matches_the_twin(isa, experts_n, top, rng):
    x = rng.standard_normal((9, 96)).astype(np.float32)
    gate = (rng.standard_normal((experts_n, 96)) * 0.3).astype(np.float32)
    ids, weights, (want_ids, want_w) = route(isa, x, gate, top)
    assert np.array_equal(ids, want_ids)
    assert nmse(weights, want_w) < num.EXACT_NMSE
    _, raw, (_, want_raw) = route(isa, x, gate, top, norm=False)
    assert nmse(raw, want_raw) < num.EXACT_NMSE


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("experts_n", [16, 60, 128])
def test_router_breaks_ties_as_llama_cpp(isa, experts_n, rng):
    """Integer logits with a few distinct values: most probabilities tie, and the kernel's std::sort orders
    them as sort_desc says (past 16 experts introsort's partitions reorder equal values: not the stable
    order)."""
    top = 8
    x = rng.integers(-2, 3, (24, 32)).astype(np.float32)
    gate = rng.integers(-1, 2, (4, 32)).astype(np.float32)[rng.integers(0, 4, experts_n)]  # 4 distinct rows
    ids, weights, (want_ids, want_w) = route(isa, x, gate, top)
    assert np.array_equal(ids, want_ids)
    assert np.array_equal(weights, want_w)
    if experts_n > num.SORT_THRESHOLD:
        p = np.exp(x.astype(np.float64) @ gate.T.astype(np.float64))
        stable = np.argsort(-p, axis=1, kind="stable")[:, :top]
        assert not np.array_equal(ids, stable)


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
def test_router_softmax_is_the_twins_bit_for_bit(isa, rng):
    """Exact logits, half of them an ulp or two from a neighbour's or equal to it: the kernel's softmax is
    the twin's operation for operation (common.cuh lp_exp64, double sums in expert order), as the GPU's
    is (tests/test_codegen_moe.py), so ids and weights are the twin's bit for bit."""
    x, gate = near_tie_routing(rng, 12, 128)
    ids, weights, (want_ids, want_w) = route(isa, x, gate, 8)
    assert np.array_equal(ids, want_ids)
    assert np.array_equal(weights, want_w)


def project(isa, op, fmt, rows, rng, n=48, e=6, top=3, sliced=False, member=None, inputs=None, inplace=False):
    """Run the family's launch; returns (output, twin's output, the inputs used). Outputs are poisoned, with
    a guard row, and must be fully written."""
    k = k_for(fmt)
    width = top * k if sliced else k
    if inputs is None:
        raw, dense = weight(rng, fmt, e * n, k)
        ids = rng.integers(0, e, (rows, top)).astype(np.int32)
        wts = rng.random((rows, top)).astype(np.float32)
        r = rng.standard_normal((rows, n)).astype(np.float32)
        inputs = (activation(rng, fmt, rows, width), (raw, dense.reshape(e, n, k)), ids, wts, r)
    (xbuf, xt), (raw, dense), ids, wts, r = inputs
    res = op == "matmul_experts_residual"
    out_n = n if res else top * n
    act = ACTIVATION_FORMAT[fmt.lower()]
    specs = [{"dtype": act, "shape": ["rows", width]}, {"dtype": "i32", "shape": ["rows", top]},
             {"dtype": "f32", "shape": ["rows", out_n]}]
    args = [{"buf": 0}, {"weight": "w"}, {"buf": 1}]
    y = np.full((rows + 1, out_n), np.nan, np.float32)
    arrays = {"buf:0": xbuf, "weight:w": raw, "buf:1": ids, "buf:2": y}
    if res:
        specs += [{"dtype": "f32", "shape": ["rows", top]}, {"dtype": "f32", "shape": ["rows", n]}]
        args += [{"buf": 3}, {"buf": 4}]
        if inplace:
            y[:rows] = r
        arrays |= {"buf:3": wts, "buf:4": y if inplace else r}
    ctx = context(specs, {"w": (fmt, (e, n, k))})
    launch = lowered({"op": op, "attrs": {}, "args": args, "outs": [{"buf": 2}], "member": member})
    run(library(catalog, isa), experts.launches(launch, ctx), arrays, {"rows": rows}, ctx.weights)
    assert np.isnan(y[rows]).all(), "wrote past the output rows"
    assert not np.isnan(y[:rows]).any(), f"{np.isnan(y[:rows]).sum()} outputs left unwritten"
    want = [np.empty((rows, out_n), np.float32)]
    twins.experts(op, {}, want, xt, dense, ids, *((wts, r) if res else ()))
    return y[:rows], want[0], inputs


def test_experts_launch_record():
    ctx = context([{"dtype": "q8_k", "shape": ["rows", 4 * 512]}, {"dtype": "i32", "shape": ["rows", 4]},
                   {"dtype": "f32", "shape": ["rows", 256]}, {"dtype": "f32", "shape": ["rows", 4]},
                   {"dtype": "f32", "shape": ["rows", 256]}], {"d": ("Q6_K", (16, 256, 512))})
    launch = lowered({"op": "matmul_experts_residual", "attrs": {}, "member": "t32",
                      "args": [{"buf": 0}, {"weight": "d"}, {"buf": 1}, {"buf": 3}, {"buf": 4}], "outs": [{"buf": 2}]})
    (ln,) = experts.launches(launch, ctx)
    assert ln.kernel.name == "lp_cpu_matmul_experts_residual_q6_k_r16" and ln.kernel.source == "experts.h"
    grouping = [{"scratch": "matmul_experts.groups", "dtype": "i32", "shape": ["rows", 18]},
                {"scratch": "matmul_experts.x", "dtype": "q8_k", "shape": ["rows", 4 * 512]},
                {"scratch": "matmul_experts.y", "dtype": "f32", "shape": ["rows", 4 * 256]}]
    assert wire(ln.args) == [{"buf": 0}, {"weight": "d", "layout": "rows16"}, {"buf": 1}, {"buf": 3}, {"buf": 4},
                             {"buf": 2}, {"i32": "rows"}, {"i32": 512}, {"i32": 256}, {"i32": 16}, {"i32": 4},
                             {"i32": 1}, *(g | {"offset": 0, "bytes": 0} for g in grouping),
                             {"i32": 32}, {"i32": 2}, {"i32": 0}]


@pytest.mark.parametrize("specs, message", [
    ([{"dtype": "q8_0", "shape": ["rows", 256]}], "takes q8_k activations"),
    ([{"dtype": "q8_k", "shape": ["rows", 512]}], "neither the weight's rows of 256 nor 3 slots"),
])
def test_experts_errors(specs, message):
    ctx = context(specs + [{"dtype": "i32", "shape": ["rows", 3]}, {"dtype": "f32", "shape": ["rows", 96]}],
                  {"w": ("Q4_K", (4, 32, 256))})
    with pytest.raises(BuildError, match=message):
        experts.launches(lowered({"op": "matmul_experts", "attrs": {}, "args": [{"buf": 0}, {"weight": "w"}, {"buf": 1}],
                                  "outs": [{"buf": 2}]}), ctx)


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", TESTED)
def test_experts_match_the_twin(fmt, isa, rng):
    for rows, sliced in ((1, False), (7, True)):
        got, want, _ = project(isa, "matmul_experts", fmt, rows, rng, sliced=sliced, member="t16")
        assert nmse(got, want) < TIGHT, (rows, sliced)


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", TESTED)
def test_experts_residual_matches_the_twin(fmt, isa, rng):
    got, want, _ = project(isa, "matmul_experts_residual", fmt, 5, rng, sliced=True)
    assert nmse(got, want) < TIGHT


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
def test_experts_residual_in_place(isa, rng):
    """The residual may be the output itself: each element is read before it is written."""
    got, want, _ = project(isa, "matmul_experts_residual", "Q6_K", 4, rng, sliced=True, inplace=True)
    assert nmse(got, want) < TIGHT


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", ["Q4_K", "Q6_K", "Q8_0"])
def test_a_row_gets_the_same_bits_whichever_rows_share_its_experts(fmt, isa, rng):
    """9 rows at once (several per expert), each row alone, and another task size give the same bits, the
    weighted sum included."""
    rows = 9
    got, _, inputs = project(isa, "matmul_experts_residual", fmt, rows, rng, sliced=True, e=3, member="t8")
    other, _, _ = project(isa, "matmul_experts_residual", fmt, rows, rng, sliced=True, e=3, member="t32", inputs=inputs)
    assert np.array_equal(got, other)
    x, w, ids, wts, r = inputs
    for row in (0, 4, 8):
        alone, _, _ = project(isa, "matmul_experts_residual", fmt, 1, rng, sliced=True, e=3,
                              inputs=(_row_of(x, row, fmt, 3 * k_for(fmt)), w, ids[row:row + 1], wts[row:row + 1],
                                      r[row:row + 1]))
        assert np.array_equal(alone[0], got[row]), row


def _row_of(x, row, fmt, width):
    """Row `row` of an activation (the kernel's buffer, the twin's view) as one of its own."""
    buf, view = x
    if not isinstance(view, twins.Packed):
        one = np.ascontiguousarray(buf[row:row + 1])
        return one, one
    raw, one = packed_buffer(ACTIVATION_FORMAT[fmt.lower()], 1, width, poison=False)
    for name, plane in view.planes.items():
        one[name][0] = plane[row]
    return raw, one


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", ["Q4_K", "Q6_K", "Q8_0", "F16"])
def test_only_the_routed_experts_are_read(fmt, isa, rng):
    """Every expert no row routes to has NaN scales (F16: NaN values): the outputs stay the twin's numbers."""
    e, n, k, rows, top = 8, 48, k_for(fmt), 3, 2
    ids = np.array([[1, 5], [5, 2], [2, 1]], np.int32)
    raw, dense = weight(rng, fmt, e * n, k)
    blocks = raw.view(FORMATS[fmt].layout).reshape(e, -1)
    for unused in sorted(set(range(e)) - set(ids.ravel().tolist())):
        if fmt == "F16":
            blocks[unused] = np.full(blocks.shape[1], np.nan, np.float16).view(blocks.dtype)
        else:
            blocks[unused]["d"] = np.nan
    inputs = (activation(rng, fmt, rows, top * k), (raw, dense.reshape(e, n, k)), ids,
              rng.random((rows, top)).astype(np.float32), rng.standard_normal((rows, n)).astype(np.float32))
    got, want, _ = project(isa, "matmul_experts_residual", fmt, rows, rng, n=n, e=e, top=top, sliced=True, inputs=inputs)
    assert np.isfinite(got).all() and nmse(got, want) < TIGHT
