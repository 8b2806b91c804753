// attention.h: causal attention over the paged f16 K/V cache on the CPU, split into slices of `chunk`
// positions (ops attention, attention_partial, attention_reduce, attention_reduce_pack; CPU twins
// runtime/cpu_kernels.py attention*, core/numerics.py attend / combine).
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
// still fills the pool; attention's and attention_reduce's are rows (and K/V heads).
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

// sum_d q[d] k[d]: 8 float lanes then the tail (SIMD paths), or in order
inline float dot_qk(const float* q, const lp_half* k, int d) {
  int i = 0;
  float s = 0.0f;
#if LP_CPU_ISA >= 1
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= d; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load_h8(k + i), acc);
  s = hsum8(acc);
#endif
  for (; i < d; ++i) s += q[i] * lp_h2f(k[i]);
  return s;
}

// acc[:] += e v[:]
inline void add_scaled(float* acc, float e, const lp_half* v, int d) {
  int i = 0;
#if LP_CPU_ISA >= 1
  const __m256 ev = _mm256_set1_ps(e);
  for (; i + 8 <= d; i += 8) _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(ev, load_h8(v + i), _mm256_loadu_ps(acc + i)));
#endif
  for (; i < d; ++i) acc[i] += e * lp_h2f(v[i]);
}

// the G query heads of row r that share K/V head h, rounded to f16 (numerics.query_heads): qh [G][d]
inline void query_heads(const Attn& a, int r, int h, float* qh) {
  const int G = a.group();
  const float* src = a.q + ((size_t)r * a.heads + (size_t)h * G) * a.d;
  for (int i = 0; i < G * a.d; ++i) qh[i] = lp_h2f(lp_f2h(src[i]));
}

// slice [lo, hi) of row r for K/V head h: acc [G][d], m [G], l [G]; s: scratch
inline void slice(const Attn& a, int r, int h, int lo, int hi, const float* qh, float* acc, float* m, float* l,
                  std::vector<float>& s) {
  const int G = a.group(), d = a.d, n = hi - lo, kv_dim = a.kv_heads * d;
  const lp_half* kp = a.cache + lp_kv_plane(a.layer, 0, a.blocks, kv_dim) + (size_t)h * d;
  const lp_half* vp = a.cache + lp_kv_plane(a.layer, 1, a.blocks, kv_dim) + (size_t)h * d;
  const int* table = a.pages + (size_t)a.seq[r] * a.npages;
  s.resize((size_t)G * n);
  for (int t = 0; t < n; ++t) {
    const int p = lo + t;
    const lp_half* krow = kp + lp_kv_row(table[p / LP_PAGE], p % LP_PAGE, kv_dim);
    for (int g = 0; g < G; ++g) s[(size_t)g * n + t] = dot_qk(qh + (size_t)g * d, krow, d) * a.scale;
  }
  for (int g = 0; g < G; ++g) {
    float* sg = s.data() + (size_t)g * n;
    float mx = sg[0];
    for (int t = 1; t < n; ++t) mx = sg[t] > mx || sg[t] != sg[t] ? sg[t] : mx;
    float total = 0.0f;
    for (int t = 0; t < n; ++t) {
      sg[t] = expf(sg[t] - mx);
      total += sg[t];
    }
    m[g] = mx, l[g] = total;
    for (int i = 0; i < d; ++i) acc[(size_t)g * d + i] = 0.0f;
  }
  for (int t = 0; t < n; ++t) {
    const int p = lo + t;
    const lp_half* vrow = vp + lp_kv_row(table[p / LP_PAGE], p % LP_PAGE, kv_dim);
    for (int g = 0; g < G; ++g) add_scaled(acc + (size_t)g * d, lp_h2f(lp_f2h(s[(size_t)g * n + t])), vrow, d);
  }
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

// part [rows, heads, splits, d + 2]: every slice of every row, (0, -inf, 0) where a slice is empty
inline void attention_partial(const Attn& a, float* part, int rows, int splits) {
  const int G = a.group(), d = a.d;
  lp_parallel(rows * a.kv_heads * splits, [&](int t) {
    const int j = t % splits, h = t / splits % a.kv_heads, r = t / splits / a.kv_heads;
    const int p = a.pos[r], first = a.first(r);
    auto at = [&](int g) { return part + (((size_t)r * a.heads + (size_t)h * G + g) * splits + j) * (d + 2); };
    if (j < first / a.chunk || j > p / a.chunk) {
      for (int g = 0; g < G; ++g) {
        float* o = at(g);
        for (int i = 0; i < d; ++i) o[i] = 0.0f;
        o[d] = -__builtin_inff(), o[d + 1] = 0.0f;
      }
      return;
    }
    static thread_local std::vector<float> qh, acc, s;
    qh.resize((size_t)G * d), acc.resize((size_t)G * d);
    query_heads(a, r, h, qh.data());
    float m[64], l[64];
    slice(a, r, h, lp_max(first, j * a.chunk), lp_min(p + 1, (j + 1) * a.chunk), qh.data(), acc.data(), m, l, s);
    for (int g = 0; g < G; ++g) {
      float* o = at(g);
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
inline void attention(const Attn& a, float* out, int rows) {
  const int G = a.group(), d = a.d;
  lp_parallel(rows * a.kv_heads, [&](int t) {
    const int h = t % a.kv_heads, r = t / a.kv_heads;
    const int p = a.pos[r], first = a.first(r), j0 = first / a.chunk, j1 = p / a.chunk;
    const int used = j1 - j0 + 1;
    static thread_local std::vector<float> qh, acc, s, part;
    qh.resize((size_t)G * d), acc.resize((size_t)G * d), part.resize((size_t)G * used * (d + 2));
    query_heads(a, r, h, qh.data());
    float m[64], l[64];
    for (int j = j0; j <= j1; ++j) {
      slice(a, r, h, lp_max(first, j * a.chunk), lp_min(p + 1, (j + 1) * a.chunk), qh.data(), acc.data(), m, l, s);
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
