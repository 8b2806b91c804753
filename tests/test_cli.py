"""`plan info` and `plan make-model` from the command line, including bad input: one line on stderr,
exit code 2, no traceback."""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys

import pytest

from llmplan.commands.cli import main

from conftest import TINY_BPE, TINY_SPM, VOCAB_SPM


def test_info_text(cli):
    code, out, err = cli("info", TINY_SPM)
    assert code == 0 and err == ""
    assert 'llama "tiny-llama-spm"' in out
    assert "layers 4, dim 512, heads 8 x 64, kv heads 2, ffn 1536, vocab 3000" in out
    assert "Q4_K         25" in out and "Q6_K          5" in out
    assert "decode reads 8500992 bytes" in out


def test_info_json(cli, gemma3_path):
    code, out, _ = cli("info", gemma3_path, "--json")
    d = json.loads(out)
    assert code == 0 and d["architecture"] == "gemma3"
    c = d["config"]
    assert (c["n_layers"], c["dim"], c["n_heads"], c["head_dim"], c["n_kv_heads"], c["vocab_size"], c["tied_output"]) \
        == (18, 640, 4, 256, 1, 262144, True)
    assert d["tokenizer"] == {"model": "llama", "kind": "SentencePiece", "pre": "default", "tokens": 262144,
                              "merges": 0, "chat_template": False}
    assert set(d["formats"]) == {"Q8_0", "Q5_0", "Q4_K", "Q6_K", "F32"}
    assert d["tensor_count"] == 236
    # tied head: every byte of every tensor plus the one gathered embedding row (640 Q8_0 values)
    assert d["decode_bytes_per_token"] == d["tensor_bytes"] + 640 // 32 * 34


def test_info_bpe_and_vocab_only(cli):
    code, out, _ = cli("info", TINY_BPE, "--json")
    d = json.loads(out)
    assert d["tokenizer"]["kind"] == "byte-level BPE" and d["tokenizer"]["pre"] == "llama-bpe"
    assert d["config"]["rope_freqs"] is True
    code, out, _ = cli("info", VOCAB_SPM)
    assert code == 0 and "tensors: none (vocabulary-only file)" in out


def _one_line_error(cli, *argv, match):
    code, out, err = cli(*argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("plan: error: ") and match in err, err
    assert "Traceback" not in err


def test_bad_files(cli, tmp_path):
    _one_line_error(cli, "info", tmp_path / "missing.gguf", match="No such file or directory")
    _one_line_error(cli, "info", tmp_path, match="Is a directory")
    text = tmp_path / "notes.txt"
    text.write_text("hello world, this is not a model\n")
    _one_line_error(cli, "info", text, match="not a GGUF file")
    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(TINY_SPM.read_bytes()[:5000])
    _one_line_error(cli, "info", trunc, match="truncated")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    _one_line_error(cli, "info", empty, match="not a GGUF file")


def test_usage_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["info"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "required" in err
    with pytest.raises(SystemExit) as e:
        main(["make-model", "--preset", "nope"])
    assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_make_model(cli, tmp_path):
    out_path = tmp_path / "tiny.gguf"
    code, out, _ = cli("make-model", "--preset", "tiny-llama", "-o", out_path)
    assert code == 0 and out.startswith(f"wrote {out_path}: tiny-llama Q4_K_M, 21 tensors")
    assert "random weights: its text is gibberish" in out.splitlines()[0]
    code, out, _ = cli("info", out_path, "--json")
    assert json.loads(out)["config"]["n_layers"] == 2
    _one_line_error(cli, "make-model", "--preset", "tiny-llama", "-o", out_path, match="exists; pass --force")
    seed0 = out_path.read_bytes()
    code, _, _ = cli("make-model", "--preset", "tiny-llama", "-o", out_path, "--force", "--seed", "3")
    seed3 = out_path.read_bytes()
    assert code == 0 and len(seed3) == len(seed0) and seed3 != seed0  # overwritten, with other weights
    code, _, _ = cli("make-model", "--preset", "tiny-llama", "-o", out_path, "--force", "--seed", "3")
    assert code == 0 and out_path.read_bytes() == seed3  # a seed gives the same file
    _one_line_error(cli, "make-model", "--preset", "tiny-llama", "-o", tmp_path, match="is a directory")
    _one_line_error(cli, "make-model", "--preset", "tiny-llama", "--set", "dim", "-o", tmp_path / "x.gguf",
                    match="--set expects FIELD=VALUE")
    _one_line_error(cli, "make-model", "--preset", "tiny-llama", "--set", "n_heads=3", "-o", tmp_path / "x.gguf",
                    match="does not divide")


def test_make_model_dry_run_json(cli, tmp_path):
    code, out, _ = cli("make-model", "--preset", "llama3-8b", "--dry-run", "--json", "-o", tmp_path / "8b.gguf")
    d = json.loads(out)
    assert code == 0 and not d["written"] and not (tmp_path / "8b.gguf").exists()
    assert d["formats"]["Q6_K"]["count"] == 33 and d["formats"]["Q4_K"]["count"] == 193
    assert d["config"]["vocab_size"] == 128256 and len(d["tensors"]) == 292


def test_console_script_installed(tmp_path):
    (entry,) = importlib.metadata.entry_points(group="console_scripts", name="plan")
    assert entry.value == "llmplan.commands.cli:main"
    script = shutil.which("plan", path=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    assert script, "the `plan` console script is not on PATH"
    r = subprocess.run([script, "info", str(tmp_path / "nope.gguf")], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("plan: error:") and r.stdout == ""
