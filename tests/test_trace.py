"""`plan run --trace`: a Chrome trace-event file (Perfetto's format) on the cpu and emu drivers (host
times), and with a device track where the driver has a device clock (the shared GPU driver code over
the emulator, tests/stream_emu.py): valid JSON, the expected spans, non-negative durations, and spans
on each track nested."""

from __future__ import annotations

import json

import pytest

from llmplan.runtime import engine as engine_module
from llmplan.runtime.engine import Engine
from llmplan.runtime.requests import Request
from llmplan.runtime.trace import DEVICE, HOST, Trace

from codegen_checks import needs_emulator
from conftest import TINY_SPM, cpu_and_gpu_plans
from stream_emu import EmuCudaDriver

EPS = 0.01  # microseconds: ts and dur are rounded separately


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    return cpu_and_gpu_plans(tmp_path_factory.mktemp("trace"), TINY_SPM, ctx=128, chunk=32, max_seqs=2)


def parents(events: list[dict]) -> dict[int, dict | None]:
    """Each complete event's innermost enclosing event on its track (by id), checking that spans on a
    track nest: one that starts inside another ends inside it."""
    out = {}
    for tid in {e["tid"] for e in events}:
        stack: list[dict] = []
        for e in sorted((e for e in events if e["tid"] == tid), key=lambda e: (e["ts"], -e["dur"])):
            while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"] - EPS:
                stack.pop()
            if stack:
                assert e["ts"] + e["dur"] <= stack[-1]["ts"] + stack[-1]["dur"] + EPS, (e, stack[-1])
            out[id(e)] = stack[-1] if stack else None
            stack.append(e)
    return out


def check(path) -> list[dict]:
    """The file's complete events, after checking the format every event must have."""
    doc = json.loads(path.read_text())
    assert {e["ph"] for e in doc["traceEvents"]} == {"X", "M"}
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    for e in xs:
        assert set(e) == {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"}, e
        assert e["ts"] >= 0 and e["dur"] >= 0 and e["tid"] in (HOST, DEVICE), e
    up = parents(xs)
    for e in xs:
        if e["cat"] == "launch" and e["tid"] == HOST:  # every launch inside a prefill or decode span
            p = up[id(e)]
            while p is not None and p["name"] not in ("prefill", "decode"):
                p = up[id(p)]
            assert p is not None, e
        if e["name"] in ("prefill", "decode", "schedule"):
            assert up[id(e)]["name"] == "step", e
        if e["name"] in ("kernels", "open model", "read plan", "buffers, weights and tables"):
            assert up[id(e)]["name"] == "load", e
    return xs


def test_plan_run_traces_a_cpu_run(cli, plans, tmp_path):
    out = tmp_path / "cpu.json"
    code, _, err = cli("run", plans["cpu"], "-p", "Once upon a time", "-n", "6", "--trace", str(out))
    assert code == 0, err
    xs = check(out)
    names = {e["name"] for e in xs}
    assert {"compile", "load", "kernels", "open model", "read plan", "step", "schedule", "prefill", "decode",
            "record decode x1", "replay decode x1"} <= names, names
    steps = [e["args"] for e in xs if e["name"] == "step"]  # a decode burst is one step of several
    assert sum(s["prefill_rows"] > 0 for s in steps) == 1 and sum(s["decode_steps"] for s in steps) == 5
    assert all(e["tid"] == HOST for e in xs)
    assert any(e["cat"] == "launch" and e["name"].startswith("lp_cpu_") for e in xs)  # the compiled CPU kernels


@needs_emulator
def test_an_emu_run_traces_pipelined_decode(plans, tmp_path):
    trace = Trace()
    engine = Engine.load(plans["sm_90"], device="emu", pipelined=True, trace=trace)
    engine.run([Request("Once upon a time", 4)])
    trace.write(str(tmp_path / "emu.json"))
    xs = check(tmp_path / "emu.json")
    assert {"read tokens", "replay decode x1"} <= {e["name"] for e in xs}
    assert all(e["tid"] == HOST for e in xs)  # the host's clock is the emulator's: no device track
    assert any(e["cat"] == "launch" and e["args"]["grid"] for e in xs)


@needs_emulator
def test_a_driver_with_a_device_clock_gets_a_device_track(plans, tmp_path, monkeypatch):
    monkeypatch.setattr(engine_module, "driver_for", lambda name: EmuCudaDriver())
    trace = Trace()
    Engine.load(plans["sm_90"], device="cuda", trace=trace).run([Request("Once upon a time", 4)])
    trace.write(str(tmp_path / "cuda.json"))
    xs = check(tmp_path / "cuda.json")
    device = [e for e in xs if e["tid"] == DEVICE]
    host = [(e["name"], e["cat"]) for e in xs if e["tid"] == HOST and e["cat"] in ("launch", "graph")
            and not e["name"].startswith("record")]
    assert [(e["name"], e["cat"]) for e in device] == host and any(e["cat"] == "graph" for e in device)
