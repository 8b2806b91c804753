"""The engine on the emulated GPU: scheduling (chunked prefill across sequences past one attention split,
batched decode at every width, preemption and recompute) changes no token; replayed decode buckets and
pipelined decode give the direct, unpipelined tokens; and launch by launch, each GPU kernel fed exactly
the CPU plan's inputs lands within docs/numerics.md's bound of its NumPy twin."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmplan.core.formats import ACTIVATION_FORMATS, planes
from llmplan.core.plan_records import Buf, Cache
from llmplan.runtime.drivers.host import typed
from llmplan.runtime.engine import Engine
from llmplan.runtime.requests import Request

from codegen_checks import needs_emulator
from conftest import TINY_BPE, cpu_and_gpu_plans
from kernel_inputs import nmse

pytestmark = needs_emulator

STORY = ("Once upon a time, in a land far away, there lived an old clockmaker who built a clock that ran "
         "backwards. Every morning the children of the village gathered to watch its hands, and every evening "
         "their parents argued about what it meant. ") * 8
EXACT, ORDER = 1e-7, 5e-4  # docs/numerics.md: exact-arithmetic kernels; accumulation-order-sensitive ones
ORDER_SENSITIVE = {"matmul", "attention_prefill", "attention_decode", "tail"}


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    return cpu_and_gpu_plans(tmp_path_factory.mktemp("emu-engine"), TINY_BPE, ctx=512, chunk=128, max_seqs=4)


def test_scheduling_on_emu_changes_no_token(plans):
    """Two prompts past 256 positions (prefilled in chunks shared across them, decoded over two attention
    splits) and a short one, together and through a pool that forces a preemption: each request gets
    the tokens it gets alone. The long ones fill 17 blocks less one position, so each needs an 18th in
    its second decode step; a pool of 36 admits all three with one block to spare, and the second long
    one's new block preempts the short one (the newest), which is recomputed."""
    alone_engine = Engine.load(plans["sm_90"], device="emu", max_seqs=1)
    long_a = alone_engine.tokenizer.encode("A. " + STORY)[:271]
    long_b = alone_engine.tokenizer.encode("B. " + STORY)[:271]
    requests = [Request(long_a, 6), Request(long_b, 4), Request("The capital of France is", 8)]
    alone = [alone_engine.run([r])[0].ids for r in requests]
    together = Engine.load(plans["sm_90"], device="emu")
    assert [r.ids for r in together.run(requests)] == alone
    assert max(r["prefill_seqs"] for r in together.records) > 1  # a chunk shared by two sequences
    assert max(r["prefill_rows"] for r in together.records) == 128  # chunks of the plan's size
    # the newest sequence is preempted for the second long one's block, then recomputed
    tight = Engine.load(plans["sm_90"], device="emu", kv_blocks=36)
    got = tight.run(requests)
    assert [r.ids for r in got] == alone
    assert sum(len(r["preempted"]) for r in tight.records) > 0
    assert tight.pool.free_blocks == tight.pool.total
    assert alone == [r.ids for r in Engine.load(plans["cpu"]).run(requests)]  # and the CPU plan's tokens


@pytest.mark.parametrize("device", ["cpu", "emu"])
def test_replay_and_pipelining_change_no_token(plans, device):
    """Batched decode at widths 4, 3, 2 and 1 (the requests end one after another), direct or replayed,
    pipelined or not: the tokens each request gets alone."""
    plan = plans["cpu" if device == "cpu" else "sm_90"]
    prompts = ["Once upon a time", "The capital of France is", "1 2 3 4 5 6 7 8", "Hello"]
    alone = Engine.load(plan, device=device, max_seqs=1, replay=False)
    runs = {"alone": [alone.run([Request(p, 6 + i)])[0].ids for i, p in enumerate(prompts)]}
    for pipelined in (False, True):
        for replay in (False, True):
            engine = Engine.load(plan, device=device, pipelined=pipelined, replay=replay)
            runs[pipelined, replay] = [r.ids for r in engine.run([Request(p, 6 + i) for i, p in enumerate(prompts)])]
            replayed = sum(b.steps for b in engine.executor.buckets.values())
            assert (replayed > 0) == replay, engine.executor.buckets
            assert any(r["pipelined"] for r in engine.records) == pipelined
            assert {r["decode_rows"] for r in engine.records} >= {1, 2, 3, 4}
            assert engine.pool.free_blocks == engine.pool.total
    assert all(ids == runs["alone"] for ids in runs.values()), runs


def test_pipelined_decode_stops_at_the_right_token(plans, monkeypatch):
    """EOS, a stop string and max_tokens end a pipelined request at the token the unpipelined engine
    ends it at; the extra row computed for the step after it is dropped."""
    plain = Engine.load(plans["cpu"], pipelined=False)
    free = plain.run([Request("Once upon a time", 12)])[0].ids
    eos, stop_at = free[5], plain.tokenizer.decode(free[3:4])
    assert stop_at.strip(), "the test needs a token with text"

    def runs(engine):
        monkeypatch.setattr(engine.tokenizer, "is_eog", lambda t: t == eos)
        return engine.run([Request("Once upon a time", 12), Request("Once upon a time", 12, stop=(stop_at,)),
                           Request("Once upon a time", 2)])

    want = runs(Engine.load(plans["cpu"], pipelined=False))
    pipelined = Engine.load(plans["cpu"], pipelined=True)
    got = runs(pipelined)
    assert [(r.ids, r.text, r.finish_reason) for r in got] == [(r.ids, r.text, r.finish_reason) for r in want]
    assert want[0].ids == free[:6] and want[0].finish_reason == "stop" and want[2].finish_reason == "length"
    assert any(r["pipelined"] for r in pipelined.records) and pipelined.pool.free_blocks == pipelined.pool.total


def _values(region, data: np.ndarray) -> np.ndarray:
    """A region's values as float64: packed activations dequantized, else as stored."""
    if region.dtype.upper() in ACTIVATION_FORMATS:
        fmt = ACTIVATION_FORMATS[region.dtype.upper()]
        ps, _ = planes(fmt, math.prod(region.shape[:-1]), region.shape[-1])
        p = {pl.name: data[pl.offset:pl.offset + pl.nbytes].view(pl.dtype).reshape(pl.shape) for pl in ps}
        return (p["qs"].astype(np.float64) * p["d"].astype(np.float64)[..., None]).reshape(region.shape)
    return data.astype(np.float64)


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_each_gpu_launch_matches_its_cpu_twin(plans, phase):
    """Prefill a prompt on the CPU plan, then run one more step launch by launch on both backends, the
    GPU launch's inputs copied from the CPU's; compare every output with docs/numerics.md's bounds."""
    cpu = Engine.load(plans["cpu"])
    gpu = Engine.load(plans["sm_90"], device="emu")
    ids = cpu.tokenizer.encode(STORY)[:40]
    n = 33 if phase == "prefill" else 1
    pages = np.zeros((1, cpu.pages_per_seq), np.int32)
    pages[0, :4] = [3, 0, 2, 1]  # scrambled blocks
    head = {"tokens": np.array(ids[:40 - n], np.int32), "pos": np.arange(40 - n, dtype=np.int32),
            "seq": np.zeros(40 - n, np.int32), "pages": pages, "last": np.array([40 - n - 1], np.int32)}
    cpu.executor.run("prefill", head, {"cache"})
    state = {"tokens": np.array(ids[40 - n:], np.int32), "pos": np.arange(40 - n, 40, dtype=np.int32),
             "seq": np.zeros(n, np.int32), "pages": pages}
    if phase == "prefill":
        state["last"] = np.array([n - 1], np.int32)
    ce, ge = cpu.executor, gpu.executor
    dims = ce.step_dims(phase, n, 1)
    worst: dict[str, float] = {}
    for i, (cl, gl) in enumerate(zip(ce.phases[phase].launches, ge.phases[phase].launches)):
        assert (cl.op, cl.args, cl.outs) == (gl.op, gl.args, gl.outs)
        for ref in cl.args + cl.outs:
            if isinstance(ref, (Buf, Cache)):
                src = ce.region(phase, ref, dims)
                ge.driver.write(ge.region(phase, ref, dims), ce.driver.read(src).result())
        ce.run_launch(phase, i, state)
        ge.run_launch(phase, i, state)
        for ref in cl.outs:
            if isinstance(ref, Cache):
                kv = ce.cache.shape[-1]
                cells = [(b, p % 16) for p in range(40 - n, 40) for b in [int(pages[0, p // 16])]]
                layer = cl.attrs["layer"]
                c, g = (typed(e.cache)[layer][:, [b for b, _ in cells], [o for _, o in cells]] for e in (ce, ge))
                assert c.shape[-1] == kv
                got, want = g.astype(np.float64), c.astype(np.float64)
            else:
                r = ce.region(phase, ref, dims)
                want = _values(r, ce.driver.read(r).result())
                got = _values(r, ge.driver.read(ge.region(phase, ref, dims)).result())
            if cl.op == "tail_argmax":
                assert np.array_equal(got, want), (i, got, want)
                continue
            finite = np.isfinite(want)  # empty attention splits hold -inf maxima: they must match exactly
            assert np.array_equal(got[~finite], want[~finite]) and np.isfinite(got[finite]).all(), (i, cl.op)
            err = nmse(got[finite], want[finite])
            bound = ORDER if cl.family in ORDER_SENSITIVE else EXACT
            assert err < bound, (i, cl.op, err)
            worst[cl.op] = max(worst.get(cl.op, 0.0), err)
    print(f"{phase}: worst NMSE per op against the CPU twin: "
          + ", ".join(f"{op} {e:.1e}" for op, e in sorted(worst.items())))
    assert {"embed", "rmsnorm_pack", "matmul_segmented", "rope_kv", "matmul_residual", "glu_pack"} <= set(worst)


def test_a_bucket_that_cannot_be_recorded_runs_directly_and_says_so_once(plans, monkeypatch):
    from llmplan.runtime.drivers.cpu import CpuDriver

    want = Engine.load(plans["cpu"], replay=False).run([Request("Once upon a time", 8)])[0].ids

    def refuse(self, calls):
        raise RuntimeError("capture is not supported here")

    monkeypatch.setattr(CpuDriver, "record", refuse)
    engine = Engine.load(plans["cpu"])
    assert engine.run([Request("Once upon a time", 8)])[0].ids == want
    notes = [n for r in engine.records for n in r.get("notes", [])]
    assert notes == [f"{phase} at 1 sequences runs directly: recording failed (RuntimeError: capture is not "
                     "supported here)" for phase in ("prefill", "decode")]  # the cpu driver records prefill too
    assert all(b.graphs is None and b.steps == 0 for b in engine.executor.buckets.values())


def test_constrained_requests_on_emu_give_the_cpu_plans_tokens(plans):
    """A batch of constrained (a JSON schema: the GPU tail's masked argmax) and free requests, pipelined
    and replayed on the emulated GPU: the CPU plan's tokens, and each constrained answer is its JSON."""
    import json

    from llmplan.runtime import grammar

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "maximum": 9}},
              "required": ["ok", "n"], "additionalProperties": False}

    def requests():
        g = grammar.json_schema(schema)
        return [Request("Once upon a time", 16, grammar=g), Request("The capital of France is", 6),
                Request("JSON:", 16, grammar=g)]

    want = Engine.load(plans["cpu"]).run(requests())
    emu = Engine.load(plans["sm_90"], device="emu", pipelined=True)
    got = emu.run(requests())
    assert [r.ids for r in got] == [r.ids for r in want]
    assert [json.loads(got[i].text)["ok"] in (True, False) for i in (0, 2)] == [True, True]
    assert any(r["pipelined"] and r["masked_rows"] for r in emu.records)
