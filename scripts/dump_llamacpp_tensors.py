"""Record llama.cpp's intermediate tensors of layer 0 for one prompt (a test oracle for the interpreter).

    python scripts/dump_llamacpp_tensors.py MODEL.gguf '[2, 818, 5279]' OUT.npz

Needs llama-cpp-python 0.3.36 (the version that made ../shared/fixtures; not a dependency of llmplan):
`pip install llama-cpp-python==0.3.36`. Runs the prompt as one batch on the CPU with an f16 K/V cache and
flash attention off (the fixtures' settings) and saves the contiguous f32 tensors of layer 0 (names
ending in "-0", attention internals left out) and the embeddings, as [rows, features]. A name that
occurs again with other values gets "#1", "#2", ... in order of evaluation (llama.cpp calls Q "Qcur-0"
before and after rope).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

import numpy as np


def main(model: str, ids: list[int], out: str) -> None:
    import llama_cpp
    import llama_cpp.llama_cpp as L

    ggml = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
    ggml.ggml_get_name.restype = ctypes.c_char_p
    ggml.ggml_get_name.argtypes = [ctypes.c_void_p]
    ggml.ggml_nelements.restype = ctypes.c_int64
    ggml.ggml_nelements.argtypes = [ctypes.c_void_p]
    ggml.ggml_get_data.restype = ctypes.c_void_p
    ggml.ggml_get_data.argtypes = [ctypes.c_void_p]
    ggml.ggml_is_contiguous.restype = ctypes.c_bool
    ggml.ggml_is_contiguous.argtypes = [ctypes.c_void_p]
    tensors: dict[str, np.ndarray] = {}

    @L.ggml_backend_sched_eval_callback
    def observe(t, ask, _):
        if ask:
            return True
        name = ggml.ggml_get_name(t).decode()
        is_f32 = ctypes.c_int32.from_address(t).value == 0  # ggml_tensor.type comes first
        wanted = (name.endswith("-0") and not name.startswith(("kq-", "kq_soft_max-", "kqv-", "norm-"))) \
            or name in ("inp_scaled", "embd")
        if is_f32 and ggml.ggml_is_contiguous(t) and wanted:
            rows = len(ids)
            data = np.ctypeslib.as_array(ctypes.cast(ggml.ggml_get_data(t), ctypes.POINTER(ctypes.c_float)),
                                         shape=(ggml.ggml_nelements(t),))
            data = data.copy().reshape(rows, -1)
            key, k = name, 1
            while key in tensors:
                if np.array_equal(tensors[key], data):  # the same values under another view: keep one
                    return True
                key, k = f"{name}#{k}", k + 1
            tensors[key] = data
        return True

    model_p = L.llama_model_load_from_file(model.encode(), L.llama_model_default_params())
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_threads, cp.n_threads_batch = 256, 512, 2, 2
    cp.flash_attn_type = 0
    cp.cb_eval = observe
    ctx = L.llama_init_from_model(model_p, cp)
    tokens = (ctypes.c_int32 * len(ids))(*ids)
    if L.llama_decode(ctx, L.llama_batch_get_one(tokens, len(ids))) != 0:
        raise SystemExit("llama_decode failed")
    np.savez_compressed(out, ids=np.array(ids, np.int32), **tensors)
    print(f"{out}: {len(tensors)} tensors: {', '.join(sorted(tensors))}")


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3])
