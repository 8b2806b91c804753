"""A GPU build finds every tool it runs before it compiles anything, and a missing one is an error that
says what to install; what was compiled is cached even when a gate then fails the build."""

import re
import subprocess

import pytest

from llmplan.codegen import build as b
from llmplan.codegen import toolchain
from llmplan.codegen.families import elementwise as ew
from llmplan.codegen.targets import TARGETS
from llmplan.commands.cli import main
from llmplan.core.errors import InputError


@pytest.fixture
def without(monkeypatch):
    """without(tool): this machine as if `tool` were not installed; no compiler may run."""
    def hide(tool):
        real = toolchain.find
        monkeypatch.setattr(toolchain, "find", lambda name, dirs=(): None if name == tool else real(name, dirs))
        for f in (toolchain.nvcc, toolchain.cuobjdump, toolchain.nvdisasm, toolchain.clang, toolchain.lld):
            f.cache_clear()
        monkeypatch.setattr(toolchain, "version", lambda path: "test")
        monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail(f"ran {a[0]} without {tool}"))
    yield hide
    for f in (toolchain.nvcc, toolchain.cuobjdump, toolchain.nvdisasm, toolchain.clang, toolchain.lld):
        f.cache_clear()


@pytest.mark.parametrize("tool, target, install", [
    ("cuobjdump", "sm_90", "pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm"),
    ("nvdisasm", "sm_89", "pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm"),
    ("nvcc", "sm_90", "install the CUDA toolkit"),
    ("ld.lld-19", "gfx1100", "apt-get install lld-19"),
    ("clang++-19", "gfx942", "apt-get install clang-19"),
])
def test_a_missing_tool_is_named_before_anything_compiles(without, tmp_path, monkeypatch, tool, target, install):
    monkeypatch.setenv("LLMPLAN_CACHE", str(tmp_path))
    without(tool)
    with pytest.raises(InputError, match="^" + re.escape(f"{tool} is not installed: {install}")):
        b.build([ew.kernel("add", 4)], TARGETS[target])


def test_the_cli_says_it_in_one_line(without, tmp_path, monkeypatch, capsys):
    from conftest import TINY_BPE

    monkeypatch.setenv("LLMPLAN_CACHE", str(tmp_path))
    without("cuobjdump")
    assert main(["compile", str(TINY_BPE), "--device", "sm_90", "-o", str(tmp_path / "t.plan"),
                 "--tune-dir", "off"]) == 2
    *phases, error = capsys.readouterr().err.splitlines()  # the phases that ran first, then one line
    assert all(p.startswith("plan compile: ") for p in phases) and phases[-1].endswith("build kernels for sm_90")
    assert error.startswith("plan: error: cuobjdump is not installed: pip install ")


def test_a_build_that_fails_a_gate_is_cached(tmp_path, monkeypatch):
    """The gate runs on the cached build too, so caching a failing build changes no verdict and
    saves its compile."""
    monkeypatch.setenv("LLMPLAN_CACHE", str(tmp_path))
    monkeypatch.setattr(toolchain, "check", lambda target: None)
    monkeypatch.setattr(toolchain, "clang", lambda: "clang++-19")
    monkeypatch.setattr(toolchain, "version", lambda path: "test")
    compiles = []
    monkeypatch.setattr(b, "_compile_hip", lambda *a: compiles.append(a) or (b"code", "no metadata", ""))
    kernel = ew.kernel("add", 4)
    for _ in range(2):
        with pytest.raises(b.BuildError, match="produced no device code"):
            b.build([kernel], TARGETS["gfx1100"])
    assert len(compiles) == 1
