"""The GPU catalog's mixture-of-experts families (codegen/families/router.py and experts.py,
codegen/kernels/router.cu and experts.cu).

- Launch records: names, grids, argument order, the scratch the residual variant shares between its two
  launches; the expert ids are a buffer argument, so the launches never depend on the routing.
- Builds for every target: no spills, no stack frame (the router's sort keeps its stack in shared memory).
- Numbers on the emulator (wave 32 and 64) against the CPU twins, ggml's way (random inputs, outputs
  poisoned with a guard row, fully written): the router's ids equal the twin's, ties included (integer
  logits: its sort is libstdc++'s std::sort step for step, as core/numerics.py sort_desc is); its softmax
  is the twin's operation for operation (common.cuh lp_exp64, double sums in expert order), so where the
  logits are exact its ids and weights equal the twin's bit for bit, near ties included, on every
  target's wave width (the emulator runs sm_90's and gfx1100's code alike at wave 32, gfx942's at 64;
  the builds above compile it with nvcc and clang); the projections within the mat-vec's
  bound (1e-9: only the order of float sums differs); and unrouted experts poisoned with NaN scales leave
  every output a number: a step reads the routed experts' rows only.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from llmplan.codegen import operands
from llmplan.codegen.build import BuildError
from llmplan.codegen.families import experts, router
from llmplan.codegen.kernel import Context
from llmplan.codegen.targets import TARGETS
from llmplan.core import numerics as num
from llmplan.core.formats import ACTIVATION_FORMAT, FORMATS
from llmplan.runtime import numpy_kernels as twins

from codegen_checks import built, needs_emulator, rng  # noqa: F401 (rng: a fixture)
from kernel_emu import runner
from kernel_inputs import near_tie_routing, nmse, packed_buffer, planar_bytes, random_activation, random_blocks
from launch_records import lowered, phase_buffers, wire

TIGHT = 1e-9
TESTED = ["Q4_K", "Q6_K", "Q8_0", "Q5_0", "F16"]


def context(target, weights: dict, buffers: list, rows: int = 1) -> Context:
    """A family's context; `rows` bounds the phase's rows (1: decode)."""
    return Context(phase_buffers(buffers), weights, TARGETS[target], {"rows": rows})


def router_launch():
    return lowered({"op": "moe_router", "attrs": {"k": 8, "norm": True}, "args": [{"buf": 0}, {"weight": "g"}],
                    "outs": [{"buf": 1}, {"buf": 2}]})


def router_buffers(k, top):
    return [{"dtype": "f32", "shape": ["rows", k]}, {"dtype": "i32", "shape": ["rows", top]},
            {"dtype": "f32", "shape": ["rows", top]}]


def experts_launch(op):
    args = [{"buf": 0}, {"weight": "w"}, {"buf": 1}] + ([{"buf": 3}, {"buf": 4}] if op.endswith("residual") else [])
    return lowered({"op": op, "attrs": {}, "args": args, "outs": [{"buf": 2}]})


def experts_buffers(act, width, top, n, residual):
    return ([{"dtype": act, "shape": ["rows", width]}, {"dtype": "i32", "shape": ["rows", top]},
             {"dtype": "f32", "shape": ["rows", n if residual else top * n]}]
            + ([{"dtype": "f32", "shape": ["rows", top]}, {"dtype": "f32", "shape": ["rows", n]}] if residual else []))


# --- the Launch records ---------------------------------------------------------------------------------

def test_router_launch():
    (ln,) = router.launches(router_launch(), context("sm_90", {"g": ("F32", (128, 2048))}, router_buffers(2048, 8)))
    assert ln.kernel.name == "lp_moe_router" and ln.kernel.source == "router.cu" and ln.kernel.block == 64
    assert ln.grid == (("rows", 1),)
    assert wire(ln.args) == [{"buf": 0}, {"weight": "g"}, {"buf": 1}, {"buf": 2}, {"i32": "rows"}, {"i32": 2048},
                             {"i32": 128}, {"i32": 8}, {"i32": 1}]


def test_router_refuses_more_experts_than_its_arrays():
    ctx = context("sm_90", {"g": ("F32", (2048, 64))}, router_buffers(64, 8))
    with pytest.raises(BuildError, match="2048 experts; the kernel routes up to 1024"):
        router.launches(router_launch(), ctx)


def test_experts_launch():
    ctx = context("gfx942", {"w": ("Q4_K", (128, 768, 2048))}, experts_buffers("q8_k", 2048, 8, 768, False))
    (ln,) = experts.launches(experts_launch("matmul_experts"), ctx)
    assert ln.kernel.name == "lp_matmul_experts_q4_k" and ln.kernel.block == 4 * 64
    assert ln.kernel.expects == ("dot4", "load128")
    assert ln.grid == (8 * 192, ("rows", 1))
    assert wire(ln.args) == [{"buf": 0}, {"weight": "w", "layout": "planar"}, {"buf": 1}, {"buf": 2}, {"i32": "rows"},
                             {"i32": 2048}, {"i32": 768}, {"i32": 128}, {"i32": 8}, {"i32": 0}]


def test_experts_residual_launches_share_a_scratch():
    ctx = context("sm_90", {"w": ("Q6_K", (128, 2048, 768))}, experts_buffers("q8_k", 8 * 768, 8, 2048, True))
    project, total = experts.launches(experts_launch("matmul_experts_residual"), ctx)
    ys = {"scratch": "matmul_experts.y", "dtype": "f32", "shape": ["rows", 8 * 2048], "offset": 0, "bytes": 0}
    assert project.kernel.name == "lp_matmul_experts_q6_k" and project.grid == (8 * 512, ("rows", 1))
    assert wire(project.args) == [{"buf": 0}, {"weight": "w", "layout": "planar"}, {"buf": 1}, ys, {"i32": "rows"},
                                  {"i32": 768}, {"i32": 2048}, {"i32": 128}, {"i32": 8}, {"i32": 1}]
    assert total.kernel.name == "lp_moe_sum_residual" and total.grid == (8, ("rows", 1))
    assert wire(total.args) == [ys, {"buf": 3}, {"buf": 4}, {"buf": 2}, {"i32": 2048}, {"i32": 8}]


def test_batched_rows_are_grouped_by_expert_on_the_device():
    """More than one row (decode-batch, prefill): the slots grouped by expert, their activation rows
    gathered in group order, one pass over an expert's rows for up to 8 of them; scratch for the groups
    and the gathered rows, the launches fixed whatever the routing."""
    ctx = context("gfx1100", {"w": ("Q4_K", (128, 768, 2048))}, experts_buffers("q8_k", 2048, 8, 768, False), rows=4)
    group, gather, project = experts.launches(experts_launch("matmul_experts"), ctx)
    groups = {"scratch": "matmul_experts.groups", "dtype": "i32", "shape": ["rows", 34], "offset": 0, "bytes": 0}
    xg = {"scratch": "matmul_experts.x", "dtype": "q8_k", "shape": ["rows", 8 * 2048], "offset": 0, "bytes": 0}
    assert group.kernel.name == "lp_moe_group" and group.grid == (1,)
    assert wire(group.args) == [{"buf": 1}, groups, {"i32": "rows"}, {"i32": 128}, {"i32": 8}]
    assert gather.kernel.name == "lp_moe_gather_q8_k" and gather.grid == (8, ("rows", 1))
    assert wire(gather.args) == [{"buf": 0}, groups, xg, {"i32": "rows"}, {"i32": 2048}, {"i32": 8}, {"i32": 0}]
    assert project.kernel.name == "lp_matmul_experts_grouped_q4_k" and project.grid == (8 * 192, ("rows", 1))
    assert wire(project.args) == [xg, {"weight": "w", "layout": "planar"}, groups, {"buf": 2}, {"i32": "rows"},
                                  {"i32": 2048}, {"i32": 768}, {"i32": 128}, {"i32": 8}]


@pytest.mark.parametrize("fmt, k, act, message", [
    ("BF16", 256, "bf16", "the kernels read"),
    ("F16", 100, "f16", "has rows of 100, not a multiple of 8"),  # the mat-vec reads 8 values a lane
    ("Q4_K", 256, "q8_0", "takes q8_k activations"),
])
def test_experts_errors(fmt, k, act, message):
    ctx = context("sm_90", {"w": (fmt, (4, 32, k))}, experts_buffers(act, k, 2, 32, False))
    with pytest.raises(BuildError, match=message):
        experts.launches(experts_launch("matmul_experts"), ctx)


# --- builds ---------------------------------------------------------------------------------------------

def catalog(target) -> list:
    return ([router.kernel(), experts.sum_kernel(), experts.group_kernel()]
            + [experts.gather_kernel(a) for a in ("q8_0", "q8_1", "q8_k", "f16")]
            + [k(f, target) for f in experts.FORMATS for k in (experts.kernel, experts.grouped_kernel)])


@pytest.mark.parametrize("target", list(TARGETS))
def test_every_kernel_builds(target):
    t = TARGETS[target]
    b = built(catalog, target)  # no spills, no stack
    for k in catalog(t):
        m = b.manifests[k.name]
        assert m.threads == k.block, k.name
        if k.name.startswith("lp_matmul_experts"):  # the mat-vec's loads, no shared memory
            assert m.shared_bytes == 0 and m.instructions["load128"] > 0, k.name


# --- numbers on the emulator ------------------------------------------------------------------------------

WAVES = [32, 64]


@functools.cache
def emu(wave: int):
    t = TARGETS["gfx942" if wave == 64 else "sm_90"]
    return runner(catalog(t), wave), t


def run(wave, launches, arrays, dims):
    e, _ = emu(wave)
    for ln in launches:
        e.launch(ln, lambda ref: arrays[ref.get("scratch") or ref.get("weight") or ref["buf"]], dims)


def route(wave, x, gate, top):
    rows, k = x.shape
    ids = np.full((rows + 1, top), -7, np.int32)
    weights = np.full((rows + 1, top), np.nan, np.float32)
    ctx = context("sm_90", {"g": ("F32", gate.shape)}, router_buffers(k, top))
    launch = lowered({"op": "moe_router", "attrs": {"k": top, "norm": True}, "args": [{"buf": 0}, {"weight": "g"}],
                      "outs": [{"buf": 1}, {"buf": 2}]})
    run(wave, router.launches(launch, ctx), {0: x, "g": gate, 1: ids, 2: weights}, {"rows": rows})
    assert (ids[rows] == -7).all() and np.isnan(weights[rows]).all(), "wrote past the rows"
    want = [np.empty((rows, top), np.int32), np.empty((rows, top), np.float32)]
    twins.moe_router("moe_router", {"k": top, "norm": True}, want, x, gate)
    return ids[:rows], weights[:rows], want


@needs_emulator
@pytest.mark.parametrize("wave", WAVES)
@pytest.mark.parametrize("n_experts, top", [(8, 2), (128, 8)])
def test_router_matches_the_cpu_twin(wave, n_experts, top, rng):
    x = rng.standard_normal((5, 96)).astype(np.float32)
    gate = (rng.standard_normal((n_experts, 96)) * 0.3).astype(np.float32)
    ids, weights, (want_ids, want_w) = route(wave, x, gate, top)
    assert np.array_equal(ids, want_ids)
    assert nmse(weights, want_w) < num.EXACT_NMSE


@needs_emulator
@pytest.mark.parametrize("target", ["sm_90", "gfx1100", "gfx942"])
@pytest.mark.parametrize("n_experts, top", [(128, 8), (60, 4)])
def test_router_softmax_is_the_twins_bit_for_bit(target, n_experts, top, rng):
    """Logits every order sums exactly, half of them an ulp or two from a neighbour's or equal to it: the
    same experts in the same order, and the same weights, bit for bit."""
    x, gate = near_tie_routing(rng, 12, n_experts)
    ids, weights, (want_ids, want_w) = route(TARGETS[target].wave, x, gate, top)
    assert np.array_equal(ids, want_ids)
    assert np.array_equal(weights, want_w)


@needs_emulator
@pytest.mark.parametrize("n_experts", [16, 60, 128])
def test_router_breaks_ties_as_llama_cpp(n_experts, rng):
    """Integer logits with a few distinct values: the kernel's port of std::sort orders the many equal
    probabilities as sort_desc (held to std::sort itself by tests/test_cpu_native_moe.py)."""
    x = rng.integers(-2, 3, (12, 32)).astype(np.float32)
    gate = rng.integers(-1, 2, (4, 32)).astype(np.float32)[rng.integers(0, 4, n_experts)]
    ids, _, (want_ids, _) = route(32, x, gate, 8)
    assert np.array_equal(ids, want_ids)


def project(wave, op, fmt, rows, rng, e=6, n=20, top=3, sliced=False, poison_unrouted=False, inputs=None):
    """Run the family's launches on the emulator and the CPU twin; returns (output, twin output, the inputs:
    (activation buffer and twin view, weight blocks and dense values, ids, weights, residual))."""
    t = emu(wave)[1]
    k = 256 * 3 if fmt.endswith("_K") else 32 * 9
    act = ACTIVATION_FORMAT[fmt.lower()]
    width = top * k if sliced else k
    if inputs is None:
        ids = rng.integers(0, e // 2 if poison_unrouted else e, (rows, top)).astype(np.int32)
        blocks = random_blocks(rng, fmt, e * n, k)
        dense = num_dequantize(blocks, fmt, e, n, k)
        if poison_unrouted:  # every expert no slot routes to: NaN scales (F16: NaN values)
            per = blocks.reshape(e, -1)
            for unused in sorted(set(range(e)) - set(ids.ravel().tolist())):
                if fmt == "F16":
                    per[unused] = np.full(per.shape[1], np.nan, np.float16).view(per.dtype)
                else:
                    per[unused]["d"] = np.nan
        inputs = (random_activation(rng, act, rows, width), (blocks, dense), ids,
                  rng.random((rows, top)).astype(np.float32), rng.standard_normal((rows, n)).astype(np.float32))
    (xbuf, x), (blocks, dense), ids, wts, r = inputs
    res = op == "matmul_experts_residual"
    out_n = n if res else top * n
    y = np.full((rows + 1, out_n), np.nan, np.float32)
    ctx = context(t.name, {"w": (fmt, (e, n, k))}, experts_buffers(act, width, top, n, res), rows)
    gathered = (np.full((rows, top * k), np.nan, np.float16) if act == "f16" else packed_buffer(act, rows, top * k)[0])
    scratch = {"matmul_experts.y": np.full((rows, top * n), np.nan, np.float32),
               "matmul_experts.groups": np.full((rows, operands.group_ints(top)), -9, np.int32),
               "matmul_experts.x": gathered}
    arrays = {0: xbuf, 1: ids, 2: y, 3: wts, 4: r, "w": planar_bytes(fmt, blocks, e * n, k)} | scratch
    run(wave, experts.launches(experts_launch(op), ctx), arrays, {"rows": rows})
    assert np.isnan(y[rows]).all(), "wrote past the output rows"
    assert not np.isnan(y[:rows]).any(), f"{np.isnan(y[:rows]).sum()} outputs left unwritten"
    want = [np.empty((rows, out_n), np.float32)]
    twins.experts(op, {}, want, x, dense, ids, *((wts, r) if res else ()))
    return y[:rows], want[0], inputs


def _row_of(inputs, row, fmt, width):
    """The inputs of row `row` alone."""
    (buf, view), w, ids, wts, r = inputs
    one = slice(row, row + 1)
    if isinstance(view, twins.Packed):
        raw, alone = packed_buffer(ACTIVATION_FORMAT[fmt.lower()], 1, width, poison=False)
        for name, plane in view.planes.items():
            alone[name][0] = plane[row]
        x = (raw, alone)
    else:
        x = (np.ascontiguousarray(buf[one]), np.ascontiguousarray(buf[one]))
    return x, w, ids[one], wts[one], r[one]


def num_dequantize(blocks, fmt, e, n, k):
    from llmplan.core.formats import dequantize

    return dequantize(np.ascontiguousarray(blocks).view(np.uint8).reshape(-1), FORMATS[fmt], (e * n, k)).reshape(e, n, k)


@needs_emulator
@pytest.mark.parametrize("wave", WAVES)
@pytest.mark.parametrize("fmt", TESTED)
def test_experts_match_the_cpu_twin(wave, fmt, rng):
    """One row (a slot a pass), and 4 and 11 grouped by expert (11 x 3 slots of 3 experts: groups longer
    than one pass of 8)."""
    for rows, sliced, e in ((1, False, 6), (4, True, 6), (11, False, 3)):
        got, want, _ = project(wave, "matmul_experts", fmt, rows, rng, e=e, sliced=sliced)
        assert nmse(got, want) < TIGHT, (rows, sliced)


@needs_emulator
@pytest.mark.parametrize("fmt", ["Q4_K", "Q8_0", "F16"])
def test_a_row_gets_the_same_bits_grouped_or_alone(fmt, rng):
    """A row's slots computed with the rows sharing their experts (grouped, the weighted sum included) and
    alone (one slot a pass): the same bits."""
    k = 256 * 3 if fmt.endswith("_K") else 32 * 9
    together, _, inputs = project(32, "matmul_experts_residual", fmt, 6, rng, e=3, sliced=True)
    for row in (0, 5):
        alone, _, _ = project(32, "matmul_experts_residual", fmt, 1, rng, e=3, sliced=True,
                              inputs=_row_of(inputs, row, fmt, 3 * k))
        assert np.array_equal(alone[0], together[row])


@needs_emulator
@pytest.mark.parametrize("wave", WAVES)
@pytest.mark.parametrize("fmt", ["Q4_K", "Q6_K"])
def test_experts_residual_matches_the_cpu_twin(wave, fmt, rng):
    got, want, _ = project(wave, "matmul_experts_residual", fmt, 3, rng, sliced=True)
    assert nmse(got, want) < TIGHT


@needs_emulator
@pytest.mark.parametrize("fmt", ["Q4_K", "Q8_0", "F16"])
def test_only_the_routed_experts_are_read(fmt, rng):
    got, want, _ = project(32, "matmul_experts_residual", fmt, 2, rng, e=8, top=2, sliced=True, poison_unrouted=True)
    assert np.isfinite(got).all() and nmse(got, want) < TIGHT
