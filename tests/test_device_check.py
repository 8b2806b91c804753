"""scripts/device-check --emu: the H200 check's own stages (models, the GPU end-to-end tests with the
8B stand-in's CPU reference computed beside them, the benchmark, summary.json and the table) on the
emulated GPU with tiny models, so the one-call device run is known to work before a GPU is lent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from codegen_checks import needs_emulator

ROOT = Path(__file__).resolve().parents[1]


@needs_emulator
def test_device_check_runs_on_the_emulated_gpu(tmp_path):
    env = os.environ | {"OUT": str(tmp_path / "out"), "PYTHON": sys.executable}
    r = subprocess.run([str(ROOT / "scripts" / "device-check"), "--emu"], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1].endswith("PASS")
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == "emu" and set(summary["tests"]) == {"e2e", "e2e8b"}
    assert all(t["tests"] > 0 and t["failures"] == t["errors"] == t["skipped"] == 0 for t in summary["tests"].values())
    bench = summary["bench"]
    assert bench["tg"] > 0 and bench["aggregate_tok_s"] > 0 and bench["pp_tok_s"] > 0 and bench["copy_gbs"] > 0
    assert bench["launches_per_step"] > 0 and bench["notes"] == []
    assert summary["stages"] and set(summary["stages"].values()) == {0}, summary["stages"]
    assert len(list(out.iterdir())) <= 8  # what the device tool brings back from $OUT


def test_device_check_writes_its_summary_when_its_time_is_spent(tmp_path):
    """A budget too small for the stages: each says it was not run, the summary and the table are
    written all the same, and the check fails."""
    env = os.environ | {"OUT": str(tmp_path / "out"), "PYTHON": sys.executable, "DEVICE_CHECK_BUDGET": "18"}
    r = subprocess.run([str(ROOT / "scripts" / "device-check"), "--emu"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 1 and r.stdout.strip().splitlines()[-1].endswith("FAIL"), r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["tests"]["e2e8b"] == {"error": "did not finish: timed out"} and "error" in summary["bench"]
    assert summary["seconds"] <= 18
