"""The GPU drivers without a GPU: argument packing against the C ABI, the `extra` array both launch
APIs take, lazy imports, the one-line error where there is no device, and the shared StreamDriver
(staged writes, pinned reads, recording) running whole GPU plans over the emulated GPU's kernels with
the emu driver's tokens (tests/stream_emu.py). The CUDA and HIP calls themselves need the device:
the `gpu` tests (tests/test_gpu_e2e.py) and scripts/device-check."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import numpy as np
import pytest

from codegen_checks import needs_emulator
from conftest import TINY_BPE
from llmplan.core.errors import InputError
from llmplan.models.model import open_model
from llmplan.plans.compile import compile_model
from llmplan.plans.planfile import read_body, read_header, write_plan
from llmplan.plans.devices import OFFLINE_TARGETS
from llmplan.runtime import engine as engine_module
from llmplan.runtime.driver import driver_for
from llmplan.runtime.drivers.gpu import LaunchArgs, pack
from llmplan.runtime.engine import Engine
from llmplan.runtime.requests import Request
from stream_emu import EmuStreamDriver, unpack

PROMPTS = ["Once upon a time", "The capital of France is"]


@pytest.mark.parametrize("params", [("float*", "int", "const block_q4_K*", "float", "unsigned"),
                                    ("int", "float*"), ("int", "int", "int"), ("const half*",), ()])
def test_packing_lays_arguments_out_as_the_c_abi_does(params):
    """A ctypes Structure of the parameter types (the C ABI's layout) reads back every value."""
    rng = np.random.default_rng(len(params))
    values = [int(rng.integers(1, 2**31)) if t in ("int", "unsigned") else float(np.float32(rng.normal()))
              if t == "float" else int(rng.integers(1, 2**47)) * 16 for t in params]
    data = pack(params, values)
    assert unpack(params, data) == values
    with pytest.raises(ValueError):
        pack(params, values + [1])
    with pytest.raises(ValueError, match="double"):
        pack(params + ("double",), values + [1.0])


def test_the_extra_array_points_at_the_buffer_and_its_size():
    args = LaunchArgs(b"\1\2\3\4\5\6\7\x08\x09", 1, 2, 3)
    words = (ctypes.c_void_p * 5).from_address(args.address)
    assert (words[0], words[2], words[4]) == (1, 2, 3)
    assert ctypes.string_at(words[1], 9) == b"\1\2\3\4\5\6\7\x08\x09"
    assert ctypes.c_size_t.from_address(words[3]).value == 9


def test_the_gpu_drivers_import_their_libraries_lazily():
    code = ("import sys; import llmplan.runtime.drivers.cuda, llmplan.runtime.drivers.hip, llmplan.runtime.engine; "
            "bad = {'cupy', 'hip', 'rocm'} & {m.split('.')[0] for m in sys.modules}; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def _has(backend: str) -> bool:
    try:
        driver_for(backend)
    except InputError:
        return False
    return True


@pytest.fixture(scope="module")
def gpu_plan(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpu-drivers") / "sm90.plan"
    compile_model(open_model(TINY_BPE), OFFLINE_TARGETS["sm_90"], path, ctx=256, chunk=64, max_seqs=2)
    return str(path)


@pytest.mark.parametrize("backend", ["cuda", "hip"])
def test_no_device_is_one_line_and_exit_2(gpu_plan, backend):
    if _has(backend):
        pytest.skip(f"a {backend} device is here")
    with pytest.raises(InputError, match=f"--device {backend}"):
        driver_for(backend)
    if backend == "cuda":
        r = subprocess.run([sys.executable, "-m", "llmplan.plans.cli", "run", gpu_plan, "--device", "cuda", "-p", "Hi",
                            "-n", "2"], capture_output=True, text=True)
        assert r.returncode == 2 and r.stdout == "", r
        assert len(r.stderr.strip().splitlines()) == 1 and "--device cuda" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "llmplan.plans.cli", "compile", str(TINY_BPE), "--device", backend,
                        "-o", "/dev/null"], capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and backend in r.stderr, r.stderr


@needs_emulator
def test_the_stream_driver_gives_the_emulators_tokens(gpu_plan, monkeypatch):
    """Direct, replayed and pipelined, at one and two sequences, in poison mode too: the emu driver's
    tokens; weights are not kept on the host; each launch went through the packed `extra` buffer; the
    pinned buffers are reused."""
    want = [r.ids for r in Engine.load(gpu_plan, device="emu", replay=False, pipelined=False)
            .run([Request(p, 5) for p in PROMPTS])]
    drivers = []
    monkeypatch.setattr(engine_module, "driver_for", lambda name: drivers.append(EmuStreamDriver()) or drivers[-1])
    for replay, pipelined in ((False, False), (True, True)):
        engine = Engine.load(gpu_plan, device="cuda", replay=replay, pipelined=pipelined)
        assert [r.ids for r in engine.run([Request(p, 5) for p in PROMPTS])] == want
        assert (sum(b.steps for b in engine.executor.buckets.values()) > 0) == replay
        assert any(r["pipelined"] for r in engine.records) == pipelined
        assert engine.executor._keep == [] and drivers[-1].launches > 0
        assert drivers[-1].pinned_allocs < 8  # staging and read buffers are reused, step after step
    poisoned = Engine.load(gpu_plan, device="cuda", poison=True)
    assert [r.ids for r in poisoned.run([Request(p, 3) for p in PROMPTS])] == [ids[:3] for ids in want]


def test_kernels_asking_beyond_the_default_shared_memory_opt_in_at_load(gpu_plan, tmp_path, monkeypatch):
    """A launch asking more dynamic shared memory than the plan's device gives without opting in (its
    smem_per_block) makes the driver opt that kernel in, once, at load, to the most any launch asks."""
    header, offset = read_header(gpu_plan)
    body = read_body(gpu_plan, offset)
    header["device"]["smem_per_block"] = 16384  # not CUDA's usual 48 KiB: the driver reads it from the plan
    glu = {k["name"] for p in body["phases"].values() for launch in p["launches"] for k in launch["kernels"]
           if k["name"].startswith("lp_glu_pack")}
    norm = {k["name"] for p in body["phases"].values() for launch in p["launches"] for k in launch["kernels"]
            if k["name"].startswith("lp_rmsnorm")}
    for p in body["phases"].values():
        for launch in p["launches"]:
            for k in launch["kernels"]:
                k["smem"] = {True: 20480, False: 16384 if k["name"] in norm else 0}[k["name"] in glu]
    asking = tmp_path / "asks.plan"
    write_plan(asking, header, body)
    drivers = []
    monkeypatch.setattr(engine_module, "driver_for", lambda name: drivers.append(EmuStreamDriver()) or drivers[-1])
    Engine.load(str(asking), device="cuda")
    assert glu and norm and drivers[0].opted == {name: 20480 for name in glu}  # the default itself needs none


# GPU 0's properties as cupy.cuda.runtime.getDeviceProperties gives them on an H200 (CUDA 13: no clock
# fields; the memory clock comes from the device attribute), trimmed to what the planner reads and a few
# it does not
H200_PROPS = {"name": b"NVIDIA H200", "totalGlobalMem": 150754820096, "sharedMemPerBlock": 49152,
              "regsPerBlock": 65536, "warpSize": 32, "maxThreadsPerBlock": 1024, "major": 9, "minor": 0,
              "multiProcessorCount": 132, "l2CacheSize": 62914560, "sharedMemPerBlockOptin": 232448,
              "regsPerMultiprocessor": 65536, "memoryBusWidth": 6144, "memoryClockRate": 3201000}
GFX1100_PROPS = {"name": b"Radeon RX 7900 XTX", "gcnArchName": b"gfx1100:sramecc-:xnack-", "multiProcessorCount": 48,
                 "warpSize": 32, "sharedMemPerBlock": 65536, "regsPerMultiprocessor": 131072,
                 "maxThreadsPerBlock": 1024, "totalGlobalMem": 25753026560}


def test_device_facts_from_the_runtimes_properties():
    from llmplan.plans.devices import cuda_facts, hip_facts

    h200 = cuda_facts(H200_PROPS)
    assert h200.key == OFFLINE_TARGETS["sm_90-h200"].key  # a plan compiled here runs there, and back
    assert (h200.name, h200.smem_per_block, h200.smem_per_block_optin, h200.int8_matrix) == \
        ("NVIDIA H200", 48 * 1024, 227 * 1024, "mma.sync.s8")
    assert 4900 < h200.bandwidth_gbs < 4950 and h200.memory_gib == 140.4
    rdna3 = hip_facts(GFX1100_PROPS)
    assert (rdna3.arch, rdna3.wave, rdna3.smem_per_block_optin, rdna3.int8_matrix) == ("gfx1100", 32, 65536, "wmma_iu8")
    with pytest.raises(InputError, match="sm_100"):
        cuda_facts(H200_PROPS | {"major": 10})


def test_hip_calls_raise_on_an_error_and_return_their_results():
    """hip-python returns (hipError_t, results...): the HIP driver's wrapper raises with the error's text
    and hands back the results (one, several, or none), without a device (a stand-in module)."""
    import enum
    import types

    from llmplan.runtime.drivers.hip import _Checked

    class Err(enum.IntEnum):
        hipSuccess = 0
        hipErrorOutOfMemory = 2

    fake = types.SimpleNamespace(hipError_t=Err, hipGetErrorString=lambda e: (Err.hipSuccess, b"out of memory"),
                                 hipMalloc=lambda n: (Err.hipSuccess, 4096) if n < 10 else (Err.hipErrorOutOfMemory, None),
                                 hipPair=lambda: (Err.hipSuccess, 1, 2), hipSync=lambda: (Err.hipSuccess,))
    api = _Checked(fake)
    assert api.hipMalloc(8) == 4096 and api.hipPair() == (1, 2) and api.hipSync() is None
    with pytest.raises(RuntimeError, match="hipMalloc: out of memory"):
        api.hipMalloc(100)
