"""A CPU plan on the NumPy kernels is announced where users look: `plan compile --device cpu`, `plan run`,
`plan eval` and `plan serve` print one line on stderr saying why, what it costs and the command that
fixes it; a plan on the compiled kernels prints none."""

from __future__ import annotations

import functools
import re

import pytest

from llmplan.codegen import toolchain
from llmplan.commands import numpy_fallback

from conftest import TINY_BPE, hide_cxx
from cpu_native import needs_compiler

LINE = re.compile(r"^plan (\w+): the NumPy kernels run this plan, not the compiled ones \((.+)\): (.+), and "
                  r"([\d.]+ [KMG]iB) of float32 weight copies; to fix it: (.+)$", re.M)
NO_CXX = "no C++ compiler (clang++ or g++) on PATH"


@functools.cache
def _numpy_plan(tmp) -> str:
    from llmplan.core.devices import local_cpu
    from llmplan.models.model import open_model
    from llmplan.plans.compile import compile_model

    plan = f"{tmp}/numpy.plan"
    with pytest.MonkeyPatch.context() as mp:
        hide_cxx(mp)
        compile_model(open_model(TINY_BPE), local_cpu(), plan, ctx=128, chunk=16)
    return plan


def _lines(err: str) -> list[tuple[str, ...]]:
    return LINE.findall(err)


def test_compile_says_it_once_with_the_install_then_the_recompile(cli, tmp_path, monkeypatch):
    hide_cxx(monkeypatch)
    plan = tmp_path / "m.plan"
    code, _, err = cli("compile", TINY_BPE, "-o", plan, "--ctx", "128", "--chunk", "16", "--tune-dir", "off")
    assert code == 0
    [(verb, why, cost, copies, fix)] = _lines(err)
    assert (verb, why) == ("compile", NO_CXX) and cost == numpy_fallback.SLOWER and copies != "0.00 KiB"
    assert fix == f"{toolchain.cxx_install()}, then plan compile {TINY_BPE} --device cpu -o {plan}"


def test_run_and_eval_say_it_on_a_plan(cli, tmp_path_factory, tmp_path, monkeypatch):
    plan = _numpy_plan(tmp_path_factory.getbasetemp())
    hide_cxx(monkeypatch)
    code, out, err = cli("run", plan, "-p", "Once upon a time", "-n", "2")
    assert code == 0 and out.startswith("Once upon a time")
    [(verb, why, _, _, fix)] = _lines(err)
    assert (verb, why) == ("run", NO_CXX) and fix.startswith(f"{toolchain.cxx_install()}, then plan compile ")
    text = tmp_path / "t.txt"
    text.write_text("Once upon a time there was a little robot who liked to sing. " * 4)
    code, _, err = cli("eval", plan, "-f", text, "--ctx", "16")
    assert code == 0 and [m[0] for m in _lines(err)] == ["eval"]


def test_a_gguf_run_needs_only_the_install(cli, tmp_path, monkeypatch):
    """`plan run MODEL.gguf` caches its plan by kernels: once a compiler is installed the next run compiles
    the native one, so the install is the whole fix."""
    monkeypatch.setenv("LLMPLAN_CACHE", str(tmp_path))
    hide_cxx(monkeypatch)
    code, _, err = cli("run", TINY_BPE, "-p", "Hi", "-n", "1", "--ctx", "256")
    assert code == 0 and [(m[0], m[4]) for m in _lines(err)] == [("run", toolchain.cxx_install())]


@needs_compiler
def test_with_a_compiler_here_the_fix_is_to_recompile_and_a_native_plan_says_nothing(cli, tmp_path_factory,
                                                                                  tmp_path, monkeypatch):
    plan = _numpy_plan(tmp_path_factory.getbasetemp())
    code, _, err = cli("run", plan, "-p", "Hi", "-n", "1")
    assert code == 0 and [m[4] for m in _lines(err)] == [f"plan compile {TINY_BPE} --device cpu -o {plan}"]
    monkeypatch.setenv("LLMPLAN_CACHE", str(tmp_path))
    code, _, err = cli("run", TINY_BPE, "-p", "Hi", "-n", "1", "--ctx", "256")
    assert code == 0 and "cached as " in err and not _lines(err)


def test_serve_says_it(tmp_path_factory, tmp_path):
    from serve_harness import Served

    served = Served(_numpy_plan(tmp_path_factory.getbasetemp()), tmp_path / "serve.log",
                    env={"PATH": "/nonexistent", "CXX": ""})
    try:
        assert [m[:2] for m in _lines(served.output())] == [("serve", NO_CXX)]
    finally:
        served.stop()
