"""`plan env` reports the machine as the builds see it: the compilers found for each target and the one
each uses (the same the builds take), the CPU's SIMD paths, llmplan's version and build id; as text and
as JSON."""

from __future__ import annotations

import json

from llmplan.codegen import cpu_build, toolchain
from llmplan.codegen.targets import TARGETS
from llmplan.commands import environment

from conftest import hide_cxx


def test_json_names_the_compilers_each_build_uses_and_the_simd_paths(cli):
    code, out, _ = cli("env", "--json")
    env = json.loads(out)
    assert code == 0 and env["llmplan"]["version"] == "0.1.0" and len(env["llmplan"]["build_id"]) == 12
    cpu = env["compilers"]["cpu"]
    found = toolchain.cxx_candidates()
    assert [f["command"] for f in cpu["found"]] == [" ".join(c.command) for c in found]
    assert [f["builds"] for f in cpu["found"]] == [cpu_build.probe(c) is None for c in found]
    want = cpu_build.compiler()
    assert cpu["uses"] == (want and " ".join(want.command))
    nvidia = env["compilers"]["nvidia"]
    assert nvidia["targets"] == [t for t, x in TARGETS.items() if x.nvidia]
    if nvidia["uses"]:
        nvcc = toolchain.nvcc()
        assert nvidia["uses"] == nvcc and nvidia["found"]["nvcc"]["from"] == toolchain.origin(nvcc)
    assert env["compilers"]["amd"]["uses"] == toolchain.find("clang++-19")
    assert env["cpu"]["simd_paths"] == list(cpu_build.host_isas()) and env["cpu"]["best"] == cpu_build.best_isa()
    assert set(env["cpu"]["features"]) <= set(environment.FEATURES) and isinstance(env["cpu"]["amx"], bool)
    assert set(env["gpus"]) == {"cuda", "hip"} and all("devices" in g for g in env["gpus"].values())
    assert env["paths"]["cache"] and env["extras"]["gpu"]["installed"] in (True, False)


def test_without_a_cpu_compiler_it_says_why_and_what_installs_one(cli, monkeypatch):
    hide_cxx(monkeypatch)
    code, out, _ = cli("env", "--json")
    cpu = json.loads(out)["compilers"]["cpu"]
    assert code == 0 and cpu["uses"] is None and cpu["found"] == []
    assert cpu["why_none"] == "no C++ compiler (clang++ or g++) on PATH" and cpu["install"] == toolchain.cxx_install()
    code, out, _ = cli("env")
    assert code == 0 and f"no compiler builds here (no C++ compiler (clang++ or g++) on PATH): {cpu['install']}" in out


def test_text_shows_each_section(cli):
    code, out, _ = cli("env")
    heads = [line.split()[0] for line in out.splitlines() if line and not line.startswith(" ")]
    assert code == 0 and heads == ["llmplan", "python", "packages", "extras", "cpu", "compilers", "gpus", "paths"]
    assert f"SIMD paths {', '.join(cpu_build.host_isas())}" in out


def test_the_build_id_follows_the_sources(tmp_path, monkeypatch):
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "__init__.py").write_text("")
    (tmp_path / "core" / "a.h").write_text("int a;")
    (tmp_path / "tests").mkdir()  # no __init__.py: not a subpackage
    (tmp_path / "tests" / "t.py").write_text("x = 1")
    monkeypatch.setattr(environment, "PACKAGE_ROOT", tmp_path)
    first = environment.build_id()
    (tmp_path / "tests" / "t.py").write_text("x = 2")
    assert environment.build_id() == first
    (tmp_path / "core" / "a.h").write_text("int b;")
    assert environment.build_id() != first
