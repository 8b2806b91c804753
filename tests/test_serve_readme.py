"""The README's Serving section runs as written: its start line, its curl example and its openai
example, against a server on a free port instead of 8000 (on a tiny plan instead of m.plan)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

from serve_harness import Served


def _blocks() -> list[str]:
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    section = re.search(r"\n## Serving\n(.*?)\n## ", readme, re.S).group(1)
    return re.findall(r"```(?:python)?\n(.*?)```", section, re.S)


def test_the_serving_examples_run(serve_plan, cli, tmp_path, capsys):
    start, curl, python = _blocks()
    assert shlex.split(start) == ["plan", "serve", "m.plan", "--port", "8000"]
    server = Served(serve_plan("bpe"), tmp_path / "readme.log")
    try:
        here = server.url.removeprefix("http://")
        out = subprocess.run(["bash", "-c", curl.replace("127.0.0.1:8000", here)], capture_output=True, text=True,
                             timeout=120, check=True).stdout
        got = json.loads(out)
        assert got["usage"]["completion_tokens"] == 16 and got["choices"][0]["finish_reason"] == "length"
        code, ref, err = cli("run", serve_plan("bpe"), "-p", "Once upon a time", "-n", "16", "--json")
        assert code == 0, err
        assert got["choices"][0]["text"] == json.loads(ref)["text"]
        exec(compile(python.replace("127.0.0.1:8000", here), "README.md", "exec"), {})
        printed = capsys.readouterr().out
        code, ref, err = cli("run", serve_plan("bpe"), "-p", "Hello!", "-n", "32", "--chat", "--json")
        assert code == 0, err
        assert printed == json.loads(ref)["text"] != ""
    finally:
        assert server.stop() == 0, server.output()
