"""A GPU build finds every tool it runs before it compiles anything, the [gpu] extra's NVIDIA tools before
PATH's, and a missing one is an error that says what to install; what was compiled is cached even when
a gate then fails the build. The CPU target's C++ compilers are found on PATH in their order ($CXX, else
each clang++ newest first, then each g++), and the first that builds the probe is the one it uses."""

import os
import re
import subprocess
import sys

import pytest

from llmplan.codegen import build as b
from llmplan.codegen import cpu_build, toolchain
from llmplan.codegen.families import elementwise as ew
from llmplan.codegen.targets import TARGETS
from llmplan.commands.cli import main
from llmplan.core.errors import InputError


@pytest.fixture
def without(monkeypatch):
    """without(tool): this machine as if `tool` were not installed; no compiler may run."""
    tools = (toolchain.nvcc, toolchain.nvcc_host, toolchain.cuobjdump, toolchain.nvdisasm, toolchain.clang,
             toolchain.lld)

    def hide(tool):
        real = toolchain.find
        monkeypatch.setattr(toolchain, "find", lambda name, *dirs: None if name == tool else real(name, *dirs))
        for f in tools:
            f.cache_clear()
        monkeypatch.setattr(toolchain, "version", lambda path: "test")
        monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail(f"ran {a[0]} without {tool}"))
    yield hide
    for f in tools:
        f.cache_clear()


@pytest.mark.parametrize("tool, target, install", [
    ("cuobjdump", "sm_90", "pip install -e '.[gpu]'"),
    ("nvdisasm", "sm_89", "pip install -e '.[gpu]'"),
    ("nvcc", "sm_90", "pip install -e '.[gpu]'"),
    ("gcc", "sm_90", f"nvcc compiles through the host's gcc: {toolchain.cxx_install()}"),
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


def _program(folder, name: str, version_line: str) -> str:
    """An executable `name` in `folder` that prints `version_line` for --version (and compiles nothing)."""
    path = folder / name
    path.write_text(f"#!/bin/sh\n[ \"$1\" = --version ] && echo '{version_line}' && exit 0\nexit 1\n")
    path.chmod(0o755)
    return str(path)


def test_the_registrys_nvidia_tools_come_before_paths(tmp_path, monkeypatch):
    registry, on_path = tmp_path / "site" / "nvidia" / "cu13" / "bin", tmp_path / "bin"
    registry.mkdir(parents=True)
    on_path.mkdir()
    wheel = _program(registry, "nvcc", "Cuda compilation tools, release 13.5, V13.5.37")
    _program(on_path, "nvcc", "Cuda compilation tools, release 13.0, V13.0.88")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "site")])
    monkeypatch.setenv("PATH", str(on_path))
    assert toolchain.find_nvidia("nvcc") == wheel and toolchain.origin(wheel) == "the [gpu] extra"
    assert toolchain.tool_env()["PATH"].split(os.pathsep)[:2] == [str(registry), str(on_path)]
    monkeypatch.setattr(sys, "path", [])
    assert toolchain.find_nvidia("nvcc") == str(on_path / "nvcc")


def test_cxx_candidates_clang_newest_first_then_gcc_and_cxx_alone(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    clang14 = _program(a, "clang++-14", "Debian clang version 14.0.6")
    clang19 = _program(b, "clang++-19", "Debian clang version 19.1.7 (3~deb12u1)")
    (a / "clang++").symlink_to(clang19)  # one binary under two names: listed once, as PATH first finds it
    gcc12 = _program(a, "g++-12", "g++ (Debian 12.2.0-14) 12.2.0\nCopyright (C) 2022 Free Software Foundation, Inc.")
    _program(a, "gcc-12", "gcc (Debian 12.2.0-14) 12.2.0")  # a C compiler: not a candidate
    monkeypatch.setenv("PATH", f"{a}{os.pathsep}{b}")
    monkeypatch.delenv("CXX", raising=False)
    found = toolchain.cxx_candidates()
    assert [c.command for c in found] == [(str(a / "clang++"),), (clang14,), (gcc12,)]
    assert [(c.family, c.version) for c in found] == [("clang", "19.1.7"), ("clang", "14.0.6"), ("gcc", "12.2.0")]
    assert found[0].identity == "Debian clang version 19.1.7 (3~deb12u1)"
    monkeypatch.setenv("CXX", f"/usr/bin/env {clang14}")  # a command: a launcher, then the compiler
    assert [c.command for c in toolchain.cxx_candidates()] == [("/usr/bin/env", clang14)]


def test_the_cpu_target_takes_the_first_compiler_that_builds_the_probe(tmp_path, monkeypatch):
    """A candidate that cannot compile is passed over, and with none the reasons name each one."""
    fake = _program(tmp_path, "clang++-99", "Debian clang version 99.0.0")  # the newest clang: tried first
    path = os.environ["PATH"]
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("LLMPLAN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cpu_build.compiler() is None and not cpu_build.available()
    assert cpu_build.no_compiler().startswith("clang++-99 99.0.0 cannot build the CPU kernels (host build (cpu-probe) "
                                              "failed: ")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{path}")
    found = toolchain.cxx_candidates()
    assert found[0].command == (fake,)
    if len(found) == 1:
        pytest.skip("no C++ compiler here")
    assert cpu_build.compiler() == found[1]
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert cpu_build.no_compiler() == "no C++ compiler (clang++ or g++) on PATH"
    monkeypatch.setenv("CXX", "no-such-compiler")
    assert cpu_build.no_compiler() == "$CXX (no-such-compiler) does not run"
