"""The CPU backend's measured decisions end to end: every strategy gives the same bits, `plan tune`
fills the store, `plan compile` takes its entries (and probes only what is missing or unusable),
`plan inspect` shows the provenance, 16 concurrent tunes leave only whole entries, the store can be off.
The decisions are the compiled kernels' task rows (plans/cpu_schedules.py) where the compiler is;
the NumPy twins' panels (plans/cpu_decisions.py) are tested alone and, in the plan compiled without a
compiler, end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from llmplan.codegen import cpu_build
from llmplan.codegen.cpu_families import matmul
from llmplan.core import numerics as num
from llmplan.core import tune_store
from llmplan.core.devices import local_cpu
from llmplan.core.plan_records import KernelCall, Launch, Phase, Weight, to_wire
from llmplan.core.planfile import read_body, read_header
from llmplan.core.tune_store import TuneStore, _invalid
from llmplan.models.model import open_model
from llmplan.plans import cpu_decisions, cpu_native, cpu_schedules
from llmplan.plans.compile import choose_cpu_kernels, compile_model, limits_for, lower_phases
from llmplan.runtime import numpy_kernels
from llmplan.runtime.engine import Engine
from llmplan.runtime.requests import Request
from llmplan.tuning import cpu_isa, probes
from llmplan.tuning import cpu_schedules as cpu_schedules_probes

from conftest import TINY_BPE, TINY_SPM, hide_cxx

FAST = ["--round-ms", "0.5", "--ctx", "64", "--chunk", "16"]  # probes in tests: correct, not meaningful timings


@pytest.fixture
def quick_probes(monkeypatch):
    monkeypatch.setattr(probes, "ROUND_SECONDS", 5e-4)


@pytest.mark.parametrize("proj", [cpu_decisions.Projection(512, (333, 40), 5), cpu_decisions.Projection(256, (1024,), 16),
                                  cpu_decisions.Projection(64, (4096,), 3), cpu_decisions.Projection(2048, (640,), 2)])
def test_every_candidate_passes_the_bit_for_bit_check(proj):
    cands = cpu_decisions.candidates(proj)
    assert cands[0] == cpu_decisions.DEFAULT and len({s.name for s in cands}) == len(cands) > 1
    v = cpu_schedules_probes.probe_panels(proj, cands, 1e-4)
    assert v.rejected == {} and set(v.medians) == {s.name for s in cands}
    assert cpu_decisions.candidates(cpu_decisions.Projection(proj.k, proj.ns, 1)) == [cpu_decisions.DEFAULT]  # one sgemv


def test_the_cpu_kernel_runs_the_launch_strategy(monkeypatch):
    seen = []
    monkeypatch.setattr(num, "matmul", lambda x, w, **how: seen.append(how) or np.zeros((len(x), len(w)), np.float32))
    x, w, out = np.ones((2, 8), np.float32), np.ones((4, 8), np.float32), np.empty((2, 4), np.float32)
    numpy_kernels.matmul("matmul", {"strategy": {"panel_bytes": 1024}}, [out], x, w)
    numpy_kernels.matmul("matmul", {}, [out], x, w)  # a plan without a strategy: numerics' default
    assert seen == [{"panel_bytes": 1024}, {}]


def _launches(plan):
    """The plan's body and every launch, in the wire form the file holds."""
    header, offset = read_header(plan)
    body = to_wire(read_body(plan, offset))
    return body, [l for p in body["phases"].values() for l in p["launches"]]


def test_tune_then_compile_takes_the_entries_without_probing(cli, tmp_path, monkeypatch):
    store = tmp_path / "store"
    code, out, _ = cli("tune", TINY_SPM, "--tune-dir", store, *FAST, "--json")
    tuned = json.loads(out)
    assert code == 0 and tuned["device_key"] == local_cpu().tune_key and tuned["store"] == str(store)
    rows = tuned["decisions"]
    n = len(rows)
    assert n > 4 and sorted(p.stem for p in store.glob("*.json")) == sorted(r["entry"] for r in rows)
    paths = cpu_native.isa_candidates()
    if len(paths) > 1:  # first the SIMD path: every one this machine runs but scalar, checked and timed
        isa, rows = rows[0], rows[1:]
        assert isa["decision"].startswith("cpu:isa:") and isa["default"] == paths[0] == cpu_build.best_isa()
        assert set(isa["medians"]) == set(paths) and not isa["rejected"] and isa["chosen"] in paths
    # every projection and the tail decide their schedule, per kernel, shape and phase rows
    default = cpu_schedules.NativeTasks(None, open_model(TINY_SPM).file, {}).default.name
    for r in rows:
        assert r["provenance"].startswith(("measured: entry ", "tie: entry ")) and r["default"] == default
        assert r["chosen"] in r["medians"] and not r["rejected"]

    def no_probe(*a):
        raise AssertionError("a compile with a filled store probed")
    monkeypatch.setattr(cpu_schedules_probes, "probe_schedules", no_probe)
    code, out, _ = cli("compile", TINY_SPM, "--tune-dir", store, "--ctx", "64", "--chunk", "16", "-o",
                       tmp_path / "t.plan", "--json")
    t = json.loads(out)["tune"]
    assert code == 0 and t["probed"] == 0 and t["measured"] + t["tie"] == t["decisions"] == n and t["heuristic"] == 0
    body, launches = _launches(tmp_path / "t.plan")
    if len(paths) > 1:
        assert body["cpu"]["isa"] == body["tune"]["decisions"][isa["decision"]]["member"] == isa["chosen"]
        assert f"SIMD path {isa['chosen']} (tuned: {isa['chosen']} " in body["cpu"]["why"]
    chosen = {r["decision"]: r["chosen"] for r in rows}
    projections = [l for l in launches if "decision" in l]
    assert len(projections) == sum(sum(r["launches"].values()) for r in rows)
    assert projections == [l for l in launches if l["family"] in ("matmul", "tail")]  # every one decides
    assert body["tune"]["device_key"] == local_cpu().tune_key
    for launch in projections:
        assert launch["member"] == chosen[launch["decision"]]
        want = [{"i32": v} for v in matmul.schedule(launch["member"])]
        assert all(k["args"][-3:] == want for k in launch["kernels"])
    code, out, _ = cli("inspect", tmp_path / "t.plan", "--json")
    assert code == 0 and json.loads(out)["tuning"]["decisions"] == body["tune"]["decisions"]
    code, out, _ = cli("inspect", tmp_path / "t.plan")
    assert code == 0 and f"tuning   {n} decisions from the tune store" in out and "measured: entry " in out


def _candidates(model) -> tuple[dict[str, list[str]], str]:
    """Every projection's decision in the model's plan (context 64, chunk 16, 2 sequences) and its
    candidates (the default first), and the build id the store keys them by (the SIMD path: below)."""
    device = local_cpu()
    phases, _, _, table = lower_phases(model, device, limits_for(model, 64, 16, 2))
    cpu, decisions, build_id = choose_cpu_kernels(model, phases, table, device, TuneStore(None))
    names = (cpu_schedules.NativeTasks(None, model.file, phases).candidates if cpu[1].kernels == "native"
             else cpu_decisions.candidates)
    return {d.key: [c.name for c in names(d.projection)] for d in decisions if d.projection}, build_id


def test_the_heuristic_prefetches_only_for_a_model_larger_than_the_cache(monkeypatch):
    """Without an entry, a model held in the last-level cache gets no prefetch (t16a0), a larger one the
    family's default distance (t16); either is the first candidate, the probes' reference. The others are
    those that run differently: prefetch distances for weights read in place, pass widths for rows16
    records with more than one activation row."""
    def shape(layout: str, rows: int) -> cpu_schedules.Shape:
        call = KernelCall("k", (1,), 1, 0, [Weight("n", "f32"), Weight("w", layout)])
        phase = Phase([Launch("matmul", "matmul", {}, [], [], [call])], [], {}, {}, [])
        return cpu_schedules.Shape("k", cpu_decisions.Projection(256, (64,), rows), phase)

    file = open_model(TINY_BPE).file
    aheads, widths = {"t16", "t16a0", "t16a1", "t16a4"}, {"t16c2", "t16c4", "t16c6"}
    for cache, want in ((file.size, "t16a0"), (file.size - 1, "t16")):
        monkeypatch.setattr(cpu_decisions, "last_level_cache", lambda: cache)
        kind = cpu_schedules.NativeTasks(None, file, {})
        assert kind.default.name == want
        for layout, rows, others in (("blocks", 1, aheads), ("blocks", 8, aheads), ("rows16", 8, widths),
                                     ("rows16", 1, set())):
            cands = [c.name for c in kind.candidates(shape(layout, rows))]
            assert cands[0] == want and sorted(cands) == sorted({want, "t8", "t32", "t64"} | others), cands


def _forced_store(path, decisions, build_id, pick) -> dict[str, str]:
    """A store whose entries choose candidate number `pick` (modulo) of every decision."""
    device, store, chosen = local_cpu(), TuneStore(path), {}
    for key, cands in decisions.items():
        s = cands[pick % len(cands)]
        medians = {c: 2e-3 for c in cands} | {s: 1e-3}
        v = tune_store.Verdict(medians, {}, cands[0], s, 1.0, False, 1, 5)
        store.save(tune_store.record(v, device.tune_key, key, build_id))
        chosen[key] = s
    return chosen


MOE = Path(__file__).parent / "data" / "tiny-qwen3moe-bpe-Q4_K_M.gguf"  # its experts' schedules decided too


@pytest.mark.parametrize("path, kernels", [(TINY_SPM, "native"), (TINY_SPM, "numpy"), (TINY_BPE, "native"),
                                           (TINY_BPE, "numpy"), (MOE, "native")])
def test_tokens_and_logits_are_identical_whatever_the_store_chose(tmp_path, path, kernels, monkeypatch):
    if kernels == "numpy":  # the plan compiled where no C++ compiler is: the NumPy twins' panels
        hide_cxx(monkeypatch)
    model = open_model(path)
    plan = tmp_path / "heuristic.plan"
    compile_model(model, local_cpu(), plan, ctx=64, chunk=16, max_seqs=2)  # no store: the heuristic
    engine = Engine.load(plan)
    prompt = engine.tokenizer.encode("Once upon a time, in a land far away, there lived", parse_special=True)
    assert len(prompt) > 16  # more than one prefill chunk
    requests = [Request(prompt, 8, keep_prompt_logits=True), Request(prompt[:5], 8)]  # the batched step too
    want = engine.run(requests)
    decisions, build_id = _candidates(model)
    for pick in range(1, max(map(len, decisions.values()))):  # every candidate of every decision at least once
        store = tmp_path / f"forced{pick}"
        chosen = _forced_store(store, decisions, build_id, pick)
        out = tmp_path / f"forced{pick}.plan"
        summary = compile_model(model, local_cpu(), out, ctx=64, chunk=16, max_seqs=2, tune=TuneStore(store))
        assert summary["tune"]["probed"] == 0
        _, launches = _launches(out)
        assert all(l["member"] == chosen[l["decision"]] for l in launches if "decision" in l)
        got = Engine.load(out).run(requests)
        assert [g.ids for g in got] == [w.ids for w in want], pick
        assert np.array_equal(got[0].prompt_logits, want[0].prompt_logits), pick


def test_tune_probes_the_experts_schedules(cli, tmp_path):
    """`plan tune` on a mixture of experts: the experts' launches run on random routing with their
    grouping scratch bound, every candidate checked bit for bit, and each decision recorded."""
    code, out, err = cli("tune", MOE, "--tune-dir", tmp_path / "store", *FAST, "--json")
    assert code == 0, err
    rows = [r for r in json.loads(out)["decisions"] if "experts" in r["decision"]]
    assert len(rows) >= 2 and all(r["provenance"].startswith(("measured: entry ", "tie: entry ")) for r in rows)
    assert all(r["chosen"] in r["medians"] and not r["rejected"] for r in rows)


TWO_PATHS = pytest.mark.skipif(not cpu_build.available() or len(cpu_native.isa_candidates()) < 2,
                               reason="no SIMD path to choose here (one besides scalar, or no compiler)")


def _simd_entry(cli, store) -> tuple[dict, Path]:
    """`plan tune` into `store`: the SIMD path's row and its entry's file."""
    code, out, _ = cli("tune", TINY_BPE, "--tune-dir", store, *FAST, "--json")
    row = json.loads(out)["decisions"][0]
    assert code == 0 and row["decision"].startswith("cpu:isa:")
    return row, TuneStore(store).path(row["entry"])


def _force(entry: Path, winner: str) -> None:
    """Make a recorded entry choose `winner` by a clear lead (a test's timings mean nothing)."""
    e = json.loads(entry.read_text())
    e |= {"medians": {n: 2e-3 for n in e["medians"]} | {winner: 1e-3}, "winner": winner, "lead": 1.0, "tie": False}
    entry.write_text(json.dumps(e))


@TWO_PATHS
def test_the_simd_path_is_measured_recorded_and_compiled_with(cli, tmp_path):
    store, default, other = tmp_path / "store", *cpu_native.isa_candidates()[:2]
    args = ["compile", TINY_BPE, "--tune-dir", store, *FAST[2:], "--json", "-o"]
    code, out, _ = cli(*args, tmp_path / "before.plan")
    cpu = json.loads(out)["cpu"]
    assert code == 0 and cpu["isa"] == default
    assert "(heuristic, the best this machine runs: no entry (plan tune measures it);" in cpu["why"]
    row, entry = _simd_entry(cli, store)
    _force(entry, other)  # not the heuristic's choice: what follows is the store's doing
    code, out, _ = cli(*args, tmp_path / "after.plan")
    s = json.loads(out)
    assert code == 0 and s["cpu"]["isa"] == other  # (its task rows are probed unless the tune chose it too)
    assert (f"SIMD path {other} (tuned: {other} measured 100% faster than {default} over a decode step "
            f"(entry {row['entry']});") in s["cpu"]["why"]
    body, _ = _launches(tmp_path / "after.plan")
    d = body["tune"]["decisions"][row["decision"]]
    assert d["member"] == other and d["provenance"].startswith(f"measured: entry {row['entry']}, lead 100%")
    assert Engine.load(tmp_path / "after.plan").executor.driver.lib.isa == other


@TWO_PATHS
def test_isa_overrides_the_stored_simd_path(cli, tmp_path):
    store, default, other = tmp_path / "store", *cpu_native.isa_candidates()[:2]
    row, entry = _simd_entry(cli, store)
    _force(entry, other)
    code, out, _ = cli("compile", TINY_BPE, "--tune-dir", store, *FAST[2:], "--isa", default, "--json", "-o",
                       tmp_path / "t.plan")
    s = json.loads(out)
    assert code == 0 and s["cpu"]["isa"] == default and f"SIMD path {default} (--isa {default};" in s["cpu"]["why"]
    body, _ = _launches(tmp_path / "t.plan")
    assert row["decision"] not in body["tune"]["decisions"]  # nothing was decided


@TWO_PATHS
def test_a_stored_simd_path_this_machine_cannot_run_is_ignored(cli, tmp_path, monkeypatch):
    store, best = tmp_path / "store", cpu_build.best_isa()
    row, entry = _simd_entry(cli, store)
    _force(entry, best)
    runs = tuple(isa for isa in cpu_build.host_isas() if isa != best)  # as in a VM that hides its best path
    monkeypatch.setattr(cpu_build, "host_isas", lambda: runs)
    code, out, _ = cli("compile", TINY_BPE, "--tune-dir", store, *FAST[2:], "--json", "-o", tmp_path / "t.plan")
    cpu = json.loads(out)["cpu"]
    assert code == 0 and cpu["isa"] == runs[-1]
    assert f"entry {row['entry']} ignored: it chose {best}, which this machine does not run" in cpu["why"]


@TWO_PATHS
def test_an_unusable_simd_path_entry_is_reported_then_replaced(cli, tmp_path):
    store = tmp_path / "store"
    row, entry = _simd_entry(cli, store)
    entry.write_text("{")
    code, out, _ = cli("compile", TINY_BPE, "--tune-dir", store, *FAST[2:], "--json", "-o", tmp_path / "t.plan")
    why = json.loads(out)["cpu"]["why"]
    assert code == 0 and f"(heuristic, the best this machine runs: entry {row['entry']} corrupt (not JSON" in why
    code, out, _ = cli("tune", TINY_BPE, "--tune-dir", store, *FAST)
    assert code == 0 and f"replaced entry {row['entry']} (corrupt (not JSON" in out


@pytest.mark.skipif(not cpu_build.available() or cpu_build.best_isa() == "scalar", reason="one SIMD path here")
def test_the_simd_path_probe_checks_agreement_within_the_kernel_bounds(tmp_path):
    """The scalar path rounds differently from the SIMD ones, launch by launch within the kernel-test
    bounds: accepted, and timed."""
    plan, best = tmp_path / "t.plan", cpu_build.best_isa()
    compile_model(open_model(TINY_BPE), local_cpu(), plan, ctx=64, chunk=16, isa=best)
    v = cpu_isa.verdict(plan, [best, "scalar"], 1e-3)
    assert v.rejected == {} and set(v.medians) == {best, "scalar"} and v.rounds == cpu_isa.ROUNDS


def test_unusable_entries_are_measured_again_and_replaced(cli, tmp_path, quick_probes, monkeypatch):
    # one SIMD path: the task rows are keyed by it, and each tune measures it again (test timings are noise)
    monkeypatch.setattr(cpu_native, "isa_candidates", lambda: [cpu_build.best_isa()])
    store_dir = tmp_path / "store"
    code, out, _ = cli("tune", TINY_SPM, "--tune-dir", store_dir, *FAST, "--json")
    rows = json.loads(out)["decisions"]
    store = TuneStore(store_dir)
    paths = [store.path(r["entry"]) for r in rows[:4]]
    paths[0].write_bytes(paths[0].read_bytes()[:40])  # truncated
    paths[1].write_bytes(b"\x00garbage\xff" * 10)
    foreign = json.loads(paths[2].read_text()) | {"device_key": "cpu:x86_64:c64:avx512_spr"}
    paths[2].write_text(json.dumps(foreign))  # copied from another machine
    other_build = json.loads(paths[3].read_text()) | {"build_id": "0123456789abcdef"}
    paths[3].write_text(json.dumps(other_build))
    code, out, _ = cli("compile", TINY_SPM, "--tune-dir", store_dir, "--ctx", "64", "--chunk", "16", "-o",
                       tmp_path / "t.plan", "--json")
    assert code == 0 and json.loads(out)["tune"]["probed"] == 4
    device = local_cpu()
    _, build_id = _candidates(open_model(TINY_SPM))
    for r in rows:
        look = store.load(device.tune_key, r["decision"], build_id)
        assert look.entry is not None, (r["decision"], look.why)
    code, out, _ = cli("tune", TINY_SPM, "--tune-dir", store_dir, *FAST)
    assert code == 0 and "replaced" not in out  # all whole again
    paths[0].write_text("{")
    code, out, _ = cli("tune", TINY_SPM, "--tune-dir", store_dir, *FAST)
    assert code == 0 and f"replaced entry {rows[0]['entry']} (corrupt (not JSON" in out


def test_store_off_writes_nothing(cli, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("LLMPLAN_TUNE_DIR", "off")
    monkeypatch.setenv("LLMPLAN_CACHE", str(tmp_path / "cache"))  # the compiled kernels' cache: not the store's
    code, out, _ = cli("compile", TINY_SPM, "-o", tmp_path / "t.plan", "--json", *FAST[2:])
    t = json.loads(out)["tune"]
    assert code == 0 and t["store"] == "off" and t["heuristic"] == t["decisions"] > 0 and t["probed"] == 0
    _, launches = _launches(tmp_path / "t.plan")
    assert {l["provenance"] for l in launches if "decision" in l} == {"heuristic: no entry (tune store off)"}
    code, out, _ = cli("tune", TINY_SPM, *FAST, "--json")  # measures, keeps nothing
    assert code == 0 and json.loads(out)["store"] == "off" and len(json.loads(out)["decisions"]) == t["decisions"]
    assert list(home.rglob("*")) == []


def test_gpu_probes_need_the_device(cli):
    for device, runtime in (("sm_90", "CUDA runtime"), ("gfx1151", "HIP runtime")):
        code, out, err = cli("tune", TINY_SPM, "--device", device)
        assert code == 2 and out == "" and err.count("\n") == 1 and runtime in err and "GPU probes" in err
    code, _, err = cli("tune", TINY_SPM, "--round-ms", "0")
    assert code == 2 and "--round-ms must be positive" in err


def test_sixteen_concurrent_tunes_leave_only_whole_entries(tmp_path):
    """16 `plan tune` processes on one store while this process reads it: every file a reader sees is a
    whole, valid entry; no temporary file is left; every process succeeds."""
    store_dir = tmp_path / "store"
    cmd = [sys.executable, "-m", "llmplan.commands.cli", "tune", str(TINY_SPM), "--tune-dir", str(store_dir), *FAST,
           "--json"]
    # BLAS's threads spin-wait for each other: 16 processes of them on a few cores would take minutes.
    # One thread each keeps this test about the store, and bounded.
    env = os.environ | {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(16)]
    reads, deadline = 0, time.monotonic() + 180
    try:
        while any(p.poll() is None for p in procs):
            assert time.monotonic() < deadline, "plan tune processes still running after 180 s"
            for path in store_dir.glob("*.json"):
                try:
                    raw = path.read_bytes()
                except FileNotFoundError:  # replaced between listing and opening: the next pass sees it
                    continue
                e = json.loads(raw)
                assert _invalid(raw, e["device_key"], e["decision_key"], e["build_id"]) == "", path
                reads += 1
            time.sleep(0.005)
        outs = [p.communicate() for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    results = [json.loads(out)["decisions"] for out, _ in outs]
    assert all(len(rows) == len(results[0]) for rows in results)
    # the task rows are measured on the SIMD path each process chose: the same entries for the same path
    by_path: dict[str, list[set[str]]] = {}
    for rows in results:
        path = rows[0]["chosen"] if rows[0]["decision"].startswith("cpu:isa:") else ""
        by_path.setdefault(path, []).append({r["entry"] for r in rows})
    assert all(ids == sets[0] and len(ids) == len(results[0]) for sets in by_path.values() for ids in sets)
    ids = set().union(*(sets[0] for sets in by_path.values()))
    assert sorted(p.stem for p in store_dir.iterdir()) == sorted(ids)  # entries only: no temporary files
    store, device = TuneStore(store_dir), local_cpu()
    build_id = json.loads(outs[0][0])["build_id"]
    assert all(store.load(device.tune_key, r["decision"], build_id).entry for r in results[0]
               if not r["decision"].startswith("cpu:isa:"))
    assert reads > 0
