"""`plan tokenize`, `plan detokenize` and `plan chat-template`, including bad input: one line on stderr,
exit code 2, no traceback."""

import json

import pytest

from llmplan.commands.cli import main

from conftest import TINY_BPE, TINY_SPM, VOCAB_BPE, VOCAB_SPM


def test_tokenize_json_follows_add_bos(cli):
    code, out, err = cli("tokenize", VOCAB_SPM, "Hello world", "--json")
    assert code == 0 and err == ""
    assert json.loads(out) == {"ids": [1, 15043, 3186], "pieces": ["<s>", " Hello", " world"]}
    code, out, _ = cli("tokenize", VOCAB_SPM, "Hello world", "--json", "--no-bos")
    assert json.loads(out)["ids"] == [15043, 3186]


def test_tokenize_special_only_when_asked(cli):
    text = "hi<|eot_id|>"
    _, out, _ = cli("tokenize", VOCAB_BPE, text, "--json", "--special")
    assert json.loads(out) == {"ids": [128000, 6151, 128009], "pieces": ["<|begin_of_text|>", "hi", "<|eot_id|>"]}
    _, out, _ = cli("tokenize", VOCAB_BPE, text, "--json")
    assert 128009 not in json.loads(out)["ids"]


def test_tokenize_text_table(cli):
    code, out, _ = cli("tokenize", TINY_BPE, "Hello world")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["id", "piece"] and lines[1].split() == ["0", "'<|begin_of_text|>'"]


def test_detokenize(cli):
    code, out, err = cli("detokenize", VOCAB_BPE, 128000, 9906, 1917, 128009)
    assert (code, out, err) == (0, "Hello world\n", "")
    _, out, _ = cli("detokenize", VOCAB_BPE, 128000, 9906, 1917, 128009, "--special")
    assert out == "<|begin_of_text|>Hello world<|eot_id|>\n"
    _, out, _ = cli("detokenize", VOCAB_SPM, 1, 15043, 3186, "--json")
    assert json.loads(out) == {"text": "Hello world"}


def test_chat_template(cli, tmp_path):
    messages = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi"},
                {"role": "user", "content": "Bye"}]
    f = tmp_path / "m.json"
    f.write_text(json.dumps(messages))
    code, out, err = cli("chat-template", TINY_SPM, "--messages", f)
    assert code == 0 and err == ""
    assert out == ("<s><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>assistant\nHi<end_of_turn>\n"
                   "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    f.write_text(json.dumps({"messages": messages}))
    _, out, _ = cli("chat-template", VOCAB_BPE, "--messages", f, "--json", "--no-generation-prompt")
    assert json.loads(out) == {"prompt": "user: Hello\nassistant: Hi\nuser: Bye\n"}


def _one_line_error(cli, *argv, match):
    code, out, err = cli(*argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("plan: error: ") and match in err, err
    assert "Traceback" not in err


def test_bad_input(cli, tmp_path):
    _one_line_error(cli, "detokenize", TINY_SPM, 3000, match="token id 3000 is not in the vocabulary")
    _one_line_error(cli, "tokenize", TINY_SPM, "a\udcffb", match="not valid UTF-8")
    _one_line_error(cli, "tokenize", tmp_path / "missing.gguf", "x", match="missing.gguf")
    bad = tmp_path / "m.json"
    bad.write_text("[{]")
    _one_line_error(cli, "chat-template", TINY_SPM, "--messages", bad, match="not valid JSON")
    bad.write_text(json.dumps([{"role": "user", "content": "x"}]))
    _one_line_error(cli, "chat-template", TINY_SPM, "--messages", tmp_path / "none.json", match="none.json")
    notgguf = tmp_path / "x.gguf"
    notgguf.write_bytes(b"nope")
    _one_line_error(cli, "tokenize", notgguf, "x", match="not a GGUF file")


@pytest.mark.parametrize("argv", [["detokenize", "m.gguf", "seven"], ["tokenize", "m.gguf"],
                                  ["chat-template", "m.gguf"]])
def test_usage_errors(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
