"""Prefill's grouped expert GEMM (codegen/families/experts_gemm.py, codegen/kernels/experts.cu
lp_moe_tiles and lp_gemm_experts on gemm.cu's tiles).

- Launch records: the grouping's launches, the tile table's scratch and the fixed grid sized for the worst
  routing; the members and their heuristic order; the planner takes the grouped mat-vec for a few rows
  and the GEMM for a prefill chunk.
- Builds for every target: no spills, no stack, the matrix-core or dot-product instructions.
- Numbers on the emulator for sm_90 (mma.sync), gfx1100 (WMMA) and gfx942 (wave 64, the dot-product tile)
  against the CPU twin, ggml's way (random inputs, outputs poisoned with NaN and a guard row, fully
  written), under unbalanced routing: one expert in every row (more than a tile of rows, not a multiple of
  it), experts with no rows; and a row's bits whatever its neighbours: alone, among other rows, at another
  place in its tile, and those of the dense GEMM tile for its expert.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import numpy as np
import pytest

from llmplan.codegen.build import BuildError
from llmplan.codegen.families import experts, experts_gemm, gemm
from llmplan.codegen.kernel import Context
from llmplan.codegen.targets import TARGETS
from llmplan.core.formats import ACTIVATION_FORMAT
from llmplan.plans.select import family_module
from llmplan.runtime import numpy_kernels as twins

from codegen_checks import built, needs_emulator, rng  # noqa: F401 (rng: a fixture)
from kernel_emu import runner
from kernel_inputs import nmse, pack_activation, packed_buffer, planar_bytes, random_blocks
from launch_records import lowered, phase_buffers, wire
from test_codegen_moe import context, experts_buffers, experts_launch, num_dequantize

TIGHT = 1e-9  # the dense GEMM tile's bound (tests/test_codegen_gemm_emu.py): exact integer sums, scaled once
TESTED = ["Q4_K", "Q6_K", "Q8_0", "F16"]
MODES = {"sm_90": ("mma", 32, "mma_64x64"), "gfx1100": ("wmma", 32, "mma_64x128"), "gfx942": ("plain", 64, "dot4_64x64")}


# --- the Launch records ---------------------------------------------------------------------------------

def test_prefill_launches():
    """Group, gather, cut into tiles, one GEMM tile per block, sum: the grid fixed by the phase's bound of
    rows, the tile table's scratch beside the groups' and the gathered rows'."""
    ctx = context("sm_90", {"w": ("Q6_K", (128, 2048, 768))}, experts_buffers("q8_k", 8 * 768, 8, 2048, True), rows=64)
    group, gather, cut, project, total = experts_gemm.launches(experts_launch("matmul_experts_residual"), ctx)
    most = 512 // 64 + 128  # ceil(64 * 8 / 64) tiles of full groups + one partial tile per expert
    groups = {"scratch": "matmul_experts.groups", "dtype": "i32", "shape": ["rows", 34], "offset": 0, "bytes": 0}
    xg = {"scratch": "matmul_experts.x", "dtype": "q8_k", "shape": ["rows", 8 * 768], "offset": 0, "bytes": 0}
    tiles = {"scratch": "matmul_experts.tiles", "dtype": "i32", "shape": [1 + 3 * most], "offset": 0, "bytes": 0}
    ys = {"scratch": "matmul_experts.y", "dtype": "f32", "shape": ["rows", 8 * 2048], "offset": 0, "bytes": 0}
    assert (group.kernel.name, gather.kernel.name) == ("lp_moe_group", "lp_moe_gather_q8_k")
    assert cut.kernel.name == "lp_moe_tiles_64" and cut.grid == (1,)
    assert wire(cut.args) == [groups, tiles, {"i32": "rows"}, {"i32": 8}, {"i32": most}]
    assert project.kernel.name == "lp_gemm_experts_mma_64x128_q6_k" and project.kernel.family == "gemm_mma"
    assert project.kernel.block == 256 and project.kernel.expects == ("imma",) and project.grid == (16, most)
    assert wire(project.args) == [xg, {"weight": "w", "layout": "planar"}, groups, tiles, ys, {"i32": "rows"},
                                  {"i32": 768}, {"i32": 2048}, {"i32": 128}, {"i32": 8}]
    assert total.kernel.name == "lp_moe_sum_residual" and wire(total.args)[0] == ys


def test_members_and_their_order():
    """Matrix-core tiles first, those an expected group fills first (rows * top / experts), the mat-vec
    last; gfx942 has the dot-product tile only; a split over k is refused (a row's sums would depend on it)."""
    def order(target, rows, e):
        ctx = context(target, {"w": ("Q4_K", (e, 256, 256))}, experts_buffers("q8_k", 256, 8, 256, False), rows)
        return experts_gemm.candidates(experts_launch("matmul_experts"), ctx), ctx

    assert order("sm_90", 512, 128)[0] == ["mma_64x128", "mma_64x64", "mma_128x128", "dot4_64x64", "matvec"]
    assert order("gfx1100", 512, 8)[0] == ["mma_128x128", "mma_64x128", "mma_64x64", "dot4_64x64", "matvec"]
    assert order("gfx942", 512, 8)[0] == ["dot4_64x64", "matvec"]
    _, ctx = order("sm_90", 64, 16)
    for member, why in (("mma_64x64_k2", "would depend on the split"), ("nope", "is not one of")):
        with pytest.raises(BuildError, match=why):
            experts_gemm.launches(dataclasses.replace(experts_launch("matmul_experts"), member=member), ctx)
    _, ctx = order("gfx942", 64, 16)
    with pytest.raises(BuildError, match="CDNA3"):
        experts_gemm.launches(dataclasses.replace(experts_launch("matmul_experts"), member="mma_64x64"), ctx)
    names = [ln.kernel.name for ln in experts_gemm.launches(dataclasses.replace(experts_launch("matmul_experts"), member="matvec"), ctx)]
    assert names == ["lp_moe_group", "lp_moe_gather_q8_k", "lp_matmul_experts_grouped_q4_k"]


@pytest.mark.parametrize("rows, module", [(1, "experts"), (8, "experts"), (9, "experts_gemm"), (512, "experts_gemm")])
def test_the_planner_takes_the_gemm_for_more_rows_than_the_mat_vec_serves(rows, module):
    """As for the dense projections (plans/select.py MATVEC_MAX_ROWS): batched decode keeps the grouped
    mat-vec, a prefill chunk takes the grouped GEMM."""
    ctx = context("sm_90", {"w": ("Q4_K", (16, 256, 256))}, experts_buffers("q8_k", 256, 4, 256, False), rows)
    assert family_module(experts_launch("matmul_experts"), ctx).__name__.endswith(f".{module}")


def test_the_grid_covers_the_worst_routing():
    """most_tiles against every way of splitting a few slots over a few experts."""
    def splits(slots, parts):
        if parts == 1:
            yield (slots,)
            return
        for first in range(slots + 1):
            for rest in splits(slots - first, parts - 1):
                yield (first, *rest)

    for slots in range(12):
        for e in (1, 2, 3, 5):
            for tr in (2, 4):
                worst = max(sum(-(-c // tr) for c in counts) for counts in splits(slots, e))
                assert worst <= experts_gemm.most_tiles(slots, tr, e), (slots, e, tr)


# --- builds ---------------------------------------------------------------------------------------------

def catalog(target) -> list:
    tiles = [gemm.MEMBERS[m] for m in gemm.members(target)]
    return ([experts_gemm.kernel(m, f) for m in tiles for f in ("Q4_K", "Q6_K", "Q5_1", "IQ4_XS", "F16")]
            + [experts_gemm.tiles_kernel(tr) for tr in sorted({m.rows for m in tiles})])


@pytest.mark.parametrize("target", list(TARGETS))
def test_every_member_builds(target):
    b = built(catalog, target)  # no spills, no stack; build.gate: the instructions each kernel expects
    for k in catalog(TARGETS[target]):
        m = b.manifests[k.name]
        assert m.threads == k.block and m.shared_bytes <= 48 * 1024, k.name


# --- numbers on the emulator ------------------------------------------------------------------------------

@functools.cache
def emu(target: str):
    mode, wave, member = MODES[target]
    m = gemm.MEMBERS[member]
    kernels = ([experts.group_kernel(), experts.sum_kernel(), experts_gemm.tiles_kernel(m.rows)]
               + [experts.gather_kernel(a) for a in sorted({ACTIVATION_FORMAT[f.lower()] for f in TESTED})]
               + [experts_gemm.kernel(m, f) for f in TESTED] + [gemm.kernel(m, ("q4_k",))])
    return runner(kernels, wave, mode)


def unbalanced(rng, rows: int, top: int, e: int) -> np.ndarray:
    """Expert 0 in every row (more rows than a tile, not a multiple of it), the other slots distinct
    experts of 1 .. e - 3: the last two experts get no rows."""
    ids = np.empty((rows, top), np.int32)
    for r in range(rows):
        ids[r] = [0, *rng.choice(np.arange(1, e - 2), top - 1, replace=False)]
    return ids


class Case(NamedTuple):
    fmt: str
    x: np.ndarray  # f32 [rows, k or top * k], packed by the twins' own packing at each run
    blocks: np.ndarray  # the weight [e * n, k]
    shape: tuple[int, int, int]  # e, n, k
    ids: np.ndarray
    weights: np.ndarray
    r: np.ndarray

    def rows(self, keep) -> Case:
        """The case of rows `keep`, in that order."""
        return self._replace(x=self.x[keep], ids=self.ids[keep], weights=self.weights[keep], r=self.r[keep])


def case(rng, fmt: str, ids: np.ndarray, e: int, n: int, sliced: bool) -> Case:
    rows, top = ids.shape
    k = {"F16": 200}.get(fmt, 512 if fmt.endswith("_K") else 160)  # partial k-tiles where a format has them
    x = (rng.standard_normal((rows, top * k if sliced else k)) * rng.uniform(0.1, 3.0, (rows, 1))).astype(np.float32)
    return Case(fmt, x, random_blocks(rng, fmt, e * n, k), (e, n, k), ids, rng.random((rows, top)).astype(np.float32),
                rng.standard_normal((rows, n)).astype(np.float32))


def _poisoned(ref: dict, rows: int) -> np.ndarray:
    """A scratch range as the executor's poison mode leaves it: NaN floats and packed planes, -1 ints."""
    shape = [rows if d == "rows" else d for d in ref["shape"]]
    if ref["dtype"] == "i32":
        return np.full(shape, -1, np.int32)
    if ref["dtype"] in ("f32", "f16"):
        return np.full(shape, np.nan, {"f32": np.float32, "f16": np.float16}[ref["dtype"]])
    return packed_buffer(ref["dtype"], *shape)[0]


def project(target: str, op: str, c: Case, bound: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The family's launches for member MODES[target] on the emulator, under the phase's bound of rows
    `bound` (the case's rows by default): (output, the twin's)."""
    rows, top = c.ids.shape
    e, n, k = c.shape
    act = ACTIVATION_FORMAT[c.fmt.lower()]
    xbuf, x = pack_activation(c.x, act)
    res = op == "matmul_experts_residual"
    ctx = context(target, {"w": (c.fmt, c.shape)}, experts_buffers(act, c.x.shape[1], top, n, res), bound or rows)
    out_n = n if res else top * n
    y = np.full((rows + 1, out_n), np.nan, np.float32)  # poisoned, with a guard row
    arrays = {0: xbuf, 1: c.ids, 2: y, 3: c.weights, 4: c.r, "w": planar_bytes(c.fmt, c.blocks, e * n, k)}

    def bind(ref):
        if "scratch" in ref:
            return arrays.setdefault(ref["scratch"], _poisoned(ref, rows))
        return arrays[ref.get("weight") or ref["buf"]]

    launch = dataclasses.replace(experts_launch(op), member=MODES[target][2])
    for ln in experts_gemm.launches(launch, ctx):
        emu(target).launch(ln, bind, {"rows": rows})
    assert np.isnan(y[rows]).all(), "wrote past the output rows"
    assert not np.isnan(y[:rows]).any(), f"{np.isnan(y[:rows]).sum()} outputs left unwritten"
    assert (arrays["matmul_experts.tiles"] != -1).all(), "the tile table left partly unwritten"
    want = [np.empty((rows, out_n), np.float32)]
    twins.experts(op, {}, want, x, num_dequantize(c.blocks, c.fmt, *c.shape), c.ids,
                  *((c.weights, c.r) if res else ()))
    return y[:rows], want[0]


def dense_gemm(target: str, c: Case, expert: int) -> np.ndarray:
    """gemm.cu's dense tile (the same member) over every row of the case against one expert's weight."""
    e, n, k = c.shape
    act = ACTIVATION_FORMAT[c.fmt.lower()]
    xbuf, _ = pack_activation(c.x, act)
    rows = len(c.x)
    y = np.full((rows, n), np.nan, np.float32)
    mine = planar_bytes(c.fmt, c.blocks.reshape(e, -1)[expert], n, k)
    ctx = Context(phase_buffers([{"dtype": act, "shape": ["rows", k]}, {"dtype": "f32", "shape": ["rows", n]}]),
                  {"w": (c.fmt, (n, k))}, TARGETS[target])
    launch = lowered({"op": "matmul", "args": [{"buf": 0}, {"weight": "w"}], "outs": [{"buf": 1}],
                      "member": MODES[target][2]})
    for ln in gemm.launches(launch, ctx):
        emu(target).launch(ln, lambda ref: mine if "weight" in ref else (xbuf, y)[ref["buf"]], {"rows": rows})
    return y


@needs_emulator
@pytest.mark.parametrize("fmt", TESTED)
@pytest.mark.parametrize("target", list(MODES))
def test_grouped_gemm_matches_the_cpu_twin(target, fmt, rng):
    """70 rows x 3 slots over 8 experts: expert 0 takes 70 rows (a full tile and 6), experts 6 and 7 none;
    each row's x whole, then (K-quants) a slice per slot with the weighted sum and residual after."""
    ids = unbalanced(rng, 70, 3, 8)
    got, want = project(target, "matmul_experts", case(rng, fmt, ids, 8, 72, sliced=False))
    assert nmse(got, want) < TIGHT
    if fmt.endswith("_K"):
        got, want = project(target, "matmul_experts_residual", case(rng, fmt, ids, 8, 72, sliced=True))
        assert nmse(got, want) < TIGHT


@needs_emulator
@pytest.mark.parametrize("target", list(MODES))
def test_a_row_gets_the_same_bits_whatever_its_neighbours(target, rng):
    """The 70 rows in reverse order (each at another place in its tiles, beside other rows), rows 0 and
    69 alone (under the same bound: the same launches), and the dense GEMM tile over each expert's rows:
    the bits of the 70 rows computed together."""
    c = case(rng, "Q4_K", unbalanced(rng, 70, 3, 8), 8, 72, sliced=False)
    together, _ = project(target, "matmul_experts", c)
    backwards, _ = project(target, "matmul_experts", c.rows(np.arange(70)[::-1]))
    assert np.array_equal(backwards[::-1], together)
    for row in (0, 69):
        alone, _ = project(target, "matmul_experts", c.rows(np.array([row])), bound=70)
        assert np.array_equal(alone[0], together[row])
    n = c.shape[1]
    for expert in np.unique(c.ids):
        rows, slots = np.nonzero(c.ids == expert)
        want = dense_gemm(target, c, int(expert))[rows]
        assert np.array_equal(np.stack([together[r, j * n:(j + 1) * n] for r, j in zip(rows, slots)]), want), expert
