"""The README's Python API example runs as written (on a tiny plan instead of m.plan)."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import TINY_SPM
from llmplan.models.model import open_model
from llmplan.plans.compile import compile_model
from llmplan.plans.devices import local_cpu


def test_python_api_example(tmp_path, capsys):
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    code = re.search(r"## Python API\n\n```python\n(.*?)```", readme, re.S).group(1)
    assert len(code.strip().splitlines()) <= 10
    plan = tmp_path / "m.plan"
    compile_model(open_model(TINY_SPM), local_cpu(), plan, ctx=256, max_seqs=4)
    scope: dict = {}
    exec(compile(code.replace('"m.plan"', repr(str(plan))), "README.md", "exec"), scope)
    engine = scope["engine"]
    assert all(r.finish_reason in ("stop", "length") and r.ids for r in scope["results"])
    assert engine.pool.free_blocks == engine.pool.total
    out = capsys.readouterr().out
    assert "0 " in out and "1 " in out and ("length" in out or "stop" in out)
