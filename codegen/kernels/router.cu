// router.cu: the mixture-of-experts router (op moe_router; CPU twin runtime/numpy_kernels.py moe_router,
// core/numerics.py route; CPU kernel codegen/cpu/router.h): each row's routed experts and their weights,
// written to device buffers that the expert projections read, so the launches of a step never depend on
// the routing.
//
// Grid (rows,), THREADS threads: thread i computes the logits of experts i, i + THREADS, ... (a float dot
// product over k in order), then the row's softmax as the CPU kernel and the twin take it, bit for bit:
// every thread the exp of its experts' difference to the max in double (common.cuh lp_exp64), thread 0
// their double sum in expert order, every thread its p = e / sum rounded to float. Thread 0 then orders
// the experts as llama.cpp's CPU argsort does (lp_sort_desc: libstdc++'s std::sort with ggml's comparator
// p[a] > p[b], step for step, so equal probabilities come out in its order) and writes the first `top`
// with their p, divided by their sum (double, rounded to float) when `norm`. A few hundred experts per
// row: the serial part is short beside a decode step.
#include "common.cuh"

constexpr int LP_SORT_THRESHOLD = 16;  // libstdc++'s _S_threshold

// --- libstdc++'s std::sort (introsort) on indices a[0, n) by descending v: core/numerics.py sort_desc ---

__device__ __forceinline__ bool lp_before(const float* v, int a, int b) { return v[a] > v[b]; }

__device__ void lp_sift(int* a, int hole, int len, int item, const float* v) {  // __adjust_heap, __push_heap
  const int top = hole;
  int child = hole;
  while (child < (len - 1) / 2) {
    child = 2 * (child + 1);
    if (lp_before(v, a[child], a[child - 1])) --child;
    a[hole] = a[child];
    hole = child;
  }
  if ((len & 1) == 0 && child == (len - 2) / 2) {
    child = 2 * (child + 1);
    a[hole] = a[child - 1];
    hole = child - 1;
  }
  int parent = (hole - 1) / 2;
  while (hole > top && lp_before(v, a[parent], item)) {
    a[hole] = a[parent];
    hole = parent;
    parent = (hole - 1) / 2;
  }
  a[hole] = item;
}

__device__ void lp_heap_sort(int* a, int n, const float* v) {  // __partial_sort(first, last, last)
  for (int parent = (n - 2) / 2; n >= 2 && parent >= 0; --parent) lp_sift(a, parent, n, a[parent], v);
  for (int last = n - 1; last > 0; --last) {
    const int item = a[last];
    a[last] = a[0];
    lp_sift(a, 0, last, item, v);
  }
}

__device__ void lp_swap(int* a, int i, int j) {
  const int t = a[i];
  a[i] = a[j];
  a[j] = t;
}

// introsort (partitions down to runs of LP_SORT_THRESHOLD, heap sort past 2 floor(log2 n) levels) with an
// explicit stack in place of __introsort_loop's recursion: the two parts of a partition are disjoint, so the
// order they are sorted in does not change the result; then __final_insertion_sort. `stack` holds
// LP_SORT_STACK ints (shared memory: a local array would be a stack frame).
constexpr int LP_SORT_STACK = 3 * 24;  // (first, last, depth) of the pending ranges: one per level (2 log2 1024), one more

__device__ void lp_sort_desc(int* a, int n, const float* v, int* stack) {
  int top = 0, levels = 0;
  for (int m = n; m > 1; m >>= 1) levels += 2;
  stack[top++] = 0, stack[top++] = n, stack[top++] = levels;
  while (top > 0) {
    int depth = stack[--top];
    const int last = stack[--top], first = stack[--top];
    if (last - first <= LP_SORT_THRESHOLD) continue;
    if (depth == 0) {
      lp_heap_sort(a + first, last - first, v);
      continue;
    }
    --depth;
    const int i = first + 1, j = first + (last - first) / 2, m = last - 1;  // __move_median_to_first
    int pick;
    if (lp_before(v, a[i], a[j])) pick = lp_before(v, a[j], a[m]) ? j : lp_before(v, a[i], a[m]) ? m : i;
    else pick = lp_before(v, a[i], a[m]) ? i : lp_before(v, a[j], a[m]) ? m : j;
    lp_swap(a, first, pick);
    int lo = first + 1, hi = last;  // __unguarded_partition around a[first]
    for (;;) {
      while (lp_before(v, a[lo], a[first])) ++lo;
      --hi;
      while (lp_before(v, a[first], a[hi])) --hi;
      if (lo >= hi) break;
      lp_swap(a, lo, hi);
      ++lo;
    }
    stack[top++] = lo, stack[top++] = last, stack[top++] = depth;
    stack[top++] = first, stack[top++] = lo, stack[top++] = depth;
  }
  for (int i = 1; i < n; ++i) {  // __insertion_sort on the first 16, __unguarded_insertion_sort on the rest
    const int item = a[i];
    int at = i;
    if (i < LP_SORT_THRESHOLD && lp_before(v, item, a[0])) {
      for (; at > 0; --at) a[at] = a[at - 1];
    } else {
      for (; lp_before(v, item, a[at - 1]); --at) a[at] = a[at - 1];
    }
    a[at] = item;
  }
}

// --- the router ---------------------------------------------------------------------------------------

// MAX_E: the most experts a model has (the shared arrays' size)
template <int THREADS, int MAX_E>
__device__ void lp_moe_router(const float* x, const float* gate, int* ids, float* weights, int rows, int k,
                              int experts, int top, int norm) {
  __shared__ float p[MAX_E];
  __shared__ double e[MAX_E];
  __shared__ int order[MAX_E];
  __shared__ int stack[LP_SORT_STACK];
  __shared__ double sum;
  const int r = lp_bid();
  const float* xr = x + (size_t)r * k;
  for (int i = lp_tid(); i < experts; i += THREADS) {
    const float* g = gate + (size_t)i * k;
    float dot = 0.0f;
    for (int j = 0; j < k; ++j) dot = lp_add_rn(dot, lp_mul_rn(xr[j], g[j]));
    p[i] = dot;
    order[i] = i;
  }
  lp_sync();
  float most = p[0];
  for (int i = 1; i < experts; ++i) most = lp_fmax(most, p[i]);
  for (int i = lp_tid(); i < experts; i += THREADS) e[i] = lp_exp64((double)p[i] - (double)most);
  lp_sync();
  if (lp_tid() == 0) {
    double s = 0.0;
    for (int i = 0; i < experts; ++i) s = lp_add_rn(s, e[i]);
    sum = s;
  }
  lp_sync();
  for (int i = lp_tid(); i < experts; i += THREADS) p[i] = (float)(e[i] / sum);
  lp_sync();
  if (lp_tid() != 0) return;
  lp_sort_desc(order, experts, p, stack);
  double chosen = 0.0;
  for (int j = 0; j < top; ++j) chosen = lp_add_rn(chosen, (double)p[order[j]]);
  const float total = (float)chosen;
  for (int j = 0; j < top; ++j) {
    ids[(size_t)r * top + j] = order[j];
    weights[(size_t)r * top + j] = norm ? p[order[j]] / total : p[order[j]];
  }
}
