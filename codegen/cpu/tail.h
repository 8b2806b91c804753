// tail.h: the fused tail on the CPU, the next token of each row (op tail_argmax; CPU twin
// runtime/numpy_kernels.py tail_argmax): argmax of pack(rmsnorm(x, norm)) . head^T over the tokens the
// row's mask allows (one bit per token, core/numerics.py masked_argmax; a free row's allows all).
// The rows are normalised and packed as norm.h does (into a buffer of the kernel's own), then the head
// runs through matmul.h's row loop, every task keeping the best (logit, index) per row of its head rows
// (common.cuh lp_better: np.argmax's order, a total order), and the tasks' bests meet in task order:
// no logit reaches memory, and the split cannot change the answer.
#pragma once
#include <vector>

#include "matmul.h"
#include "norm.h"

namespace lp_cpu {

// HF: the head's format; FMT: the packed format it takes (LP_ACT_*)
template <int HF, int FMT>
inline void tail_argmax(const float* x, const float* norm, const void* head, const uint32_t* mask, int* out, int rows,
                        int k, int vocab, float eps, int task_rows, int ahead, int cols) {
  const size_t words = ((size_t)vocab + 31) / 32;
  std::vector<uint64_t> packed((packed_bytes<FMT>(rows, k) + 7) / 8);
  rmsnorm_pack<FMT>(x, norm, packed.data(), rows, k, eps);
  const int tr = task_rows_of<HF>(task_rows);
  const int tasks = (vocab + tr - 1) / tr;
  std::vector<LpBest> best((size_t)tasks * rows, lp_no_best());
  const void* w[1] = {head};
  const int n[1] = {vocab};
  project<HF, 0, 0, 1>(packed.data(), w, n, rows, k, tr, ahead, cols, [&](int t, int, int row, int col, float v) {
    if (!(mask[col * words + row / 32] >> (row % 32) & 1u)) return;
    LpBest& b = best[(size_t)t * rows + col];
    if (lp_better(v, row, b.v, b.i)) b = {v, row};
  });
  for (int c = 0; c < rows; ++c) {
    LpBest b = lp_no_best();
    for (int t = 0; t < tasks; ++t) {
      const LpBest& o = best[(size_t)t * rows + c];
      if (lp_better(o.v, o.i, b.v, b.i)) b = o;
    }
    out[c] = b.i;
  }
}

}  // namespace lp_cpu
