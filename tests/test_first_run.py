"""The first `plan run MODEL.gguf` a new user types: it compiles without probing (the heuristic decides
what the tune store lacks), says so and how to measure them, says where it cached the plan; `plan tune`
then drops that plan so the next run compiles with the measured decisions. Long commands show their
phases on stderr."""

import io

from llmplan.codegen import cpu_build
from llmplan.core.console import Progress
from llmplan.core.plan_records import to_wire
from llmplan.core.planfile import read_body, read_header
from llmplan.plans import cpu_native
from llmplan.tuning import cpu_schedules

from conftest import TINY_SPM


def _tuning(plan):
    header, offset = read_header(plan)
    return to_wire(read_body(plan, offset).tune.decisions)


def test_a_first_run_probes_nothing_and_says_how_to_tune(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("LLMPLAN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("LLMPLAN_TUNE_DIR", str(tmp_path / "store"))
    probes = {name: getattr(cpu_schedules, name) for name in ("probe_panels", "probe_schedules")}
    for name in probes:
        monkeypatch.setattr(cpu_schedules, name, lambda *a: (_ for _ in ()).throw(AssertionError("probed")))
    run = ("run", TINY_SPM, "-p", "Once upon a time", "-n", "2", "--ctx", "256")
    code, _, err = cli(*run)
    [plan] = (tmp_path / "cache" / "plans").iterdir()
    assert code == 0 and f"cached as {plan}\n" in err
    simd = cpu_build.available() and len(cpu_native.isa_candidates()) > 1  # the SIMD path: plan tune measures it
    assert f"{4 + simd} tuning decisions by heuristic: plan tune {TINY_SPM} measures them" in err
    assert not (tmp_path / "store").exists()
    assert {d["provenance"] for d in _tuning(plan).values()} == {
        "heuristic: no entry (not probed)", *["heuristic: no entry (plan tune measures it)"] * simd}
    code, _, err = cli(*run)
    assert code == 0 and err == ""  # the cached plan
    plan.write_bytes(b"LLMPLAN\0" + (99).to_bytes(4, "little") + bytes(8))  # as a later llmplan's
    code, _, err = cli(*run)
    assert code == 0 and "compiled" in err  # compiled again, not refused
    for name, probe in probes.items():
        monkeypatch.setattr(cpu_schedules, name, probe)
    code, _, _ = cli("tune", TINY_SPM, "--ctx", "256", "--round-ms", "0.5")
    assert code == 0 and not plan.exists()
    code, _, err = cli(*run)
    assert code == 0 and "compiled" in err and "heuristic" not in err
    assert all(d["provenance"].startswith(("measured", "tie")) for d in _tuning(plan).values())


def test_compile_shows_its_phases(cli, tmp_path):
    code, _, err = cli("compile", TINY_SPM, "--ctx", "256", "--tune-dir", "off", "-o", tmp_path / "t.plan")
    assert code == 0 and err.splitlines() == ["plan compile: trace, fuse and lower 3 phases",
                                              "plan compile: choose kernels", f"plan compile: write {tmp_path / 't.plan'}"]


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_on_a_terminal_and_off_it():
    tty, log = _Terminal(), io.StringIO()
    for stream in (tty, log):
        p = Progress("plan x", stream)
        with p.phase("build"):
            if stream.isatty():
                stream.write("\r probing 1/2")  # tqdm's bar (a terminal only) drawing over the line
        p.note("done")
    assert log.getvalue() == "plan x: build\nplan x: done\n"
    first, second = tty.getvalue().split("\n")[:2]
    assert first.startswith("plan x: build ...\r probing 1/2\r\x1b[Kplan x: build (") and first.endswith(" s)")
    assert second == "plan x: done"
