"""The GPU runtime libraries (CuPy, hip-python), imported on first use only, with a device checked:
what the cuda/hip drivers and the local device's facts both need, and their one-line errors."""

from __future__ import annotations

from typing import Any

from .errors import InputError


def cupy() -> Any:
    """CuPy, with at least one usable CUDA device."""
    try:
        import cupy as cp
    except ImportError:
        raise InputError("--device cuda needs CuPy: pip install 'llmplan[cuda]'") from None
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except cp.cuda.runtime.CUDARuntimeError as e:
        raise InputError(f"--device cuda: no usable CUDA device here ({e})") from None
    if count == 0:
        raise InputError("--device cuda: no CUDA device here")
    return cp


def hip() -> Any:
    """hip-python's `hip` module, with at least one HIP device."""
    try:
        from hip import hip as h
    except ImportError:
        try:
            from rocm.bindings import hip as h  # hip-python's newer packaging
        except ImportError:
            raise InputError("--device hip needs hip-python: pip install 'llmplan[hip]'") from None
    try:
        err, count = h.hipGetDeviceCount()
    except RuntimeError as e:  # hip-python opens libamdhip64 at the first call
        raise InputError(f"--device hip: no HIP runtime here ({e})") from None
    if err != h.hipError_t.hipSuccess or count == 0:
        raise InputError("--device hip: no HIP device here")
    return h


def hip_properties(h: Any, device: int = 0) -> tuple[Any, Any]:
    """(hipError_t, hipDeviceProp_t) of a device. hip-python 6.x and 7.x fill a properties struct the
    caller passes, hipGetDeviceProperties(prop, deviceId) -> (err,); rocm.bindings (hip-python 10)
    returns it, hipGetDeviceProperties(deviceId) -> (err, prop)."""
    try:
        prop = h.hipDeviceProp_t()
        return h.hipGetDeviceProperties(prop, device)[0], prop
    except TypeError:  # the one-argument form
        return h.hipGetDeviceProperties(device)
