"""The arithmetic of the model's operations, shared by the IR's reference interpreter and the CPU
backend so that both round exactly alike.

Where llama.cpp's CPU backend fixes an order of float operations that changes results (the RMSNorm
reduction, the rounding of 8-bit activation blocks on x86), these functions follow it; tests check
each against llama.cpp's own tensors (tests/test_reference_llamacpp.py).
"""

from __future__ import annotations

import math

import numpy as np

from .formats import ACTIVATION_FORMATS

# docs/numerics.md's kernel-test bounds, NMSE against the reference: exact-arithmetic kernels (packing, integer
# dots, norms), where only a rounding an ulp moves can differ; accumulation-order-sensitive ones
EXACT_NMSE, ORDER_NMSE = 1e-7, 5e-4

def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w over groups of len(w) features, in llama.cpp's order: squares in
    f32 summed in f64, then mean, scale and products in f32."""
    g = w.shape[0]
    xs = x.reshape(*x.shape[:-1], -1, g)
    mean = ((xs * xs).astype(np.float64).sum(axis=-1, keepdims=True) / g).astype(np.float32)
    scale = np.float32(1.0) / np.sqrt(mean + np.float32(eps))
    return ((xs * scale) * w).reshape(x.shape)


def rope_theta(pos: np.ndarray, dims: int, base: float, scale: float, factors: np.ndarray | None = None) -> np.ndarray:
    """theta[p, i] = (pos[p] * scale) * base^(-2i/dims) / factors[i] in float64: the angles of rope and
    of the GPU kernels' (cos, sin) table, from one computation."""
    freqs = base ** (-np.arange(0, dims, 2, dtype=np.float64) / dims)
    if factors is not None:
        freqs = freqs / np.asarray(factors).astype(np.float64)
    return (np.asarray(pos).astype(np.float64) * scale)[:, None] * freqs[None, :]


def rope_table(positions: int, dims: int, base: float, scale: float, factors: np.ndarray | None = None,
               mscale: float = 1.0) -> np.ndarray:
    """(cos, sin) of rope_theta for positions 0..positions-1, times mscale, rounded to float32:
    [positions, dims / 2, 2], the table the kernels read instead of computing sin/cos
    (codegen/families/rope_kv.py)."""
    theta = rope_theta(np.arange(positions), dims, base, scale, factors)
    return (np.stack([np.cos(theta), np.sin(theta)], axis=-1) * mscale).astype(np.float32)


def rope(x: np.ndarray, pos: np.ndarray, heads: int, dims: int, base: float, scale: float, mode: str,
         factors: np.ndarray | None = None, mscale: float = 1.0) -> np.ndarray:
    """Rotate each head's first `dims` features by position pos[r] * scale and multiply them by mscale;
    frequency i is base^(-2i/dims) / factors[i]. "norm" pairs (2i, 2i+1), "neox" pairs (i, i + dims/2)."""
    rows = x.shape[0]
    hx = x.reshape(rows, heads, -1).astype(np.float64)
    theta = rope_theta(pos, dims, base, scale, factors)
    cos, sin = np.cos(theta)[:, None, :] * mscale, np.sin(theta)[:, None, :] * mscale
    out = hx.copy()
    i0, i1 = (slice(0, dims, 2), slice(1, dims, 2)) if mode == "norm" else (slice(0, dims // 2), slice(dims // 2, dims))
    x0, x1 = hx[..., i0], hx[..., i1]
    out[..., i0] = x0 * cos - x1 * sin
    out[..., i1] = x0 * sin + x1 * cos
    return out.reshape(x.shape).astype(np.float32)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return (0.5 * x64 * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x64 + 0.044715 * x64**3)))).astype(np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return (x64 / (1.0 + np.exp(-x64))).astype(np.float32)


ACTIVATIONS = {"silu": silu, "gelu_tanh": gelu_tanh}


# --- projections -----------------------------------------------------------------------------------

PANEL_BYTES = 4 << 20  # weight rows a panel of batched rows shares: about what stays in the last-level cache


def matmul(x: np.ndarray, w: np.ndarray, panel_bytes: int = PANEL_BYTES) -> np.ndarray:
    """x [rows, K] @ w[N, K].T in float32, every row its own matrix-vector product (BLAS sgemv: a row
    alone takes the same path). BLAS's matrix-matrix kernels sum a row's products in an order that
    depends on how many rows share the call, so a row's result would change with what is batched beside
    it; here it never does, whatever the panel size (tests/test_numerics.py). Several rows go through w
    one panel of rows at a time (`panel_bytes`; 0: one panel over all of w) so that the panel is read
    from memory once for all of them; the best size depends on the shape and the machine, which is what
    the tune store decides (plans/cpu_decisions.py)."""
    rows, n = x.shape[0], w.shape[0]
    if rows == 1:
        return x @ w.T
    out = np.empty((rows, n), np.float32)
    step = panel_rows(panel_bytes, w.shape[1] * w.itemsize, n)
    x3 = x[:, None, :]
    for a in range(0, n, step):
        np.matmul(x3, w[a:a + step].T, out=out[:, None, a:a + step])
    return out


def panel_rows(panel_bytes: int, row_bytes: int, n: int) -> int:
    """Weight rows per panel: a multiple of 16 rows within `panel_bytes` (16 at least), or all n rows
    when panel_bytes is 0."""
    return n if panel_bytes <= 0 else min(n, max(16, panel_bytes // max(1, row_bytes)) // 16 * 16)


# --- mixture of experts ----------------------------------------------------------------------------

# exp64's constants (codegen/kernels/common.cuh lp_exp64): ln2 in two parts (n * LN2_HI exact), 1 / ln2,
# and the Taylor coefficients 1 / i! to degree 13 (each a correctly rounded quotient of exact doubles)
LN2_HI, LN2_LO, INV_LN2 = 6.93147180369123816490e-01, 1.90821492927058770002e-10, 1.44269504088896338700e+00
EXP64_TERMS = [1.0 / math.factorial(i) for i in range(14)]


def exp64(d: np.ndarray) -> np.ndarray:
    """exp(d) in float64 for d <= 0, operation for operation as codegen/kernels/common.cuh lp_exp64, which
    the CPU and GPU routers call: d = n ln2 + r (n = rint(d / ln2)), exp(r) by its degree-13 Taylor
    polynomial in Horner's order, scaled by 2^n; 0 below -746, NaN as NaN. Libm's, the GPUs' and NumPy's
    own exp differ in the last bit; this one is the same everywhere."""
    d = np.asarray(d, np.float64)
    ok = d >= -746.0
    x = np.where(ok, d, 0.0)
    n = np.rint(x * INV_LN2)
    r = (x - n * LN2_HI) - n * LN2_LO
    q = np.full_like(r, EXP64_TERMS[13])
    for c in reversed(EXP64_TERMS[:13]):
        q = c + r * q
    return np.where(ok, np.ldexp(q, n.astype(np.int32)), np.where(d < -746.0, 0.0, d))


def route(logits: np.ndarray, k: int, norm: bool) -> tuple[np.ndarray, np.ndarray]:
    """Mixture-of-experts routing of each row of logits [rows, experts]: the probabilities p =
    softmax(logits) (exp64 of the difference to the row's max, divided by their float64 sum in expert
    order, rounded to float32: the CPU and GPU kernels' operations, so all three agree bit for bit), the
    first k experts of llama.cpp's CPU argsort of p, descending (std::sort: sort_desc), and their weights
    p, divided by their sum (float64 in order, rounded to float32) when norm, as build_moe_ffn does (its clamp of
    the sum at 2^-14 never acts on softmax weights: the k largest of at most 1024 experts' probabilities
    sum to 1/1024 at least). llama.cpp's own soft_max takes expf in float (ggml_v_expf on its SIMD paths)
    and scales by the float of 1 / sum; float64 here keeps p within an ulp of the exact softmax. Returns
    (ids int32 [rows, k], weights float32 [rows, k]); each row alone."""
    x = logits.astype(np.float64)
    e = exp64(x - x.max(axis=-1, keepdims=True))
    p = (e / _sum_in_order(e)).astype(np.float32)
    ids = np.stack([sort_desc(row)[:k] for row in p]).astype(np.int32).reshape(len(p), k)
    w = np.take_along_axis(p, ids, axis=-1)
    if norm:
        w = w / _sum_in_order(w.astype(np.float64)).astype(np.float32)
    return ids, w


def _sum_in_order(a: np.ndarray) -> np.ndarray:
    """Each row's float64 sum, left to right as the kernels add (NumPy's own sum is pairwise) [rows, 1]."""
    total = np.zeros((len(a), 1))
    for i in range(a.shape[-1]):
        total[:, 0] += a[:, i]
    return total


MAX_EXPERTS = 1024  # the most experts a model may have and the kernels route: llama.cpp's LLAMA_MAX_EXPERTS
SORT_THRESHOLD = 16  # libstdc++'s _S_threshold: std::sort leaves runs this short to its insertion sort


def sort_desc(v: np.ndarray) -> np.ndarray:
    """The indices of v by descending value as libstdc++'s std::sort with ggml's comparator (v[a] > v[b])
    orders them, equal values included: llama.cpp's CPU argsort. Without equal values that is the one
    descending order; with them, introsort's own (median-of-three partitions down to runs of
    SORT_THRESHOLD, heap sort past 2 log2(n) levels, then one insertion sort), ported step for step."""
    if len(np.unique(v)) == len(v):
        return np.argsort(-v, kind="stable")
    a = list(range(len(v)))
    val = [float(t) for t in v]

    def before(i: int, j: int) -> bool:  # comp(a[i], a[j])
        return val[a[i]] > val[a[j]]

    def sift(first: int, hole: int, length: int, item: int) -> None:  # __adjust_heap
        top = hole
        child = hole
        while child < (length - 1) // 2:
            child = 2 * (child + 1)
            if val[a[first + child]] > val[a[first + child - 1]]:
                child -= 1
            a[first + hole] = a[first + child]
            hole = child
        if length % 2 == 0 and child == (length - 2) // 2:
            child = 2 * (child + 1)
            a[first + hole] = a[first + child - 1]
            hole = child - 1
        parent = (hole - 1) // 2
        while hole > top and val[a[first + parent]] > val[item]:
            a[first + hole] = a[first + parent]
            hole = parent
            parent = (hole - 1) // 2
        a[first + hole] = item

    def heap_sort(first: int, last: int) -> None:  # __partial_sort(first, last, last): make_heap, sort_heap
        n = last - first
        for parent in range((n - 2) // 2, -1, -1):
            sift(first, parent, n, a[first + parent])
        while last - first > 1:
            last -= 1
            item = a[last]
            a[last] = a[first]
            sift(first, 0, last - first, item)

    def median_to_first(r: int, i: int, j: int, m: int) -> None:  # __move_median_to_first
        if before(i, j):
            pick = j if before(j, m) else m if before(i, m) else i
        else:
            pick = i if before(i, m) else m if before(j, m) else j
        a[r], a[pick] = a[pick], a[r]

    def partition(first: int, last: int, pivot: int) -> int:  # __unguarded_partition
        while True:
            while before(first, pivot):
                first += 1
            last -= 1
            while before(pivot, last):
                last -= 1
            if first >= last:
                return first
            a[first], a[last] = a[last], a[first]
            first += 1

    def introsort(first: int, last: int, depth: int) -> None:
        while last - first > SORT_THRESHOLD:
            if depth == 0:
                heap_sort(first, last)
                return
            depth -= 1
            median_to_first(first, first + 1, first + (last - first) // 2, last - 1)
            cut = partition(first + 1, last, first)
            introsort(cut, last, depth)
            last = cut

    def linear_insert(i: int) -> None:  # __unguarded_linear_insert
        item = a[i]
        while val[item] > val[a[i - 1]]:
            a[i] = a[i - 1]
            i -= 1
        a[i] = item

    n = len(a)
    introsort(0, n, 2 * (n.bit_length() - 1))
    for i in range(1, min(n, SORT_THRESHOLD)):  # __final_insertion_sort
        if before(i, 0):
            a[1:i + 1], a[0] = a[0:i], a[i]
        else:
            linear_insert(i)
    for i in range(SORT_THRESHOLD, n):
        linear_insert(i)
    return np.array(a, np.int64)


def matmul_experts(x: np.ndarray, w: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Each row's routed projections: y[r, j*N:(j+1)*N] = x_j @ w[ids[r, j]].T for w [experts, N, K], x_j
    the row x[r] (x [rows, K]) or its slot's slice x[r, j*K:(j+1)*K] (x [rows, k*K]); every (row, slot) is
    its own matrix-vector product (matmul), so its result does not depend on which rows share its expert."""
    rows, k = ids.shape
    n, kk = w.shape[1], w.shape[2]
    xs = x.reshape(rows * k, kk) if x.shape[1] == k * kk else np.repeat(x, k, axis=0)
    flat = ids.reshape(-1)
    y = np.empty((rows * k, n), np.float32)
    for e in np.unique(flat):
        at = np.flatnonzero(flat == e)
        y[at] = matmul(xs[at], w[e])
    return y.reshape(rows, k * n)


def moe_sum(y: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The routed experts' weighted sum: sum over slots j of weights[r, j] * y[r, j*N:(j+1)*N], each product
    rounded to float32 and added slot after slot from j = 0, as llama.cpp's build_moe_ffn adds them."""
    rows, k = weights.shape
    ys = y.reshape(rows, k, -1)
    out = ys[:, 0] * weights[:, :1]
    for j in range(1, k):
        out = out + ys[:, j] * weights[:, j:j + 1]
    return out


# --- activation packing --------------------------------------------------------------------------

def pack_blocks(x: np.ndarray, fmt: str) -> np.ndarray:
    """x [rows, K] as 8-bit activation blocks (structured array [rows, K / block]) rounded as llama.cpp's
    x86 CPU backend does: q8_0/q8_1 take amax/127 as an f16 scale and round half to even; q8_k is
    quantize_row_q8_K_ref (signed max, f32 scale 1/iscale)."""
    f = ACTIVATION_FORMATS[fmt.upper()]
    rows = x.shape[0]
    b = x.reshape(rows, -1, f.block)
    out = np.empty(b.shape[:2], f.layout)
    if f.name == "Q8_K":
        imax = np.argmax(np.abs(b), axis=-1)[..., None]
        mx = np.take_along_axis(b, imax, axis=-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            iscale = np.where(mx != 0, np.float32(-127.0) / mx, np.float32(0)).astype(np.float32)
            d = np.where(mx != 0, np.float32(1.0) / iscale, np.float32(0)).astype(np.float32)
        q = np.minimum(np.rint(iscale * b), 127).astype(np.int8)
        out["d"] = d[..., 0]
        out["qs"] = q
        out["bsums"] = q.reshape(rows, -1, 16, 16).astype(np.int16).sum(axis=-1)
        return out
    amax = np.abs(b).max(axis=-1, keepdims=True)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(b * inv)
    out["d"] = d[..., 0].astype(np.float16)
    out["qs"] = q.astype(np.int8)
    if f.name == "Q8_1":
        out["s"] = (d[..., 0] * q.sum(axis=-1)).astype(np.float16)
    return out


def unpack_blocks(blocks: np.ndarray) -> np.ndarray:
    """The values 8-bit activation blocks stand for, as float32 [rows, K]."""
    d = blocks["d"].astype(np.float32)[..., None]
    return (blocks["qs"].astype(np.float32) * d).reshape(blocks.shape[0], -1)


def packed_values(x: np.ndarray, fmt: str) -> np.ndarray:
    """The values x takes once packed to `fmt` (an 8-bit block format, f16 or bf16)."""
    if fmt == "f32":
        return x
    if fmt == "f16":
        return x.astype(np.float16).astype(np.float32)
    if fmt == "bf16":  # round to nearest even, as ggml_compute_fp32_to_bf16; NaNs stay (quiet) NaNs
        bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        nan = (bits & 0x7FFFFFFF) > 0x7F800000
        return (np.where(nan, (bits >> 16) | 64, rounded) << 16).astype(np.uint32).view(np.float32)
    return unpack_blocks(pack_blocks(x, fmt))


# --- attention -------------------------------------------------------------------------------------

def attend(qh: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One slice of a row's context for all heads: qh [kv_heads, group, d] (already f16-rounded), k and v
    [n, kv_heads, d] from the f16 cache. Returns (exp-weighted V sum [heads, d], max score [heads],
    exp sum [heads]). The exp weights meet V as f16, as in f16 matrix-unit kernels; products accumulate
    in f32. A context that fits one slice gives the same bits split or not."""
    kv_heads, group, d = qh.shape
    s = np.einsum("hgd,nhd->hgn", qh, k) * np.float32(scale)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - m)
    acc = np.einsum("hgn,nhd->hgd", e.astype(np.float16).astype(np.float32), v)
    return acc.reshape(kv_heads * group, d), m.reshape(-1), e.sum(axis=-1).reshape(-1)


def combine(acc: np.ndarray, m: np.ndarray, total: np.ndarray) -> np.ndarray:
    """Softmax-weighted outputs from per-slice partials along axis -2 of acc ([..., splits, d]) and -1
    of m and total ([..., splits]); empty slices carry m = -inf."""
    top = m.max(axis=-1, keepdims=True)
    w = np.where(np.isfinite(m), np.exp(m - top), 0).astype(np.float32)
    return (acc * w[..., None]).sum(axis=-2) / (total * w).sum(axis=-1)[..., None]


def query_heads(q: np.ndarray, heads: int, kv_heads: int) -> np.ndarray:
    """q [rows, heads * d] as f16-rounded [rows, kv_heads, group, d] (the heads sharing a K/V head together)."""
    d = q.shape[1] // heads
    return q.astype(np.float16).astype(np.float32).reshape(q.shape[0], kv_heads, heads // kv_heads, d)


def first_position(p: int, window: int) -> int:
    """The first cache position row position p attends to (window 0: the whole context)."""
    return max(0, p - window + 1) if window > 0 else 0


# The K/V cache is paged: cache [layers, 2, blocks, PAGE, kv features] holds PAGE positions of every
# layer per block, and sequence s's position p lives in block pages[s, p // PAGE] at offset p % PAGE.
PAGE = 16


def pages_for(positions: int) -> int:
    """The pages (cache blocks) that hold this many positions."""
    return -(-positions // PAGE)

# `attention` rounds as split-context attention over SLICE-position slices does, so a row gets the same
# bits whether a prefill chunk or a decode step computes it (passes/split_attention.py uses it too).
SLICE = 256


def store_kv(cache: np.ndarray, layer: int, k: np.ndarray, v: np.ndarray, seq: np.ndarray, pages: np.ndarray,
             pos: np.ndarray) -> None:
    """Write K and V rows, rounded to f16, at position pos[r] of sequence seq[r] (through its pages)."""
    block, offset = pages[seq, pos // PAGE], pos % PAGE
    cache[layer, 0, block, offset] = k.astype(np.float16)
    cache[layer, 1, block, offset] = v.astype(np.float16)


def _slice(qh, cache, layer, table, lo, hi, scale):
    kv_heads, _, d = qh.shape
    p = np.arange(lo, hi)
    block, offset = table[p // PAGE], p % PAGE
    k = cache[layer, 0, block, offset].astype(np.float32).reshape(-1, kv_heads, d)
    v = cache[layer, 1, block, offset].astype(np.float32).reshape(-1, kv_heads, d)
    return attend(qh, k, v, scale)


def attention(q, cache, seq, pages, pos, layer: int, heads: int, kv_heads: int, scale: float,
              window: int) -> np.ndarray:
    """Causal attention of each query row over its sequence's positions [first_position, pos[r]],
    combined from SLICE-position slices exactly as split-context attention combines them."""
    return reduce_partials(attention_partials(q, cache, seq, pages, pos, layer, heads, kv_heads, scale, window, SLICE))


def attention_partials(q, cache, seq, pages, pos, layer: int, heads: int, kv_heads: int, scale: float, window: int,
                       chunk: int) -> np.ndarray:
    """Split-context attention's partials [rows, heads, splits, d + 2]: per `chunk`-aligned slice of
    positions, (exp-weighted V sum, max score, exp sum); unused slices hold (0, -inf, 0). The splits
    cover the positions pages can address."""
    qh = query_heads(q, heads, kv_heads)
    d = qh.shape[3]
    out = np.zeros((q.shape[0], heads, -(-pages.shape[1] * PAGE // chunk), d + 2), np.float32)
    out[..., d] = -np.inf
    for r in range(q.shape[0]):
        p = int(pos[r])
        first = first_position(p, window)
        for j in range(first // chunk, p // chunk + 1):
            lo, hi = max(first, j * chunk), min(p + 1, (j + 1) * chunk)
            out[r, :, j, :d], out[r, :, j, d], out[r, :, j, d + 1] = _slice(qh[r], cache, layer, pages[seq[r]], lo, hi,
                                                                           scale)
    return out


def reduce_partials(part: np.ndarray) -> np.ndarray:
    """Split-context attention's result [rows, heads * d] from its partials."""
    d = part.shape[3] - 2
    return combine(part[..., :d], part[..., d], part[..., d + 1]).reshape(part.shape[0], -1).astype(np.float32)


# --- token masks -----------------------------------------------------------------------------------
# A row's token mask is one bit per vocabulary entry, 32 to an int32 word, bit t % 32 of word t // 32
# (llguidance's and xgrammar's layout): 1 allows token t. The fused tail's argmax skips what it forbids.

NO_TOKEN = 0x7FFFFFFF  # the argmax of a row whose mask allows nothing (common.cuh lp_no_best's index)
EVERY_TOKEN = -1  # a mask word that allows all 32 of its tokens: a free row's, and the mask input's default


def mask_words(vocab: int) -> int:
    return -(-vocab // 32)


def allowed(mask: np.ndarray, vocab: int) -> np.ndarray:
    """The bool [rows, vocab] a mask [rows, mask_words(vocab)] stands for."""
    bits = np.unpackbits(np.ascontiguousarray(mask, np.int32).view(np.uint8), axis=-1, bitorder="little")
    return bits[..., :vocab].astype(bool)


def masked_argmax(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """np.argmax of each row over the tokens its mask allows (np.argmax's order: a NaN first, then the
    largest, the lowest index on ties); NO_TOKEN for a row that allows none."""
    ok = allowed(mask, logits.shape[-1])
    out = np.full(logits.shape[0], NO_TOKEN, np.int32)
    for r in range(logits.shape[0]):
        ids = np.flatnonzero(ok[r])
        if ids.size:
            out[r] = ids[np.argmax(logits[r, ids])]
    return out
