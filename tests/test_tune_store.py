"""The tune store and the probe protocol: entries are believed only for their device key, decision
key and build id; bad files are reported, never raised; probes reject wrong candidates and call small
leads ties."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.core import tune_store
from llmplan.core.tune_store import TuneStore, Verdict, record
from llmplan.tuning import probes
from llmplan.tuning.probes import decide, measure

KEYS = ("cpu:x86_64:c2:avx2", "cpu:matmul:k64:n32:rows1", "b1d")


def _entry(winner="b", default="a", keys=KEYS):
    v = Verdict({"a": 2e-3, "b": 1e-3}, {"c": "wrong"}, default, winner, 1.0, False, 3, 5)
    return record(v, *keys)


def test_an_entry_is_found_only_under_its_own_keys(tmp_path):
    store = TuneStore(tmp_path)
    eid = store.save(_entry())
    hit = store.load(*KEYS)
    assert hit.id == eid and hit.entry["winner"] == "b" and hit.why == ""
    for other in [("cpu:x86_64:c16:avx512_icl", *KEYS[1:]), (KEYS[0], "cpu:matmul:k64:n32:rows8", KEYS[2]),
                  (*KEYS[:2], "another-build")]:
        assert store.load(*other).why == "missing"  # another name: never even read
    # the same file under another key's name (copied from another machine, or by hand) is still ignored
    for other, why in [(("cpu:x86_64:c16:avx512_icl", *KEYS[1:]), "ignored: measured on another device"),
                       ((*KEYS[:2], "another-build"), "ignored: measured another kernel build"),
                       ((KEYS[0], "cpu:matmul:k64:n32:rows8", KEYS[2]), "ignored: an entry for another decision")]:
        os.link(store.path(eid), store.path(TuneStore.entry_id(*other)))
        look = store.load(*other)
        assert look.entry is None and look.why.startswith(why), look.why
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("content, why", [
    (b"", "corrupt (not JSON"), (b'{"format": 1, "device_k', "corrupt (not JSON"), (b"\xff\xfe garbage", "corrupt (not JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "corrupt (not JSON"), (b"[1, 2]", "corrupt (not a format-1"),
    (b" " * (tune_store.MAX_ENTRY_BYTES + 1), "corrupt (too large)"),
])
def test_bad_files_are_reported_not_raised(tmp_path, content, why):
    store = TuneStore(tmp_path)
    store.path(TuneStore.entry_id(*KEYS)).write_bytes(content)
    look = store.load(*KEYS)
    assert look.entry is None and look.why.startswith(why), look.why


@pytest.mark.parametrize("field, value", [("medians", {}), ("medians", {"a": -1.0, "b": 1.0}), ("medians", [1]),
                                          ("medians", {"a": float("nan"), "b": 1.0}), ("winner", "zzz"),
                                          ("winner", ["b"]), ("default", None), ("lead", "7%"), ("tie", 0)])
def test_entries_with_wrong_fields_are_corrupt(tmp_path, field, value):
    store = TuneStore(tmp_path)
    store.path(TuneStore.entry_id(*KEYS)).write_text(json.dumps(_entry() | {field: value}))
    look = store.load(*KEYS)
    assert look.entry is None and look.why.startswith("corrupt"), look.why


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=600), st.integers(0, 600))
def test_mutated_entries_never_raise(tmp_path_factory, noise, at):
    store = TuneStore(tmp_path_factory.mktemp("fuzz"))
    raw = json.dumps(_entry()).encode()
    store.path(TuneStore.entry_id(*KEYS)).write_bytes(raw[:at] + noise + raw[at + len(noise):])
    look = store.load(*KEYS)
    assert (look.entry is None) == bool(look.why)


def test_where_the_store_is(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMPLAN_TUNE_DIR", str(tmp_path / "env"))
    assert tune_store.resolve(str(tmp_path / "flag")) == tmp_path / "flag"
    assert tune_store.resolve(None) == tmp_path / "env"
    assert tune_store.resolve("off") is None
    monkeypatch.setenv("LLMPLAN_TUNE_DIR", "off")
    assert tune_store.resolve(None) is None and tune_store.resolve(str(tmp_path)) == tmp_path
    off = TuneStore.from_flag(None)
    assert not off.enabled and off.load(*KEYS).why == "off" and off.describe() == "off"
    monkeypatch.delenv("LLMPLAN_TUNE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if os.name == "posix" and os.uname().sysname == "Linux":
        assert tune_store.resolve(None) == tmp_path / "xdg" / "llmplan" / "tune"


def test_the_verdict_rules():
    assert decide({"a": 1.0, "b": 0.98}, "a") == ("a", pytest.approx(1 / 0.98 - 1), True)  # 2%: a tie
    assert decide({"a": 1.0, "b": 0.9}, "a") == ("b", pytest.approx(1 / 0.9 - 1), False)
    assert decide({"a": 0.9, "b": 1.0, "c": 0.99}, "a") == ("a", pytest.approx(0.99 / 0.9 - 1), False)
    assert decide({"a": 0.99, "b": 1.0}, "a")[2]  # the default fastest by 1%: also a tie, the default stands
    assert decide({"a": 1.0}, "a") == ("a", 0.0, False)


def test_probes_reject_a_fast_wrong_candidate_and_interleave_rounds():
    calls = []

    def cand(name, value):
        def run(i):
            calls.append((name, i))
            return value
        return run

    v = measure({"slow": cand("slow", 1), "fast_wrong": cand("fast_wrong", 2), "other": cand("other", 1)},
                lambda out: "" if out == 1 else f"got {out}", "slow", round_seconds=1e-4)
    assert v.rejected == {"fast_wrong": "got 2"} and set(v.medians) == {"slow", "other"}
    assert v.winner in ("slow", "other") and v.default == "slow"
    timed = calls[4:]  # after the three checks and the calibration call
    assert len(timed) == probes.ROUNDS * 2 * v.calls
    firsts = [timed[r * 2 * v.calls][0] for r in range(probes.ROUNDS)]
    assert firsts[:2] == ["slow", "other"]  # the order rotates round by round
    inputs = [i for _, i in timed]
    assert inputs == sorted(set(inputs))  # every call gets the next input set
    with pytest.raises(probes.ProbeError, match="the default candidate bad fails its check"):
        measure({"bad": cand("bad", 2)}, lambda out: "" if out == 1 else "wrong", "bad")
