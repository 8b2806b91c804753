"""`plan compile --device <GPU target>` on a machine without a GPU: every launch gets compiled kernels
that pass the build gates, members are chosen by the shape filter with the reason for each prune,
scratch buffers are placed without aliasing, every kernel has its NumPy twin, and `plan inspect` shows
manifests and sources. Generated sources for tiny-llama3-bpe are compared with goldens."""

import dataclasses
import json
import re
from pathlib import Path

import pytest

from llmplan.codegen import families
from llmplan.codegen.build import BuildError
from llmplan.codegen.kernel import Context
from llmplan.codegen.targets import TARGETS
from llmplan.core.console import human_bytes
from llmplan.core.devices import OFFLINE_TARGETS
from llmplan.core.errors import InputError
from llmplan.core.op_traits import FAMILIES
from llmplan.core.plan_records import to_wire
from llmplan.core.planfile import read_body, read_header
from llmplan.core.tune_store import TuneStore, Verdict, record
from llmplan.models.info import describe
from llmplan.models.model import open_model
from llmplan.plans import select
from llmplan.plans.compile import compile_model, limits_for, lower_phases
from llmplan.runtime.numpy_kernels import KERNELS

from conftest import TINY_BPE, TINY_SPM, require_compiler


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory):
    """One kernel cache for the module: plans for several models share most kernels."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLMPLAN_CACHE", str(tmp_path_factory.mktemp("kernel-cache")))
        yield


@pytest.fixture(scope="module")
def compiled(kernel_cache, tmp_path_factory):
    """compiled(model path, target) -> (path, header, body), each plan compiled once per module."""
    plans = {}

    def get(model, target):
        require_compiler(TARGETS[target])
        if (model, target) not in plans:
            out = tmp_path_factory.mktemp("plans") / f"{model.stem}.{target}.plan"
            compile_model(open_model(model), OFFLINE_TARGETS[target], out)
            header, offset = read_header(out)
            plans[model, target] = out, to_wire(header), to_wire(read_body(out, offset))  # as the file holds them
        return plans[model, target]

    return get


def _launched(body):
    return [(ph, l, k) for ph, p in body["phases"].items() for l in p["launches"] for k in l["kernels"]]


@pytest.mark.parametrize("target", list(TARGETS))
def test_tiny_llama3_compiles_for_every_target(compiled, target):
    _, header, body = compiled(TINY_BPE, target)
    gpu = body["gpu"]
    assert header["device"]["arch"] == target and gpu["target"] == target and len(gpu["binary"]) > 1000
    names = {k["name"] for _, _, k in _launched(body)}
    assert names == set(gpu["manifests"]) == set(body["kernels"])
    for name, m in gpu["manifests"].items():
        assert m["spill_bytes"] == 0 and m["stack_bytes"] == 0, name
        assert m["wave"] == TARGETS[target].wave
    for _, launch, k in _launched(body):
        assert k["block"] == gpu["manifests"][k["name"]]["threads"]
        assert launch["provenance"].startswith("heuristic: ")
    assert all(launch["kernels"] for launch in body["phases"]["decode"]["launches"])


def _manifest(body, pattern):
    hits = {n: m for n, m in body["gpu"]["manifests"].items() if re.fullmatch(pattern, n)}
    assert hits, f"no kernel matches {pattern}: {sorted(body['gpu']['manifests'])}"
    return hits


def test_instructions_on_hopper_and_strix_halo(compiled):
    """The acceptance pairs: the Q4_K mat-vec on integer dots and 128-bit loads, the prefill tile on
    integer matrix cores (IMMA on sm_90, v_wmma on gfx1151)."""
    for target in ("sm_90", "gfx1151"):
        _, _, body = compiled(TINY_BPE, target)
        for name, m in _manifest(body, r"lp_matvec_q4_k.*").items():
            assert m["instructions"]["dot4"] > 0 and m["instructions"]["load128"] > 0, (target, name)
        for name, m in _manifest(body, r"lp_gemm_mma_.*q4_k.*").items():
            assert m["instructions"]["imma"] > 0, (target, name)
        for name, m in _manifest(body, r"lp_attention_flash_d128").items():
            assert m["instructions"]["hmma"] > 0, (target, name)


def test_cdna3_takes_the_dot_product_tile_and_row_attention(compiled):
    _, _, body = compiled(TINY_BPE, "gfx942")
    members = {l["member"] for p in body["phases"].values() for l in p["launches"]
               if l["family"] in ("matmul", "attention_prefill")}
    assert "rows" in members and any(m.startswith("dot4_64x64") for m in members)
    assert not any(n.startswith(("lp_gemm_mma", "lp_attention_flash")) for n in body["gpu"]["manifests"])


@pytest.mark.parametrize("target", ["sm_90", "gfx1151", "gfx942"])
def test_gemma3_compiles(compiled, gemma3_path, target):
    """Gemma 3: query/key norms in the rope kernel, GELU, sliding windows, head dim 256, tied head."""
    _, _, body = compiled(gemma3_path, target)
    ops = {l["op"] for _, l, _ in _launched(body)}
    assert {"norm_rope_kv", "glu_pack", "attention", "attention_partial", "tail_argmax"} <= ops
    assert all(m["spill_bytes"] == 0 for m in body["gpu"]["manifests"].values())


def test_spm_model_compiles(compiled):
    """Llama 2 (SentencePiece, GQA 2, no rope factors): every launched kernel is built, passed the gates
    and gets an argument per parameter; nothing is built that no launch runs."""
    _, _, body = compiled(TINY_SPM, "sm_90")
    manifests = body["gpu"]["manifests"]
    launched = _launched(body)
    assert {k["name"] for _, _, k in launched} == set(manifests) and body["gpu"]["binary"]
    assert all(m["instructions"] and m["spill_bytes"] == 0 for m in manifests.values())
    for _, _, k in launched:
        assert len(k["args"]) == len(body["kernels"][k["name"]]["params"]), k["name"]
    assert {l["op"] for _, l, _ in launched} >= {"rope_kv", "attention", "tail_argmax"}


def test_every_kernel_has_its_numpy_twin(compiled):
    """A GPU kernel serves a launch whose catalog family is a CPU backend kernel, its NumPy twin; every
    kernel family has both a GPU template module and a twin."""
    assert set(FAMILIES) == set(KERNELS)
    modules = {p.stem for p in Path(families.__file__).parent.glob("*.py")}
    assert set(FAMILIES) - {"matmul"} | {"matvec", "gemm"} <= modules
    for model, target in ((TINY_BPE, "sm_90"), (TINY_BPE, "gfx1151")):
        for _, launch, k in _launched(compiled(model, target)[2]):
            assert launch["family"] in KERNELS, (k["name"], launch["family"])


def test_cache_kernels_read_through_the_page_table(compiled):
    """Every kernel on the K/V cache gets the page table and the paged cache's symbols (pages per
    sequence, blocks), and every symbol a kernel's grid or scalars name is one its phase binds."""
    for target in ("sm_90", "gfx942"):  # flash and the row member for prefill attention
        _, _, body = compiled(TINY_BPE, target)
        for name, phase in body["phases"].items():
            for launch in phase["launches"]:
                for k in launch["kernels"]:
                    symbols = {a[kind] for a in k["args"] for kind in ("i32", "f32") if isinstance(a.get(kind), str)}
                    symbols |= {g[0] for g in k["grid"] if isinstance(g, list)}
                    assert symbols <= set(phase["dims"]), (target, name, k["name"], symbols - set(phase["dims"]))
                    if {"cache": 1} in k["args"]:
                        assert {"state": "pages"} in k["args"], (target, k["name"])
                        assert {"i32": "pages"} in k["args"] and {"i32": "blocks"} in k["args"], (target, k["name"])


def _intervals(phase):
    """(first, last) launch index of each arena buffer, as the planner defines liveness."""
    live = {}
    for i, l in enumerate(phase["launches"]):
        for r in l["args"] + l["outs"]:
            if "buf" in r:
                live.setdefault(r["buf"], [i, i])[1] = i
    for r in phase["outputs"].values():
        if "buf" in r:
            live[r["buf"]][1] = len(phase["launches"])
    return live


def test_scratch_buffers_alias_nothing_live(compiled):
    _, _, body = compiled(TINY_BPE, "sm_90")
    seen = 0
    for phase in body["phases"].values():
        live = _intervals(phase)
        for i, launch in enumerate(phase["launches"]):
            regions = {r["scratch"]: (r["offset"], r["offset"] + r["bytes"])
                       for k in launch["kernels"] for r in k["args"] if "scratch" in r}
            seen += len(regions)
            busy = [(b["offset"], b["offset"] + b["bytes"]) for j, b in enumerate(phase["buffers"])
                    if live[j][0] <= i <= live[j][1]] + list(regions.values())
            for name, (lo, hi) in regions.items():
                assert 0 <= lo < hi <= body["arena_bytes"]
                assert sum(1 for a, b in busy if a < hi and lo < b) == 1, (name, i)  # overlaps only itself
    assert seen >= 3  # the tail's two, and a split-K workspace in prefill


def test_shape_filter_prunes_with_the_rule_and_limit(kernel_cache, tmp_path):
    require_compiler(TARGETS["sm_90"])
    small = dataclasses.replace(OFFLINE_TARGETS["sm_90"], smem_per_block_optin=38 * 1024)
    compile_model(open_model(TINY_BPE), small, tmp_path / "t.plan")
    header, offset = read_header(tmp_path / "t.plan")
    gemm = [l for l in to_wire(read_body(tmp_path / "t.plan", offset))["phases"]["prefill"]["launches"]
            if l["op"].startswith("matmul") and l.get("pruned")]
    assert gemm
    for launch in gemm:
        assert not launch["member"].startswith("mma_128x128")
        assert launch["provenance"] == "heuristic: no entry, first member that fits, in the family's order"
        (why,) = [w for m, w in launch["pruned"].items() if m.startswith("mma_128x128")]
        assert re.search(r"lp_gemm_mma_128x128\w*: \d+ bytes of shared memory over the 38912-byte per-block limit "
                         r"of sm_90", why), why
    narrow = dataclasses.replace(OFFLINE_TARGETS["sm_90"], max_threads_per_block=128)
    with pytest.raises(BuildError, match=r"no member of \w+ fits sm_90: \w+: lp_\w+: 256 threads over the "
                                         r"128-thread per-block limit of sm_90"):
        compile_model(open_model(TINY_BPE), narrow, tmp_path / "n.plan")
    tiny = dataclasses.replace(small, smem_per_block_optin=1024)
    with pytest.raises(BuildError, match=r"no member of \w+ fits sm_90: \w+: lp_\w+: \d+ bytes of shared memory over "
                                         r"the 1024-byte per-block limit of sm_90"):
        compile_model(open_model(TINY_BPE), tiny, tmp_path / "u.plan")


def test_a_plan_larger_than_the_device_is_refused(kernel_cache, tmp_path):
    """Weights in their device layouts, the K/V cache and the arena must fit the device's memory; the
    error names the parts and what shrinks the cache."""
    require_compiler(TARGETS["sm_90"])
    small = dataclasses.replace(OFFLINE_TARGETS["sm_90"], memory_gib=0.028)  # 28.7 MiB
    with pytest.raises(InputError, match=r"the plan needs 0\.03 GiB on NVIDIA H100 SXM5, which has 0\.028 GiB "
                                         r"\(weights 0\.02, K/V cache 0\.01 for 256 blocks, arena 0\.01\): a smaller "
                                         r"--ctx or --max-seqs shrinks the K/V cache"):
        compile_model(open_model(TINY_BPE), small, tmp_path / "big.plan", ctx=4096)
    compile_model(open_model(TINY_BPE), small, tmp_path / "fits.plan", ctx=512)
    header, offset = read_header(tmp_path / "fits.plan")
    memory = read_body(tmp_path / "fits.plan", offset).device_memory
    assert memory["total"] == memory["weights"] + memory["kv_cache"] + memory["arena"] <= 0.028 * 2**30
    assert memory["kv_cache"] == 2 * 2 * 32 * 16 * 256 * 2  # layers, K and V, blocks, positions, kv features, f16


def test_inspect_kernels_and_source(compiled, cli, tmp_path):
    path, _, body = compiled(TINY_BPE, "gfx1151")
    code, out, _ = cli("inspect", path)
    want = describe(TINY_BPE)["decode_bytes_per_token"]
    assert code == 0 and f"a decode step reads {human_bytes(want)} of weights: at the device's peak 256 GB/s, " \
                         f"{want / 256e6:.3f} ms a step at least" in out
    assert re.search(r"memory   [\d.]+ MiB on the device, of its 96.0 GiB: weights [\d.]+ MiB, kv cache", out)
    code, out, _ = cli("inspect", path, "--kernels")
    assert code == 0 and out.startswith(f"{len(body['gpu']['manifests'])} kernels for gfx1151")
    for name, m in body["gpu"]["manifests"].items():
        row = next(ln for ln in out.splitlines() if ln.startswith(name + " "))
        assert row.split()[1:5] == [str(m["threads"]), str(m["registers"]), "0", str(m["shared_bytes"])]
    code, out, _ = cli("inspect", path, "--kernels", "--json")
    assert json.loads(out)["manifests"] == body["gpu"]["manifests"]
    code, out, _ = cli("inspect", path, "--source", "lp_matvec_q4_k_seg3_res0_c1")
    assert code == 0 and out.startswith("// ---- matvec.cu ----\n")
    assert re.search(r"// ---- entry point ----\nLP_KERNEL void __launch_bounds__\(128\) lp_matvec_q4_k_seg3_res0_c1\(",
                     out)
    code, out, err = cli("inspect", path, "--source", "lp_nope")
    assert code != 0 and "no kernel named 'lp_nope' in this plan" in err
    code, out, _ = cli("inspect", path)
    assert code == 0 and "planar (version 1): " in out and "held on the device" in out and "--device emu" in out
    code, out, _ = cli("compile", TINY_BPE, "--device", "gfx1151", "-o", tmp_path / "g.plan", "--tune-dir", "off")
    assert code == 0 and f"{len(body['gpu']['manifests'])} kernels from the kernel cache (" in out  # built above
    code, _, err = cli("compile", TINY_BPE, "-o", tmp_path / "c.plan", "--tune-dir", "off")
    assert code == 0, err
    code, out, _ = cli("inspect", tmp_path / "c.plan", "--kernels")  # the compiled CPU kernels' parameters
    assert code == 0 and "kernels for the CPU, SIMD path" in out and "lp_cpu_matmul_" in out


def _generated(body) -> str:
    """What codegen generated for a plan: the sources it inlined, the entry points, and each launch's
    kernels with grid, block and arguments (decode, then prefill)."""
    src = body["gpu"]["source"]
    files = list(dict.fromkeys(re.findall(r"^// ---- (\S+) ----$", src, re.M)))
    entries = src.split("// ---- entry-points ----\n", 1)[1]
    lines = [f"// target {body['gpu']['target']}; sources: {', '.join(f for f in files if f != 'entry-points')}",
             entries.rstrip("\n")]
    for phase in ("decode", "prefill"):
        lines.append(f"// ---- launches: {phase} ----")
        for launch in body["phases"][phase]["launches"]:
            for k in launch["kernels"]:
                args = " ".join(json.dumps(a, sort_keys=True, separators=(",", ":")) for a in k["args"])
                lines.append(f"{launch['op']} [{launch['member']}] {k['name']} grid {k['grid']} block {k['block']} "
                             f"smem {k['smem']}: {args}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("target", ["sm_90", "gfx1151"])
def test_generated_sources_golden(compiled, golden, target):
    golden(f"codegen/tiny-llama3-bpe.{target}.txt", _generated(compiled(TINY_BPE, target)[2]))


def test_the_tune_store_decides_gpu_members(kernel_cache, tmp_path):
    """An entry under sm_90's tune key, a launch's decision key and the build id of its candidates'
    sources puts its winner first, with the entry in the provenance; entries measured on another device
    or another build are ignored (the heuristic decides, and says so)."""
    require_compiler(TARGETS["sm_90"])
    device, model = OFFLINE_TARGETS["sm_90"], open_model(TINY_BPE)
    phases, _, _, table = lower_phases(model, device, limits_for(model, None, 256, 1))
    p = phases["prefill"]
    ctx = Context(p.buffers, table, TARGETS["sm_90"], p.dims, device.multiprocessors)
    store = TuneStore(tmp_path / "store")

    def entry(launch, device_key=device.tune_key, build=None):
        cands = select.members(launch, ctx)
        names = list(cands)
        bid = build or select.build_id(tuple(ln.kernel for lns in cands.values() for ln in lns))
        v = Verdict({n: 2e-4 for n in names} | {names[1]: 1e-4}, {}, names[0], names[1], 1.0, False, 10, 5)
        store.save(record(v, device_key, select.decision_key(launch, ctx), bid))
        return select.decision_key(launch, ctx), names[1]  # the family's second: not the heuristic's

    seg, res = (next(l for l in p.launches if l.op == op) for op in ("matmul_segmented", "matmul_residual"))
    key, pick = entry(seg)
    entry(res, device_key=OFFLINE_TARGETS["sm_89"].tune_key)
    entry(res, build="0" * 16)
    compile_model(model, device, tmp_path / "t.plan", tune=store)
    header, offset = read_header(tmp_path / "t.plan")
    launches = to_wire(read_body(tmp_path / "t.plan", offset))["phases"]["prefill"]["launches"]
    measured = [l for l in launches if l.get("decision") == key]
    assert measured and pick == "mma_64x128"
    for launch in measured:
        assert launch["member"] == pick and launch["provenance"].startswith("measured: entry ")
    ignored = [l for l in launches if l.get("decision") == select.decision_key(res, ctx)]
    assert ignored and all(l["provenance"].startswith("heuristic: no entry") for l in ignored)
