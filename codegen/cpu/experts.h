// experts.h: the routed experts' projections on the CPU (ops matmul_experts, matmul_experts_residual; CPU
// twin runtime/numpy_kernels.py experts, core/numerics.py matmul_experts and moe_sum).
//
// A launch has rows x top slots, slot s = row * top + j routed to expert ids[s]. The slots are grouped by
// expert (a counting sort: counts, their scan, then the slots in order), each group's activation rows
// gathered into a packed buffer of its own (x's row, or the slot's own k-wide slice where x holds one per
// slot: `sliced`), and every group runs matmul.h's engines on its expert's matrix alone: weight rows
// [e * n, (e + 1) * n) of the [experts * n, k] tensor, in place or as rows16 records, so a step reads the
// routed experts' rows and no others, each once for all the rows routed to it. The tasks are
// (group, task_rows weight rows) pairs over the pool. An output's operations depend only on its weight
// row and activation row (matmul.h), never on which rows share its expert. matmul_experts_residual then
// adds each row's slots, weighted, to the residual: s = y_0 * w_0, s = s + y_j * w_j for j = 1 .. top - 1,
// out = r + s (llama.cpp's order; r may be the output itself).
#pragma once
#include <string.h>

#include <vector>

#include "matmul.h"
#include "rows.h"

namespace lp_cpu {

// row `src` of a packed [from, k] buffer into row `dst` of a packed [to, k] one (their planes: common.cuh
// lp_q8_rows; plain values)
template <int ACT> inline void copy_packed_row(const void* x, int from, int src, void* y, int to, int dst, int k) {
  if constexpr (ACT == LP_ACT_Q8_0 || ACT == LP_ACT_Q8_1 || ACT == LP_ACT_Q8_K) {
    const Q8Rows a = lp_q8_rows((void*)x, from, k, ACT), b = lp_q8_rows(y, to, k, ACT);
    memcpy(b.qs + (size_t)dst * k, a.qs + (size_t)src * k, k);
    const size_t scales = ACT == LP_ACT_Q8_K ? k / 256 * sizeof(float) : k / 32 * sizeof(lp_half);
    memcpy((char*)b.d + dst * scales, (const char*)a.d + src * scales, scales);
    if constexpr (ACT == LP_ACT_Q8_1) memcpy(b.s + (size_t)dst * (k / 32), a.s + (size_t)src * (k / 32), scales);
    if constexpr (ACT == LP_ACT_Q8_K) memcpy(b.bsums + (size_t)dst * (k / 16), a.bsums + (size_t)src * (k / 16), k / 16 * 2);
  } else {
    const size_t bytes = packed_bytes<ACT>(1, k);
    memcpy((char*)y + dst * bytes, (const char*)x + src * bytes, bytes);
  }
}

// bytes of one expert's [n, k] matrix in format F as the kernels read it (rows16 records or blocks)
template <int F> constexpr size_t expert_bytes(int n, int k) {
  if constexpr (is_r16<F>) return (size_t)(n / R16) * (k / 256) * LpRows16<F>::BYTES;
  else return (size_t)n * (k / LpFormat<F>::BLOCK) * LpFormat<F>::BYTES;
}

constexpr int LP_UNUSED = -2;  // a groups entry no group uses: not -1, poison mode's mark of an int left unwritten

// The slots grouped by expert into the groups scratch, experts.cu lp_moe_group's layout (int32, S = rows
// * top slots): [0] the group count G; [1, 1 + S) each group's expert, ascending; [1 + S, 2 + 2S) each
// group's first position (G + 1 of them); [2 + 2S, 2 + 3S) the slots in group order (within a group, slot
// order); [2 + 3S, 2 + 4S) each slot's position (LP_UNUSED: an id out of range, no group); the rest of its
// rows * (4 top + 2) ints LP_UNUSED. A counting sort on the calling thread: counts, their scan, then the
// slots in order. MAX_E: the most experts a model has (the counts' stack array).
template <int MAX_E> inline void group_slots(const int* ids, int* groups, int rows, int experts, int top) {
  const int S = rows * top;
  int first[MAX_E + 1] = {};
  for (int i = 0; i < rows * (4 * top + 2); ++i) groups[i] = LP_UNUSED;
  for (int s = 0; s < S; ++s)
    if (ids[s] >= 0 && ids[s] < experts) ++first[ids[s] + 1];
  int g = 0;
  for (int e = 0; e < experts; ++e) {
    if (first[e + 1] > 0) groups[1 + g] = e, groups[1 + S + g++] = first[e];
    first[e + 1] += first[e];
  }
  groups[0] = g;
  groups[1 + S + g] = first[experts];
  for (int s = 0; s < S; ++s)
    if (ids[s] >= 0 && ids[s] < experts) {
      const int at = first[ids[s]]++;
      groups[2 + 2 * S + at] = s;
      groups[2 + 3 * S + s] = at;
    }
}

// groups: the groups scratch; xg: the gathered activations [S, k] in x's activation format, in group order
// (planes as an arena buffer's); ys: the slots' results [S, n] (matmul_experts_residual; else y itself)
template <int F, bool RES, int MAX_E>
inline void matmul_experts(const void* x, const void* w, const int* ids, const float* weights, const float* r, float* y,
                           int* groups, void* xg, float* ys, int rows, int k, int n, int experts, int top, int sliced,
                           int task_rows, int ahead, int cols) {
  constexpr int ACT = act_of<F>();
  const int S = rows * top;
  if (S <= 0) return;
  group_slots<MAX_E>(ids, groups, rows, experts, top);
  const int G = groups[0], *expert = groups + 1, *first = groups + 1 + S, *slot = groups + 2 + 2 * S;
  const int* position = groups + 2 + 3 * S;
  const int xrows = sliced ? S : rows;
  over_rows(S, k, [&](int s0, int s1) {
    for (int s = s0; s < s1; ++s)
      if (position[s] >= 0) copy_packed_row<ACT>(x, xrows, sliced ? s : s / top, xg, S, position[s], k);
  });
  std::vector<Acts> acts(G);  // each group's rows of xg as the engines take them
  for (int u = 0; u < G; ++u) {
    make_acts<ACT>(acts[u], xg, first[u + 1] - first[u], k, S, first[u]);
    if constexpr (is_r16<F>) r16_sums(acts[u].bsums, acts[u].rows, k, acts[u].pairs, acts[u].off);
  }
  float* out = RES ? ys : y;
  const int tr = task_rows_of<F>(task_rows), per = (n + tr - 1) / tr;
  lp_parallel(G * per, [&](int t) {
    const int u = t / per, r0 = t % per * tr, r1 = lp_min(n, r0 + tr);
    const int* at = slot + first[u];
    auto put = [&](int row, int col, float v) { out[(size_t)at[col] * n + row] = v; };
    weight_rows<F, R16_PATH>((const uint8_t*)w + expert[u] * expert_bytes<F>(n, k), n, r0, r1, acts[u], ahead, cols, put);
  });
  if constexpr (RES) {
    over_rows(rows, top * n, [&](int row0, int row1) {
      for (int row = row0; row < row1; ++row) {
        const float* wr = weights + (size_t)row * top;
        const float* yr = ys + (size_t)row * top * n;
        for (int i = 0; i < n; ++i) {
          float s = yr[i] * wr[0];
          for (int j = 1; j < top; ++j) s = s + yr[(size_t)j * n + i] * wr[j];
          y[(size_t)row * n + i] = r[(size_t)row * n + i] + s;
        }
      }
    });
  }
}

}  // namespace lp_cpu
