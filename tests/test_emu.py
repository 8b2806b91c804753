"""GPU plans run end to end on the emulated GPU (`--device emu`): the plan's own kernels for sm_90 (mma.sync
fragments), gfx1100 (WMMA) and gfx942 (wave 64) give the CPU plan's greedy tokens and, within
docs/numerics.md's bound, its prompt logits, on six models that between them have every feature the kernels
specialise on: SPM llama, GQA with rope factors, Gemma 3 (sliding window, GELU, query/key norms, tied
head), a mix of the 32-value and K-quant formats, and the IQ4_XS and IQ4_NL recipes (with their Q5_K and
Q6_K tensors). Every run is in poison mode: each launch's outputs,
scratch and K/V cells are NaN before it and must be fully written after it."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from llmplan.core.devices import OFFLINE_TARGETS, local_cpu
from llmplan.models.builder import plan_build
from llmplan.models.model import open_model
from llmplan.plans.compile import compile_model
from llmplan.runtime.engine import Engine
from llmplan.runtime.requests import Request

from codegen_checks import needs_emulator
from conftest import TINY_BPE, TINY_SPM
from kernel_inputs import nmse

pytestmark = needs_emulator

TARGETS = ("sm_90", "gfx1100", "gfx942")
STEPS = 8
PROMPTS = ["Once upon a time", "The capital of France is",
           "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"]
LOGITS_NMSE = 1e-3  # docs/numerics.md: whole-model prompt logits
# a model whose projections cover the formats the other three lack: Q2_K, Q3_K, Q5_K and Q5_0 / Q8_0
# (random blocks: there are no Q2_K / Q3_K quantizers)
MIX = {"blk.0.attn_q.weight": "Q2_K", "blk.0.attn_k.weight": "Q3_K", "blk.0.attn_v.weight": "Q5_K",
       "blk.0.attn_output.weight": "Q5_0", "blk.0.ffn_gate.weight": "Q8_0", "blk.0.ffn_up.weight": "Q5_0",
       "blk.0.ffn_down.weight": "Q3_K", "blk.1.attn_q.weight": "Q5_K", "blk.1.attn_k.weight": "Q2_K",
       "blk.1.attn_v.weight": "Q8_0", "blk.1.ffn_down.weight": "Q2_K", "output.weight": "Q5_K"}
IQ4 = {"iq4_xs": "IQ4_XS", "iq4_nl": "IQ4_NL"}  # model name -> the recipe it is made with


@pytest.fixture(scope="session")
def model(tmp_path_factory):
    """name -> GGUF path: the two fixtures, and two built once."""
    root = tmp_path_factory.mktemp("emu-models")
    made = {}

    def get(name: str) -> str:
        if name == "tiny-llama":
            return str(TINY_SPM)
        if name == "tiny-llama3":
            return str(TINY_BPE)
        if name not in made:
            path = root / f"{name}.gguf"
            if name == "tiny-gemma3":
                plan_build(path, "tiny-gemma3").write(progress=False)
            elif name in IQ4:
                plan_build(path, "tiny-llama3", IQ4[name]).write(progress=False)
            else:
                plan_build(path, "tiny-llama3", formats=MIX, weights="blocks").write(progress=False)
            made[name] = str(path)
        return made[name]

    return get


@pytest.fixture(scope="session")
def compiled(tmp_path_factory, model):
    """(model name, device name, limits...) -> plan path, compiled once per session."""
    root = tmp_path_factory.mktemp("emu-plans")

    @functools.cache
    def get(name: str, device: str, ctx: int = 512, chunk: int = 64, max_seqs: int = 3) -> str:
        out = root / f"{name}.{device}.{ctx}.{chunk}.{max_seqs}.plan"
        facts = local_cpu() if device == "cpu" else OFFLINE_TARGETS[device]
        compile_model(open_model(model(name)), facts, out, ctx=ctx, chunk=chunk, max_seqs=max_seqs)
        return str(out)

    return get


def test_the_mix_model_has_its_formats(model):
    m = open_model(model("mix"))
    assert {m.weights[n].type.name for n in MIX} == {"Q2_K", "Q3_K", "Q5_K", "Q5_0", "Q8_0"}
    for name, recipe in IQ4.items():
        assert {t.type.name for t in open_model(model(name)).weights.values()} == {recipe, "Q5_K", "Q6_K", "F32"}


def _margin(engine: Engine, ids: list[int]) -> float:
    """The gap between the two largest logits after `ids`: how near a tie the next greedy token is."""
    row = engine.run([Request(ids, 1, keep_prompt_logits=True)])[0].prompt_logits
    top = np.sort(row)[-2:]
    return float(top[1] - top[0])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-llama3", "tiny-gemma3", "mix", *IQ4])
def test_gpu_plan_on_emu_gives_the_cpu_plans_tokens(compiled, name, target):
    """The same greedy tokens for STEPS steps (or to the same end of generation) on every prompt, but
    where the CPU plan's next token is a near tie (its top two logits closer than twice the largest
    logit difference the two backends show on the prompt row), where they may part; at least two
    prompts go the whole way."""
    requests = [Request(p, STEPS, keep_prompt_logits=True) for p in PROMPTS]
    cpu_engine = Engine.load(compiled(name, "cpu"), poison=True)
    cpu = cpu_engine.run(requests)
    emu = Engine.load(compiled(name, target), device="emu", poison=True)
    got = emu.run(requests)
    assert emu.device == "emu" and max(r["decode_rows"] for r in emu.records) == len(PROMPTS)
    errors = [nmse(e.prompt_logits, c.prompt_logits) for c, e in zip(cpu, got)]
    print(f"{name} on {target}: prompt logits NMSE against the CPU plan " + ", ".join(f"{x:.2e}" for x in errors))
    whole = 0
    for c, e, err in zip(cpu, got, errors):
        assert err < LOGITS_NMSE
        same = next((k for k, (a, b) in enumerate(zip(c.ids, e.ids)) if a != b), None)
        if same is None:  # the same tokens to the end (STEPS of them, or to the end of generation)
            assert e.ids == c.ids and e.finish_reason == c.finish_reason
            whole += len(c.ids) == STEPS
        else:
            tie = 2 * float(np.abs(e.prompt_logits - c.prompt_logits).max())
            margin = _margin(cpu_engine, c.prompt_ids + c.ids[:same])
            print(f"  parts at step {same} of {c.prompt_ids[:4]}...: a near tie, margin {margin:.4f} < {tie:.4f}")
            assert margin < tie, (name, target, same, c.ids, e.ids)
    assert whole >= 2
    assert emu.pool.free_blocks == emu.pool.total


def test_poison_mode_catches_an_unwritten_output(compiled, monkeypatch):
    """A kernel that writes nothing is caught: the launch's output still holds the poison."""
    from llmplan.runtime.drivers.emu import EmuDriver
    from llmplan.runtime.executor import StepError

    engine = Engine.load(compiled("tiny-llama3", "sm_90"), device="emu", poison=True)
    real = EmuDriver.launch

    def skip_glu(self, call):
        if not call.name.startswith("lp_glu_pack"):
            real(self, call)

    monkeypatch.setattr(EmuDriver, "launch", skip_glu)
    with pytest.raises(StepError, match=r"prefill: launch glu_pack \(lp_glu_pack_silu_q8_k\) left \d+ values of output"):
        engine.run([Request(PROMPTS[0], 1)])


def test_emu_needs_a_gpu_plan(compiled, cli):
    code, _, err = cli("run", compiled("tiny-llama3", "cpu"), "-p", "hi", "--device", "emu")
    assert code == 2 and err.count("\n") == 1 and "is a CPU plan: the emulated GPU runs GPU plans" in err


def test_plan_run_device_emu(compiled, cli):
    """`plan run G.plan --device emu` and `plan run MODEL.gguf --device emu --target` give plan run's
    tokens on the CPU plan."""
    args = ("-p", PROMPTS[1], "-n", "4", "--json")
    code, out, _ = cli("run", compiled("tiny-llama3", "cpu"), *args)
    import json
    want = json.loads(out)["ids"]
    code, out, err = cli("run", compiled("tiny-llama3", "gfx942"), "--device", "emu", *args)
    assert code == 0 and json.loads(out)["ids"] == want, err
    code, out, err = cli("run", TINY_BPE, "--device", "emu", "--target", "gfx1100", "--ctx", "512", *args)
    assert code == 0 and json.loads(out)["ids"] == want, err
    code, _, err = cli("run", TINY_BPE, "--device", "emu", "--target", "sm_99", *args)
    assert code == 2 and "--target sm_99: not a GPU target" in err
