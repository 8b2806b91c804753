"""Plan-file faults: another device, another model, truncation, flipped bits, another format version,
not a plan at all. Each is one clear line on stderr and exit code 2, saying what to run instead."""

import struct

import pytest

from conftest import TINY_BPE, TINY_SPM
from llmplan.plans.devices import OFFLINE_TARGETS
from llmplan.plans.planfile import FORMAT_VERSION, read_body, read_header, write_plan


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    from llmplan.models.model import open_model
    from llmplan.plans.compile import compile_model
    from llmplan.plans.devices import local_cpu

    out = tmp_path_factory.mktemp("plan") / "spm.plan"
    compile_model(open_model(TINY_SPM), local_cpu(), out, ctx=256, chunk=64)
    return out


def _fails(cli, plan_path, *match, verb="run"):
    argv = ("run", plan_path, "-p", "hi", "-n", "1") if verb == "run" else ("inspect", plan_path)
    code, out, err = cli(*argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    for m in match:
        assert m in err, err
    return err


def test_good_plan_runs_and_inspects(cli, plan):
    code, out, _ = cli("run", plan, "-p", "Once upon a time", "-n", "3", "--json")
    assert code == 0 and '"finish_reason": "length"' in out
    code, out, _ = cli("inspect", plan)
    assert code == 0 and "context 256, prefill chunk 64" in out


def test_wrong_device(cli, plan, tmp_path):
    header, offset = read_header(plan)
    other = tmp_path / "h200.plan"
    write_plan(other, header | {"device": OFFLINE_TARGETS["sm_90-h200"].to_dict()}, read_body(plan, offset))
    _fails(cli, other, "compiled for sm_90 (cuda:sm_90", "this device is cpu:",
                 f"recompile with: plan compile {TINY_SPM} --device cpu")


def test_other_model_file(cli, plan):
    code, out, err = cli("run", plan, "-p", "hi", "--model", TINY_BPE)
    assert code == 2 and "compiled from another model file than" in err and "recompile with: plan compile" in err


def test_model_gone(cli, plan, tmp_path):
    header, offset = read_header(plan)
    moved = tmp_path / "moved.plan"
    write_plan(moved, header | {"model": header["model"] | {"path": str(tmp_path / "gone.gguf")}}, read_body(plan, offset))
    _fails(cli, moved, "gone.gguf, is not there: pass --model PATH")


@pytest.mark.parametrize("keep", [0, 7, 15, 40, -33, -1])
def test_truncated(cli, plan, tmp_path, keep):
    data = plan.read_bytes()
    cut = tmp_path / "cut.plan"
    cut.write_bytes(data[:keep] if keep >= 0 else data[:len(data) + keep])
    err = _fails(cli, cut)
    assert "recompile" in err or "not a plan file" in err


def test_bit_flips_in_the_header(cli, plan, tmp_path):
    data = bytearray(plan.read_bytes())
    (hlen,) = struct.unpack("<I", data[12:16])
    for pos in range(16, 16 + hlen, max(1, hlen // 25)):
        for bit in (0, 5):
            flipped = bytearray(data)
            flipped[pos] ^= 1 << bit
            bad = tmp_path / "flip.plan"
            bad.write_bytes(bytes(flipped))
            _fails(cli, bad, "header is corrupt (checksum mismatch)", verb="inspect")


def test_bit_flip_in_the_body(cli, plan, tmp_path):
    data = bytearray(plan.read_bytes())
    data[len(data) // 2] ^= 0x10
    bad = tmp_path / "flip.plan"
    bad.write_bytes(bytes(data))
    _fails(cli, bad, "body is corrupt (checksum mismatch)")


@pytest.mark.parametrize("version,word", [(FORMAT_VERSION + 1, "newer"), (0, "older")])
def test_other_format_version(cli, plan, tmp_path, version, word):
    data = bytearray(plan.read_bytes())
    data[8:12] = struct.pack("<I", version)
    bad = tmp_path / "v.plan"
    bad.write_bytes(bytes(data))
    _fails(cli, bad, f"plan format {version} was written by {'a' if word == 'newer' else 'an'} {word} llmplan",
           f"reads format {FORMAT_VERSION}", "recompile with")


def test_not_a_plan(cli, tmp_path):
    junk = tmp_path / "junk.plan"
    junk.write_bytes(b"hello, this is not a plan at all")
    _fails(cli, junk, "not a plan file")
