// attention.h: causal attention over the paged f16 K/V cache on the CPU, split into slices of `chunk`
// positions (ops attention, attention_partial, attention_reduce, attention_reduce_pack; CPU twins
// runtime/numpy_kernels.py attention*, core/numerics.py attend / combine).
//
// A row's slice j covers positions [max(first, j chunk), min(pos + 1, (j + 1) chunk)), first =
// max(0, pos - window + 1) with a window, else 0. For the G = heads / kv_heads query heads that share a
// K/V head, one slice gives, as numerics.attend does:
//   s[g][n] = (sum_d f16(q[g][d]) * k[n][d]) * scale   (products of f16 values: exact in float)
//   m[g] = max_n s, e = exp(s - m), l[g] = sum_n e, acc[g][:] = sum_n f16(e) * v[n][:]
// and the slices combine (numerics.combine): top = max_j m_j, w_j = exp(m_j - top) (empty slices
// skipped), out = sum_j acc_j w_j / sum_j l_j w_j. `attention` (prefill) and attention_partial +
// attention_reduce (decode) run the same two functions, so a row gets the same bits either way. Only
// the order of the float sums differs from the twin (tolerance class: accumulation order).
//
// Threads: attention_partial's tasks are (row, K/V head, slice), so one decode row over a long context
// still fills the pool; attention's and attention_reduce's are rows (and K/V heads). The kernels are
// specialised on the group G, so a K/V row's products for all G heads stay in registers.
#pragma once
#include <math.h>

#include <vector>

#include "rows.h"
#include "simd.h"

namespace lp_cpu {

struct Attn {
  const float* q;  // [rows, heads * d]
  const lp_half* cache;
  const int *seq, *pages, *pos;
  int layer, npages, blocks, heads, kv_heads, d, window, chunk;
  float scale;
  int group() const { return heads / kv_heads; }
  int first(int r) const { return window > 0 ? lp_max(0, pos[r] - window + 1) : 0; }
};

#if LP_CPU_ISA >= 1
// The SIMD paths' vector: 16 floats (avx512) or 8 (avx2)
#if LP_CPU_ISA >= 2
inline __m512 lp_cpu_vmax(__m512 a, __m512 b) { return _mm512_max_ps(a, b); }
inline __m512 lp_cpu_vround(__m512 a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
using Vf = __m512;
constexpr int VL = 16;
inline Vf vzero() { return _mm512_setzero_ps(); }
inline Vf vset(float x) { return _mm512_set1_ps(x); }
inline Vf vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, Vf v) { _mm512_storeu_ps(p, v); }
inline Vf vload_h(const lp_half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
inline Vf vfma(Vf a, Vf b, Vf c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(Vf v) {
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  return hsum8(_mm256_add_ps(_mm512_castps512_ps256(v), hi));
}
inline Vf vscale2(Vf y, Vf n) { return _mm512_scalef_ps(y, n); }
#else
inline __m256 lp_cpu_vmax(__m256 a, __m256 b) { return _mm256_max_ps(a, b); }
inline __m256 lp_cpu_vround(__m256 a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
using Vf = __m256;
constexpr int VL = 8;
inline Vf vzero() { return _mm256_setzero_ps(); }
inline Vf vset(float x) { return _mm256_set1_ps(x); }
inline Vf vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, Vf v) { _mm256_storeu_ps(p, v); }
inline Vf vload_h(const lp_half* p) { return load_h8(p); }
inline Vf vfma(Vf a, Vf b, Vf c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(Vf v) { return hsum8(v); }
inline Vf vscale2(Vf y, Vf n) {  // y 2^n for integral n in [-126, 127]
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
#endif

// exp(x) for x <= 0 (the scores less their max), Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-6
// polynomial in r, times 2^n; within 2 ulp of expf, and 0 below -87 (where expf is under 2^-125)
inline Vf vexp(Vf x) {
  x = lp_cpu_vmax(x, vset(-87.0f));
  const Vf n = lp_cpu_vround(vfma(x, vset(1.44269504088896341f), vzero()));
  Vf r = vfma(n, vset(-0.693359375f), x);
  r = vfma(n, vset(2.12194440e-4f), r);
  Vf p = vset(1.9875691500e-4f);
  p = vfma(p, r, vset(1.3981999507e-3f));
  p = vfma(p, r, vset(8.3334519073e-3f));
  p = vfma(p, r, vset(4.1665795894e-2f));
  p = vfma(p, r, vset(1.6666665459e-1f));
  p = vfma(p, r, vset(5.0000001201e-1f));
  const Vf r2 = vfma(r, r, vzero());
  const Vf y = vfma(p, r2, vfma(r, vset(1.0f), vset(1.0f)));
  return vscale2(y, n);
}

// A decode step reads a slice's K and V rows cold (the weights streamed since have evicted them): 2d bytes
// a position at a stride of kv_dim halves, too sparse for the hardware prefetchers to run ahead. The score
// pass requests its K rows KV_AHEAD positions ahead, and the V rows the second pass reads, into L2
// (llama3-8b at 140 positions, alternated steps: attention_partial 3.0 -> 2.2 ms a step).
constexpr int KV_AHEAD = 8;
inline void prefetch_row(const lp_half* p, int d) {
  for (int b = 0; b < 2 * d; b += 64) _mm_prefetch((const char*)p + b, _MM_HINT_T1);
}
#endif

// sum_d q[d] k[d] in order (the scalar path)
inline float dot_qk(const float* q, const lp_half* k, int d) {
  float s = 0.0f;
  for (int i = 0; i < d; ++i) s += q[i] * lp_h2f(k[i]);
  return s;
}

// the G query heads of row r that share K/V head h, rounded to f16 (numerics.query_heads): qh [G][d]
inline void query_heads(const Attn& a, int r, int h, float* qh) {
  const int G = a.group();
  const float* src = a.q + ((size_t)r * a.heads + (size_t)h * G) * a.d;
  for (int i = 0; i < G * a.d; ++i) qh[i] = lp_h2f(lp_f2h(src[i]));
}

// slice [lo, hi) of row r for K/V head h: acc [G][d], m [G], l [G]; s: scratch. The SIMD paths read each
// K and V row once for the G heads: scores as VL-lane sums over d (then the lanes), exp vectorized (vexp),
// acc[g][i] += f16(e) v[i] in position order with CH outputs of all G heads held in registers.
template <int G>
inline void slice(const Attn& a, int r, int h, int lo, int hi, const float* qh, float* acc, float* m, float* l,
                  std::vector<float>& s) {
  const int d = a.d, n = hi - lo, kv_dim = a.kv_heads * d;
  const lp_half* kp = a.cache + lp_kv_plane(a.layer, 0, a.blocks, kv_dim) + (size_t)h * d;
  const lp_half* vp = a.cache + lp_kv_plane(a.layer, 1, a.blocks, kv_dim) + (size_t)h * d;
  const int* table = a.pages + (size_t)a.seq[r] * a.npages;
  auto row = [&](const lp_half* plane, int p) { return plane + lp_kv_row(table[p / LP_PAGE], p % LP_PAGE, kv_dim); };
  s.resize((size_t)G * n);
#if LP_CPU_ISA >= 1
  const int dv = d / VL * VL;
  // the scores of U positions from t: U G independent sums, each position's in its own order
  auto scores = [&]<int U>(int t) {
    const lp_half* krow[U];
    for (int u = 0; u < U; ++u) {
      krow[u] = row(kp, lo + t + u);
      if (t + u + KV_AHEAD < n) prefetch_row(row(kp, lo + t + u + KV_AHEAD), d);
      prefetch_row(row(vp, lo + t + u), d);
    }
    Vf sum[U][G];
    for (int u = 0; u < U; ++u)
      for (int g = 0; g < G; ++g) sum[u][g] = vzero();
    for (int i = 0; i < dv; i += VL) {
      Vf kf[U];
      for (int u = 0; u < U; ++u) kf[u] = vload_h(krow[u] + i);
      for (int g = 0; g < G; ++g) {
        const Vf qf = vload(qh + (size_t)g * d + i);
        for (int u = 0; u < U; ++u) sum[u][g] = vfma(qf, kf[u], sum[u][g]);
      }
    }
    for (int u = 0; u < U; ++u)
      for (int g = 0; g < G; ++g) {
        float sg = vsum(sum[u][g]);
        for (int i = dv; i < d; ++i) sg += qh[(size_t)g * d + i] * lp_h2f(krow[u][i]);
        s[(size_t)g * n + t + u] = sg * a.scale;
      }
  };
  // two positions a pass where their 2 G sums fit the registers: G = 4 alone waits on each FMA's latency
  // (gemma3-270m's decode attention at 6000 positions, alternated: 1.066-1.073x, the same bits)
  constexpr int P = 2 * G + 4 <= (VL == 16 ? 32 : 16) ? 2 : 1;
  int at = 0;
  for (; at + P <= n; at += P) scores.template operator()<P>(at);
  for (; at < n; ++at) scores.template operator()<1>(at);
#else
  for (int t = 0; t < n; ++t) {
    const lp_half* krow = row(kp, lo + t);
    for (int g = 0; g < G; ++g) s[(size_t)g * n + t] = dot_qk(qh + (size_t)g * d, krow, d) * a.scale;
  }
#endif
  for (int g = 0; g < G; ++g) {
    float* sg = s.data() + (size_t)g * n;
    float mx = sg[0];
    for (int t = 1; t < n; ++t) mx = sg[t] > mx || sg[t] != sg[t] ? sg[t] : mx;
    int t = 0;
#if LP_CPU_ISA >= 1
    for (; t + VL <= n; t += VL) vstore(sg + t, vexp(vload(sg + t) - vset(mx)));
    for (; t < n; ++t) {  // the tail through the same vector code, one lane used
      float lane[VL] = {};
      lane[0] = sg[t] - mx;
      vstore(lane, vexp(vload(lane)));
      sg[t] = lane[0];
    }
#else
    for (; t < n; ++t) sg[t] = expf(sg[t] - mx);
#endif
    float total = 0.0f;
    for (t = 0; t < n; ++t) total += sg[t];
    m[g] = mx, l[g] = total;
    for (t = 0; t < n; ++t) sg[t] = lp_h2f(lp_f2h(sg[t]));  // the weights meet V as f16
  }
#if LP_CPU_ISA >= 1
  constexpr int CH = 4 * VL;  // outputs of each head per pass over the slice's V rows
  for (int i0 = 0; i0 < d; i0 += CH) {
    if (i0 + CH > d) {  // a last part of fewer than CH outputs
      for (int g = 0; g < G; ++g)
        for (int i = i0; i < d; ++i) acc[(size_t)g * d + i] = 0.0f;
      for (int t = 0; t < n; ++t) {
        const lp_half* vrow = row(vp, lo + t);
        for (int g = 0; g < G; ++g)
          for (int i = i0; i < d; ++i) acc[(size_t)g * d + i] = __builtin_fmaf(s[(size_t)g * n + t], lp_h2f(vrow[i]), acc[(size_t)g * d + i]);
      }
      break;
    }
    Vf o[G][4];
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < 4; ++j) o[g][j] = vzero();
    for (int t = 0; t < n; ++t) {
      const lp_half* vrow = row(vp, lo + t) + i0;
      Vf vf[4];
      for (int j = 0; j < 4; ++j) vf[j] = vload_h(vrow + j * VL);
      for (int g = 0; g < G; ++g) {
        const Vf e = vset(s[(size_t)g * n + t]);
        for (int j = 0; j < 4; ++j) o[g][j] = vfma(e, vf[j], o[g][j]);
      }
    }
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < 4; ++j) vstore(acc + (size_t)g * d + i0 + j * VL, o[g][j]);
  }
#else
  for (int g = 0; g < G; ++g)
    for (int i = 0; i < d; ++i) acc[(size_t)g * d + i] = 0.0f;
  for (int t = 0; t < n; ++t) {
    const lp_half* vrow = row(vp, lo + t);
    for (int g = 0; g < G; ++g)
      for (int i = 0; i < d; ++i) acc[(size_t)g * d + i] += s[(size_t)g * n + t] * lp_h2f(vrow[i]);
  }
#endif
}

// one head's output from its slices' partials part[j] = (acc [d], m, l), j < splits, stride d + 2;
// slices with m = -inf (empty) are skipped
inline void combine(const float* part, int splits, int d, float* out) {
  float top = -__builtin_inff();
  for (int j = 0; j < splits; ++j) top = lp_max(top, part[(size_t)j * (d + 2) + d]);
  float den = 0.0f;
  for (int i = 0; i < d; ++i) out[i] = 0.0f;
  for (int j = 0; j < splits; ++j) {
    const float* pj = part + (size_t)j * (d + 2);
    if (!(pj[d] > -__builtin_inff())) continue;
    const float w = expf(pj[d] - top);
    for (int i = 0; i < d; ++i) out[i] += pj[i] * w;
    den += pj[d + 1] * w;
  }
  for (int i = 0; i < d; ++i) out[i] /= den;
}

// part [rows, heads, splits, d + 2]: every slice of every row, (0, -inf, 0) where a slice is empty;
// G = heads / kv_heads. The tasks are the slices [j0, j1] that some row uses: the pool's contiguous
// shares then split the work, not a range of empty slices (a 512-position window at position 6000 is
// slices 21-23 of 32: as 32 tasks, one thread's share held all three)
template <int G> inline void attention_partial(const Attn& a, float* part, int rows, int splits) {
  const int d = a.d;
  auto at = [&](int r, int h, int g, int j) { return part + (((size_t)r * a.heads + (size_t)h * G + g) * splits + j) * (d + 2); };
  auto empty = [&](int r, int h, int j) {
    for (int g = 0; g < G; ++g) {
      float* o = at(r, h, g, j);
      for (int i = 0; i < d; ++i) o[i] = 0.0f;
      o[d] = -__builtin_inff(), o[d + 1] = 0.0f;
    }
  };
  int j0 = splits - 1, j1 = 0;
  for (int r = 0; r < rows; ++r) j0 = lp_min(j0, a.first(r) / a.chunk), j1 = lp_max(j1, a.pos[r] / a.chunk);
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < a.kv_heads; ++h)
      for (int j = 0; j < splits; ++j)
        if (j < j0 || j > j1) empty(r, h, j);
  const int used = j1 - j0 + 1;
  lp_parallel(rows * a.kv_heads * used, [&](int t) {
    const int j = j0 + t % used, h = t / used % a.kv_heads, r = t / used / a.kv_heads;
    const int p = a.pos[r], first = a.first(r);
    if (j < first / a.chunk || j > p / a.chunk) return empty(r, h, j);
    static thread_local std::vector<float> qh, acc, s;
    qh.resize((size_t)G * d), acc.resize((size_t)G * d);
    query_heads(a, r, h, qh.data());
    float m[G], l[G];
    slice<G>(a, r, h, lp_max(first, j * a.chunk), lp_min(p + 1, (j + 1) * a.chunk), qh.data(), acc.data(), m, l, s);
    for (int g = 0; g < G; ++g) {
      float* o = at(r, h, g, j);
      for (int i = 0; i < d; ++i) o[i] = acc[(size_t)g * d + i];
      o[d] = m[g], o[d + 1] = l[g];
    }
  });
}

// out [rows, heads * d] from the partials, stored in format FMT (rows.h pack_row)
template <int FMT> inline void attention_reduce(const float* part, void* out, int rows, int heads, int d, int splits) {
  over_rows(rows, heads * d * splits, [&](int r0, int r1) {
    std::vector<float> v((size_t)heads * d);
    for (int r = r0; r < r1; ++r) {
      for (int hh = 0; hh < heads; ++hh)
        combine(part + ((size_t)r * heads + hh) * splits * (d + 2), splits, d, v.data() + (size_t)hh * d);
      pack_row<FMT>(v.data(), heads * d, out, rows, r);
    }
  });
}

// out [rows, heads * d] f32: each row's slices computed and combined at once (prefill)
template <int G> inline void attention(const Attn& a, float* out, int rows) {
  const int d = a.d;
  lp_parallel(rows * a.kv_heads, [&](int t) {
    const int h = t % a.kv_heads, r = t / a.kv_heads;
    const int p = a.pos[r], first = a.first(r), j0 = first / a.chunk, j1 = p / a.chunk;
    const int used = j1 - j0 + 1;
    static thread_local std::vector<float> qh, acc, s, part;
    qh.resize((size_t)G * d), acc.resize((size_t)G * d), part.resize((size_t)G * used * (d + 2));
    query_heads(a, r, h, qh.data());
    float m[G], l[G];
    for (int j = j0; j <= j1; ++j) {
      slice<G>(a, r, h, lp_max(first, j * a.chunk), lp_min(p + 1, (j + 1) * a.chunk), qh.data(), acc.data(), m, l, s);
      for (int g = 0; g < G; ++g) {
        float* o = part.data() + ((size_t)g * used + (j - j0)) * (d + 2);
        for (int i = 0; i < d; ++i) o[i] = acc[(size_t)g * d + i];
        o[d] = m[g], o[d + 1] = l[g];
      }
    }
    for (int g = 0; g < G; ++g)
      combine(part.data() + (size_t)g * used * (d + 2), used, d, out + ((size_t)r * a.heads + (size_t)h * G + g) * d);
  });
}

}  // namespace lp_cpu
