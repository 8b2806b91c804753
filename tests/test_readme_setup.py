"""The README's set-up and use, as a new user runs them: a fresh virtual environment, the README's
install command, then its commands on a PATH without clang or the machine's CUDA toolkit, so that the CPU
plan `plan run` compiles is native and built by g++ and the sm_90 plan is built by the nvcc the install
brought from PyPI; then, with no C++ compiler on PATH at all, `plan run` says it fell back to the NumPy
kernels; last, on the whole PATH, the offline AMD compile (clang-19 and lld-19 are the OS's).

The environment sees the system's site-packages so that pip finds numpy, the NVIDIA wheels and the rest
installed already (no download, no network: .ci/run installs them), which means the system's own packages
could stand in for the ones the install must bring; so the test also checks that the installed llmplan
requires them under the extra the README installs, and that the nvcc and cuobjdump the build runs are
files of those packages."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from llmplan.codegen.targets import TARGETS

from conftest import require_compiler

ROOT = Path(__file__).parents[1]
NVIDIA = ("nvidia-cuda-nvcc", "nvidia-cuda-cccl", "nvidia-cuda-cuobjdump", "nvidia-cuda-nvdisasm")
# what each PATH hides, by name: clang and LLVM's tools and the CUDA toolkit's; then every C and C++ compiler
NO_CLANG_NO_CUDA = r"clang|lld|llvm|nvcc|ptxas|fatbinary|nvlink|cudafe|cuobjdump|nvdisasm|bin2c"
NO_CXX = NO_CLANG_NO_CUDA + r"|g\+\+|gcc|c\+\+|^cc$|^c89|^c99"


def _readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Set up and use\n\n```\n(.*?)```", readme, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def _path_without(hidden: str, folder: Path, first: Path) -> str:
    """A PATH of `first`, then a folder of links to every program on this PATH whose name `hidden` does
    not match (the first of each name, as PATH finds it)."""
    folder.mkdir()
    for d in os.environ["PATH"].split(os.pathsep):
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            link, target = folder / name, Path(d) / name
            if not re.search(hidden, name) and not link.exists() and target.is_file() and os.access(target, os.X_OK):
                link.symlink_to(target)
    return f"{first}{os.pathsep}{folder}"


@pytest.mark.slow
def test_readme_setup_then_native_cpu_and_offline_gpu_compiles(tmp_path):
    require_compiler(TARGETS["sm_90"])
    require_compiler(TARGETS["gfx1100"])
    commands = _readme_commands()
    assert commands[0].startswith("pip install -e ") and "[gpu]" in commands[0] and commands[1] == "plan env"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    env = dict(os.environ, PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", VIRTUAL_ENV=str(venv),
               LLMPLAN_CACHE=str(tmp_path / "cache"), LLMPLAN_TUNE_DIR=str(tmp_path / "tune"),
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    for var in ("PYTHONPATH", "CXX"):
        env.pop(var, None)
    work = tmp_path / "work"
    work.mkdir()

    def sh(cmd: str, cwd: Path = work, path: str | None = None) -> subprocess.CompletedProcess:
        r = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env | ({"PATH": path} if path else {}),
                           capture_output=True, text=True)
        assert r.returncode == 0, f"{cmd}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
        return r

    sh(f"python -m pip install --quiet {commands[0].removeprefix('pip install ')}", cwd=ROOT)
    python = str(venv / "bin" / "python")
    check = ("import importlib.metadata as m; print(m.requires('llmplan')); "
             f"print({{p: [str(f.locate()) for f in m.files(p) if f.parent.name == 'bin'] for p in {NVIDIA!r}}})")
    requires, files = sh(f"{python} -c {shlex.quote(check)}").stdout.splitlines()
    for pkg in NVIDIA:
        assert re.search(rf"'{pkg}[<>=,.\d]+; extra == \"gpu\"'", requires), requires
    registry = {os.path.realpath(f) for fs in ast.literal_eval(files).values() for f in fs}
    assert sh("command -v plan").stdout.strip() == str(venv / "bin" / "plan")

    # clang and the CUDA toolkit hidden: the README's commands build with g++ and the registry's nvcc
    path = _path_without(NO_CLANG_NO_CUDA, tmp_path / "no-clang-no-cuda", venv / "bin")
    machine = json.loads(sh("plan env --json", path=path).stdout)
    cpu, nvidia = machine["compilers"]["cpu"], machine["compilers"]["nvidia"]
    assert cpu["uses"] and os.path.basename(cpu["uses"]).startswith("g++") and "simd_paths" in machine["cpu"]
    assert os.path.realpath(nvidia["uses"]) in registry and nvidia["found"]["nvcc"]["from"] == "the [gpu] extra"
    assert os.path.realpath(nvidia["found"]["cuobjdump"]["path"]) in registry
    text = sh(commands[1], path=path).stdout
    assert f"builds with {cpu['uses']}" in text and f"builds with {nvidia['uses']}" in text
    made_and_run, gpu = (sh(cmd, path=path) for cmd in commands[2:])
    assert "random weights: its text is gibberish" in made_and_run.stdout
    assert re.search(r"^Once upon a time", made_and_run.stdout, re.M)
    cached = re.search(r"cached as (\S+\.plan)", made_and_run.stderr).group(1)
    plan = json.loads(sh(f"plan inspect {cached} --json", path=path).stdout)
    assert plan["cpu"]["kernels"] == "native" and plan["cpu"]["compiler"].startswith("g++")
    assert "NumPy" not in made_and_run.stderr
    assert "sm_90" in gpu.stdout and "kernels built in" in gpu.stdout
    sm90 = json.loads(sh("plan inspect tiny.sm_90.plan --kernels --json", path=path).stdout)
    assert sm90["compiler"] == nvidia["found"]["nvcc"]["version"]

    # no C++ compiler at all: the run falls back to the NumPy kernels and says so
    bare = _path_without(NO_CXX, tmp_path / "no-cxx", venv / "bin")
    fallback = sh('plan run tiny.gguf -p "Once upon a time" -n 4', path=bare)
    assert re.search(r"^plan run: the NumPy kernels run this plan, not the compiled ones \(no C\+\+ compiler",
                     fallback.stderr, re.M), fallback.stderr

    amd = sh("plan compile tiny.gguf --device gfx1100 -o tiny.gfx1100.plan")
    assert "gfx1100" in amd.stdout and "kernels built in" in amd.stdout
