"""GPU probes (tuning/gpu_members.py) on the emulated GPU: the decisions of a
GPU plan, every member checked against the default's output (one that writes nothing is rejected),
timed in interleaved rounds, recorded in the tune store under the key and build id the planner
consults, so the next compile takes them. The timings mean nothing here; on a GPU it is
`plan tune --device cuda`, which scripts/device-check runs on the gemma3-270m preset."""

from __future__ import annotations

import dataclasses

from llmplan.core.devices import OFFLINE_TARGETS
from llmplan.core.plan_records import to_wire
from llmplan.core.planfile import read_body, read_header
from llmplan.core.tune_store import TuneStore
from llmplan.models.model import open_model
from llmplan.plans.compile import cache_descriptor, compile_model, limits_for, lower_phases
from llmplan.runtime.drivers.emu import EmuDriver
from llmplan.tuning import gpu_members
from llmplan.tuning.gpu_members import ProbeRunner

from codegen_checks import needs_emulator
from conftest import TINY_BPE
from test_arch_fixtures import DATA

pytestmark = needs_emulator


def test_gpu_probes_fill_the_store_the_planner_reads(tmp_path):
    model, device = open_model(TINY_BPE), OFFLINE_TARGETS["sm_90"]
    limits = limits_for(model, 256, 16, 2)  # prefill chunks of 16 rows: the GEMM tiles, quick enough to emulate
    phases, _, _, table = lower_phases(model, device, limits)
    found, built = gpu_members.decisions(phases, table, device)
    assert found and all(len(d.candidates) > 1 for d in found)
    cheap = [d for d in found if d.key.startswith("gemm:")][:2]
    assert cheap, [d.key for d in found]
    runner = ProbeRunner(EmuDriver(), device, model.file, table, built, found, cache_descriptor(model))
    store = TuneStore(tmp_path / "tune")
    for d in cheap:
        v = runner.verdict(d, round_seconds=0.001)
        assert v.rejected == {} and set(v.medians) == set(d.candidates) and v.default == next(iter(d.candidates))
        gpu_members.keep(d, v, device, store)
    idle = dataclasses.replace(cheap[0], candidates={**cheap[0].candidates, "nothing": []})
    assert "NMSE" in runner.verdict(idle, round_seconds=0.001).rejected["nothing"]

    plan = tmp_path / "p.plan"
    compile_model(model, device, plan, ctx=256, chunk=16, max_seqs=2, tune=store)
    header, offset = read_header(plan)
    launches = [l for p in to_wire(read_body(plan, offset))["phases"].values() for l in p["launches"]]
    for d in cheap:
        taken = [l for l in launches if l.get("decision") == d.key]
        assert taken and all(l["member"] == d.verdict.winner and l["provenance"] == d.provenance for l in taken), d.key
        assert d.provenance.startswith(("measured: entry", "tie: entry"))


def test_the_expert_gemm_is_a_decision_like_the_others(tmp_path):
    """A mixture of experts' prefill projections: the grouped GEMM's tiles and the grouped mat-vec are one
    decision's members, probed and recorded like the dense ones, and the next compile takes the winner."""
    model, device = open_model(DATA / "tiny-qwen3moe-bpe-Q4_K_M.gguf"), OFFLINE_TARGETS["sm_90"]
    phases, _, _, table = lower_phases(model, device, limits_for(model, 128, 16, 2))
    found, built = gpu_members.decisions(phases, table, device)
    d = next(d for d in found if d.key.startswith("experts_gemm:matmul_experts_residual"))
    assert list(d.candidates) == ["mma_64x128", "mma_64x64", "mma_128x128", "dot4_64x64", "matvec"]
    d = dataclasses.replace(d, candidates={m: d.candidates[m] for m in ("mma_64x128", "matvec")})  # emulation is slow
    v = ProbeRunner(EmuDriver(), device, model.file, table, built, [d], cache_descriptor(model)).verdict(d, round_seconds=0.001)
    assert v.rejected == {} and set(v.medians) == set(d.candidates)
    store = TuneStore(tmp_path / "tune")
    gpu_members.keep(d, v, device, store)
    plan = tmp_path / "p.plan"
    compile_model(model, device, plan, ctx=128, chunk=16, max_seqs=2, tune=store)
    launches = to_wire(read_body(plan, read_header(plan)[1]))["phases"]["prefill"]["launches"]
    taken = [ln for ln in launches if ln.get("decision") == d.key]
    assert taken and all(ln["member"] == d.verdict.winner for ln in taken)


def test_the_attention_members_are_probed_on_a_full_context(tmp_path):
    """The prefill attention's members (flash, rows) read the K/V cache and the step state: the probe
    gives them a random cache and a step of whole contexts' last rows on pages of their own, and both
    give the same outputs there."""
    model, device = open_model(TINY_BPE), OFFLINE_TARGETS["sm_90"]
    phases, _, _, table = lower_phases(model, device, limits_for(model, 256, 16, 2))
    found, built = gpu_members.decisions(phases, table, device)
    d = next(d for d in found if d.key.startswith("attention_prefill:"))
    step = gpu_members.probe_step(d.state, d.dims)
    assert step["seq"].tolist() == [0] * 8 + [1] * 8 and step["pos"].tolist() == list(range(248, 256)) * 2
    assert step["last"].tolist() == [7, 15] and len(set(step["pages"].ravel())) == step["pages"].size
    v = ProbeRunner(EmuDriver(), device, model.file, table, built, [d], cache_descriptor(model)).verdict(
        d, round_seconds=0.001)
    assert v.rejected == {} and set(v.medians) == {"flash", "rows"}
