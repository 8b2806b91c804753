"""Whole CPU plans on the compiled kernels (plan compile --device cpu, run by the cpu driver through the
executor), on the tiny fixture models, once per SIMD path this machine has (the scalar path always):
- the greedy tokens are the NumPy backend's (the same model compiled where no compiler is) up to a near
  tie, and the logits agree within llama.cpp's own spread (conftest.llama_cpp_bound; measured up to 3e-4:
  the integer dot products and the float sums' order differ, and an ulp that moves an 8-bit rounding in
  one layer grows through the next); so do tiny models made with the IQ4_XS and IQ4_NL recipes, within
  docs/numerics.md's whole-model 1e-3 (no llama.cpp spread is recorded for them);
- the fused tail's argmax is the logits' argmax;
- chunking never changes a result: a prompt prefilled in one chunk, in chunks of 7 rows, or one token at
  a time gives the same logits, bit for bit, and so the same tokens.
"""

from __future__ import annotations

import functools
import threading
import time

import numpy as np
import pytest

from llmplan.codegen import cpu_build
from llmplan.core import layouts
from llmplan.core.devices import local_cpu
from llmplan.core.errors import InputError
from llmplan.core.numerics import pages_for
from llmplan.models.builder import plan_build
from llmplan.models.model import open_model
from llmplan.plans.compile import compile_model
from llmplan.runtime.engine import Engine
from llmplan.runtime.requests import Request

from conftest import TINY_BPE, TINY_SPM, hide_cxx, llama_cpp_bound
from cpu_native import COMPILERS, ISAS, cxx, each_compiler, needs_compiler, use_compiler  # noqa: F401 (cxx: a fixture)
from kernel_inputs import nmse

PROMPT = "Once upon a time, in a land far away, there lived"
STEPS = 8
CTX = 256
NEAR_TIE = 1e-3  # a top-2 logit gap under this may flip between two correct roundings
WHOLE_MODEL_NMSE = 1e-3  # docs/numerics.md


@pytest.fixture(scope="session")
def iq4_model(tmp_path_factory):
    """recipe -> a tiny-llama3 GGUF made with it (IQ4 projections, Q5_K attn_v, a Q6_K head)."""
    made = {}

    def get(recipe: str):
        if recipe not in made:
            made[recipe] = tmp_path_factory.mktemp("iq4") / f"tiny-llama3-{recipe}.gguf"
            plan_build(made[recipe], "tiny-llama3", recipe).write(progress=False)
        return made[recipe]

    return get


def _engine(tmp, model, isa: str | None, chunk: int = CTX) -> Engine:
    """The model's plan on SIMD path `isa`, built by the compiler in use ($CXX) (None: the NumPy twins, as
    compiled without a compiler)."""
    return _built(tmp, model, isa, chunk, isa and cpu_build.compiler())


@functools.cache
def _built(tmp, model, isa: str | None, chunk: int, compiler) -> Engine:
    out = f"{tmp}/{model.stem}.{isa}.{chunk}.{compiler.name if compiler else 'numpy'}.plan"
    if isa is None:
        with pytest.MonkeyPatch.context() as mp:
            hide_cxx(mp)
            compile_model(open_model(model), local_cpu(), out, CTX, chunk)
    else:
        compile_model(open_model(model), local_cpu(), out, CTX, chunk, isa=isa)
    return Engine.load(out)


def _greedy(engine: Engine, ids: list[int], n: int, head: str = "logits") -> tuple[list[int], list[np.ndarray]]:
    """Greedy tokens after the prompt (prefilled in the plan's chunks), and the `head` row of each step,
    through the executor."""
    chunk = engine.header.limits.chunk
    pages = np.arange(pages_for(CTX), dtype=np.int32)[None, :]
    for at in range(0, len(ids), chunk):
        part = ids[at:at + chunk]
        state = {"tokens": np.asarray(part, np.int32), "pos": np.arange(at, at + len(part), dtype=np.int32),
                 "seq": np.zeros(len(part), np.int32), "pages": pages, "last": np.array([len(part) - 1], np.int32)}
        res = engine.executor.run("prefill", state, {"cache", head})
    rows, out = [res[head][0].copy()], []
    for step in range(n):
        tok = int(rows[-1]) if head == "next_token" else int(np.argmax(rows[-1]))
        out.append(tok)
        if step == n - 1:
            break
        state = {"tokens": np.array([tok], np.int32), "pos": np.array([len(ids) + step], np.int32),
                 "seq": np.zeros(1, np.int32), "pages": pages}
        rows.append(engine.executor.run("decode", state, {"cache", head})[head][0].copy())
    return out, rows


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("model", [TINY_BPE, TINY_SPM], ids=["tiny-llama3-bpe", "tiny-llama-spm"])
def test_greedy_tokens_and_logits_match_the_numpy_backend(model, isa, tmp_path_factory):
    tmp = tmp_path_factory.getbasetemp()
    numpy_engine, native = _engine(tmp, model, None), _engine(tmp, model, isa)
    assert native.body.cpu.isa == native.executor.driver.lib.isa == isa
    ids = native.tokenizer.encode(PROMPT, add_special=True, parse_special=True)
    got = _greedy(native, ids, STEPS)
    _same_up_to_a_near_tie(got, _greedy(numpy_engine, ids, STEPS), llama_cpp_bound(model.stem))
    assert _greedy(native, ids, STEPS, head="next_token")[0] == got[0]  # the fused tail's argmax: the same tokens


def _same_up_to_a_near_tie(got: tuple[list[int], list[np.ndarray]], want: tuple[list[int], list[np.ndarray]],
                           bound: float) -> None:
    """Each step's logits within `bound` (NMSE) and the same greedy token, up to the first step where the
    tokens part at a near tie."""
    for i, (g, w) in enumerate(zip(got[1], want[1])):
        assert nmse(g, w) < bound
        if got[0][i] != want[0][i]:  # a near tie: the rest of the run follows another token
            top2 = np.sort(w)[-2:]
            assert top2[1] - top2[0] < NEAR_TIE, f"step {i}: {got[0][i]} != {want[0][i]}, gap {top2[1] - top2[0]}"
            break


@needs_compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("recipe", ["IQ4_XS", "IQ4_NL"])
def test_iq4_models_match_the_numpy_backend(recipe, isa, iq4_model, tmp_path_factory):
    tmp, model = tmp_path_factory.getbasetemp(), iq4_model(recipe)
    numpy_engine, native = _engine(tmp, model, None), _engine(tmp, model, isa)
    ids = native.tokenizer.encode(PROMPT, add_special=True, parse_special=True)
    got = _greedy(native, ids, STEPS)
    _same_up_to_a_near_tie(got, _greedy(numpy_engine, ids, STEPS), WHOLE_MODEL_NMSE)
    assert _greedy(native, ids, STEPS, head="next_token")[0] == got[0]


@pytest.mark.parametrize("isa", ISAS)
def test_clang_and_gcc_give_the_same_bits(isa, tmp_path_factory, monkeypatch):
    """Every kernel computes in the order its code fixes (exact integer dot products, each float operation
    rounded once, nothing contracted into an FMA the code does not ask for), so a plan's library gives
    the same logits bit for bit whichever compiler built it."""
    tmp = tmp_path_factory.getbasetemp()
    runs = {}
    for name in COMPILERS:
        compiler = use_compiler(monkeypatch, name)
        engine = _engine(tmp, TINY_BPE, isa)
        assert engine.executor.driver.lib.library.compiler == compiler
        ids = engine.tokenizer.encode(PROMPT, add_special=True, parse_special=True)
        runs[name] = _greedy(engine, ids, 4)
    (a_ids, a_rows), (b_ids, b_rows) = runs.values()
    assert a_ids == b_ids and all(np.array_equal(a, b) for a, b in zip(a_rows, b_rows))


@each_compiler
@pytest.mark.parametrize("isa", ISAS)
def test_chunking_never_changes_a_bit(isa, tmp_path_factory):
    tmp = tmp_path_factory.getbasetemp()
    ids = _engine(tmp, TINY_BPE, isa).tokenizer.encode(PROMPT, add_special=True, parse_special=True)
    runs = {chunk: _greedy(_engine(tmp, TINY_BPE, isa, chunk), ids, 4) for chunk in (CTX, 7, 1)}
    for chunk in (7, 1):
        assert runs[chunk][0] == runs[CTX][0]
        for a, b in zip(runs[chunk][1], runs[CTX][1]):
            assert np.array_equal(a, b), f"chunks of {chunk} changed the logits"


@each_compiler
def test_the_library_is_built_once_and_threads_reach_its_pool(tmp_path_factory):
    engine = _engine(tmp_path_factory.getbasetemp(), TINY_BPE, ISAS[-1])
    again = Engine.load(engine.plan_path, threads=1)
    assert again.executor.driver.lib.library.cached and again.executor.driver.lib.threads() == 1
    ids = again.tokenizer.encode(PROMPT, add_special=True, parse_special=True)
    assert _greedy(again, ids, 4)[0] == _greedy(Engine.load(engine.plan_path, threads=2), ids, 4)[0]
    with pytest.raises(InputError, match="--threads must be at least 1"):
        Engine.load(engine.plan_path, threads=0)


@each_compiler
def test_the_driver_makes_the_relaid_out_weights_with_the_plans_code(tmp_path_factory, monkeypatch):
    """Each rows16 weight is made at load by the plan's library (matmul.relayout), never by the NumPy
    maker, and holds what the NumPy maker makes."""
    engine = _engine(tmp_path_factory.getbasetemp(), TINY_BPE, ISAS[-1])
    numpy_make = layouts.make
    made = []
    monkeypatch.setattr(layouts, "make", lambda layout, *a, **k: made.append(layout) or numpy_make(layout, *a, **k))
    again = Engine.load(engine.plan_path)
    ex = again.executor
    held = {name for name, layout in ex.weights if layout == "rows16"}
    assert held and "rows16" not in made
    for name in held:
        w = ex.body.weights[name]
        data = ex.weights[(name, "rows16")]
        want = numpy_make("rows16", ex.model.tensor_bytes(name), w.format, tuple(w.shape))
        assert np.array_equal(data.buffer[data.offset:data.offset + data.nbytes], want), name


@each_compiler
def test_a_replayed_decode_step_is_one_native_call_and_changes_no_bit(tmp_path_factory):
    """The cpu driver records a decode step's compiled kernels as one native call (codegen/cpu/graph.h):
    replayed steps give the direct launches' logits bit for bit."""
    plan = _engine(tmp_path_factory.getbasetemp(), TINY_BPE, ISAS[-1]).plan_path
    direct, replayed = Engine.load(plan, replay=False), Engine.load(plan)
    ids = direct.tokenizer.encode(PROMPT, add_special=True, parse_special=True)
    (want_ids, want_rows), (got_ids, got_rows) = _greedy(direct, ids, 6), _greedy(replayed, ids, 6)
    assert got_ids == want_ids and all(np.array_equal(g, w) for g, w in zip(got_rows, want_rows))
    buckets = [b for b in replayed.executor.buckets.values() if b.graphs is not None]
    assert sum(b.steps for b in buckets) >= 3 and all(len(g.steps) == 1 for b in buckets for g in b.graphs)


@each_compiler
def test_a_decode_burst_gives_the_tokens_of_single_steps_in_one_native_call(tmp_path_factory, monkeypatch):
    """A greedy burst (the executor's burst, graph.h lp_cpu_replay_steps) advances the position and feeds
    each step the token the last one wrote, in native code: the tokens are those of single steps."""
    plan = _engine(tmp_path_factory.getbasetemp(), TINY_BPE, ISAS[-1]).plan_path
    stepped, bursting = Engine.load(plan), Engine.load(plan)
    ids = stepped.tokenizer.encode(PROMPT, add_special=True, parse_special=True)
    want, _ = _greedy(stepped, ids, 12, head="next_token")
    first, _ = _greedy(bursting, ids, 1, head="next_token")
    ex = bursting.executor
    native = []
    replay_steps = ex.driver.replay_steps
    monkeypatch.setattr(ex.driver, "replay_steps", lambda *a: native.append(replay_steps(*a)) or native[-1])
    pages = np.arange(pages_for(CTX), dtype=np.int32)[None, :]
    got = list(first)
    for steps in (3, 8):  # each burst's first step records the bucket (or finds it), the rest replay it natively
        state = {"tokens": np.array(got[-1:], np.int32), "pos": np.array([len(ids) + len(got) - 1], np.int32),
                 "seq": np.zeros(1, np.int32), "pages": pages}
        tokens = ex.burst("decode", state, steps)
        assert tokens.shape == (steps, 1) and tokens.dtype == np.int32
        got += [int(t) for t in tokens[:, 0]]
    assert got == want
    assert [t.shape for t in native] == [(2, 1), (7, 1)]


@each_compiler
def test_a_timed_replay_runs_the_step_and_times_each_call(tmp_path_factory):
    """The profile's timed replay (cpu driver timed_replay, graph.h's clock readings) runs a decode step's
    calls as the step does: the same logits bit for bit, and a time for each call, together within the
    wall time of the replay."""
    engine = Engine.load(_engine(tmp_path_factory.getbasetemp(), TINY_BPE, ISAS[-1]).plan_path, replay=False)
    ids = engine.tokenizer.encode(PROMPT, add_special=True, parse_special=True)
    toks, _ = _greedy(engine, ids, 2)
    ex = engine.executor
    state = {"tokens": np.array([toks[-1]], np.int32), "pos": np.array([len(ids) + 1], np.int32),
             "seq": np.zeros(1, np.int32), "pages": np.arange(pages_for(CTX), dtype=np.int32)[None, :]}
    want = ex.run("decode", state, {"cache", "logits"})["logits"].copy()
    dims = ex.step_dims("decode", 1, 1)
    ex.write_state("decode", state, dims)
    calls = [c for _, c in ex.calls("decode", dims, {"cache", "logits"})]
    logits = ex.region("decode", ex.phases["decode"].outputs["logits"], dims)
    ex.driver.write(logits, np.full(want.shape, np.nan, np.float32))  # what the replay must overwrite
    timed = ex.driver.timed_replay(calls)
    t0 = time.perf_counter()
    seconds = timed()
    wall = time.perf_counter() - t0
    got = ex.driver.read(logits).result()
    assert np.array_equal(got, want)
    assert seconds.shape == (len(calls),) and (seconds >= 0).all() and 0 < seconds.sum() <= wall


@each_compiler
@pytest.mark.skipif(len(ISAS) < 2, reason="this machine runs the scalar path only")
def test_a_plan_for_a_simd_path_this_machine_lacks_asks_to_be_recompiled(tmp_path_factory, monkeypatch):
    engine = _engine(tmp_path_factory.getbasetemp(), TINY_BPE, ISAS[-1])
    monkeypatch.setattr(cpu_build, "host_isas", lambda: ("scalar",))
    with pytest.raises(InputError, match=f"built for SIMD path {ISAS[-1]}; this machine runs scalar: recompile"):
        Engine.load(engine.plan_path)


@each_compiler
def test_engines_in_two_threads_share_the_pool_safely(tmp_path_factory):
    """Two engines on one library (one pool per process), decoding at once from two Python threads, one of
    them resizing the pool as it loads: each gets the tokens it gets alone."""
    plan = _engine(tmp_path_factory.getbasetemp(), TINY_BPE, ISAS[-1]).plan_path
    first = Engine.load(plan, threads=2)
    ids = first.tokenizer.encode(PROMPT, add_special=True, parse_special=True)
    want = first.run([Request(ids, 16)])[0].ids
    got = {}
    other = threading.Thread(target=lambda: got.setdefault("other", Engine.load(plan, threads=1).run(
        [Request(ids, 16)])[0].ids))
    other.start()
    got["first"] = first.run([Request(ids, 16)])[0].ids
    other.join()
    assert got == {"first": want, "other": want}
