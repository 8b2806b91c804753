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

// The slots grouped by expert: group e is slot[first[e] .. first[e + 1]), in slot order. A slot whose id is
// out of range joins no group (its outputs stay unwritten).
struct ExpertGroups {
  std::vector<int> first, slot;
  ExpertGroups(const int* ids, int slots, int experts) : first(experts + 1, 0), slot(slots) {
    for (int s = 0; s < slots; ++s)
      if (ids[s] >= 0 && ids[s] < experts) ++first[ids[s] + 1];
    for (int e = 0; e < experts; ++e) first[e + 1] += first[e];
    std::vector<int> at(first.begin(), first.end() - 1);
    for (int s = 0; s < slots; ++s)
      if (ids[s] >= 0 && ids[s] < experts) slot[at[ids[s]]++] = s;
  }
  int size(int e) const { return first[e + 1] - first[e]; }
};

template <int F, bool RES>
inline void matmul_experts(const void* x, const void* w, const int* ids, const float* weights, const float* r, float* y,
                           int rows, int k, int n, int experts, int top, int sliced, int task_rows, int ahead, int cols) {
  constexpr int ACT = act_of<F>();
  const int slots = rows * top;
  if (slots <= 0) return;
  const ExpertGroups g(ids, slots, experts);
  std::vector<int> used;
  for (int e = 0; e < experts; ++e)
    if (g.size(e) > 0) used.push_back(e);
  const int xrows = sliced ? slots : rows;
  std::vector<std::vector<uint64_t>> packed(used.size());
  std::vector<Acts> acts(used.size());
  for (size_t u = 0; u < used.size(); ++u) {
    const int e = used[u], c = g.size(e);
    packed[u].resize((packed_bytes<ACT>(c, k) + 7) / 8);
    for (int i = 0; i < c; ++i) {
      const int s = g.slot[g.first[e] + i];
      copy_packed_row<ACT>(x, xrows, sliced ? s : s / top, packed[u].data(), c, i, k);
    }
    make_acts<ACT>(acts[u], packed[u].data(), c, k);
    if constexpr (is_r16<F>) r16_sums(acts[u].bsums, c, k, acts[u].pairs, acts[u].off);
  }
  std::vector<float> own(RES ? (size_t)slots * n : 0);
  float* ys = RES ? own.data() : y;
  const int tr = task_rows_of<F>(task_rows), per = (n + tr - 1) / tr;
  lp_parallel((int)used.size() * per, [&](int t) {
    const int u = t / per, e = used[u], r0 = t % per * tr, r1 = lp_min(n, r0 + tr);
    const int* slot = g.slot.data() + g.first[e];
    auto out = [&](int row, int col, float v) { ys[(size_t)slot[col] * n + row] = v; };
    weight_rows<F, R16_PATH>((const uint8_t*)w + e * expert_bytes<F>(n, k), n, r0, r1, acts[u], ahead, cols, out);
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
