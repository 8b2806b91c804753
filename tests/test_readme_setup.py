"""The README's set-up and use, as a new user runs them: a fresh virtual environment, the README's
install command, its commands, then the offline GPU compiles for NVIDIA (sm_90) and AMD (gfx1100).

The environment sees the system's site-packages so that pip finds numpy and the rest installed already
(no download, no network), which means the system's own NVIDIA tools could stand in for the ones the
install must bring; so the test also checks that the installed llmplan requires them under the extra
the README installs, and that the cuobjdump the build runs is a file of that package."""

from __future__ import annotations

import ast
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


def _readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Set up and use\n\n```\n(.*?)```", readme, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


@pytest.mark.slow
def test_readme_setup_then_offline_gpu_compiles(tmp_path):
    require_compiler(TARGETS["sm_90"])
    require_compiler(TARGETS["gfx1100"])
    commands = _readme_commands()
    assert commands[0].startswith("pip install -e ") and "[gpu]" in commands[0]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    env = dict(os.environ, PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", VIRTUAL_ENV=str(venv),
               LLMPLAN_CACHE=str(tmp_path / "cache"), LLMPLAN_TUNE_DIR=str(tmp_path / "tune"),
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)
    work = tmp_path / "work"
    work.mkdir()

    def sh(cmd: str, cwd: Path = work) -> subprocess.CompletedProcess:
        r = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True)
        assert r.returncode == 0, f"{cmd}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
        return r

    sh(f"python -m pip install --quiet {commands[0].removeprefix('pip install ')}", cwd=ROOT)
    python = str(venv / "bin" / "python")
    check = ("import importlib.metadata as m, llmplan.codegen.toolchain as t, pathlib; "
             "print(m.requires('llmplan')); print(t.cuobjdump()); "
             "print([str(f.locate()) for f in m.files('nvidia-cuda-cuobjdump') if f.name == 'cuobjdump'])")
    requires, tool, files = sh(f"{python} -c {shlex.quote(check)}").stdout.splitlines()
    for pkg in ("nvidia-cuda-cuobjdump", "nvidia-cuda-nvdisasm"):
        assert re.search(rf"'{pkg}>=13; extra == \"gpu\"'", requires), requires
    assert os.path.realpath(tool) in [os.path.realpath(f) for f in ast.literal_eval(files)]
    assert sh("command -v plan").stdout.strip() == str(venv / "bin" / "plan")
    outputs = [sh(cmd) for cmd in commands[1:]]
    made_and_run, gpu = outputs[0], outputs[1]
    assert "random weights: its text is gibberish" in made_and_run.stdout
    assert re.search(r"^Once upon a time", made_and_run.stdout, re.M)
    assert "cached as " in made_and_run.stderr
    assert "sm_90" in gpu.stdout and "kernels built in" in gpu.stdout and (work / "tiny.sm_90.plan").exists()
    amd = sh("plan compile tiny.gguf --device gfx1100 -o tiny.gfx1100.plan")
    assert "gfx1100" in amd.stdout and "kernels built in" in amd.stdout
