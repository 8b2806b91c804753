"""Plan-file faults: another device, another model, truncation, flipped bits, another format version,
not a plan at all. Each is one clear line on stderr and exit code 2, saying what to run instead."""

import dataclasses
import struct

import pytest

from llmplan.core.devices import OFFLINE_TARGETS
from llmplan.core.plan_records import to_wire
from llmplan.core.planfile import FORMAT_VERSION, read_body, read_header, write_plan

from conftest import TINY_BPE, TINY_SPM
from cpu_native import needs_compiler


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    from llmplan.core.devices import local_cpu
    from llmplan.models.model import open_model
    from llmplan.plans.compile import compile_model

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
    """A plan for a GPU on a machine without one (CuPy missing, or no device)."""
    header, offset = read_header(plan)
    other = tmp_path / "h200.plan"
    write_plan(other, dataclasses.replace(header, device=OFFLINE_TARGETS["sm_90-h200"]), read_body(plan, offset))
    _fails(cli, other, "compiled for sm_90 (cuda:sm_90", "--device cuda", "--device emu",
                 f"recompile with: plan compile {TINY_SPM} --device cpu")


def test_other_model_file(cli, plan):
    code, out, err = cli("run", plan, "-p", "hi", "--model", TINY_BPE)
    assert code == 2 and "compiled from another model file than" in err and "recompile with: plan compile" in err


def test_model_gone(cli, plan, tmp_path):
    header, offset = read_header(plan)
    moved = tmp_path / "moved.plan"
    gone = dataclasses.replace(header.model, path=str(tmp_path / "gone.gguf"))
    write_plan(moved, dataclasses.replace(header, model=gone), read_body(plan, offset))
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


def _edit(plan, tmp_path, change):
    """A copy of the plan whose body `change(body)` edited in its wire form (checksums recomputed: a plan
    that is well-formed msgpack but does not hold together)."""
    header, offset = read_header(plan)
    body = to_wire(read_body(plan, offset))
    change(body)
    out = tmp_path / "edited.plan"
    write_plan(out, header, body)
    return out


def _launch(body, phase="decode", i=2):
    return body["phases"][phase]["launches"][i]


@pytest.mark.parametrize("change,where,problem", [
    (lambda b: _launch(b)["kernels"][0]["args"].__setitem__(1, {"foo": 1}),
     "phases.decode.launches[2].kernels[0].args[1]", "unknown argument kind 'foo'"),
    (lambda b: _launch(b).pop("kernels"), "phases.decode.launches[2].kernels", "a launch makes at least one kernel call"),
    (lambda b: b["phases"]["prefill"]["buffers"][3].__setitem__("bytes", 12),
     "phases.prefill.buffers[3].bytes", "12 bytes, but"),
    (lambda b: b["weights"]["blk.0.attn_q.weight"]["layouts"]["rows16"].__setitem__("bytes", 7),
     "weights.blk.0.attn_q.weight.layouts.rows16.bytes", "7 bytes, but a Q4_K"),
    (lambda b: b["weights"]["blk.0.attn_q.weight"]["layouts"]["rows16"].__setitem__("version", 99),
     "weights.blk.0.attn_q.weight.layouts.rows16.version", "layout version 99"),
    (lambda b: b["cpu"].pop("source"), "cpu", "missing field 'source'"),
    (lambda b: b["cpu"].__setitem__("kernels", "fortran"), "cpu.kernels", "'fortran' is not one of native, numpy"),
    (lambda b: b["cpu"].__setitem__("kernels", "numpy"), "phases.prefill.launches[0].kernels[0].name",
     "lp_cpu_embed_q4_k in a plan whose cpu.kernels is numpy"),
    (lambda b: _launch(b)["kernels"][0].__setitem__("name", "lp_cpu_nope"),
     "phases.decode.launches[2].kernels[0].name", "kernel lp_cpu_nope is not in the plan's kernel table"),
    (lambda b: _launch(b)["kernels"][0]["args"].__setitem__(0, {"buf": 999}),
     "phases.decode.launches[2].kernels[0].args[0]", "buffer 999 of"),
    (lambda b: b["phases"]["decode"]["state"].pop("pos"), "phases.decode.state", "missing step-state input 'pos'"),
    (lambda b: b["cache"].__setitem__("dtype", "f32"), "cache.dtype", "the K/V cache is f16"),
    (lambda b: b["phases"]["decode"]["buffers"][0].__setitem__("shape", ["rows", "nope"]),
     "phases.decode.buffers[0].shape[1]", "unknown dimension 'nope'"),
    (lambda b: _launch(b).__setitem__("op", "frobnicate"), "phases.decode.launches[2].op", "unknown op"),
])
@needs_compiler  # the plan's calls are the compiled kernels
def test_inconsistent_body(cli, plan, tmp_path, change, where, problem):
    """A body that decodes but does not hold together is refused on read, naming the field, for run
    and inspect alike."""
    bad = _edit(plan, tmp_path, change)
    for verb in ("run", "inspect"):
        _fails(cli, bad, "the plan's body is inconsistent", f"{where}: {problem}", "recompile with", verb=verb)


def test_gpu_plan_kernel_arguments_are_checked_against_their_parameters(cli, tmp_path):
    from llmplan.models.model import open_model
    from llmplan.plans.compile import compile_model

    gpu = tmp_path / "g.plan"
    compile_model(open_model(TINY_SPM), OFFLINE_TARGETS["gfx1100"], gpu, ctx=256, chunk=64)

    def scalar_for_pointer(b):
        _launch(b)["kernels"][0]["args"][0] = {"i32": 3}

    def one_argument_short(b):
        _launch(b)["kernels"][0]["args"].pop()

    _fails(cli, _edit(gpu, tmp_path, scalar_for_pointer), "phases.decode.launches[2].kernels[0].args[0]: parameter 0 "
           "of lp_matvec", "is a pointer", verb="inspect")
    _fails(cli, _edit(gpu, tmp_path, one_argument_short), "phases.decode.launches[2].kernels[0].args: ",
           "arguments for the", verb="inspect")
