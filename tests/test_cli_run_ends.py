"""`plan run` at the edges a new user meets: a prompt longer than the context (--truncate, "truncate"
in a prompts file), a generation the context cuts short (said on stderr, "context" in --json), the
prompt echoed before its continuation, and a file that is not what its name says."""

import json

import pytest

from conftest import TINY_SPM

LONG = "Once upon a time " * 20  # more tokens than the plan's context of 32


@pytest.fixture(scope="module")
def small_plan(tmp_path_factory):
    from llmplan.commands.cli import main

    path = tmp_path_factory.mktemp("plans") / "ctx32.plan"
    assert main(["compile", str(TINY_SPM), "--ctx", "32", "--chunk", "16", "--tune-dir", "off", "-o", str(path),
                 "--json"]) == 0
    return path


def test_a_long_prompt_fails_or_is_truncated(cli, small_plan, tmp_path):
    code, _, err = cli("run", small_plan, "-p", LONG, "-n", "2")
    assert code == 2 and err.count("\n") == 1 and "plan run --truncate" in err
    # 4 blocks: the plan's 2 hold the context, but admission wants a block of headroom beyond the prompt
    code, out, err = cli("run", small_plan, "-p", LONG, "-n", "2", "--truncate", "--json", "--kv-blocks", "4")
    d = json.loads(out)
    assert code == 0 and len(d["prompt_ids"]) == 31 and d["prompt_ids"][0] == 1 and len(d["ids"]) == 1
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": LONG, "max_tokens": 1, "truncate": True}) + "\n"
                       + json.dumps({"prompt": LONG, "max_tokens": 1}) + "\n")
    code, out, _ = cli("run", small_plan, "--prompts-file", prompts, "--json", "--kv-blocks", "4")
    first, second = json.loads(out)
    assert code == 0 and len(first["prompt_ids"]) == 31 and "--truncate" in second["error"]


def test_the_context_ending_a_generation_is_said(cli, small_plan):
    code, out, err = cli("run", small_plan, "-p", "hi", "-n", "100", "--json")
    d = json.loads(out)
    assert code == 0 and d["finish_reason"] == "context" and len(d["prompt_ids"]) + len(d["ids"]) == 32
    assert f"stopped at the plan's context of 32 tokens, after {len(d['ids'])} of 100 tokens" in err
    code, out, err = cli("run", small_plan, "-p", "hi", "-n", "3", "--json")
    assert code == 0 and json.loads(out)["finish_reason"] == "length" and "context" not in err


def test_the_prompt_is_echoed(cli, small_plan):
    code, out, _ = cli("run", small_plan, "-p", "Once upon a time", "-n", "3")
    _, js, _ = cli("run", small_plan, "-p", "Once upon a time", "-n", "3", "--json")
    assert code == 0 and out == "Once upon a time" + json.loads(js)["text"] + "\n"


@pytest.mark.parametrize("verb, name, says", [("run", "text.gguf", "not a GGUF file"),
                                              ("run", "text.plan", "not a plan file"),
                                              ("eval", "text.gguf", "not a GGUF file"),
                                              ("info", "text.plan", "not a GGUF file")])
def test_a_file_is_not_what_its_name_says(cli, tmp_path, verb, name, says):
    path = tmp_path / name
    path.write_text("hello, world\n")
    extra = {"run": ["-p", "hi"], "eval": ["-f", path], "info": []}[verb]
    code, _, err = cli(verb, path, *extra)
    assert code == 2 and err.count("\n") == 1 and f"{path}: " in err and says in err
