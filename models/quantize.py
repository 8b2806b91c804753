"""Quantization: float32 weights to GGML blocks, and random blocks for synthetic models.

`quantize` ports llama.cpp's reference quantizers (`quantize_row_*_ref` in ggml-quants.c) operation
for operation in float32, vectorized over every block at once. Its bytes equal gguf-py's
`gguf.quants.quantize` for the formats gguf-py has (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, BF16, F16, F32)
and ggml's C reference for Q4_K, Q5_K and Q6_K when that is compiled without FMA contraction. IQ4_NL
and IQ4_XS port `quantize_iq4_nl` / `quantize_iq4_xs` without an importance matrix (what
`llama_model_quantize` writes; `quantize_row_iq4_xs_ref` is the same), whose bytes the tests check
against llama.cpp's own library.
Two deliberate departures keep the output finite for any finite input, where the C code would
store an infinite float16 scale or hit undefined behaviour: values beyond what a format can represent
are clipped to its range first, and a scale whose reciprocal overflows float32 gets a clamped one.
NaN and infinite inputs are rejected.

`random_blocks` draws quantized blocks directly (uniform random payload bits, scales chosen so the
dequantized values have a requested standard deviation; float formats look normal values up in a
quantile table), which is how the synthetic-model builder makes multi-gigabyte models in seconds
instead of quantizing floats.
"""

from __future__ import annotations

import functools
import statistics
from typing import Callable

import numpy as np

from llmplan.core.errors import FormatError, InputError
from llmplan.core.formats import KVALUES_IQ4NL, QK_K, Format, format_of

F32 = np.float32
U8 = np.uint8
F16_MAX = 65504.0
_F16_TINY = 2.0**-24  # smallest float16 subnormal: a block scale below it would read as 0
BF16_MAX = float(np.array(0x7F7F0000, np.uint32).view(F32))
_F32_MAX = float(np.finfo(F32).max)
# K formats derive their float16 scales from least-squares fits rather than from the block's
# maximum, so they get a conservative bound that keeps d and dmin finite with a wide margin.
_K_LIMIT = 32 * F16_MAX
_GROUP_MAX_EPS = F32(1e-15)  # ggml's "this group is all zero" threshold
_CHUNK_VALUES = 1 << 18  # values per step: bounds the temporaries and keeps them cache-sized


# --- float32 helpers that mirror ggml's C ------------------------------------------------------


def _nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int: round half to even by adding 1.5*2^23 (same bits as C even out of range)."""
    return ((v + F32(12582912.0)).view(np.int32) & 0x7FFFFF) - 0x400000


def _roundf(v: np.ndarray) -> np.ndarray:
    """C's roundf (half away from zero), exact in float32 unlike floor(v + 0.5)."""
    a = np.abs(v)
    whole = np.floor(a)
    return np.copysign(whole + (a - whole >= F32(0.5)), v)


def _inverse(d: np.ndarray) -> np.ndarray:
    """1/d, or 0 where d is 0; clamped where d is subnormal and C would compute inf."""
    return np.where(d == 0, F32(0), np.clip(F32(1) / d, -_F32_MAX, _F32_MAX))


def _stored(v: np.ndarray) -> np.ndarray:
    """A scale as the block stores it: rounded to float16, read back as float32."""
    return v.astype(np.float16).astype(F32)


def _signed_absmax(x: np.ndarray, axis: int) -> np.ndarray:
    """The value of largest magnitude; the first on ties, as ggml's strict `>` scan keeps."""
    i = np.expand_dims(np.abs(x).argmax(axis=axis), axis)
    return np.take_along_axis(x, i, axis=axis).squeeze(axis)


def _pack_nibbles(q: np.ndarray, group: int) -> np.ndarray:
    """Inverse of formats.nibbles: each run of 2*group values -> group bytes, first half low."""
    n = q.shape[0]
    q = q.reshape(n, -1, 2, group)
    return ((q[:, :, 0] & U8(0x0F)) | (q[:, :, 1] << U8(4))).reshape(n, -1)


def _pack_bits(q: np.ndarray, width: int, group: int) -> np.ndarray:
    """Inverse of formats.bits: each run of (8/width)*group values -> group bytes, lowest field first."""
    n = q.shape[0]
    q = q.reshape(n, -1, 8 // width, group)
    out = np.zeros((n, q.shape[1], group), U8)
    for k in range(8 // width):
        out |= q[:, :, k] << U8(k * width)
    return out.reshape(n, -1)


def _pack_k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Inverse of formats.k_scale_min: eight 6-bit scales and eight 6-bit mins -> 12 bytes."""
    out = np.empty((sc.shape[0], 12), U8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> U8(4)) << U8(6))
    out[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> U8(4)) << U8(6))
    out[:, 8:12] = (sc[:, 4:] & U8(0x0F)) | (mn[:, 4:] << U8(4))
    return out


# --- float formats (x is (n, 1)) --------------------------------------------------------------


def _f32(x: np.ndarray) -> np.ndarray:
    return x.astype("<f4")


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype("<f2")


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even on the top 16 bits, as ggml_compute_fp32_to_bf16 (input is finite)."""
    n = x.view(np.uint32)
    return ((n + (0x7FFF + ((n >> 16) & 1))) >> 16).astype(np.uint16).view("<i2")


# --- 32-value formats (x is (n, 32)) ----------------------------------------------------------


def _q8_0(x: np.ndarray, b: np.ndarray) -> None:
    d = np.abs(x).max(axis=1) / F32(127)
    b["d"] = d
    b["qs"] = _roundf(x * _inverse(d)[:, None]).astype(np.int8)


def _symmetric(x: np.ndarray, b: np.ndarray, half: int) -> np.ndarray:
    """Q4_0/Q5_0: d = -max/half, q = (int)(x/d + half + 0.5) capped at 2*half-1."""
    d = _signed_absmax(x, 1) / F32(-half)
    b["d"] = d
    q = (x * _inverse(d)[:, None] + F32(half + 0.5)).astype(U8)
    return np.minimum(q, U8(2 * half - 1))


def _offset(x: np.ndarray, b: np.ndarray, levels: int) -> np.ndarray:
    """Q4_1/Q5_1: m = min, d = (max - min)/(levels-1), q = (int)((x - m)/d + 0.5)."""
    lo, hi = x.min(axis=1), x.max(axis=1)
    d = (hi - lo) / F32(levels - 1)
    b["d"], b["m"] = d, lo
    q = ((x - lo[:, None]) * _inverse(d)[:, None] + F32(0.5)).astype(U8)
    return np.minimum(q, U8(levels - 1))


def _q5_high(q: np.ndarray) -> np.ndarray:
    """Bit 4 of each of the 32 values, as one little-endian uint32 per block."""
    return np.packbits(q >> U8(4), axis=1, bitorder="little").view("<u4")[:, 0]


def _q4_0(x: np.ndarray, b: np.ndarray) -> None:
    b["qs"] = _pack_nibbles(_symmetric(x, b, 8), 16)


def _q5_0(x: np.ndarray, b: np.ndarray) -> None:
    q = _symmetric(x, b, 16)
    b["qh"], b["qs"] = _q5_high(q), _pack_nibbles(q, 16)


def _q4_1(x: np.ndarray, b: np.ndarray) -> None:
    b["qs"] = _pack_nibbles(_offset(x, b, 16), 16)


def _q5_1(x: np.ndarray, b: np.ndarray) -> None:
    q = _offset(x, b, 32)
    b["qh"], b["qs"] = _q5_high(q), _pack_nibbles(q, 16)


# --- K formats --------------------------------------------------------------------------------
# Sub-blocks are laid out value-major, shape (values per sub-block, sub-blocks), so that sum(axis=0)
# adds each sub-block's terms one after another in index order, exactly like ggml's C loops
# (NumPy's pairwise summation only applies along the contiguous axis).


def _sub_blocks(x: np.ndarray, size: int) -> np.ndarray:
    return np.ascontiguousarray(x.reshape(-1, size).T)


def _levels(v: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """nearest_int clamped to lo..hi, kept in float32; equal to C for the finite values it gets."""
    return np.rint(np.clip(v, F32(lo), F32(hi)))


def _finite(v: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(v), v, F32(0))


def _make_qkx2_quants(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    """ggml's make_qkx2_quants (use_mad = false) for every column: (scale, the_min, L).

    Where the spread max - min is 0 or so small that iscale overflows, C's nearest_int turns the
    resulting inf/nan into level 0; a zeroed iscale does the same, which also covers C's early
    return for max == min (scale 1/inf = 0, all levels 0). Rather than copying the levels of every
    better trial, it remembers the trial's (iscale, min) and recomputes the winning levels once."""
    lo = np.minimum(x.min(axis=0), F32(0))
    hi = x.max(axis=0)
    sum_w = w.sum(axis=0)
    sum_x = (w * x).sum(axis=0)
    iscale = F32(nmax) / (hi - lo)
    scale = F32(1) / iscale
    best_iscale, best_lo = _finite(iscale), lo
    L = _levels(best_iscale * (x - lo), 0, nmax)
    best = (w * np.square(scale * L + lo - x)).sum(axis=0)
    for step in range(nstep + 1):
        # `lo` is the running best min, as in C where the loop reuses the updated variable
        iscale = _finite((F32(rmin) + F32(rdelta) * F32(step) + F32(nmax)) / (hi - lo))
        Laux = _levels(iscale * (x - lo), 0, nmax)
        wl = w * Laux
        sum_l, sum_l2, sum_xl = wl.sum(axis=0), (wl * Laux).sum(axis=0), (wl * x).sum(axis=0)
        D = sum_w * sum_l2 - sum_l * sum_l
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
        pos = this_min > 0
        this_min = np.where(pos, F32(0), this_min)
        this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
        err = (w * np.square(this_scale * Laux + this_min - x)).sum(axis=0)
        take = (D > 0) & (err < best)
        best_iscale, best_lo = np.where(take, iscale, best_iscale), np.where(take, lo, best_lo)
        best = np.where(take, err, best)
        scale = np.where(take, this_scale, scale)
        lo = np.where(take, this_min, lo)
    return scale, -lo, _levels(best_iscale * (x - best_lo), 0, nmax).astype(U8)


def _k_quant(x: np.ndarray, b: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int) -> np.ndarray:
    """Q4_K/Q5_K: fit each 32-value sub-block, then 6-bit scales and mins; returns L (n, 256)."""
    n = x.shape[0]
    xs = _sub_blocks(x, 32)
    av_x = np.sqrt(np.square(xs).sum(axis=0) / F32(32))
    scales, mins, L = _make_qkx2_quants(xs, av_x + np.abs(xs), nmax, rmin, rdelta, nstep)
    scales, mins = scales.reshape(n, 8), mins.reshape(n, 8)
    max_scale = np.maximum(scales.max(axis=1), F32(0))
    max_min = np.maximum(mins.max(axis=1), F32(0))
    inv_scale = np.where(max_scale > 0, F32(63) / max_scale, F32(0))
    inv_min = np.where(max_min > 0, F32(63) / max_min, F32(0))
    # C stores nearest_int into a uint8 (wrapping) before capping at 63
    ls = np.minimum(_nearest_int(inv_scale[:, None] * scales).astype(U8), U8(63))
    lm = np.minimum(_nearest_int(inv_min[:, None] * mins).astype(U8), U8(63))
    b["scales"], b["d"], b["dmin"] = _pack_k_scales(ls, lm), max_scale / F32(63), max_min / F32(63)
    d = (_stored(b["d"])[:, None] * ls.astype(F32)).reshape(1, -1)
    dm = (_stored(b["dmin"])[:, None] * lm.astype(F32)).reshape(1, -1)
    requant = np.clip(_nearest_int((xs + dm) / d), 0, nmax).astype(U8)
    L = np.where(d == 0, L, requant)  # C skips sub-blocks whose scale reads as 0
    return L.T.reshape(n, QK_K)


def _q4_k(x: np.ndarray, b: np.ndarray) -> None:
    b["qs"] = _pack_nibbles(_k_quant(x, b, 15, -1.0, 0.1, 20), 32)


def _q5_k(x: np.ndarray, b: np.ndarray) -> None:
    L = _k_quant(x, b, 31, -0.5, 0.1, 15)
    b["qs"] = _pack_nibbles(L, 32)
    b["qh"] = _pack_bits(L >> U8(4), 1, 32)


def _make_qx_quants(x: np.ndarray, nmax: int):
    """ggml's make_qx_quants with rmse_type 1 (weights x^2) and no quant weights: (scale, L + nmax).
    Like _make_qkx2_quants it keeps the best trial's iscale and recomputes its levels at the end."""
    mx = _signed_absmax(x, 0)
    w = x * x
    wx = w * x

    def fit(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        l = _levels(iscale * x, -nmax, nmax - 1)
        return (wx * l).sum(axis=0), (w * l * l).sum(axis=0)

    best_iscale = F32(-nmax) / mx
    sumlx, suml2 = fit(best_iscale)
    scale = np.where(suml2 != 0, sumlx / suml2, F32(0))
    best = scale * sumlx
    for step in [s for s in range(-9, 10) if s]:
        iscale = -(F32(nmax) + F32(0.1) * F32(step)) / mx
        sumlx, suml2 = fit(iscale)
        take = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        best_iscale = np.where(take, iscale, best_iscale)
        scale = np.where(take, sumlx / suml2, scale)
        best = np.where(take, scale * sumlx, best)
    zero = np.abs(mx) < _GROUP_MAX_EPS  # C returns scale 0 and levels 0 for these
    L = (_levels(best_iscale * x, -nmax, nmax - 1) + F32(nmax)).astype(U8)
    return np.where(zero, F32(0), scale), np.where(zero, U8(0), L)


def _q6_k(x: np.ndarray, b: np.ndarray) -> None:
    n = x.shape[0]
    xs = _sub_blocks(x, 16)
    scales, L = _make_qx_quants(xs, 32)
    scales = scales.reshape(n, 16)
    max_scale = _signed_absmax(scales, 1)
    iscale = F32(-128) / max_scale
    sc = np.minimum(_nearest_int(iscale[:, None] * scales), 127).astype(np.int8)
    b["d"], b["scales"] = F32(1) / iscale, sc
    d = (_stored(b["d"])[:, None] * sc.astype(F32)).reshape(1, -1)
    requant = (np.clip(_nearest_int(xs / d), -32, 31) + 32).astype(U8)
    L = np.where(d == 0, L, requant).T.reshape(n, QK_K)  # C skips zero-scale sub-blocks
    b["ql"] = _pack_nibbles(L & U8(0x0F), 64)
    b["qh"] = _pack_bits(L >> U8(4), 2, 32)
    b[np.abs(max_scale) < _GROUP_MAX_EPS] = np.zeros((), b.dtype)  # C zeroes all-zero blocks


# --- non-linear 4-bit formats ----------------------------------------------------------------
# ggml's quantize_row_iq4_nl_impl with ntry = 7 and no quant weights (weights x^2), sub-blocks value-major
# as the K formats'.

_IQ4_VALUES = np.array(KVALUES_IQ4NL, F32)
_IQ4_TRIES = 7


def _iq4_index(v: np.ndarray) -> np.ndarray:
    """ggml's best_index_int8 over the codebook: the nearest value's index, the upper one unless the lower
    is strictly nearer, in float32."""
    mu = np.clip(np.searchsorted(_IQ4_VALUES, v, side="right"), 1, 15)
    lower = (v - _IQ4_VALUES[mu - 1]) < (_IQ4_VALUES[mu] - v)
    return np.where(v <= _IQ4_VALUES[0], 0, np.where(v >= _IQ4_VALUES[15], 15, mu - lower)).astype(U8)


def _iq4_fit(xs: np.ndarray, w: np.ndarray, iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sum w q x and sum w q^2 over each column, q the codebook value nearest iscale * x."""
    q = _IQ4_VALUES[_iq4_index(iscale * xs)]
    return (w * q * xs).sum(axis=0), (w * q * q).sum(axis=0)


def _iq4_scales(xs: np.ndarray) -> np.ndarray:
    """The least-squares scale of each 32-value column: from d = max / 127, then the 2 * 7 + 1 trial
    reciprocals (try - 127) / max, keeping a trial that fits better; 0 for all-zero columns."""
    w = xs * xs
    mx = _signed_absmax(xs, 0)
    sumqx, sumq2 = _iq4_fit(xs, w, F32(1) / (-mx / _IQ4_VALUES[0]))
    d = np.where(sumq2 > 0, sumqx / sumq2, F32(0))
    best = d * sumqx
    for step in range(-_IQ4_TRIES, _IQ4_TRIES + 1):
        sumqx, sumq2 = _iq4_fit(xs, w, F32(step + KVALUES_IQ4NL[0]) / mx)
        take = (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
        d = np.where(take, sumqx / sumq2, d)
        best = np.where(take, d * sumqx, best)
    return np.where(np.abs(xs).max(axis=0) < _GROUP_MAX_EPS, F32(0), d)


def _iq4_nl(x: np.ndarray, b: np.ndarray) -> None:
    d = _iq4_scales(_sub_blocks(x, 32))
    b["d"] = d
    b["qs"] = _pack_nibbles(_iq4_index(_inverse(d)[:, None] * x), 16)


def _iq4_xs(x: np.ndarray, b: np.ndarray) -> None:
    n = x.shape[0]
    scales = _iq4_scales(_sub_blocks(x, 32)).reshape(n, 8)
    mx = _signed_absmax(scales, 1)
    d = -np.where(mx != 0, mx, F32(0)) / F32(32)  # ggml keeps its +0 start where every |scale| is 0
    b["d"] = d
    ls = np.clip(_nearest_int(_inverse(d)[:, None] * scales), -32, 31)
    dl = (d[:, None] * ls.astype(F32)).reshape(n, 8, 1)  # the unrounded d, as ggml
    L = _iq4_index(_inverse(dl) * x.reshape(n, 8, 32)).reshape(n, QK_K)
    ls = (ls + 32).astype(U8)
    b["scales_l"] = _pack_nibbles(ls, 1)
    high = (ls >> U8(4)).astype(np.uint16) << np.arange(0, 16, 2, dtype=np.uint16)
    b["scales_h"] = high.sum(axis=1, dtype=np.uint16)
    b["qs"] = _pack_nibbles(L, 16)


# --- public entry points ----------------------------------------------------------------------

# name -> (quantizer, largest magnitude the format holds with finite float16 scales)
_QUANTIZERS: dict[str, tuple[Callable, float]] = {
    "F32": (_f32, np.inf),
    "F16": (_f16, F16_MAX),
    "BF16": (_bf16, BF16_MAX),
    "Q8_0": (_q8_0, 127 * F16_MAX),
    "Q4_0": (_q4_0, 8 * F16_MAX),
    "Q5_0": (_q5_0, 16 * F16_MAX),
    "Q4_1": (_q4_1, F16_MAX),  # the block minimum is stored as float16
    "Q5_1": (_q5_1, F16_MAX),
    "Q4_K": (_q4_k, _K_LIMIT),
    "Q5_K": (_q5_k, _K_LIMIT),
    "Q6_K": (_q6_k, _K_LIMIT),
    # a scale is a weighted mean of x / q, each below max / 17 (the index of value 1 takes |iscale * x| up
    # to 7, and |iscale| >= 120 / max); IQ4_XS stores the largest / 32
    "IQ4_NL": (_iq4_nl, 16 * F16_MAX),
    "IQ4_XS": (_iq4_xs, 16 * 32 * F16_MAX),
}
_FLOAT_FORMATS = ("F32", "F16", "BF16")
QUANTIZABLE: tuple[str, ...] = tuple(_QUANTIZERS)  # the formats `quantize` writes


def _quantize_blocks(x: np.ndarray, fmt: Format) -> np.ndarray:
    """(n, fmt.block) finite float32 -> n blocks of fmt.layout."""
    fn, limit = _QUANTIZERS[fmt.name]
    if np.isfinite(limit):
        x = np.clip(x, -limit, limit)
    if fmt.name in _FLOAT_FORMATS:
        return fn(x).reshape(-1).view(fmt.layout)
    blocks = np.zeros(x.shape[0], fmt.layout)
    # lanes that the C code skips by branching compute throwaway inf/nan values here
    with np.errstate(all="ignore"):
        fn(x, blocks)
    return blocks


def quantize(x: np.ndarray, fmt: Format | str | int) -> np.ndarray:
    """Quantize float32 `x` row by row (last axis) into `fmt`; returns uint8 (*x.shape[:-1], row bytes)."""
    fmt = fmt if isinstance(fmt, Format) else format_of(fmt)
    if fmt.name not in _QUANTIZERS:
        raise FormatError(f"cannot quantize to {fmt.name} (quantize supports {', '.join(QUANTIZABLE)})")
    x = np.asarray(x, dtype=F32)
    if x.ndim == 0:
        raise FormatError(f"{fmt.name}: cannot quantize a scalar; give at least one row")
    row_bytes = fmt.row_bytes(x.shape[-1])
    if not np.isfinite(x).all():
        raise FormatError(f"{fmt.name}: cannot quantize NaN or infinite values")
    flat = x.reshape(-1, fmt.block)
    out = np.empty(flat.shape[0], fmt.layout)
    step = max(1, _CHUNK_VALUES // fmt.block)
    for s in range(0, flat.shape[0], step):
        out[s : s + step] = _quantize_blocks(flat[s : s + step], fmt)
    return out.view(U8).reshape(*x.shape[:-1], row_bytes)


# --- random blocks ----------------------------------------------------------------------------
# The payload bits stay uniformly random; only scale fields are set. With q uniform on its levels,
# a value is (block scale) x (sub-block scale) x (centred q), so its variance is the product of
# their mean squares, and each fill picks the block scale that makes that equal std^2.


def _ms(lo: int, hi: int) -> float:
    """Mean square of an integer drawn uniformly from lo..hi."""
    k = hi - lo + 1
    return (k * k - 1) / 12 + ((lo + hi) / 2) ** 2


_U_MS = 13 / 12  # mean square of |u| uniform on [0.5, 1.5]


def _block_scales(rng: np.random.Generator, n: int, rms: float, signed: bool) -> np.ndarray:
    """n block scales with root mean square `rms`, each off by up to 50% (and of random sign if
    `signed`) so that a kernel reading the wrong block's scale gets visibly wrong results."""
    base = rms / np.sqrt(_U_MS)
    if 1.5 * base > F16_MAX or 0.5 * base < _F16_TINY:
        raise FormatError(f"std out of range: block scales of about {base:.3g} do not fit float16")
    v = rng.random(n, dtype=F32) * F32(2) - F32(1)
    u = F32(0.5) + np.abs(v)
    return (np.copysign(u, v) if signed else u) * F32(base)


def _symmetric_fill(q_ms: float, sub_ms: float = 1.0) -> Callable:
    """Q8_0, Q4_0, Q5_0, Q3_K, Q6_K, IQ4_NL, IQ4_XS: any sub-block scales stay random too. The centred
    quants have mean -1/2 (the codebook's -5.9), so d takes a random sign to make the mean zero."""

    def fill(b: np.ndarray, rng: np.random.Generator, std: float) -> None:
        b["d"] = _block_scales(rng, b.shape[0], std / np.sqrt(q_ms * sub_ms), signed=True)

    return fill


def _offset_fill(levels: int) -> Callable:
    """Q4_1, Q5_1: the stored minimum -d*(levels-1)/2 centres each block on zero."""

    def fill(b: np.ndarray, rng: np.random.Generator, std: float) -> None:
        q_var = _ms(0, levels - 1) - ((levels - 1) / 2) ** 2
        d = _block_scales(rng, b.shape[0], std / np.sqrt(q_var), signed=False)
        b["d"], b["m"] = d, d * F32(-(levels - 1) / 2)

    return fill


def _k_fill(levels: int) -> Callable:
    """Q4_K, Q5_K: 6-bit scales drawn from 32..63 with min = scale and dmin = d*(levels-1)/2, so every
    sub-block is centred on zero as real weights are."""

    def fill(b: np.ndarray, rng: np.random.Generator, std: float) -> None:
        sc = (b["scales"][:, :8] & U8(31)) | U8(32)
        b["scales"] = _pack_k_scales(sc, sc)
        q_var = _ms(0, levels - 1) - ((levels - 1) / 2) ** 2
        d = _block_scales(rng, b.shape[0], std / np.sqrt(_ms(32, 63) * q_var), signed=False)
        b["d"], b["dmin"] = d, d * F32((levels - 1) / 2)

    return fill


def _fill_q2_k(b: np.ndarray, rng: np.random.Generator, std: float) -> None:
    """Q2_K: 4-bit scales drawn from 8..15 with min = scale and dmin = 1.5*d (centred sub-blocks)."""
    sc = (b["scales"] & U8(7)) | U8(8)
    b["scales"] = sc | (sc << U8(4))
    d = _block_scales(rng, b.shape[0], std / np.sqrt(_ms(8, 15) * 1.25), signed=False)
    b["d"], b["dmin"] = d, d * F32(1.5)


_IQ4_MS = float(np.mean(np.square(_IQ4_VALUES)))  # mean square of a uniformly drawn codebook value

_RANDOM_FILL: dict[str, Callable] = {
    "Q8_0": _symmetric_fill(_ms(-128, 127)),
    "Q4_0": _symmetric_fill(_ms(-8, 7)),
    "Q5_0": _symmetric_fill(_ms(-16, 15)),
    "Q4_1": _offset_fill(16),
    "Q5_1": _offset_fill(32),
    "Q2_K": _fill_q2_k,
    "Q3_K": _symmetric_fill(_ms(-4, 3), _ms(-32, 31)),
    "Q4_K": _k_fill(16),
    "Q5_K": _k_fill(32),
    "Q6_K": _symmetric_fill(_ms(-32, 31), _ms(-128, 127)),
    "IQ4_NL": _symmetric_fill(_IQ4_MS),
    "IQ4_XS": _symmetric_fill(_IQ4_MS, _ms(-32, 31)),
}


def _random_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    """n uniform random bytes, writable; full-range uint64 draws are the fastest source NumPy has."""
    return rng.integers(0, 1 << 64, size=-(-n // 8), dtype=np.uint64).view(U8)[:n]


@functools.cache
def _normal_table() -> np.ndarray:
    """65536 equally likely values of a standard normal (its quantiles at the bin centres, so the
    tails stop at 4.3 sigma), rescaled to unit variance."""
    inv_cdf = statistics.NormalDist().inv_cdf
    t = np.array([inv_cdf((k + 0.5) / 65536) for k in range(65536)], np.float64)
    return (t / t.std()).astype(F32)


def _random_floats(fmt: Format, n: int, rng: np.random.Generator, std: float) -> np.ndarray:
    """n normal values: random 16-bit indices into the normal table, converted to `fmt` once, which
    is several times faster than drawing normals and converting each to float16."""
    table = _quantize_blocks((_normal_table() * F32(std))[:, None], fmt)
    plain = table.view(table.dtype[0])
    return plain[_random_bytes(rng, 2 * n).view(np.uint16)].view(fmt.layout)


def random_blocks(fmt: Format | str | int, n_blocks: int, rng: np.random.Generator, std: float) -> np.ndarray:
    """`n_blocks` random blocks of `fmt` (a structured array of fmt.layout) whose dequantized values
    are finite with mean ~0 and standard deviation ~`std`; deterministic for a given `rng` state."""
    fmt = fmt if isinstance(fmt, Format) else format_of(fmt)
    if not (np.isfinite(std) and std > 0):
        raise InputError(f"std must be positive and finite, got {std}")
    if fmt.name in _FLOAT_FORMATS:
        return _random_floats(fmt, n_blocks, rng, std)
    blocks = _random_bytes(rng, n_blocks * fmt.block_bytes).view(fmt.layout)
    _RANDOM_FILL[fmt.name](blocks, rng, std)
    return blocks
