"""Rotary embedding + K/V cache write (codegen/kernels/rope_kv.cu): ops rope_kv and norm_rope_kv.

One launch per op: grid (heads + kv_heads, rows), THREADS threads; a block per query head (rotated
into q_out) and per K/V head (key rotated, key and value written to the paged f16 cache [layers, 2,
blocks, PAGE, kv features] at position pos[r] of sequence seq[r]: block pages[seq[r], pos[r] // PAGE],
offset pos[r] % PAGE, the page looked up once per block). norm_rope_kv RMS-normalises each query / key
head first (q_norm, k_norm), with norm.cu's arithmetic. The kernel is tiny and memory bound; one pass, coalesced.

The rope table. The device computes no sin/cos: it reads (cos, sin) from a table that the runtime
builds once per distinct (base, scale, dims, factors) with core/numerics.rope_table, in float64 exactly as
core/numerics.rope computes theta, rounded to float32. A launch names it with the argument

    {"rope_table": {"base": float, "scale": float, "dims": int, "factors": weight name or None,
                    "positions": "ctx"}}

meaning: a float32 device array [positions, dims / 2, 2] = rope_table(positions, dims, base, scale,
factors), positions bound like a buffer dimension (the plan's context length), factors the named
weight's float32 values (Llama 3.1's rope_freqs) or none. Llama-3.1-8B at a context of 8192 needs one
4 MiB table; Gemma 3 two (its local and global bases).

Tolerance. The rotation is float32 with one rounding per operation in a fixed, unfused order
(`rope_f32` is the same computation in NumPy, equal to the device bit for bit). Against the float64
twin (numerics.rope) it differs by float32 rounding only: on random data over positions up to 2^17
(Llama 3.1 factors, both modes) the measured normalised mean squared error is 2.3e-15 and the
largest error 2 float32 ulps of the head's largest |x| (tests/test_codegen_small.py asserts < 1e-13
and <= 4 ulps), so rope_kv is in the exact-arithmetic class (NMSE < 1e-7). About 60% of the values
are bit-equal to the twin's. Keys reach the cache as f16, where an ulp-level difference can flip a
rounding (rarely: within one f16 ulp).

Operands and arguments as codegen/operands.py's rope_kv contract says.
"""

from __future__ import annotations

import numpy as np

from llmplan.core.plan_records import Launch, grid_dim

from .. import operands
from ..kernel import Context, Kernel, KernelLaunch
from ..operands import ROPE_MODES, declare, refs, rope_kv_call, rope_kv_params

THREADS = 64


def rope_f32(x: np.ndarray, pos: np.ndarray, heads: int, dims: int, mode: str, table: np.ndarray) -> np.ndarray:
    """The device's rotation in NumPy: float32, y0 = x0*c - x1*s, y1 = x0*s + x1*c, each operation
    rounded once (no FMA), (c, s) = table[pos[r], i]."""
    rows = x.shape[0]
    hx = x.astype(np.float32).reshape(rows, heads, -1)
    out = hx.copy()
    c, s = table[pos, :, 0][:, None, :], table[pos, :, 1][:, None, :]
    i0, i1 = (slice(0, dims, 2), slice(1, dims, 2)) if mode == "norm" else (slice(0, dims // 2), slice(dims // 2, dims))
    x0, x1 = hx[..., i0], hx[..., i1]
    out[..., i0] = x0 * c - x1 * s
    out[..., i1] = x0 * s + x1 * c
    return out.reshape(x.shape)


def kernel(mode: str, norm: bool, bias: bool = False) -> Kernel:
    name = f"lp_{'norm_' if norm else ''}rope_kv_{mode}{'_bias' if bias else ''}"
    flags, pointers, eps = rope_kv_call(norm, bias)
    call = (f"lp_rope_kv<{ROPE_MODES[mode]}, {flags}>(q, k, v, pos, seq, pages, cache, table, {pointers}, "
            f"q_out, heads, kv_heads, d, dims, layer, npages, blocks, {eps})")
    params = declare(rope_kv_params(norm, bias))
    entry = f"LP_KERNEL void __launch_bounds__({THREADS}) {name}({params}) {{ {call}; }}"
    return Kernel(name, "rope_kv", "rope_kv.cu", entry, THREADS)


def launches(launch: Launch, ctx: Context) -> list[KernelLaunch]:
    c = operands.rope_kv(launch, ctx)
    return [KernelLaunch(kernel(c.mode, c.norm, c.bias), (c.heads + c.kv_heads, grid_dim(c.rows)), refs(c.args))]
