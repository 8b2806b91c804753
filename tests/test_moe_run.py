"""The mixtures of experts (issue 27: a qwen3moe and a Mixtral-style llama fixture, tests/data) end to end
on the CPU target against llama.cpp's recorded rows, held as tests/test_archs_run.py holds the dense
architectures: the compiled kernels' plan over several prefill chunks and the NumPy fallback's plan, each
prompt's logits row and greedy tokens; batched decode at 4 sequences gives every sequence the tokens it
gets alone (a row's experts' results do not depend on the rows routed with it); and the plan reads only the
routed experts' rows (plan info's active bytes per token); and the GPU catalog's plans for sm_90, gfx1100
and gfx942 on the emulated GPU, in poison mode, their prefill on the grouped expert GEMM."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest

from llmplan.core.devices import OFFLINE_TARGETS, local_cpu
from llmplan.core.formats import value_bytes
from llmplan.core.plan_records import Buf, Scratch
from llmplan.core.planfile import read_body, read_header
from llmplan.models.model import open_model
from llmplan.plans.compile import compile_model
from llmplan.runtime.engine import Engine
from llmplan.runtime.requests import Request

from codegen_checks import needs_emulator
from test_arch_fixtures import DATA, MOE_NAMES
from test_archs_run import STEPS, _agrees_with_llama_cpp, _cases, _plan


@pytest.mark.parametrize("name", MOE_NAMES)
def test_the_compiled_cpu_plan_matches_llama_cpp(tmp_path_factory, name):
    plan = _plan(name, str(tmp_path_factory.getbasetemp()), "native")
    body = read_body(plan, read_header(plan)[1])
    assert body.cpu.kernels == "native"
    ops = {ln.op for ln in body.phases["decode"].launches}
    assert {"moe_router", "matmul_experts", "matmul_experts_residual"} <= ops and "moe_sum" not in ops
    _agrees_with_llama_cpp(name, Engine.load(plan), 4)


@pytest.mark.parametrize("name", MOE_NAMES)
def test_the_cpu_experts_grouping_buffers_are_planned_scratch(tmp_path_factory, name):
    """Every compiled experts launch takes its grouping buffers from the phase's arena, sized for the
    phase's bound of rows (the worst case), placed apart from every value live across it and inside the
    arena the plan sizes (plan info's figures: arena_bytes, activation_bytes)."""
    plan = _plan(name, str(tmp_path_factory.getbasetemp()), "native")
    body = read_body(plan, read_header(plan)[1])
    for phase in body.phases.values():
        live: dict[int, list[int]] = {}
        for i, launch in enumerate(phase.launches):
            for r in launch.args + launch.outs:
                if isinstance(r, Buf):
                    live.setdefault(r.index, [i, i])[1] = i
        for r in phase.outputs.values():
            if isinstance(r, Buf):
                live[r.index][1] = len(phase.launches)
        planned = 0
        for i, launch in enumerate(phase.launches):
            if not launch.op.startswith("matmul_experts"):
                continue
            (call,) = launch.kernels
            scratch = {r.name: r for r in call.args if isinstance(r, Scratch)}
            want = {"matmul_experts.groups", "matmul_experts.x"} | (
                {"matmul_experts.y"} if launch.op == "matmul_experts_residual" else set())
            assert set(scratch) == want
            x, w, ids = launch.args[:3]
            rows, top = phase.buffers[ids.index].shape
            rows = phase.dims[rows] if isinstance(rows, str) else rows  # the phase's bound: the worst case
            _, n, k = body.weights[w.name].shape
            sizes = {"matmul_experts.groups": value_bytes("i32", (rows, 4 * top + 2)),
                     "matmul_experts.x": value_bytes(phase.buffers[x.index].dtype, (rows, top * k)),
                     "matmul_experts.y": value_bytes("f32", (rows, top * n))}
            for name, r in scratch.items():
                assert r.bytes == sizes[name], (name, r.bytes, sizes[name])
                assert r.offset + r.bytes <= phase.arena_bytes
                for b, (first, last) in live.items():
                    d = phase.buffers[b]
                    if first <= i <= last:
                        assert r.offset + r.bytes <= d.offset or d.offset + d.bytes <= r.offset, (name, b)
                planned += r.bytes
        assert planned <= phase.activation_bytes


@pytest.mark.parametrize("name", MOE_NAMES)
def test_the_numpy_plan_matches_llama_cpp(tmp_path_factory, name):
    plan = _plan(name, str(tmp_path_factory.getbasetemp()), "numpy")
    assert read_body(plan, read_header(plan)[1]).cpu.kernels == "numpy"
    _agrees_with_llama_cpp(name, Engine.load(plan), 2)


@functools.cache
def _batched_plan(name: str, root: str) -> str:
    """The compiled CPU plan for 4 sequences, prefill in chunks of 16 rows (_plan's: 4, one sequence)."""
    plan = f"{root}/{name}.seqs4.plan"
    compile_model(open_model(DATA / f"{name}.gguf"), local_cpu(), plan, ctx=128, chunk=16, max_seqs=4)
    return plan


@pytest.mark.parametrize("name", MOE_NAMES)
def test_batched_decode_at_4_sequences(tmp_path_factory, name):
    """The four prompts decoded together (one decode-batch row each, their experts grouped) give each the
    tokens it gets alone, and llama.cpp's up to the first close call."""
    engine = Engine.load(_batched_plan(name, str(tmp_path_factory.getbasetemp())))
    cases, _ = _cases(name)
    steps = 16
    together = engine.run([Request(c["prompt_ids"], steps) for c in cases])
    for case, got in zip(cases, together):
        alone = engine.run([Request(case["prompt_ids"], steps)])[0]
        assert got.ids == alone.ids
        sure = next((i for i, m in enumerate(case["top1_margin"]) if m < 1.0), len(case["greedy_ids"]))
        assert got.ids[:min(sure, steps)] == case["greedy_ids"][:min(sure, steps)]


@pytest.mark.parametrize("name", MOE_NAMES)
def test_the_prefill_chunk_changes_no_bit(tmp_path_factory, name):
    """A prompt prefilled in chunks of 4 rows and of 16 (other rows routed beside each row) gives the same
    logits bit for bit, and the same tokens after."""
    root = str(tmp_path_factory.getbasetemp())
    small, large = Engine.load(_plan(name, root, "native")), Engine.load(_batched_plan(name, root))
    for case in _cases(name)[0]:
        a, b = (e.run([Request(case["prompt_ids"], 8, keep_prompt_logits=True)])[0] for e in (small, large))
        assert np.array_equal(a.prompt_logits, b.prompt_logits) and a.ids == b.ids


@pytest.mark.parametrize("name", MOE_NAMES)
def test_decode_bytes_per_token_are_the_routed_experts(cli, tmp_path_factory, name):
    """plan info and the plan say what a decode step reads: every weight but the embedding table (one row of
    it) and the experts, and n_experts_used / n_experts of each ffn_*_exps tensor; every expert's figure
    beside it."""
    code, out, _ = cli("info", DATA / f"{name}.gguf", "--json")
    d = json.loads(out)
    m = open_model(DATA / f"{name}.gguf")
    c = m.config
    experts = sum(t.nbytes for n, t in m.weights.items() if n.endswith("_exps.weight"))
    dense = sum(t.nbytes for n, t in m.weights.items() if not n.endswith("_exps.weight") and n != "token_embd.weight")
    embd_row = m.weights["token_embd.weight"].row_bytes
    assert d["decode_bytes_per_token"] == dense + experts * c.n_experts_used // c.n_experts + embd_row
    assert d["decode_bytes_per_token_every_expert"] == dense + experts + embd_row
    plan = _plan(name, str(tmp_path_factory.getbasetemp()), "native")
    assert read_body(plan, read_header(plan)[1]).decode_bytes_per_token == d["decode_bytes_per_token"]


GPU_RUNS = [(name, target) for name in MOE_NAMES for target in ("sm_90", "gfx1100", "gfx942")]


@needs_emulator
@pytest.mark.parametrize("name, target", GPU_RUNS)
def test_the_gpu_plan_on_the_emulated_gpu_matches_llama_cpp(tmp_path_factory, name, target):
    """Every vendor path (mma.sync, WMMA, wave 64) in poison mode; the routing stays on the device: the
    decode phase's launches read the router's ids from its buffers; batched decode groups the rows for
    the grouped mat-vec, a prefill chunk for the grouped GEMM."""
    plan = str(tmp_path_factory.getbasetemp() / f"{name}.{target}.plan")
    compile_model(open_model(DATA / f"{name}.gguf"), OFFLINE_TARGETS[target], plan, ctx=128, chunk=16,
                  max_seqs=4)
    phases = read_body(plan, read_header(plan)[1]).phases
    kernels = {p: {k.name for ln in phases[p].launches for k in ln.kernels} for p in phases}
    assert "lp_moe_router" in kernels["decode"] and "lp_moe_sum_residual" in kernels["decode"]
    assert any(k.startswith("lp_matmul_experts_grouped_") for k in kernels["decode-batch"])
    prefill = [k for k in kernels["prefill"] if "experts" in k]
    assert prefill and all(k.startswith("lp_gemm_experts_") for k in prefill), prefill
    _agrees_with_llama_cpp(name, Engine.load(plan, device="emu", poison=True), STEPS)
