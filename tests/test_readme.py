"""The README's Python API example runs as written (on a tiny plan instead of m.plan)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from llmplan.core.devices import local_cpu
from llmplan.models.model import open_model
from llmplan.plans.compile import compile_model

from conftest import TINY_SPM


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
    # the streamed lines (index, repr(text), finish reason) add up to each request's own run: greedy
    # for the first, seeded for the second, whatever ran beside them
    lines = capsys.readouterr().out.splitlines()
    streamed = {0: "", 1: ""}
    ends = {}
    for line in lines:
        m = re.fullmatch(r"([01]) ('.*'|\".*\") (stop|length|)", line)
        if m is None:
            break  # the chat example's text follows
        streamed[int(m.group(1))] += ast.literal_eval(m.group(2))
        if m.group(3):
            ends[int(m.group(1))] = m.group(3)
    alone = [engine.run([scope["Request"]("Once upon a time")])[0],
             engine.run([scope["Request"]("The capital of France is", 16, scope["hot"], stop=(".",))])[0]]
    assert [streamed[0], streamed[1]] == [r.text for r in alone] and all(alone[i].text for i in (0, 1))
    assert ends == {0: alone[0].finish_reason, 1: alone[1].finish_reason}
