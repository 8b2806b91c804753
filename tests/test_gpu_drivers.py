"""The GPU drivers without a GPU: argument packing against the C ABI, the `extra` array both launch
APIs take, lazy imports, the one-line error where there is no device, and the cuda and hip drivers
themselves (runtime/drivers/cuda.py, hip.py, gpu.py) running whole GPU plans over stand-ins for CuPy and
hip-python with the libraries' own signatures and the emulated GPU's kernels, to the emu driver's tokens
(tests/stream_emu.py); the stand-ins' signatures are held against the installed CuPy and hip-python
where they import (neither needs a device to import). What the libraries do inside a call needs the
device: the `gpu` tests (tests/test_gpu_e2e.py) and scripts/device-check."""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import inspect
import re
import subprocess
import sys
import types
from unittest import mock

import numpy as np
import pytest

from llmplan.codegen.targets import TARGETS
from llmplan.core.devices import OFFLINE_TARGETS, cuda_facts, hip_facts, local_gpu
from llmplan.core.errors import InputError
from llmplan.core.planfile import read_body, read_header, write_plan
from llmplan.models.model import open_model
from llmplan.plans.compile import compile_model
from llmplan.runtime import engine as engine_module
from llmplan.runtime.driver import driver_for
from llmplan.runtime.drivers.gpu import LaunchArgs, pack
from llmplan.runtime.engine import Engine
from llmplan.runtime.requests import Request

from codegen_checks import needs_emulator
from conftest import TINY_BPE, require_compiler
from stream_emu import (
    GFX1100_PROPS,
    H200_PROPS,
    EmuCudaDriver,
    EmuDevice,
    EmuHipDriver,
    FakeError,
    Stub,
    fake_cupy,
    fake_hip,
    parse_signature,
    unpack,
)

PROMPTS = ["Once upon a time", "The capital of France is"]


@pytest.mark.parametrize("params", [("float*", "int", "const block_q4_K*", "float", "unsigned"),
                                    ("int", "float*"), ("float*", "int"), ("int", "int", "int"), ("const half*",), ()])
def test_packing_lays_arguments_out_as_the_c_abi_does(params):
    """A ctypes Structure of the parameter types (the C ABI's layout) reads back every value."""
    rng = np.random.default_rng(len(params))
    values = [int(rng.integers(1, 2**31)) if t in ("int", "unsigned") else float(np.float32(rng.normal()))
              if t == "float" else int(rng.integers(1, 2**47)) * 16 for t in params]
    data = pack(params, values)
    assert unpack(params, data) == values  # and its size has no tail padding (unpack checks)
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


@pytest.fixture(scope="module")
def hip_plan(tmp_path_factory):
    require_compiler(TARGETS["gfx1100"])
    path = tmp_path_factory.mktemp("gpu-drivers") / "gfx1100.plan"
    compile_model(open_model(TINY_BPE), OFFLINE_TARGETS["gfx1100"], path, ctx=256, chunk=64, max_seqs=2)
    return str(path)


@pytest.mark.parametrize("backend", ["cuda", "hip"])
def test_no_device_is_one_line_and_exit_2(gpu_plan, backend):
    if _has(backend):
        pytest.skip(f"a {backend} device is here")
    with pytest.raises(InputError, match=f"--device {backend}"):
        driver_for(backend)
    if backend == "cuda":
        r = subprocess.run([sys.executable, "-m", "llmplan.commands.cli", "run", gpu_plan, "--device", "cuda", "-p", "Hi",
                            "-n", "2"], capture_output=True, text=True)
        assert r.returncode == 2 and r.stdout == "", r
        assert len(r.stderr.strip().splitlines()) == 1 and "--device cuda" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "llmplan.commands.cli", "compile", str(TINY_BPE), "--device", backend,
                        "-o", "/dev/null"], capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and backend in r.stderr, r.stderr


def _drivers(monkeypatch, make):
    """Engines built from here on get the stand-in driver `make()`; the list holds them."""
    drivers = []
    monkeypatch.setattr(engine_module, "driver_for", lambda name: drivers.append(make()) or drivers[-1])
    return drivers


@needs_emulator
def test_the_cuda_driver_gives_the_emulators_tokens(gpu_plan, monkeypatch):
    """Direct, replayed and pipelined, at one and two sequences, in poison mode too: the emu driver's
    tokens; weights are not kept on the host; each launch went through the packed `extra` buffer; the
    pinned buffers are reused."""
    want = [r.ids for r in Engine.load(gpu_plan, device="emu", replay=False, pipelined=False)
            .run([Request(p, 5) for p in PROMPTS])]
    drivers = _drivers(monkeypatch, EmuCudaDriver)
    for replay, pipelined in ((False, False), (True, True)):
        engine = Engine.load(gpu_plan, device="cuda", replay=replay, pipelined=pipelined)
        assert [r.ids for r in engine.run([Request(p, 5) for p in PROMPTS])] == want
        assert (sum(b.steps for b in engine.executor.buckets.values()) > 0) == replay
        assert engine.executor.notes == [] and any(r["pipelined"] for r in engine.records) == pipelined
        assert engine.executor._keep == [] and drivers[-1].device.launches > 0
        assert drivers[-1].device.pinned_allocs < 8  # staging and read buffers are reused, step after step
    poisoned = Engine.load(gpu_plan, device="cuda", poison=True)
    assert [r.ids for r in poisoned.run([Request(p, 3) for p in PROMPTS])] == [ids[:3] for ids in want]


@needs_emulator
@pytest.mark.parametrize("returned_props", [False, True], ids=["hip-python-7", "rocm-bindings"])
def test_the_hip_driver_gives_the_emulators_tokens(hip_plan, monkeypatch, returned_props):
    """A gfx1100 plan on the hip driver, direct and pipelined (HIP has no graphs here): the emu
    driver's tokens, under both forms of hipGetDeviceProperties."""
    want = [r.ids for r in Engine.load(hip_plan, device="emu", pipelined=False).run([Request(p, 4) for p in PROMPTS])]
    drivers = _drivers(monkeypatch, lambda: EmuHipDriver(returned_props=returned_props))
    for pipelined in (False, True):
        engine = Engine.load(hip_plan, device="hip", pipelined=pipelined)
        assert [r.ids for r in engine.run([Request(p, 4) for p in PROMPTS])] == want
        assert engine.executor.buckets == {} and any(r["pipelined"] for r in engine.records) == pipelined
        assert engine.executor._keep == [] and drivers[-1].device.launches > 0
    with pytest.raises(InputError, match="this plan is for hip gfx1100; the device here is hip gfx1151"):
        _drivers(monkeypatch, lambda: EmuHipDriver("gfx1151"))
        Engine.load(hip_plan, device="hip")


def _asking(plan: str, tmp_path, smem_per_block: int, smem) -> str:
    """The plan with its device's smem_per_block and each launch's dynamic shared memory smem(name)."""
    header, offset = read_header(plan)
    body = read_body(plan, offset)
    header.device = dataclasses.replace(header.device, smem_per_block=smem_per_block)
    for p in body.phases.values():
        for launch in p.launches:
            for k in launch.kernels:
                k.smem = smem(k.name, body.gpu.manifests[k.name]["shared_bytes"])
    out = tmp_path / "asks.plan"
    write_plan(out, header, body)
    return str(out)


@needs_emulator
def test_kernels_asking_beyond_the_default_shared_memory_opt_in_at_load(gpu_plan, tmp_path, monkeypatch):
    """A kernel whose static shared memory and the most dynamic shared memory any of its launches asks
    pass what a block gets without opting in (the plan device's smem_per_block) is opted in, once, at
    load, to that dynamic size; a kernel that fits exactly is not."""
    plan = _asking(gpu_plan, tmp_path, 16384, lambda name, static: 20480 if name.startswith("lp_glu_pack")
                   else 16384 - static if name.startswith("lp_rmsnorm") else 0)
    drivers = _drivers(monkeypatch, lambda: EmuCudaDriver(smem_per_block=16384))
    engine = Engine.load(plan, device="cuda")
    opted = dict(drivers[0].device.max_dynamic)
    assert opted and set(opted) == {n for n in engine.executor.body.kernels if n.startswith("lp_glu_pack")}
    assert set(opted.values()) == {20480}
    # without opting in, the stand-in's launch fails as cuLaunchKernel does (the emulator itself runs
    # no dynamic shared memory: these plans are only loaded)
    drivers[0].device.max_dynamic.clear()
    ex = engine.executor
    glu = next(ln for ln in ex.phases["prefill"].launches if ln.kernels[0].name in opted)
    with pytest.raises(FakeError, match="dynamic shared memory past its limit"):
        ex.driver.launch(ex._launch_calls("prefill", glu, ex.step_dims("prefill", 1, 1))[0])


@needs_emulator
def test_a_hip_plan_asking_more_shared_memory_than_a_block_gets_is_refused(hip_plan, tmp_path, monkeypatch):
    plan = _asking(hip_plan, tmp_path, 65536, lambda name, static: 65536 - static + 16 if name.startswith("lp_glu_pack") else 0)
    _drivers(monkeypatch, EmuHipDriver)
    with pytest.raises(InputError, match="AMD GPUs have no opt-in"):
        Engine.load(plan, device="hip")


def test_device_facts_from_the_runtimes_properties():
    h200 = cuda_facts(H200_PROPS)
    assert h200.key == OFFLINE_TARGETS["sm_90-h200"].key  # a plan compiled here runs there, and back
    assert (h200.name, h200.smem_per_block, h200.smem_per_block_optin, h200.int8_matrix) == \
        ("NVIDIA H200", 48 * 1024, 227 * 1024, "mma.sync.s8")
    assert 4900 < h200.bandwidth_gbs < 4950 and h200.memory_gib == 140.4
    rdna3 = hip_facts(GFX1100_PROPS)
    assert (rdna3.arch, rdna3.wave, rdna3.smem_per_block_optin, rdna3.int8_matrix) == ("gfx1100", 32, 65536, "wmma_iu8")
    with pytest.raises(InputError, match="sm_100"):
        cuda_facts(H200_PROPS | {"major": 10})


@pytest.mark.parametrize("returned_props", [False, True], ids=["hip-python-7", "rocm-bindings"])
def test_local_device_facts_through_the_libraries(returned_props):
    """core/devices.local_gpu over the stand-ins: CuPy's getDeviceProperties dict, and hip-python's
    hipDeviceProp_t in either form (filled in by the call, or returned by it)."""
    device = EmuDevice("sm_90", 49152, 232448, 0)
    with mock.patch.dict(sys.modules, {"cupy": fake_cupy(device)}):
        assert local_gpu("cuda") == cuda_facts(H200_PROPS)
    with mock.patch.dict(sys.modules, {"hip": fake_hip(device, returned_props=returned_props)}):
        assert local_gpu("hip") == hip_facts(GFX1100_PROPS)


@needs_emulator
def test_the_kernel_tests_gpu_runner_over_the_cupy_stand_in(monkeypatch):
    """tests/cuda_runner.py, which runs the kernel tests' launches on the GPU in scripts/device-check,
    over the CuPy stand-in: its calls have CuPy's signatures, its scalars go as 4-byte NumPy scalars,
    and an rmsnorm launch gives the emulator's output bit for bit."""
    from test_codegen_build import _norm_kernels

    import cuda_runner
    import kernel_emu

    require_compiler(TARGETS["sm_90"])
    launch = _norm_kernels()[-1]
    assert launch.kernel.name == "lp_rmsnorm_f32"
    device = EmuDevice("sm_90", 49152, 232448, 0)
    device.program_kernels([launch.kernel])
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(device))
    rng = np.random.default_rng(0)
    arrays = {0: rng.standard_normal((3, 1024)).astype(np.float32), "w": rng.standard_normal(1024).astype(np.float32)}
    outs = []
    for run in (cuda_runner.CudaRunner([launch.kernel]), kernel_emu.Emulator([launch.kernel])):
        out = np.full((3, 1024), np.nan, np.float32)
        run.launch(launch, lambda ref: out if ref.get("buf") == 4 else arrays[ref.get("buf", ref.get("weight"))],
                   {"rows": 3})
        outs.append(out)
    assert not np.isnan(outs[0]).any() and np.array_equal(outs[0], outs[1])
    assert device.launches == 1 and device.memory == {}  # its device arrays were freed


# --- the stand-ins against the installed libraries -------------------------------------------------

def _params(line: str) -> list[tuple[str, str, bool]]:
    """(name, C type, has a default) of each parameter."""
    same = {"unsigned long": "size_t", "unicode": "str"}  # hip-python 6.x/7.x, CuPy 13 (Cython 0.29)
    return [(n, same.get(t, t), d is not None) for n, t, d in parse_signature(line)[1]]


def _accepts(fake: str, real: str) -> bool:
    """Whether every call the stand-in's signature takes, the library's takes alike: the same
    parameters, and after them only ones with defaults (CuPy 14 added Stream's `priority`)."""
    f, r = _params(fake), _params(real)
    return r[:len(f)] == f and all(d for _, _, d in r[len(f):])


def _doc_line(obj) -> str:
    """The signature line Cython embeds in a docstring; for a Python function, one made from its
    signature's positional parameters."""
    if inspect.isfunction(obj):
        ps = [p for p in inspect.signature(obj).parameters.values() if p.kind == p.POSITIONAL_OR_KEYWORD]
        return f"{obj.__name__}(" + ", ".join(p.name + ("=..." if p.default is not p.empty else "") for p in ps) + ")"
    line = (obj.__doc__ or "").strip().splitlines()[0] if obj.__doc__ else ""
    return line if re.match(r"[\w.]+\(.*\)", line) else ""


def _compare(fake, real, where: str, errors: list[str]) -> None:
    """Every name the stand-in module or class `fake` defines exists in `real`, with the same
    signature (Cython's embedded one), value, enum members or kind of attribute."""
    for name, value in vars(fake).items():
        if name.startswith("__") and name not in ("__init__", "__call__"):
            continue
        here = f"{where}.{name}"
        if not hasattr(real, name):
            errors.append(f"{here}: missing")
            continue
        r = inspect.getattr_static(real, name) if isinstance(real, type) else getattr(real, name)
        if isinstance(value, types.ModuleType) or isinstance(value, type) and issubclass(value, Stub):
            _compare(value, getattr(real, name), here, errors)
            if isinstance(value, type) and "__init__" not in vars(value):
                continue
            if isinstance(value, type) and hasattr(vars(value)["__init__"], "signature"):
                line = vars(value)["__init__"].signature
                got = _doc_line(getattr(real, name).__init__)
                got = got if "__init__(" in got else _doc_line(getattr(real, name))  # a cdef class: the class's
                if not _accepts(line, got):
                    errors.append(f"{here}(): {line!r}, the library has {got!r}")
        elif isinstance(value, type) and issubclass(value, enum.Enum):
            errors += [f"{here}.{m.name}: {m.value}, the library has {getattr(r, m.name, None)}"
                       for m in value if getattr(getattr(r, m.name, None), "value", None) != m.value]
        elif isinstance(value, type) and issubclass(value, BaseException):
            if not issubclass(r, BaseException):
                errors.append(f"{here}: not an exception")
        elif isinstance(value, property):
            if not inspect.isdatadescriptor(r):
                errors.append(f"{here}: not a property")
        elif hasattr(value, "signature") and name != "__init__":
            got = _doc_line(r if not isinstance(r, (staticmethod, classmethod)) else r.__func__)
            if not got and name == "__call__":  # a slot's docstring has none (read from the source instead)
                continue
            if not _accepts(value.signature, got):
                errors.append(f"{here}: {value.signature!r}, the library has {got!r}")
        elif isinstance(value, int) and not isinstance(value, bool):
            if int(r) != value:
                errors.append(f"{here} = {value}, the library has {r}")


def test_the_cupy_stand_in_has_cupys_signatures():
    """Every CuPy function, class, attribute and constant the cuda driver, gpu_runtime and devices.py
    use, as the stand-in has it (name, parameters with their C types and defaults, values) is the
    installed CuPy's; the device properties the planner reads are keys CuPy's getDeviceProperties sets."""
    cupy = pytest.importorskip("cupy")
    errors: list[str] = []
    _compare(fake_cupy(EmuDevice("sm_90", 49152, 232448, 0)), cupy, "cupy", errors)
    assert errors == []
    assert cupy.cuda.driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES == 8
    keys = ("name", "totalGlobalMem", "sharedMemPerBlock", "warpSize", "maxThreadsPerBlock", "major", "minor",
            "multiProcessorCount", "sharedMemPerBlockOptin", "regsPerMultiprocessor", "memoryBusWidth", "memoryClockRate")
    binary = open(cupy.cuda.runtime.__file__, "rb").read()  # the dict's keys are string constants in the module
    assert [k for k in keys if f"'{k}'".encode() not in binary and k.encode() not in binary] == []


def test_the_hip_stand_in_has_hip_pythons_signatures():
    """The same for hip-python (`from hip import hip`; it imports without ROCm): every function the
    hip driver, gpu_runtime and devices.py call, the enums and flags, and the hipDeviceProp_t fields."""
    try:
        from hip import hip
    except ImportError:
        pytest.skip("hip-python is not installed")
    returned = len(_params(_doc_line(hip.hipGetDeviceProperties))) == 1  # rocm.bindings' form
    errors: list[str] = []
    _compare(fake_hip(EmuDevice("gfx1100", 65536, 65536, 3), returned_props=returned).hip, hip, "hip", errors)
    assert errors == []
    assert [k for k in GFX1100_PROPS if not hasattr(hip.hipDeviceProp_t, k)] == []


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
